// Per-key admission: how many requests one key may have in flight at once, so that no single
// caller can take the gateway or a model's upstream capacity from the others (src/OPERATIONS.md,
// "No single caller can pin the gateway": ACS_MAX_REQUESTS_PER_KEY, ACS_MAX_STREAMS_PER_KEY,
// ACS_MAX_UPSTREAM_SHARE_PER_KEY).
import { ApiError } from "../core/errors/index.js";

/** Seconds a caller refused for a cap is told to wait (`Retry-After`): one of its requests may end by then. */
export const ADMISSION_RETRY_AFTER_SECONDS = 1;

/** The caps of {@link createAdmission}. A count of 0 means no cap. */
export interface AdmissionLimits {
  /** Concurrent requests of one key, streamed or not; 0 = no cap (ACS_MAX_REQUESTS_PER_KEY). */
  readonly maxRequestsPerKey: number;
  /** Concurrent streams of one key; 0 = no cap (ACS_MAX_STREAMS_PER_KEY). */
  readonly maxStreamsPerKey: number;
  /**
   * The share of a model's upstream capacity (Σ over its replicas of `max_concurrent_requests`) one
   * key may hold: a fraction in (0, 1]; the cap is ⌊share × capacity⌋ requests, at least 1
   * (ACS_MAX_UPSTREAM_SHARE_PER_KEY).
   */
  readonly maxUpstreamSharePerKey: number;
}

/**
 * The caps a configuration sets (ACS_MAX_REQUESTS_PER_KEY, ACS_MAX_STREAMS_PER_KEY,
 * ACS_MAX_UPSTREAM_SHARE_PER_KEY; their defaults resolved by src/config/env-schema.ts).
 */
export function admissionLimitsFrom(config: AdmissionLimits): AdmissionLimits {
  return {
    maxRequestsPerKey: config.maxRequestsPerKey,
    maxStreamsPerKey: config.maxStreamsPerKey,
    maxUpstreamSharePerKey: config.maxUpstreamSharePerKey,
  };
}

/** What one request asks of admission. */
export interface AdmissionDemand {
  /** True for a streamed request (counts against the stream cap too). */
  readonly stream: boolean;
  /** The model's canonical id. */
  readonly modelId: string;
  /** The model's upstream capacity: concurrent completions all its replicas take. */
  readonly modelCapacity: number;
  /**
   * Inference requests this request may hold at once: 1, or a lens fan-out's concurrency
   * (proto/API.md §6). Counted against the key's share of the model, at most the share itself.
   * @default 1
   */
  readonly upstreamRequests?: number;
}

/** One admitted request's place; give it back exactly once with `release` (later calls do nothing). */
export interface AdmissionTicket {
  /** Inference requests the request may hold at once (its demand, at most the key's share). */
  readonly upstreamRequests: number;
  release(): void;
}

/** What one key has in flight now. */
export interface KeyInFlight {
  readonly requests: number;
  readonly streams: number;
  /** Requests per model id. */
  readonly byModel: ReadonlyMap<string, number>;
}

/** `1 request`, `2 requests`: a count and its noun, in a refusal's message. */
function counted(n: number, noun: string): string {
  return `${n} ${noun}${n === 1 ? "" : "s"}`;
}

/** Per-key counts of requests in flight, with caps. */
export interface Admission {
  readonly limits: AdmissionLimits;
  /**
   * Admits one request of `keyId`, or throws (or rejects with) ApiError 429 `rate_limited` (type
   * `rate_limit_error`, param null, retry after {@link ADMISSION_RETRY_AFTER_SECONDS} s) naming
   * the first cap it would break, in this order: requests, streams, the model's share. One
   * process's counts answer at once; a cluster worker's ask the primary, which counts every
   * worker's (src/app/cluster/admission-broker.ts), and answer with a promise.
   */
  admit(keyId: string, demand: AdmissionDemand): AdmissionTicket | Promise<AdmissionTicket>;
  /** What `keyId` has in flight now (zeros for a key with nothing in flight). */
  inFlight(keyId: string): KeyInFlight;
  /** Keys with at least one request in flight (a key with none takes no memory). */
  readonly activeKeys: number;
}

/** An {@link Admission} whose counts are this process's own: it answers at once. */
export interface LocalAdmission extends Admission {
  admit(keyId: string, demand: AdmissionDemand): AdmissionTicket;
}

interface Counts {
  requests: number;
  streams: number;
  byModel: Map<string, number>;
}

