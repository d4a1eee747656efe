/**
 * Model presets: the dimensions of each model the engine can serve.
 * See src/engine/README.md for the table and the reasoning behind the llama-8b internals.
 */

export type PresetName = "tiny" | "llama-8b";

/** Dimensions and internals of one preset. All sizes are counts (tokens, coordinates, units). */
export interface PresetDims {
  readonly name: PresetName;
  /** Default served model name (`model` field, `/v1/models` id). */
  readonly servedModelName: string;
  readonly tokenizer: "bytes" | "llama3";
  readonly vocabSize: number;
  /** Residual stream width (what activations and steering vectors use as their last dim). */
  readonly hiddenSize: number;
  readonly numLayers: number;
  readonly numHeads: number;
  readonly headDim: number;
  /** SwiGLU inner width. */
  readonly mlpDim: number;
  /** Longest prompt + completion, in tokens. */
  readonly maxModelLen: number;
  readonly ropeTheta: number;
  readonly rmsEps: number;
  /** dense: full matrices. sparse: each residual coordinate feeds/reads one inner unit (O(hidden) per projection). */
  readonly projection: "dense" | "sparse";
  /** Rank of the unembedding (equals hiddenSize for dense). */
  readonly unembedRank: number;
  /** Tokens whose logits come from the hidden state; the rest share a fixed logit (exact log-softmax over all). */
  readonly activeVocab: number;
  /** Seed of the weight PRNG. */
  readonly seed: number;
  /** Prompt tokens processed per scheduler step (keeps the event loop responsive). */
  readonly prefillChunk: number;
}

const PRESETS: Readonly<Record<PresetName, PresetDims>> = {
  tiny: {
    name: "tiny",
    servedModelName: "acs/tiny",
    tokenizer: "bytes",
    vocabSize: 258,
    hiddenSize: 64,
    numLayers: 4,
    numHeads: 4,
    headDim: 16,
    mlpDim: 128,
    maxModelLen: 512,
    ropeTheta: 10000,
    rmsEps: 1e-5,
    projection: "dense",
    unembedRank: 64,
    activeVocab: 258,
    seed: 1234,
    prefillChunk: 64,
  },
  "llama-8b": {
    name: "llama-8b",
    servedModelName: "meta-llama/Llama-3.1-8B",
    tokenizer: "llama3",
    vocabSize: 128256,
    hiddenSize: 4096,
    numLayers: 32,
    numHeads: 2,
    headDim: 8,
    mlpDim: 64,
    maxModelLen: 1024,
    ropeTheta: 500000,
    rmsEps: 1e-5,
    projection: "sparse",
    unembedRank: 64,
    activeVocab: 4096,
    seed: 8008,
    prefillChunk: 8,
  },
};

/** Names of all presets. */
export const PRESET_NAMES: readonly PresetName[] = ["tiny", "llama-8b"];

/**
 * Returns the dimensions of a preset.
 * @throws Error when `name` is not a preset name.
 */
export function getPreset(name: string): PresetDims {
  if (name !== "tiny" && name !== "llama-8b") {
    throw new Error(`unknown preset "${name}" (known: ${PRESET_NAMES.join(", ")})`);
  }
  return PRESETS[name];
}
