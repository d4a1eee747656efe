import { hostname } from "node:os";
import { ApiError, type RetryAdvice } from "../errors/index.js";
import {
  apiKeyHint,
  generateApiKey,
  generateHoldId,
  generateKeyId,
  hashApiKey,
  hashesEqual,
  maskApiKey,
  parseAuthorization,
} from "./api-key.js";
import type { BudgetStore, KeyRecord, KeyUsageRecord, SettleResult } from "./budget-store.js";
import { checkDemand, type HoldDemand } from "./plan-hold.js";
import { createSqliteBudgetStore } from "./sqlite-budget-store.js";

/**
 * The longest a request may run without renewing its Hold: the API's 14-minute wait for a
 * non-streamed answer plus one minute of margin, in milliseconds.
 */
export const DEFAULT_HOLD_TTL_MS = 15 * 60_000;

/**
 * Seconds a caller refused only because of Holds in flight is told to wait (`Retry-After`): the
 * ledger cannot know when they settle; one second lets a client try again soon, at no cost.
 */
export const HOLD_RETRY_AFTER_SECONDS = 1;

/**
 * Whether a request refused with `insufficient_quota` can succeed later: yes when the Budget less
 * what is spent would hold it once the Holds in flight settle; no when the Budget is spent.
 */
export function quotaRetry(outcome: {
  readonly budgetTokens: number;
  readonly spentTokens: number;
  readonly minimumTokens: number;
}): RetryAdvice {
  return outcome.budgetTokens - outcome.spentTokens >= outcome.minimumTokens
    ? { retry: true, afterSeconds: HOLD_RETRY_AFTER_SECONDS }
    : { retry: false };
}

/** How often the ledger reclaims stale Holds by default, in milliseconds. */
export const DEFAULT_RECLAIM_INTERVAL_MS = 60_000;

/** Options shared by both ways of opening a ledger. */
export interface BudgetLedgerCommonOptions {
  /**
   * Names the process in every Hold it places (for `reclaimOnStart("instance")` with several
   * replicas on a shared store). @default `${hostname}:${pid}:${random}`
   */
  readonly instanceId?: string;
  /** A Hold's lifetime after placeHold or renew, in ms. @default {@link DEFAULT_HOLD_TTL_MS} */
  readonly holdTtlMs?: number;
  /** The clock, in Unix epoch ms. @default Date.now */
  readonly now?: () => number;
  /**
   * Runs reclaimStale() every this many ms on an unref'd timer; 0 turns the timer off.
   * @default {@link DEFAULT_RECLAIM_INTERVAL_MS}
   */
  readonly reclaimIntervalMs?: number;
  /** Called with each error of the reclaim timer. @default process.emitWarning */
  readonly onReclaimError?: (err: unknown) => void;
}

/** Options of {@link createBudgetLedger}: a SQLite file path, or a store of your own. */
export type BudgetLedgerOptions = BudgetLedgerCommonOptions &
  (
    | {
        /** Path of the SQLite file (created when missing). */
        readonly path: string;
        /** busy_timeout of the SQLite store, in ms. @default 5000 */
        readonly busyTimeoutMs?: number;
        /** SQLite `synchronous` of the store. @default "full" */
        readonly synchronous?: "full" | "normal";
      }
    | { readonly store: BudgetStore }
  );

/** An authenticated key, as the service passes it back to checkModel and placeHold. */
export interface KeyInfo {
  /** Public id, `key_` + 12 hex. */
  readonly id: string;
  readonly name: string;
  /** Allowed model ids, or null for every model. */
  readonly models: readonly string[] | null;
}

/** A placed Hold: the id to renew and settle, and the max_tokens the request may use. */
export interface PlacedHold {
  readonly holdId: string;
  /** max_tokens for the request: as asked, or lower when clamped. */
  readonly maxTokens: number;
  /** True when maxTokens is lower than asked (send `X-Acs-Max-Tokens-Clamped: <maxTokens>`). */
  readonly clamped: boolean;
  /** Tokens held: promptTokens + prompts × n × maxTokens. */
  readonly heldTokens: number;
}

/** A new key: shown once in clear, never stored. */
export interface CreatedKey {
  readonly id: string;
  /** `acs-` + 43 base64url characters. */
  readonly key: string;
}

