/** The limits and defaults of the API's contract (proto/API.md §3–§5): their one home. */
export const limits = {
  /** prompts × n × max_tokens ≤ this, tokens (§3). */
  maxGeneratedTokens: 32_000,
  /** max_tokens above this needs `stream` (the 14-minute wait), tokens (§3). */
  maxNonStreamTokens: 15_600,
  /** Largest request body on every route, bytes: 8 MiB; larger → 413 (§4). */
  bodyLimitBytes: 8 * 1024 * 1024,
  /** Longest wait for a non-streamed answer, ms: 14 minutes, then 504 (§5). */
  nonStreamDeadlineMs: 14 * 60 * 1000,
  /** Interval of a stream's `: keepalive` comments, ms (§5). */
  keepaliveIntervalMs: 5000,
  /**
   * Default bytes of decoded steering tensors one request may hold: 32 MiB, what the most numbers
   * a request may send (2^23, MAX_STEERING_NUMBERS in src/lens) take as float32 (§6).
   */
  steeringRequestBytes: 2 ** 23 * 4,
  /** Default bytes of decoded steering tensors all requests may hold at once: 256 MiB (§6). */
  steeringProcessBytes: 256 * 2 ** 20,
  /**
   * Default Inference requests one lens fan-out (capture or steering with several prompts and/or
   * n > 1: one request per choice) runs at once (§6).
   */
  lensFanOutConcurrency: 8,
  /** Default most requests one key may have in flight at once, streamed or not (§9; 0 = no cap). */
  maxRequestsPerKey: 1024,
  /** Default most streams one key may have open at once (§9; 0 = no cap). */
  maxStreamsPerKey: 512,
  /** Default share of a model's upstream capacity one key may hold, a fraction in (0, 1] (§9). */
  maxUpstreamSharePerKey: 0.5,
  /** Default time a stream may wait for its caller to read (drain) before it is ended, ms (§5). */
  streamStallMs: 60_000,
  /**
   * Default longest wait for an upstream answer's next event — its first (every completion but
   * prompt_logprobs and captures is streamed from Inference, so that event follows prefill), or
   * the next between two — ms: past it the replica is silent; the call fails over, or ends 504
   * (§5). Far above a prefill of the longest prompt and a token's time, so no legitimate
   * generation is cut; a generation's length does not count.
   */
  upstreamHeadersTimeoutMs: 60_000,
} as const;

/**
 * Defaults of the gateway's own machinery that a library below config also uses when it runs alone
 * (tests, the keys CLI): written here once, read by the env schema and by that library.
 */
export const machineryDefaults = {
  /** How long a replica's Budget lease outlives its last sync, ms (ACS_LEASE_TTL_MS; src/budget/leases). */
  leaseTtlMs: 30_000,
} as const;
