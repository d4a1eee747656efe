import { createHash, randomBytes, timingSafeEqual } from "node:crypto";

/** Every key starts with this prefix; the rest is 43 characters of base64url (32 random bytes). */
export const API_KEY_PREFIX = "acs-";

const KEY_SHAPE = /^acs-[A-Za-z0-9_-]{43,}$/;

/** A fresh key: `acs-` + 43 base64url characters (256 bits of randomness). Shown once, never stored. */
export function generateApiKey(): string {
  return `${API_KEY_PREFIX}${randomBytes(32).toString("base64url")}`;
}

/** A fresh public key id: `key_` + 12 lowercase hex (48 random bits). Safe to log and show. */
export function generateKeyId(): string {
  return `key_${randomBytes(6).toString("hex")}`;
}

/** Random bytes drawn 12 at a time by {@link generateHoldId}: one `randomBytes` per 256 Hold ids. */
const HOLD_ID_BYTES = 12;
let holdIdPool: Buffer = Buffer.alloc(0);
let holdIdPoolAt = 0;

/**
 * A fresh Hold id: `hold_` + 24 lowercase hex (96 random bits), from a pool of cryptographically
 * random bytes refilled every 256 ids (as node's `crypto.randomUUID` does), not a `randomBytes`
 * call per id.
 */
export function generateHoldId(): string {
  if (holdIdPoolAt + HOLD_ID_BYTES > holdIdPool.length) {
    holdIdPool = randomBytes(HOLD_ID_BYTES * 256);
    holdIdPoolAt = 0;
  }
  const hex = holdIdPool.toString("hex", holdIdPoolAt, holdIdPoolAt + HOLD_ID_BYTES);
  holdIdPoolAt += HOLD_ID_BYTES;
  return `hold_${hex}`;
}

/**
 * SHA-256 of the key's UTF-8 bytes (32 bytes). A plain hash is enough: keys are 256-bit random
 * strings, so there is nothing for a slow password hash to protect against guessing.
 */
export function hashApiKey(key: string): Buffer {
  return createHash("sha256").update(key, "utf8").digest();
}

/** Constant-time comparison of two key hashes (false when the lengths differ). */
export function hashesEqual(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && timingSafeEqual(a, b);
}

/** True when `key` has the shape of a key this API issues (prefix and base64url body). */
export function looksLikeApiKey(key: string): boolean {
  return KEY_SHAPE.test(key);
}

/**
 * A display hint that identifies a key without revealing it: `acs-…` + its last 4 characters
 * (24 of its 256 bits), as OpenAI's dashboards show keys.
 */
export function apiKeyHint(key: string): string {
  return `${API_KEY_PREFIX}…${key.slice(-4)}`;
}

/** What an `Authorization` header value holds, for {@link parseAuthorization}. */
export type ParsedAuthorization =
  | { readonly kind: "missing" }
  | { readonly kind: "wrong_scheme" }
  | { readonly kind: "bearer"; readonly token: string };

/**
 * Splits an `Authorization` header value (RFC 7235: `scheme 1*SP credentials`). The scheme is
 * compared case-insensitively; surrounding whitespace is ignored. A missing or blank header, or a
 * `Bearer` scheme with no token, is `missing`; any other scheme is `wrong_scheme`.
 */
export function parseAuthorization(header: string | undefined): ParsedAuthorization {
  const value = header?.trim() ?? "";
  if (value === "") return { kind: "missing" };
  const match = /^([^\s]+)(?:[ \t]+(.*))?$/s.exec(value);
  const scheme = match?.[1] ?? "";
  if (scheme.toLowerCase() !== "bearer") return { kind: "wrong_scheme" };
  const token = (match?.[2] ?? "").trim();
  if (token === "") return { kind: "missing" };
  return { kind: "bearer", token };
}

/**
 * The key as OpenAI echoes it in "Incorrect API key provided: acs-abc***wxyz": the first 7 and
 * last 4 characters, only when the value has a key's character set and is long enough that the
 * mask hides most of it; otherwise null (nothing of the value is echoed).
 */
export function maskApiKey(token: string): string | null {
  if (token.length < 20 || !/^[A-Za-z0-9_-]+$/.test(token)) return null;
  return `${token.slice(0, 7)}***${token.slice(-4)}`;
}

/** Every admin key starts with this prefix; an API key never does (and an admin key is never an API key). */
export const ADMIN_KEY_PREFIX = "acs-admin-";

/** A fresh admin key: `acs-admin-` + 43 base64url characters (256 bits). Shown once, never stored. */
export function generateAdminKey(): string {
  return `${ADMIN_KEY_PREFIX}${randomBytes(32).toString("base64url")}`;
}

/** A fresh public admin key id: `adm_` + 12 lowercase hex (48 random bits). */
export function generateAdminKeyId(): string {
  return `adm_${randomBytes(6).toString("hex")}`;
}

/** A fresh audit log entry id: `audit_` + 16 lowercase hex (64 random bits). */
export function generateAuditId(): string {
  return `audit_${randomBytes(8).toString("hex")}`;
}

/** True when the token has an admin key's prefix (so it is never looked up as an API key). */
export function isAdminKeyToken(token: string): boolean {
  return token.startsWith(ADMIN_KEY_PREFIX);
}

/** `acs-admin-…` + the admin key's last 4 characters, for listings. */
export function adminKeyHint(key: string): string {
  return `${ADMIN_KEY_PREFIX}…${key.slice(-4)}`;
}
