// Who is calling: the key of an Authorization header, through a small cache of keys read
// lately, and whether that key may use a model.
import { hashApiKey, hashesEqual, isAdminKeyToken, maskApiKey, parseAuthorization } from "../api-key.js";
import type { KeyRecord } from "../budget-store.js";
import { findAdminKey } from "./admin-keys.js";
import type { KeyInfo } from "./api.js";
import {
  adminKeyOnApiRoute,
  expiredKey,
  incorrectKey,
  modelNotAllowed,
  noKey,
  revokedKey,
  storeUnavailable,
  wrongScheme,
} from "./errors.js";
import type { LedgerState } from "./state.js";

/** Keys kept by the authentication cache at most. */
const AUTH_CACHE_ENTRIES = 10_000;

/** `BudgetLedger.authenticate`, through the ledger's cache of keys read lately. */
export async function authenticate(l: LedgerState, authorization: string | undefined): Promise<KeyInfo> {
  const { now, authCache, authCacheTtlMs } = l;
  const parsed = parseAuthorization(authorization);
  if (parsed.kind === "missing") throw noKey();
  if (parsed.kind === "wrong_scheme") throw wrongScheme();
  if (isAdminKeyToken(parsed.token)) {
    // An admin key never serves completions: 403 for a live one (the caller holds a real key of
    // the wrong kind), 401 for anything else.
    const admin = await findAdminKey(l, parsed.token);
    if (admin !== undefined && admin.revokedAt === null) throw adminKeyOnApiRoute();
    throw incorrectKey(maskApiKey(parsed.token));
  }
  const t = now();
  let record: KeyRecord | undefined;
  // The cache is keyed by the key itself: a hit was matched by its hash when it was read from
  // the store, so a request with a cached key costs no hash (and no store read).
  const cached = authCache.get(parsed.token);
  if (cached !== undefined && t - cached.at < authCacheTtlMs) {
    record = cached.record;
    authCache.delete(parsed.token); // least recently used first
    authCache.set(parsed.token, cached);
  } else {
    if (cached !== undefined) authCache.delete(parsed.token);
    record = await readKey(l, parsed.token, t);
  }
  if (record === undefined) throw incorrectKey(maskApiKey(parsed.token));
  if (record.revokedAt !== null) throw revokedKey(record.hint);
  const expiresAt = record.expiresAt ?? null;
  if (expiresAt !== null && expiresAt <= t) throw expiredKey(record.hint, expiresAt);
  return {
    id: record.id,
    name: record.name,
    models: record.models,
    hint: record.hint,
    ...(expiresAt === null ? {} : { expiresAt }),
    ...(record.rateLimits == null ? {} : { rateLimits: record.rateLimits }),
  };
}

/** The key's record read from the store (matched by its hash), cached as read at `t`; undefined when unknown. */
export async function readKey(l: LedgerState, token: string, t: number): Promise<KeyRecord | undefined> {
  const { authCache, authCacheTtlMs, store } = l;
  const hash = hashApiKey(token);
  let record: KeyRecord | undefined;
  try {
    record = await store.findKeyByHash(hash);
  } catch (err) {
    throw storeUnavailable(err, "the API key could not be checked");
  }
  if (record !== undefined && !hashesEqual(record.keyHash, hash)) record = undefined;
  if (record !== undefined && authCacheTtlMs > 0) {
    authCache.set(token, { record, at: t });
    if (authCache.size > AUTH_CACHE_ENTRIES) {
      const oldest = authCache.keys().next().value;
      if (oldest !== undefined) authCache.delete(oldest);
    }
  }
  return record;
}

/** `BudgetLedger.checkModel`: throws model_not_allowed unless the key's allow-list names the model or an alias. */
export function checkModel(key: KeyInfo, modelId: string, aliases: readonly string[] = []): void {
  const allowed = key.models;
  if (allowed !== null && !allowed.includes(modelId) && !aliases.some((a) => allowed.includes(a))) {
    throw modelNotAllowed(modelId);
  }
}
