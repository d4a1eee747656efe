// What a BudgetStore keeps for the admin surface: the keys' admin settings read and changed one
// transaction each, admin keys, and the append-only audit log (every change writes its audit row
// in the transaction of the change). Times are Unix epoch ms.
import type { KeyRecord } from "./key-record.js";
import type { KeySettingError } from "./key-settings.js";

/** An admin key as a store keeps it (the secret only as its SHA-256). */
export interface AdminKeyRecord {
  /** `adm_` + 12 hex. */
  readonly id: string;
  readonly keyHash: Uint8Array;
  /** `acs-admin-…` + the key's last 4 characters. */
  readonly hint: string;
  readonly name: string;
  readonly createdAt: number;
  readonly revokedAt: number | null;
}

/** Who did what, when: the stamp of one audit row (its before and after are the store's to write). */
export interface AuditStamp {
  /** `audit_` + 16 hex. */
  readonly id: string;
  readonly at: number;
  /** The admin key id (`adm_…`), or `cli`. */
  readonly actor: string;
  /** e.g. `api_key.created`, `api_key.updated`, `api_key.rotated`, `api_key.revoked`, `admin_key.created`. */
  readonly action: string;
}

/** One audit row: the stamp, the target's id, and the target as JSON before and after (null: none). */
export interface AuditEntry extends AuditStamp {
  readonly targetId: string;
  readonly before: Readonly<Record<string, unknown>> | null;
  readonly after: Readonly<Record<string, unknown>> | null;
}

/** What a key change may set (the rest of the key row is kept). */
export type KeyPatch = Partial<
  Pick<
    KeyRecord,
    | "name"
    | "budgetTokens"
    | "models"
    | "rateLimits"
    | "expiresAt"
    | "metadata"
    | "keyHash"
    | "hint"
    | "revokedAt"
  >
>;

/** A key as a change sees it, locked: its record and the tokens its Holds and leases take. */
export interface LockedKey extends KeyRecord {
  readonly heldTokens: number;
  readonly leasedTokens: number;
}

/** The input of {@link AdminStore.changeKey}. */
export interface KeyChangeInput {
  readonly keyId: string;
  readonly audit: AuditStamp;
  /** The patch, decided from the locked key; or the setting error that refuses the change (nothing written). */
  readonly plan: (key: LockedKey) => KeyPatch | KeySettingError;
}

/** The outcome of {@link AdminStore.changeKey}. */
export type KeyChangeOutcome =
  | { readonly kind: "changed"; readonly before: KeyRecord; readonly after: KeyRecord }
  | { readonly kind: "refused"; readonly error: KeySettingError }
  | { readonly kind: "unknown_key" };

/** One page of a list: after the item of id `after` (left out: from the start), at most `limit`. */
export interface PageRequest {
  readonly after?: string;
  readonly limit: number;
}

/** A page of items, and whether more follow. */
export interface Page<T> {
  readonly items: readonly T[];
  readonly hasMore: boolean;
}

/**
 * The admin part of a BudgetStore. Lists are newest first (keys by creation time then id, audit
 * rows by the order they were written); a page request whose `after` is an unknown id answers
 * undefined.
 */
export interface AdminStore {
  /** The key of that id, or undefined. */
  getKey(keyId: string): Promise<KeyRecord | undefined>;
  listKeysPage(page: PageRequest): Promise<Page<KeyRecord> | undefined>;
  /** Inserts the key and its `api_key.created` audit row, in one transaction. */
  createKeyAudited(record: KeyRecord, audit: AuditStamp): Promise<void>;
  /**
   * In one transaction: locks the key, plans the patch, writes it with its audit row (before and
   * after), and, when the patch revokes the key, flags its leases to drain.
   */
  changeKey(input: KeyChangeInput): Promise<KeyChangeOutcome>;
  /** Inserts the admin key and its `admin_key.created` audit row, in one transaction. */
  createAdminKey(record: AdminKeyRecord, audit: AuditStamp): Promise<void>;
  findAdminKeyByHash(keyHash: Uint8Array): Promise<AdminKeyRecord | undefined>;
  /** Revokes the admin key (a second revoke keeps the first time) with its audit row; undefined for an unknown id. */
  revokeAdminKey(adminKeyId: string, audit: AuditStamp): Promise<AdminKeyRecord | undefined>;
  listAuditPage(page: PageRequest): Promise<Page<AuditEntry> | undefined>;
}
