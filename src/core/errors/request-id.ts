import { randomFillSync } from "node:crypto";

/** Random bytes drawn 4 KiB at a time: one call into the CSPRNG per 256 ids, not one per id. */
const pool = Buffer.allocUnsafe(4096);
let poolAt = pool.length;

/**
 * 32 lowercase hex of 16 fresh random bytes (the CSPRNG's, as `randomBytes(16)` gives them), taken
 * from a pool refilled 4 KiB at a time: unique and unpredictable, at a fraction of a
 * `randomBytes` call each. Every byte is used once.
 */
export function randomHex32(): string {
  if (poolAt + 16 > pool.length) {
    randomFillSync(pool);
    poolAt = 0;
  }
  const hex = pool.toString("hex", poolAt, poolAt + 16);
  poolAt += 16;
  return hex;
}

/** A fresh request id: `req_` + 32 lowercase hex (proto/API.md §5), sent as X-Request-Id. */
export function newRequestId(): string {
  return `req_${randomHex32()}`;
}

/** True when `id` has the request-id form `req_` + 32 lowercase hex. */
export function isRequestId(id: string): boolean {
  return /^req_[0-9a-f]{32}$/.test(id);
}
