/**
 * The reference engine: vLLM's OpenAI-compatible HTTP contract (with vllm-lens activations and
 * steering) over a small Llama-architecture transformer with PRNG weights.
 * Only src/main.ts and tests may import this module; the gateway never does.
 */
import type { EventEmitter } from "node:events";
import type { AddressInfo } from "node:net";
import { createModel, type ForwardResult, type Model } from "./model.js";
import { getPreset, type PresetDims, type PresetName } from "./presets.js";
import type { SchedulingPolicy } from "./protocol.js";
import { createEngineServer, type EngineStats } from "./server.js";
import { applySteering, parseSteeringVectors } from "./steering.js";
import { createByteTokenizer, createLlama3Tokenizer, type Tokenizer } from "./tokenizer.js";
import { buildPresetWeights, shapeOf } from "./weights.js";

export type { PresetDims, PresetName } from "./presets.js";
export { getPreset, PRESET_NAMES } from "./presets.js";
export { decodeTensorDict, encodeFloatTensorAsBf16, roundBf16, type TensorDict } from "./tensor-codec.js";

export interface StartEngineOptions {
  /** Default "tiny". */
  preset?: PresetName;
  /** Default "127.0.0.1". */
  host?: string;
  /** Default 0 (a free port). */
  port?: number;
  /** Default: the preset's (meta-llama/Llama-3.1-8B for llama-8b, acs/tiny for tiny). */
  servedModelName?: string;
  /** Default: the preset's. Must be ≥ 2. */
  maxModelLen?: number;
  /** vLLM `--scheduling-policy`: `fcfs` refuses a non-zero priority, as vLLM's default does. Default "priority". */
  schedulingPolicy?: SchedulingPolicy;
}

/** A reference forward pass, for comparing numbers with what the server returns. */
export interface EngineModel {
  id: string;
  maxModelLen: number;
  hiddenSize: number;
  numLayers: number;
  vocabSize: number;
  /** Token ids of `text` (BOS prepended unless addSpecialTokens is false). */
  tokenize(text: string, addSpecialTokens?: boolean): number[];
  /**
   * Runs the model over `tokenIds` from position 0 (float32, no bf16 rounding).
   * `steering` is what `apply_steering_vectors` takes (a JSON string or the list itself).
   * Returns residualStream[layer] as (positions × hidden) row-major float32, and logits per position.
   * @throws EngineError when the steering list is malformed.
   */
  forward(tokenIds: readonly number[], opts?: { steering?: unknown }): Promise<ForwardResult>;
}

export interface RunningEngine {
  /** http://127.0.0.1:PORT */
  url: string;
  model: EngineModel;
  stats: EngineStats;
  /** Emits "abort" (response id `cmpl-…`) and "finish" (same id). */
  events: EventEmitter;
  close(): Promise<void>;
}

const built = new Map<PresetName, { model: Model; tokenizer: Tokenizer }>();

/** Builds (once per process) the model and tokenizer of a preset. */
export function loadPreset(name: PresetName): { preset: PresetDims; model: Model; tokenizer: Tokenizer } {
  const preset = getPreset(name);
  let b = built.get(name);
  if (!b) {
    const tokenizer = preset.tokenizer === "bytes" ? createByteTokenizer() : createLlama3Tokenizer();
    b = { model: createModel(shapeOf(preset), buildPresetWeights(preset, tokenizer)), tokenizer };
    built.set(name, b);
  }
  return { preset, ...b };
}

/**
 * Starts an engine server. Resolves once it listens.
 * @throws Error on an unknown preset, a bad maxModelLen, or when the port cannot be bound.
 */
export async function startEngine(opts: StartEngineOptions = {}): Promise<RunningEngine> {
  const { preset, model, tokenizer } = loadPreset(opts.preset ?? "tiny");
  const maxModelLen = opts.maxModelLen ?? preset.maxModelLen;
  if (!Number.isInteger(maxModelLen) || maxModelLen < 2) throw new Error(`bad maxModelLen ${maxModelLen}`);
  const servedModelName = opts.servedModelName ?? preset.servedModelName;
  const server = createEngineServer({
    preset,
    model,
    tokenizer,
    servedModelName,
    maxModelLen,
    schedulingPolicy: opts.schedulingPolicy ?? "priority",
  });
  await server.app.listen({ host: opts.host ?? "127.0.0.1", port: opts.port ?? 0 });
  const addr = server.app.server.address() as AddressInfo;
  const host = addr.family === "IPv6" ? `[${addr.address}]` : addr.address;
  const engineModel: EngineModel = {
    id: servedModelName,
    maxModelLen,
    hiddenSize: preset.hiddenSize,
    numLayers: preset.numLayers,
    vocabSize: preset.vocabSize,
    tokenize: (text, add = true) => tokenizer.encode(text, add),
    async forward(tokenIds, fopts = {}) {
      const steering =
        fopts.steering === undefined || fopts.steering === null
          ? []
          : await parseSteeringVectors(fopts.steering, preset.numLayers, 1 << 26);
      const usable = steering.filter((v) => v.hidden === preset.hiddenSize);
      return model.forward(tokenIds, {
        afterLayer: (layer, pos, h) => applySteering(usable, layer, pos, h),
      });
    },
  };
  return {
    url: `http://${host}:${addr.port}`,
    model: engineModel,
    stats: server.stats,
    events: server.events,
    close: async () => {
      await server.app.close();
    },
  };
}
