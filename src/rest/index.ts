export { createCallContext } from "./call-context.js";
export {
  completionRequestFieldNames,
  type DecodedCompletionRequest,
  decodeCompletionRequest,
} from "./decode-completion-request.js";
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
} from "./send-error.js";
export {
  createSseWriter,
  type SseWriter,
  type SseWriterOptions,
} from "./sse-writer.js";
