// The client of Inference (vLLM + vllm-lens over HTTP): wire types, request builder, SSE
// decoding, error mapping and converters to the proto messages.
export {
  buildVllmRequest,
  type ResolvedCompletion,
  serializeVllmRequest,
  type VllmRequestBody,
  vllmRequestBody,
  vllmRequestJson,
} from "./build-vllm-request.js";
export { createTokenizeCache, type TokenizeCache, type TokenizeEntry } from "./create-tokenize-cache.js";
export { createVllmClient, DEFAULT_MAX_CONCURRENT_COMPLETIONS } from "./create-vllm-client.js";
export { DEFAULT_MAX_SSE_EVENT_CHARS, decodeSse } from "./decode-sse.js";
export { newCompletionId, newUpstreamRequestId } from "./ids.js";
export {
  isVllmErrorBody,
  mapUpstreamError,
  parseVllmError,
  type UpstreamFailure,
  type UpstreamFault,
  UpstreamSilenceError,
  upstreamFaultOf,
  upstreamSilence,
} from "./map-upstream-error.js";
export { orderedEntries, parseJsonOrdered } from "./parse-json-ordered.js";
export {
  parseVllmCompletion,
  parseVllmCompletionChunk,
  parseVllmDetokenizeResponse,
  parseVllmJson,
  parseVllmModelList,
  parseVllmTokenizeResponse,
} from "./parse-vllm-response.js";
export { ChoiceTextOffsets, TextOffsets } from "./text-offsets.js";
export { toCompletionResponse, toStreamChunk } from "./to-completion-response.js";
export { VllmInference } from "./translate.js";
export type * from "./types.js";
export type {
  CompleteOptions,
  ControlCallOptions,
  StreamOptions,
  TokenizeResult,
  VllmClient,
  VllmClientOptions,
} from "./vllm-client-types.js";
