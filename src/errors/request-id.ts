import { randomBytes } from "node:crypto";

/** A fresh request id: `req_` + 32 lowercase hex (proto/API.md §5), sent as X-Request-Id. */
export function newRequestId(): string {
  return `req_${randomBytes(16).toString("hex")}`;
}

/** True when `id` has the request-id form `req_` + 32 lowercase hex. */
export function isRequestId(id: string): boolean {
  return /^req_[0-9a-f]{32}$/.test(id);
}
