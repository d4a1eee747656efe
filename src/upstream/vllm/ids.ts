// Every id src/upstream makes, one maker per kind (their formats are relied on by tests and logs):
//  - a control call's own upstream request id (no caller request behind it): 32 lowercase hex;
//  - a failover attempt's upstream request id: the caller's id, then `<id>-retry`;
//  - the completion id callers see: `cmpl-` + 32 lowercase hex.
// Not made here: the gateway's request id `req_<32 hex>` (src/core/errors `newRequestId`); a request's
// successive upstream ids `<req>`, `<req>-2`… (src/service); the `-2`, `-3`… that keeps an id unique
// among live upstream requests (src/telemetry `claimUpstreamRequestId`, applied by the client).
import { randomHex32 } from "../../core/errors/index.js";

/** A fresh upstream request id: 32 lowercase hex (vLLM answers with id `cmpl-<it>`). */
export function newUpstreamRequestId(): string {
  return randomHex32();
}

/** The upstream request id of an attempt: the caller's, then `<id>-retry` for the failover. */
export function attemptRequestId(id: string, attempt: number): string {
  return attempt === 0 ? id : `${id}-retry`;
}

/** A fresh completion id: `cmpl-` + 32 lowercase hex, made by the gateway (Inference's id stays inside). */
export function newCompletionId(): string {
  return `cmpl-${randomHex32()}`;
}