/**
 * The most requests one key may have in flight on a model of `capacity` concurrent completions:
 * ⌊share × capacity⌋, at least 1.
 */
export function upstreamShareCap(share: number, capacity: number): number {
  return Math.max(1, Math.floor(share * capacity));
}

function checkLimits(limits: AdmissionLimits): AdmissionLimits {
  for (const name of ["maxRequestsPerKey", "maxStreamsPerKey"] as const) {
    const v = limits[name];
    if (!Number.isSafeInteger(v) || v < 0) throw new RangeError(`${name} must be an integer ≥ 0, got ${v}`);
  }
  const share = limits.maxUpstreamSharePerKey;
  if (!(share > 0 && share <= 1)) {
    throw new RangeError(`maxUpstreamSharePerKey must be in (0, 1], got ${share}`);
  }
  return limits;
}

const retry = { retry: true, afterSeconds: ADMISSION_RETRY_AFTER_SECONDS } as const;

function refuse(message: string): ApiError {
  return rateLimited(`${message} Retry when one of them has finished.`);
}

/**
 * The 429 `rate_limited` of a cap, with its whole message (e.g. the primary's refusal, passed on by
 * a cluster worker): retry after {@link ADMISSION_RETRY_AFTER_SECONDS} s.
 */
export function rateLimited(message: string): ApiError {
  return new ApiError("rate_limited", message, { retry });
}

/**
 * Per-key admission counts of one process (the primary's count for every worker of ACS_WORKERS;
 * replicas of the gateway on other machines count each their own). Checked
 * after the key and the model are known and before the Hold; released when the request ends,
 * whatever the way (answer, error, disconnect, deadline, a stalled stream ended).
 */
export function createAdmission(limits: AdmissionLimits): LocalAdmission {
  checkLimits(limits);
  const keys = new Map<string, Counts>();

  return {
    limits,
    get activeKeys() {
      return keys.size;
    },
    inFlight(keyId) {
      const c = keys.get(keyId);
      return c === undefined
        ? { requests: 0, streams: 0, byModel: new Map() }
        : { requests: c.requests, streams: c.streams, byModel: new Map(c.byModel) };
    },
    admit(keyId, demand) {
      const c = keys.get(keyId) ?? { requests: 0, streams: 0, byModel: new Map<string, number>() };
      const { maxRequestsPerKey: maxRequests, maxStreamsPerKey: maxStreams } = limits;
      if (maxRequests > 0 && c.requests >= maxRequests) {
        throw refuse(
          `This key already has ${counted(c.requests, "request")} in flight: the per-key request cap is ${counted(maxRequests, "concurrent request")} (streamed or not).`,
        );
      }
      if (demand.stream && maxStreams > 0 && c.streams >= maxStreams) {
        throw refuse(
          `This key already has ${counted(c.streams, "stream")} open: the per-key stream cap is ${counted(maxStreams, "concurrent stream")}.`,
        );
      }
      const onModel = c.byModel.get(demand.modelId) ?? 0;
      const shareCap = upstreamShareCap(limits.maxUpstreamSharePerKey, demand.modelCapacity);
      const weight = Math.min(Math.max(1, demand.upstreamRequests ?? 1), shareCap);
      if (onModel + weight > shareCap) {
        const percent = Math.round(limits.maxUpstreamSharePerKey * 1000) / 10;
        throw refuse(
          `This key already has ${counted(onModel, "request")} in flight on ${demand.modelId}: the per-key share of a model's capacity is ${percent}% of its ${counted(demand.modelCapacity, "concurrent request")}, ${counted(shareCap, "request")}.`,
        );
      }
      c.requests++;
      if (demand.stream) c.streams++;
      c.byModel.set(demand.modelId, onModel + weight);
      keys.set(keyId, c);

      let released = false;
      return {
        upstreamRequests: weight,
        release() {
          if (released) return;
          released = true;
          c.requests--;
          if (demand.stream) c.streams--;
          const left = (c.byModel.get(demand.modelId) ?? weight) - weight;
          if (left > 0) c.byModel.set(demand.modelId, left);
          else c.byModel.delete(demand.modelId);
          if (c.requests === 0) keys.delete(keyId);
        },
      };
    },
  };
}

/** A ticket that holds nothing (keys off: no caps apply). */
export const noAdmission: AdmissionTicket = { upstreamRequests: Number.POSITIVE_INFINITY, release() {} };
