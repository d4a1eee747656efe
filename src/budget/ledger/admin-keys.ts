// Admin keys (the admin API's callers; the first one comes from the keys CLI): create, authenticate,
// revoke; and the audit log's pages. An admin key is never an API key and the reverse: each is
// refused on the other's routes (403 permission_denied for a live key of the wrong kind).

import type { AdminKeyRecord, AuditEntry, Page } from "../admin-store.js";
import {
  adminKeyHint,
  generateAdminKey,
  generateAdminKeyId,
  hashApiKey,
  hashesEqual,
  isAdminKeyToken,
  maskApiKey,
  parseAuthorization,
} from "../api-key.js";
import { KeySettingError } from "../key-settings.js";
import type { AdminKeyInfo, CreatedAdminKey } from "./api.js";
import {
  apiKeyOnAdminRoute,
  incorrectAdminKey,
  noKey,
  storeUnavailable,
  UnknownIdError,
  wrongScheme,
} from "./errors.js";
import { CLI_ACTOR, checkLimit, stamp } from "./key-admin.js";
import type { LedgerState } from "./state.js";

/** The admin key of a token (matched by its hash), revoked or not; undefined when unknown. */
export async function findAdminKey(l: LedgerState, token: string): Promise<AdminKeyRecord | undefined> {
  const hash = hashApiKey(token);
  let record: AdminKeyRecord | undefined;
  try {
    record = await l.store.findAdminKeyByHash(hash);
  } catch (err) {
    throw storeUnavailable(err, "the admin key could not be checked");
  }
  return record !== undefined && hashesEqual(record.keyHash, hash) ? record : undefined;
}

const info = (r: AdminKeyRecord): AdminKeyInfo => ({
  id: r.id,
  name: r.name,
  hint: r.hint,
  createdAt: r.createdAt,
  revokedAt: r.revokedAt,
});

/** `BudgetLedger.createAdminKey`: a new admin key (shown once) and its audit row. */
export async function createAdminKey(
  l: LedgerState,
  input: { name?: string },
  actor = CLI_ACTOR,
): Promise<CreatedAdminKey> {
  const key = generateAdminKey();
  const record: AdminKeyRecord = {
    id: generateAdminKeyId(),
    keyHash: hashApiKey(key),
    hint: adminKeyHint(key),
    name: input.name ?? "",
    createdAt: l.now(),
    revokedAt: null,
  };
  await l.store.createAdminKey(record, stamp(l, actor, "admin_key.created"));
  return { ...info(record), key };
}

/**
 * `BudgetLedger.authenticateAdmin`: the admin key of an Authorization header. Not cached: a revoked
 * admin key is refused at once on every replica. 401 `invalid_api_key` for no key, another scheme,
 * an unknown or revoked admin key; 403 `permission_denied` for a live API key.
 */
export async function authenticateAdmin(
  l: LedgerState,
  authorization: string | undefined,
): Promise<AdminKeyInfo> {
  const parsed = parseAuthorization(authorization);
  if (parsed.kind === "missing") throw noKey();
  if (parsed.kind === "wrong_scheme") throw wrongScheme();
  const { token } = parsed;
  if (!isAdminKeyToken(token)) {
    let apiKey: Awaited<ReturnType<LedgerState["store"]["findKeyByHash"]>>;
    try {
      apiKey = await l.store.findKeyByHash(hashApiKey(token));
    } catch (err) {
      throw storeUnavailable(err, "the admin key could not be checked");
    }
    if (apiKey !== undefined && apiKey.revokedAt === null) throw apiKeyOnAdminRoute();
    throw incorrectAdminKey(maskApiKey(token), false);
  }
  const record = await findAdminKey(l, token);
  if (record === undefined) throw incorrectAdminKey(maskApiKey(token), false);
  if (record.revokedAt !== null) throw incorrectAdminKey(record.hint, true);
  return info(record);
}

/** `BudgetLedger.revokeAdminKey` (audited); UnknownIdError for an unknown admin key. */
export async function revokeAdminKey(l: LedgerState, id: string, actor = CLI_ACTOR): Promise<AdminKeyInfo> {
  const after = await l.store.revokeAdminKey(id, stamp(l, actor, "admin_key.revoked"));
  if (after === undefined) throw new UnknownIdError("admin key", id);
  return info(after);
}

/** `BudgetLedger.listAuditLogs`: newest first; KeySettingError (param `after`) for an unknown cursor. */
export async function listAuditLogs(
  l: LedgerState,
  page: { after?: string; limit: number },
): Promise<Page<AuditEntry>> {
  checkLimit(page.limit);
  const found = await l.store.listAuditPage(page);
  if (found === undefined) {
    throw new KeySettingError(
      "after",
      `Invalid value for 'after': no audit log entry with id '${page.after}'.`,
    );
  }
  return found;
}