/** A key as admins see it (no hash, no key). Times are Unix epoch ms. */
export interface KeySummary {
  readonly id: string;
  readonly name: string;
  /** `acs-…` + the key's last 4 characters. */
  readonly hint: string;
  readonly budgetTokens: number;
  readonly spentTokens: number;
  readonly models: readonly string[] | null;
  readonly createdAt: number;
  readonly revokedAt: number | null;
}

/** A key's Budget right now, in tokens. */
export interface KeyUsage extends KeySummary {
  /** Σ of the open Holds (requests in flight). */
  readonly heldTokens: number;
  /** budget − spent − held: what the next request can hold. */
  readonly availableTokens: number;
  readonly openHolds: number;
  readonly settledHolds: number;
  readonly reclaimedHolds: number;
}

/**
 * The ledger of keys, Budgets and Holds (API.md §9) that the service calls. Every refusal meant
 * for a caller is an ApiError; misuse by the calling code (a negative token count, an unknown
 * Hold id) is a RangeError or an {@link UnknownIdError}.
 */
export interface BudgetLedger {
  /** The instance id written into this ledger's Holds. */
  readonly instanceId: string;
  /**
   * The key of an `Authorization` header value (`Bearer <key>`, scheme case-insensitive). Throws
   * ApiError `invalid_api_key` (401, param null) for a missing header, another scheme, an unknown
   * key or a revoked key.
   */
  authenticate(authorization: string | undefined): KeyInfo;
  /**
   * Throws ApiError `model_not_allowed` (403, param `model`) when the key has an allow-list that
   * names neither modelId nor any of its aliases (so a key made with `--models llama-8b` serves a
   * request for the alias and for the served id it resolves to).
   */
  checkModel(key: KeyInfo, modelId: string, aliases?: readonly string[]): void;
  /**
   * Holds promptTokens + prompts × n × maxTokens of the key's Budget, in one transaction, lowering
   * maxTokens to what the Budget can hold when it cannot hold it all. Throws ApiError
   * `insufficient_quota` (429) when not one generated token per choice fits, `invalid_api_key` when
   * the key was revoked meanwhile, RangeError for numbers out of range.
   */
  placeHold(key: KeyInfo, demand: HoldDemand): PlacedHold;
  /**
   * Keeps an open Hold alive for ttlMs more (default: the ledger's holdTtlMs). Returns false when
   * the Hold is no longer open (settled, or reclaimed as stale).
   */
  renew(holdId: string, ttlMs?: number): boolean;
  /**
   * Ends a Hold: charges the tokens actually used, at most the tokens held, and gives the rest
   * back to the Budget. Exactly once: a repeated settle charges nothing (`already_settled`). A
   * Hold already reclaimed as stale is charged what the Budget still has free. Throws
   * UnknownIdError for an unknown Hold id, RangeError for a usedTokens that is not an integer ≥ 0.
   */
  settle(holdId: string, usedTokens: number): SettleResult;
  /** Releases every open Hold past its expiry, charging nothing; returns how many. */
  reclaimStale(): number;
  /**
   * Releases open Holds left by a previous run, charging nothing; returns how many. `all`
   * (default) releases every open Hold in the store — right for the embedded SQLite store, which
   * serves one gateway process. `instance` releases only this instanceId's Holds (replicas on a
   * shared store, each with a stable instanceId).
   */
  reclaimOnStart(scope?: "all" | "instance"): number;
  /** Stops the reclaim timer and closes the store. Idempotent. */
  close(): void;

  /** Creates a key with a Budget of budgetTokens (integer ≥ 0) and an optional model allow-list. */
  createKey(input: { name?: string; budgetTokens: number; models?: readonly string[] }): CreatedKey;
  /** Every key, oldest first. */
  listKeys(): KeySummary[];
  /** Adds tokens (integer ≥ 1) to a key's Budget and returns its usage. Throws UnknownIdError. */
  grant(id: string, tokens: number): KeyUsage;
  /** Revokes a key (from now on every request with it gets 401). Throws UnknownIdError. */
  revoke(id: string): KeySummary;
  /** A key's Budget, spent, held and available tokens. Throws UnknownIdError. */
  usage(id: string): KeyUsage;
}

