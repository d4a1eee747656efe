export { invalidType, isRangeRefusal, rangeRefusal, unknownField } from "../../core/json/decode-refusals.js";
export { integerInString } from "../../core/json/integer-in-string.js";
export {
  isJsonNumber,
  type JsonArrayCap,
  JsonNumberText,
  parseStrictJson,
  readExactInteger,
  readExactIntegerText,
} from "../../core/json/strict-json.js";
export { apiDocsRoutes } from "./api-docs.js";
export { createCallContext } from "./call-context.js";
export {
  completionRequestFieldNames,
  type DecodedCompletionRequest,
  decodeCompletionRequest,
} from "./decode-completion-request.js";
export {
  decodeDetokenizeRequest,
  decodeTokenizeRequest,
  detokenizeRequestFieldNames,
  tokenizeRequestFieldNames,
} from "./decode-tokens-request.js";
export {
  errorCodesOfStatus,
  errorStatuses,
  type JsonSchema,
  type OpenApiDocument,
  type OpenApiOperation,
  type OpenApiResponse,
  openApiDocument,
} from "./openapi.js";
export {
  type ActivationsJson,
  type CompletionChoiceJson,
  type CompletionChunkJson,
  type CompletionJson,
  type CompletionStreamChoiceJson,
  type LogprobsJson,
  type ModelJson,
  type ModelListJson,
  type PromptLogprobsJson,
  type RenderOptions,
  renderChunk,
  renderCompletion,
  renderModel,
  renderModelList,
  type UsageJson,
} from "./render-completion.js";
export { type DetokenizeJson, renderDetokenize, renderTokenize, type TokenizeJson } from "./render-tokens.js";
export {
  allowedMethods,
  CHAT_COMPLETIONS_MESSAGE,
  handleUnmatchedRoute,
  type RestRoutesOptions,
  restRouteMethods,
  restRoutes,
} from "./rest-routes.js";
export {
  apiErrorFrom,
  renderMethodNotAllowed,
  renderNotFound,
  requestIdOf,
  requestTooLarge,
  sendError,
  unknownRoute,
} from "./send-error.js";
export {
  createSseWriter,
  type SseWriter,
  type SseWriterOptions,
} from "./sse-writer.js";
export {
  parseUsageQuery,
  registerUsageRoute,
  USAGE_COMPLETIONS_PATH,
  type UsageRouteDeps,
} from "./usage-route.js";
