import { ApiError, clip, type ErrorCode, MAX_UPSTREAM_MESSAGE_CHARS } from "../../core/errors/index.js";
import type { VllmErrorDetail } from "./types.js";

/**
 * Something that went wrong talking to Inference:
 * - `transport`: a thrown error (undici `UND_ERR_*`, errno codes, or an ApiError we aborted
 *   with); `responseStarted` tells whether response headers had arrived.
 * - `response`: an HTTP response that is an error — any non-2xx status, or a 2xx whose JSON
 *   body has a top-level `error` key; `body` is the raw body text.
 * - `event`: an in-band SSE `data:` event holding `{"error": …}` (already parsed JSON).
 */
export type UpstreamFailure =
  | { readonly kind: "transport"; readonly error: unknown; readonly responseStarted: boolean }
  | { readonly kind: "response"; readonly status: number; readonly body: string }
  | { readonly kind: "event"; readonly body: unknown };

/** How one transport code maps: before any response / after the response began. */
interface TransportRule {
  readonly before: ErrorCode;
  readonly after: ErrorCode;
  readonly message: string;
}

const unreachable: TransportRule = {
  before: "upstream_unavailable",
  after: "upstream_unavailable",
  message: "Inference is unavailable",
};
const broken: TransportRule = {
  before: "upstream_unavailable",
  after: "upstream_error",
  message: "The connection to Inference broke off",
};
const timeout: TransportRule = {
  before: "deadline_exceeded",
  after: "deadline_exceeded",
  message: "Inference did not answer in time",
};
const aborted: TransportRule = { before: "canceled", after: "canceled", message: "The request was canceled" };
const malformed: TransportRule = {
  before: "upstream_error",
  after: "upstream_error",
  message: "Inference sent a malformed HTTP response",
};

/** Transport errors by their stable code (undici `UND_ERR_*`, Node errno codes). */
const transportTable: Readonly<Record<string, TransportRule>> = {
  ECONNREFUSED: unreachable,
  ENOTFOUND: unreachable,
  EAI_AGAIN: unreachable,
  EHOSTUNREACH: unreachable,
  EHOSTDOWN: unreachable,
  ENETUNREACH: unreachable,
  ENETDOWN: unreachable,
  UND_ERR_CONNECT_TIMEOUT: unreachable,
  ECONNRESET: broken,
  ECONNABORTED: broken,
  EPIPE: broken,
  ETIMEDOUT: broken,
  UND_ERR_SOCKET: broken,
  UND_ERR_CLOSED: broken,
  UND_ERR_DESTROYED: broken,
  UND_ERR_HEADERS_TIMEOUT: timeout,
  UND_ERR_BODY_TIMEOUT: timeout,
  UND_ERR_ABORTED: aborted,
  UND_ERR_ABORT: aborted,
  ABORT_ERR: aborted,
  UND_ERR_RES_CONTENT_LENGTH_MISMATCH: malformed,
  UND_ERR_RES_EXCEEDED_MAX_SIZE: malformed,
  UND_ERR_HEADERS_OVERFLOW: malformed,
  UND_ERR_INFO: malformed,
};

/** What an HTTP status from Inference becomes. */
type StatusRule =
  /** Inference refused the request itself: passed on with Inference's message and param. */
  | "pass_on"
  /** The model is not served. */
  | "model_not_found"
  /** Inference refused the gateway's own credentials: never the caller's fault. */
  | "credentials"
  | "unavailable"
  | "failed";

/** HTTP statuses (effective: the body's integer `code` for a 2xx with an error) → rule. */
const statusTable: Readonly<Record<number, StatusRule>> = {
  400: "pass_on",
  422: "pass_on",
  401: "credentials",
  403: "credentials",
  404: "model_not_found",
  429: "unavailable",
  503: "unavailable",
};

/**
 * Every failure of a call to Inference as the gateway's ApiError — the one mapping (connect-node
 * `node-error.ts` style): table lookups on stable codes and statuses, never message matching
 * where a code exists.
 *
 * - Transport: ECONNREFUSED / ENOTFOUND / connect timeout → 503 `upstream_unavailable`;
 *   ECONNRESET / UND_ERR_SOCKET → 503 before a response, 502 `upstream_error` after it began;
 *   headers/body timeout → 504 `deadline_exceeded`; abort → `canceled`; an ApiError passes
 *   through (the client aborts with ApiError reasons); anything else → 502.
 * - vLLM error bodies in every form — nested `{"error": {message, type, param, code}}`, flat
 *   `{"object": "error", …}`, `{"error": "Unauthorized"}` — also with status 200 (then the
 *   body's integer `code` is the status; 502 without one) and in-band on a stream:
 *   400/422 → 400 `invalid_request` with Inference's message and param; a prompt too long
 *   (param `input_tokens` or a message about the context length) → 400
 *   `context_length_exceeded`, param `prompt`; 404 with a vLLM error body → 404
 *   `model_not_found`, param `model` (a bare 404 is a wrong route: 502); 401/403 → 502
 *   `upstream_error` (the gateway's upstream credentials are wrong); 429 and 503 → 503
 *   `upstream_unavailable`; other statuses → 502; an unreadable body → 502.
 * - Message decoration: vLLM ends many messages with ` (parameter=p, value=v)`. It is cut off
 *   only when `p` is what the error's param ends up being (so the information stays in param, and
 *   the value is the caller's own); otherwise the message is kept as it is.
 * - Inference's integer `code` and class-name `type` never reach callers; 5xx messages are the
 *   gateway's own (Inference's internals stay in `cause`).
 * - A message passed on is clipped to {@link MAX_UPSTREAM_MESSAGE_CHARS} (1,024) and a param to
 *   200 characters (`clip`, the rule for echoed caller text too): vLLM's messages can echo a whole
 *   request field.
 */