/** Thrown for an id (key or Hold) the store does not know; `kind` says which. */
export class UnknownIdError extends Error {
  override readonly name = "UnknownIdError";
  constructor(
    readonly kind: "key" | "hold",
    readonly id: string,
  ) {
    super(`No ${kind} with id '${id}'.`);
  }
}

const NO_KEY_MESSAGE =
  "You didn't provide an API key. You need to provide your API key in an Authorization header using " +
  "Bearer auth (i.e. Authorization: Bearer YOUR_KEY).";
const WRONG_SCHEME_MESSAGE =
  "Unsupported authorization scheme. You need to provide your API key in an Authorization header using " +
  "Bearer auth (i.e. Authorization: Bearer YOUR_KEY).";

/**
 * Opens the ledger on a SQLite file (`path`, created and migrated on open) or on a given store,
 * and starts the reclaim timer (unref'd; it never keeps the process alive). Does not reclaim on
 * its own: the gateway calls reclaimOnStart() once at start-up.
 */
export function createBudgetLedger(options: BudgetLedgerOptions): BudgetLedger {
  const store =
    "store" in options
      ? options.store
      : createSqliteBudgetStore({
          path: options.path,
          ...(options.busyTimeoutMs === undefined ? {} : { busyTimeoutMs: options.busyTimeoutMs }),
          ...(options.synchronous === undefined ? {} : { synchronous: options.synchronous }),
        });
  const now = options.now ?? Date.now;
  const holdTtlMs = options.holdTtlMs ?? DEFAULT_HOLD_TTL_MS;
  const instanceId = options.instanceId ?? `${hostname()}:${process.pid}:${generateKeyId().slice(4)}`;
  checkInt("holdTtlMs", holdTtlMs, 1);
  let closed = false;

  const reclaimIntervalMs = options.reclaimIntervalMs ?? DEFAULT_RECLAIM_INTERVAL_MS;
  const onReclaimError =
    options.onReclaimError ??
    ((err: unknown) => process.emitWarning(`Budget ledger: reclaiming stale Holds failed: ${String(err)}`));
  const timer =
    reclaimIntervalMs > 0
      ? setInterval(() => {
          try {
            store.reclaimExpired(now());
          } catch (err) {
            onReclaimError(err);
          }
        }, reclaimIntervalMs)
      : undefined;
  timer?.unref();

  const mustKnowKey = (id: string): KeyUsage => {
    const usage = store.keyUsage(id);
    if (usage === undefined) throw new UnknownIdError("key", id);
    return toUsage(usage);
  };

  return {
    instanceId,

    authenticate(authorization) {
      const parsed = parseAuthorization(authorization);
      if (parsed.kind === "missing") throw new ApiError("invalid_api_key", NO_KEY_MESSAGE);
      if (parsed.kind === "wrong_scheme") throw new ApiError("invalid_api_key", WRONG_SCHEME_MESSAGE);
      const hash = hashApiKey(parsed.token);
      const record = store.findKeyByHash(hash);
      if (record === undefined || !hashesEqual(record.keyHash, hash)) {
        const masked = maskApiKey(parsed.token);
        throw new ApiError(
          "invalid_api_key",
          `Incorrect API key provided${masked === null ? "" : `: ${masked}`}. Check the key, or ask the API's operator for one.`,
        );
      }
      if (record.revokedAt !== null) {
        throw new ApiError(
          "invalid_api_key",
          `The API key provided (${record.hint}) has been revoked. Ask the API's operator for a new key.`,
        );
      }
      return { id: record.id, name: record.name, models: record.models };
    },

    checkModel(key, modelId, aliases = []) {
      const allowed = key.models;
      if (allowed !== null && !allowed.includes(modelId) && !aliases.some((a) => allowed.includes(a))) {
        throw new ApiError(
          "model_not_allowed",
          `The API key provided is not allowed to use the model '${modelId}'.`,
          {
            param: "model",
          },
        );
      }
    },

    placeHold(key, demand) {
      checkDemand(demand);
      const t = now();
      const holdId = generateHoldId();
      const outcome = store.placeHold({
        holdId,
        keyId: key.id,
        demand,
        instanceId,
        now: t,
        expiresAt: t + holdTtlMs,
      });
      switch (outcome.kind) {
        case "held":
          return {
            holdId,
            maxTokens: outcome.maxTokens,
            clamped: outcome.clamped,
            heldTokens: outcome.tokens,
          };
        case "insufficient": {
          const available = outcome.budgetTokens - outcome.spentTokens - outcome.heldTokens;
          throw new ApiError(
            "insufficient_quota",
            `You exceeded your current quota: this request needs at least ${outcome.minimumTokens} tokens ` +
              `(${demand.promptTokens} prompt tokens + ${demand.prompts * demand.n} × 1 generated token` +
              `${demand.captureReplay === true ? ` + ${demand.n * demand.promptTokens} tokens of the capture's replay` : ""}), ` +
              `and the key's Budget has ${Math.max(0, available)} of ${outcome.budgetTokens} tokens left ` +
              `(${outcome.spentTokens} spent, ${outcome.heldTokens} held by requests in flight).`,
            { retry: quotaRetry(outcome) },
          );
        }
        case "revoked":
          throw new ApiError("invalid_api_key", "The API key provided has been revoked.");
        case "unknown_key":
          throw new ApiError("invalid_api_key", "Incorrect API key provided.");
      }
    },

    renew(holdId, ttlMs) {
      const ttl = ttlMs ?? holdTtlMs;
      checkInt("ttlMs", ttl, 1);
      return store.renewHold(holdId, now() + ttl);
    },

    settle(holdId, usedTokens) {
      checkInt("usedTokens", usedTokens, 0);
      const result = store.settleHold(holdId, usedTokens, now());
      if (result === undefined) throw new UnknownIdError("hold", holdId);
      return result;
    },

    reclaimStale() {
      return store.reclaimExpired(now());
    },

    reclaimOnStart(scope = "all") {
      return store.reclaimOpen(now(), scope === "instance" ? instanceId : undefined);
    },

    close() {
      if (closed) return;
      closed = true;
      if (timer !== undefined) clearInterval(timer);
      store.close();
    },

    createKey(input) {
      checkInt("budgetTokens", input.budgetTokens, 0);
      const models = input.models === undefined ? null : [...new Set(input.models)];
      if (models?.some((m) => m === "")) throw new RangeError("models: a model id must not be empty");
      const key = generateApiKey();
      const id = generateKeyId();
      store.insertKey({
        id,
        keyHash: hashApiKey(key),
        hint: apiKeyHint(key),
        name: input.name ?? "",
        budgetTokens: input.budgetTokens,
        spentTokens: 0,
        models,
        createdAt: now(),
        revokedAt: null,
      });
      return { id, key };
    },

    listKeys() {
      return store.listKeys().map(toSummary);
    },

    grant(id, tokens) {
      checkInt("tokens", tokens, 1);
      if (!store.addBudget(id, tokens)) throw new UnknownIdError("key", id);
      return mustKnowKey(id);
    },

    revoke(id) {
      if (!store.revokeKey(id, now())) throw new UnknownIdError("key", id);
      return mustKnowKey(id);
    },

    usage(id) {
      return mustKnowKey(id);
    },
  };
}

function toSummary(record: KeyRecord): KeySummary {
  return {
    id: record.id,
    name: record.name,
    hint: record.hint,
    budgetTokens: record.budgetTokens,
    spentTokens: record.spentTokens,
    models: record.models,
    createdAt: record.createdAt,
    revokedAt: record.revokedAt,
  };
}

function toUsage(record: KeyUsageRecord): KeyUsage {
  return {
    ...toSummary(record),
    heldTokens: record.heldTokens,
    availableTokens: record.budgetTokens - record.spentTokens - record.heldTokens,
    openHolds: record.openHolds,
    settledHolds: record.settledHolds,
    reclaimedHolds: record.reclaimedHolds,
  };
}

function checkInt(name: string, value: number, min: number): void {
  if (!Number.isSafeInteger(value) || value < min) {
    throw new RangeError(`${name} must be an integer ≥ ${min}, got ${value}`);
  }
}
