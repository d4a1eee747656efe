// The models the gateway serves and their replicas, as src/config/models-file.ts reads them and
// Config.models holds them.

/** One replica of a model: an Inference server (vLLM's OpenAI-compatible server) that runs it. */
export interface UpstreamConfig {
  /** Base URL of the replica, without `/v1`, e.g. `http://10.0.0.5:8000` (a path prefix is kept). */
  readonly url: string;
  /** Bearer key for the replica's `--api-key`, if any. */
  readonly apiKey: string | undefined;
  /** Its share of the model's requests relative to the other replicas. @default 1 */
  readonly weight: number;
}

/** One model the gateway serves, and where Inference runs it. */
export interface ModelConfig {
  /** The canonical id callers see, e.g. `meta-llama/Llama-3.1-8B`. */
  readonly id: string;
  /** Other names the model answers to, e.g. `llama-8b`. @default [] */
  readonly aliases: readonly string[];
  /** The replicas that run it (at least one; each URL once). */
  readonly upstreams: readonly UpstreamConfig[];
  /** The model name Inference serves it under. @default id */
  readonly servedModelName: string;
  /** Longest prompt + completion in tokens; read from Inference's /v1/models when undefined. */
  readonly maxModelLen: number | undefined;
  /** Residual stream width (last dim of steering vectors), e.g. 4096 for Llama-3.1-8B. */
  readonly hiddenSize: number;
  /** Decoder layers, e.g. 32 for Llama-3.1-8B. */
  readonly numLayers: number;
  /** `owned_by` in /v1/models. @default "acs" */
  readonly ownedBy: string;
  /**
   * Concurrent completions each replica accepts (vLLM's own queue is behind it): the gateway opens
   * up to this many connections per replica, and no more. @default 16384 (enough for 10,000
   * streams; undefined = the default)
   */
  readonly maxConcurrentRequests?: number | undefined;
  /**
   * The model's tokenizer is a byte-level BPE without a normalizer (Llama 3, GPT-2 families): a
   * text prompt is never more tokens than its UTF-8 bytes plus the special tokens added (BOS), so
   * the gateway skips `/tokenize` when that bound decides (src/service/count-prompt-tokens.ts).
   * Leave it off for a SentencePiece tokenizer or one that normalizes (NFC, NFKC): text can grow.
   * @default false
   */
  readonly byteLevelTokenizer?: boolean | undefined;
}