export function mapUpstreamError(failure: UpstreamFailure): ApiError {
  switch (failure.kind) {
    case "transport":
      return mapTransport(failure.error, failure.responseStarted);
    case "response":
      return mapErrorBody(failure.status, parseJsonOrUndefined(failure.body), failure.body);
    case "event":
      return mapErrorBody(200, failure.body, failure.body);
  }
}

function mapTransport(error: unknown, responseStarted: boolean): ApiError {
  if (error instanceof ApiError) return error;
  const code = errorCode(error);
  const rule =
    (code === undefined ? undefined : transportTable[code]) ??
    (code?.startsWith("HPE_") ? malformed : undefined);
  if (rule === undefined) {
    return new ApiError("upstream_error", "The request to Inference failed.", { cause: error });
  }
  return new ApiError(responseStarted ? rule.after : rule.before, `${rule.message} (${code}).`, {
    cause: error,
  });
}

/** The first known code on the error, its `cause` chain, or an AggregateError's errors. */
function errorCode(error: unknown, depth = 0): string | undefined {
  if (typeof error !== "object" || error === null || depth > 4) return undefined;
  const own = (error as { code?: unknown }).code;
  if (typeof own === "string" && (own in transportTable || own.startsWith("HPE_"))) return own;
  if (error instanceof AggregateError) {
    for (const inner of error.errors) {
      const c = errorCode(inner, depth + 1);
      if (c !== undefined) return c;
    }
  }
  const fromCause = errorCode((error as { cause?: unknown }).cause, depth + 1);
  if (fromCause !== undefined) return fromCause;
  return typeof own === "string" ? own : undefined;
}

