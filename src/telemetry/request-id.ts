import { newRequestId } from "../core/errors/index.js";

/** Longest `X-Request-Id` a caller may send and have kept, in characters. */
export const MAX_REQUEST_ID_LENGTH = 128;

/**
 * The characters of a request id the gateway keeps: letters, digits, `_ . : -` (UUIDs, ULIDs,
 * hex ids, `req_…` ids, dotted or colon-separated ids), 1 to {@link MAX_REQUEST_ID_LENGTH} of them.
 */
const requestIdForm = /^[A-Za-z0-9_.:-]{1,128}$/;

/** True when `id` is a request id the gateway keeps or makes (see {@link requestIdForm}). */
export function isAcceptedRequestId(id: unknown): id is string {
  return typeof id === "string" && requestIdForm.test(id);
}

/**
 * The request id of an incoming request: its `X-Request-Id` header when it is one value of the
 * accepted form (1–128 characters of `A–Z a–z 0–9 _ . : -`), else a fresh `req_` + 32 lowercase
 * hex. A header sent twice, empty, too long or with other characters is replaced, never echoed.
 */
export function requestIdFrom(header: string | string[] | undefined): string {
  return isAcceptedRequestId(header) ? header : newRequestId();
}
