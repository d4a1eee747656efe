// What a failed call says about the replica that handled it, for each kind of failure the
// Inference client raises (the errors come from mapUpstreamError, the one mapping).
import { describe, expect, it } from "vitest";
import { ApiError } from "../../src/core/errors/index.js";
import {
  mapUpstreamError,
  type UpstreamFault,
  upstreamFaultOf,
  upstreamSilence,
} from "../../src/upstream/index.js";

const transport = (code: string, responseStarted = false) =>
  mapUpstreamError({ kind: "transport", error: Object.assign(new Error(code), { code }), responseStarted });
const response = (status: number, error: unknown) =>
  mapUpstreamError({ kind: "response", status, body: JSON.stringify({ error }) });
const vllmError = (code: number, message = "m") => ({ message, type: "X", param: null, code });

describe("upstreamFaultOf", () => {
  it.each<[string, unknown, UpstreamFault]>([
    ["connection refused", transport("ECONNREFUSED"), "unreachable"],
    ["connect timeout", transport("UND_ERR_CONNECT_TIMEOUT"), "unreachable"],
    ["DNS", transport("ENOTFOUND"), "unreachable"],
    ["reset before the response", transport("ECONNRESET"), "broken"],
    ["socket closed after the response began", transport("UND_ERR_SOCKET", true), "broken"],
    [
      "a stream cut before [DONE]",
      new ApiError("upstream_error", "Inference's stream ended without [DONE]."),
      "broken",
    ],
    ["not an ApiError", new TypeError("x"), "broken"],
    ["HTTP 503", response(503, vllmError(503)), "unavailable"],
    ["HTTP 429", response(429, vllmError(429)), "unavailable"],
    [
      "HTTP 401",
      mapUpstreamError({ kind: "response", status: 401, body: '{"error": "Unauthorized"}' }),
      "rejected",
    ],
    ["HTTP 404 model", response(404, vllmError(404, "The model `x` does not exist.")), "rejected"],
    ["HTTP 500", response(500, vllmError(500)), "server_error"],
    ["in-band 500", mapUpstreamError({ kind: "event", body: { error: vllmError(500) } }), "server_error"],
    ["HTTP 400", response(400, vllmError(400)), "none"],
    ["context length", response(400, { ...vllmError(400), param: "input_tokens" }), "none"],
    ["canceled", new ApiError("canceled", "The request was canceled."), "none"],
    ["deadline", new ApiError("deadline_exceeded", "Inference did not answer within 10 ms."), "none"],
    ["no response headers in time", transport("UND_ERR_HEADERS_TIMEOUT"), "silent"],
    ["no first event in time", upstreamSilence(3000), "silent"],
  ])("%s → %s", (_, err, fault) => {
    expect(upstreamFaultOf(err)).toBe(fault);
  });
});