function parseJsonOrUndefined(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/**
 * True when a JSON body is an error, whatever its status: a top-level `error` key (any value),
 * or vLLM's flat form `{"object": "error", …}`.
 */
export function isVllmErrorBody(json: unknown): boolean {
  return isRecord(json) && ("error" in json || json.object === "error");
}

/**
 * The error of a vLLM error body in any of its forms, or null when `body` is not one:
 * nested `{"error": {message, type, param, code}}`, flat `{"object": "error", message, …}`,
 * or `{"error": "<message>"}`.
 */
export function parseVllmError(body: unknown): VllmErrorDetail | null {
  if (!isRecord(body)) return null;
  const inner = body.error;
  if (typeof inner === "string") return { message: inner, type: null, param: null, code: null };
  if (isRecord(inner)) return detailOf(inner);
  if (body.object === "error") return detailOf(body);
  return null;
}

function detailOf(o: Record<string, unknown>): VllmErrorDetail | null {
  if (typeof o.message !== "string") return null;
  return {
    message: o.message,
    type: typeof o.type === "string" ? o.type : null,
    param: typeof o.param === "string" && o.param !== "" ? o.param : null,
    code: typeof o.code === "number" && Number.isInteger(o.code) ? o.code : null,
  };
}

const decoration = / \(parameter=([A-Za-z0-9_.[\]-]+), value=[\s\S]*\)$/;

function mapErrorBody(httpStatus: number, json: unknown, raw: unknown): ApiError {
  const detail = parseVllmError(json);
  const status = httpStatus >= 400 ? httpStatus : effectiveStatus(detail);
  const rule = statusTable[status] ?? "failed";
  const cause = { status: httpStatus, body: raw };
  if (detail === null) {
    if (rule === "unavailable")
      return new ApiError("upstream_unavailable", `Inference is unavailable (HTTP ${status}).`, { cause });
    if (rule === "credentials") return credentials(status, cause);
    return new ApiError("upstream_error", `Inference answered HTTP ${status} with an unreadable error.`, {
      cause,
    });
  }
  switch (rule) {
    case "pass_on":
      return passOn(detail, cause);
    case "model_not_found":
      return new ApiError("model_not_found", upstreamMessage(detail.message), { param: "model", cause });
    case "credentials":
      return credentials(status, cause);
    case "unavailable":
      return new ApiError("upstream_unavailable", `Inference is unavailable (HTTP ${status}).`, { cause });
    case "failed":
      return new ApiError("upstream_error", `Inference failed (HTTP ${status}).`, { cause });
  }
}

/** A 2xx or in-band error: its integer `code` (vLLM puts the HTTP status there), else 500. */
function effectiveStatus(detail: VllmErrorDetail | null): number {
  const code = detail?.code;
  return code !== null && code !== undefined && code >= 400 && code <= 599 ? code : 500;
}

function credentials(status: number, cause: unknown): ApiError {
  return new ApiError("upstream_error", `Inference refused the gateway's credentials (HTTP ${status}).`, {
    cause,
  });
}

/** Inference's message as a caller sees it: at most MAX_UPSTREAM_MESSAGE_CHARS (then `…`). */
function upstreamMessage(message: string): string {
  return clip(message, MAX_UPSTREAM_MESSAGE_CHARS);
}

function passOn(detail: VllmErrorDetail, cause: unknown): ApiError {
  const decorated = decoration.exec(detail.message);
  const decoratedParam = decorated?.[1] ?? null;
  if (detail.param === "input_tokens" || /context length/i.test(detail.message)) {
    return new ApiError("context_length_exceeded", upstreamMessage(detail.message), {
      param: "prompt",
      cause,
    });
  }
  // vLLM names no param for a token id past the vocabulary in a stream's in-band error (its JSON
  // answer says `prompt`): the caller gets `prompt` either way (a keyed non-streamed request is
  // Inference's stream, collected).
  const param =
    detail.param ??
    decoratedParam ??
    (/^Token id -?\d+ is out of vocabulary/.test(detail.message) ? "prompt" : null);
  const message =
    decorated !== null && param !== null && param === decoratedParam
      ? detail.message.slice(0, decorated.index)
      : detail.message;
  return new ApiError("invalid_request", upstreamMessage(message), {
    param: param === null ? null : clip(param),
    cause,
  });
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * What a failed call tells about the Inference server that handled it — for the replica pool
 * (src/upstream/pool), which decides from it whether to take the replica out and whether a request
 * may go to another replica:
 * - `unreachable`: no connection could be made (refused, DNS, connect timeout);
 * - `broken`: the connection broke, or the server sent something that is not an answer (a stream
 *   cut before `[DONE]`, garbage, a malformed response);
 * - `unavailable`: the server answered 503 or 429;
 * - `rejected`: the server refused the gateway itself: its credentials (401/403) or the model
 *   name (404 `model_not_found`) — a replica set up unlike the models file says;
 * - `server_error`: the server answered with another 5xx error (or one in-band);
 * - `silent`: the server said nothing within the bound on the start of its answer
 *   ({@link upstreamSilence}, or undici's headers timeout);
 * - `none`: the request's own outcome (Inference refused the request, the caller went away, the
 *   deadline passed): nothing wrong with the server.
 * Works on the ApiErrors of {@link mapUpstreamError} and of the client (src/upstream/vllm); any
 * other thrown value is `broken`.
 */
export type UpstreamFault =
  | "unreachable"
  | "broken"
  | "unavailable"
  | "rejected"
  | "server_error"
  | "silent"
  | "none";

/** The cause of {@link upstreamSilence}'s error: how long Inference was silent. */
export class UpstreamSilenceError extends Error {
  readonly code = "ACS_UPSTREAM_SILENT";
  constructor(readonly silentMs: number) {
    super(`no response within ${silentMs} ms`);
    this.name = "UpstreamSilenceError";
  }
}

/**
 * The error of a call whose answer did not start within `silentMs` (no response, or no first SSE
 * event of a stream): 504 `deadline_exceeded`, the fault `silent` (the replica's, unlike a
 * deadline the caller set).
 */
export function upstreamSilence(silentMs: number): ApiError {
  return new ApiError("deadline_exceeded", `Inference sent nothing within ${silentMs} ms.`, {
    cause: new UpstreamSilenceError(silentMs),
  });
}

/** The {@link UpstreamFault} of an error thrown by a call to Inference. */
export function upstreamFaultOf(err: unknown): UpstreamFault {
  if (!(err instanceof ApiError)) return "broken";
  if (err.cause instanceof UpstreamSilenceError || errorCode(err.cause) === "UND_ERR_HEADERS_TIMEOUT")
    return "silent";
  switch (err.code) {
    case "canceled":
    case "deadline_exceeded":
    case "invalid_request":
    case "context_length_exceeded":
      return "none";
    case "model_not_found":
      return "rejected";
    default:
      break;
  }
  const cause = err.cause;
  // An answer of Inference's (mapErrorBody): its cause is the status and body.
  if (isRecord(cause) && !(cause instanceof Error) && typeof cause.status === "number") {
    if (err.code === "upstream_unavailable") return "unavailable";
    const status = cause.status;
    if (status === 401 || status === 403) return "rejected";
    return "server_error";
  }
  if (err.code === "upstream_unavailable" || err.code === "upstream_error") {
    const code = errorCode(cause);
    return code !== undefined && transportTable[code] === unreachable ? "unreachable" : "broken";
  }
  return "broken";
}
