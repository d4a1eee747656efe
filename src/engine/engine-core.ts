/**
 * The scheduler: runs every live sequence one step per batch pass, yielding to the event loop
 * between slices (setImmediate) so concurrent requests progress together and none blocks the loop.
 *
 * vllm-lens behaviours reproduced here: steering runs after each decoder layer, then capture;
 * a steering vector whose hidden size is wrong makes vllm-lens's hook raise at its layers — in that
 * batch pass, steering at those layers is skipped for every sequence and the capture of every
 * sequence that captures one of those layers is dropped.
 */
import type { KvCache, Model } from "./model.js";
import { OutputText } from "./output-text.js";
import { createRng } from "./prng.js";
import { computeLogprobs, type SamplingParams, sampleToken, type TokenLogprobs } from "./sampler.js";
import { applySteering, badLayers, type SteeringVector } from "./steering.js";
import { toBf16Bits } from "./tensor-codec.js";
import type { Tokenizer } from "./tokenizer.js";

/** What a sequence reports after each step that produced a token (or at its end). */
export interface StepOutput {
  /** Token ids added by this step. */
  tokenIds: number[];
  /** Logprobs for those tokens (when requested). */
  logprobs: TokenLogprobs[];
  /** Text that became safe to emit. */
  delta: string;
  finished: boolean;
}

export interface SequenceSpec {
  promptIds: number[];
  params: SamplingParams;
  /** PRNG seed for this sample (seed + k, exact), or null for a random one. */
  seed: bigint | null;
  steering: SteeringVector[];
  /** Layers to capture (ascending) or null. */
  capture: number[] | null;
  /** Top-k for prompt logprobs, or -1 for none. */
  promptLogprobsTopK: number;
  maxModelLen: number;
  /** The token sequences of params.badWords (bad-words.ts): one list for all of a request's sequences. */
  badWordsTokenIds: readonly (readonly number[])[];
  onStep: (out: StepOutput) => void;
}

let anonSeed = 0;

/** One generated sample: prefill, then decode until a stop condition. */
export class Sequence {
  readonly outputIds: number[] = [];
  readonly text: OutputText;
  finishReason: "stop" | "length" | "abort" | null = null;
  stopReason: string | number | null = null;
  readonly logprobs: TokenLogprobs[] = [];
  /** promptLogprobs[i] for prompt token i ≥ 1 (index 0 unused). */
  readonly promptLogprobs: (TokenLogprobs | null)[] = [null];
  /** Captured residual stream per captured layer: bf16 bits, rows of hidden. */
  readonly captured = new Map<number, { bits: Uint16Array; rows: number }>();
  captureDropped = false;
  private readonly cache: KvCache;
  private prefilled = 0;
  private lastLogits: Float32Array | null = null;
  private readonly rng;
  private readonly promptCounts = new Map<number, number>();
  private readonly outputCounts = new Map<number, number>();
  private readonly captureSet: Set<number> | null;

  constructor(
    private readonly model: Model,
    private readonly tok: Tokenizer,
    readonly spec: SequenceSpec,
  ) {
    const p = spec.params;
    this.text = new OutputText(tok, p.skipSpecialTokens, p.stop, p.includeStopStrInOutput);
    this.cache = model.createCache(Math.min(spec.maxModelLen, spec.promptIds.length + p.maxTokens));
    this.rng = createRng(spec.seed ?? `anon:${Date.now()}:${anonSeed++}:${Math.random()}`);
    for (const id of spec.promptIds) this.promptCounts.set(id, (this.promptCounts.get(id) ?? 0) + 1);
    this.captureSet = spec.capture ? new Set(spec.capture) : null;
    if (spec.capture)
      for (const l of spec.capture) this.captured.set(l, { bits: new Uint16Array(0), rows: 0 });
  }

  get finished(): boolean {
    return this.finishReason !== null;
  }

  /** Residual stream of the sequence for captured layers as (layers, positions, hidden) bf16 bits. */
  captureBits(): { bits: Uint16Array; shape: number[] } | null {
    if (!this.spec.capture || this.captureDropped || this.spec.capture.length === 0) return null;
    const D = this.model.shape.hiddenSize;
    const layers = this.spec.capture;
    const rows = this.captured.get(layers[0]!)!.rows;
    const out = new Uint16Array(layers.length * rows * D);
    layers.forEach((l, i) => {
      out.set(this.captured.get(l)!.bits.subarray(0, rows * D), i * rows * D);
    });
    return { bits: out, shape: [layers.length, rows, D] };
  }

  /** Runs one step: a prefill chunk, or one decode token. `skipLayers`: layers whose hook fails this pass. */
  step(prefillChunk: number, skipLayers: ReadonlySet<number>): void {
    if (this.finished) return;
    const D = this.model.shape.hiddenSize;
    const steering = this.spec.steering;
    if (this.captureSet && skipLayers.size > 0) {
      for (const l of skipLayers) if (this.captureSet.has(l)) this.captureDropped = true;
    }
    const hooks =
      steering.length > 0 || this.captureSet
        ? {
            afterLayer: (layer: number, pos: number, h: Float32Array): void => {
              if (skipLayers.has(layer)) return;
              if (steering.length > 0) applySteering(steering, layer, pos, h);
              if (this.captureSet?.has(layer)) this.record(layer, h, D);
            },
          }
        : null;
    const prompt = this.spec.promptIds;
    const wantPromptLp = this.spec.promptLogprobsTopK >= 0;
    if (this.prefilled < prompt.length) {
      const end = Math.min(prompt.length, this.prefilled + prefillChunk);
      for (let i = this.prefilled; i < end; i++) {
        const last = i === prompt.length - 1;
        const logits = this.model.step(this.cache, prompt[i]!, hooks, last || wantPromptLp);
        if (logits && wantPromptLp && !last) {
          this.promptLogprobs.push(
            computeLogprobs(logits, prompt[i + 1]!, this.spec.promptLogprobsTopK, true),
          );
        }
        if (last) this.lastLogits = Float32Array.from(logits!);
      }
      this.prefilled = end;
      if (this.prefilled < prompt.length) return;
      if (this.spec.params.maxTokens <= 0) {
        this.finish("length", null);
        this.spec.onStep({ tokenIds: [], logprobs: [], delta: this.text.takeDelta(), finished: true });
        return;
      }
    } else {
      const lastId = this.outputIds[this.outputIds.length - 1]!;
      this.lastLogits = this.model.step(this.cache, lastId, hooks, true);
    }
    this.sampleNext();
  }

  private record(layer: number, h: Float32Array, D: number): void {
    const c = this.captured.get(layer)!;
    if ((c.rows + 1) * D > c.bits.length) {
      const grown = new Uint16Array(Math.max((c.rows + 1) * D, c.bits.length * 2));
      grown.set(c.bits);
      c.bits = grown;
    }
    const base = c.rows * D;
    for (let i = 0; i < D; i++) c.bits[base + i] = toBf16Bits(h[i]!);
    c.rows++;
  }

  private sampleNext(): void {
    const logits = this.lastLogits!;
    const p = this.spec.params;
    const id = sampleToken(logits, p, {
      rng: this.rng,
      promptCounts: this.promptCounts,
      outputCounts: this.outputCounts,
      generated: this.outputIds.length,
      eosId: this.tok.eosId,
      outputIds: this.outputIds,
      badWordsTokenIds: this.spec.badWordsTokenIds,
    });
    this.outputIds.push(id);
    this.outputCounts.set(id, (this.outputCounts.get(id) ?? 0) + 1);
    const lps: TokenLogprobs[] = [];
    if (p.logprobs !== null) {
      const lp = computeLogprobs(logits, id, p.logprobs, false);
      this.logprobs.push(lp);
      lps.push(lp);
    }
    const n = this.outputIds.length;
    const pastMin = n > p.minTokens;
    let done = false;
    if (pastMin && id === this.tok.eosId && !p.ignoreEos) {
      done = true;
      this.finish("stop", null, id);
    } else if (pastMin && p.stopTokenIds.includes(id)) {
      done = true;
      this.finish("stop", id, id);
    } else {
      const stop = this.text.push(id, pastMin);
      if (stop !== null) {
        done = true;
        this.finish("stop", stop);
      } else if (n >= p.maxTokens || this.spec.promptIds.length + n >= this.spec.maxModelLen) {
        done = true;
        this.finish("length", null);
      }
    }
    this.spec.onStep({ tokenIds: [id], logprobs: lps, delta: this.text.takeDelta(), finished: done });
  }

  private finish(reason: "stop" | "length", stopReason: string | number | null, stopTokenId?: number): void {
    if (stopTokenId !== undefined && this.spec.params.includeStopStrInOutput)
      this.text.push(stopTokenId, false);
    this.text.finish();
    this.finishReason = reason;
    this.stopReason = stopReason;
  }

  /** Marks the sequence aborted (no more steps). */
  abort(): void {
    if (!this.finished) this.finishReason = "abort";
  }
}

/** Runs sequences in interleaved batch passes. */
export class Scheduler {
  private readonly active = new Set<Sequence>();
  private running = false;

  constructor(
    private readonly model: Model,
    private readonly tok: Tokenizer,
    private readonly prefillChunk: number,
    private readonly sliceMs = 8,
  ) {}

  /** Number of live sequences. */
  get size(): number {
    return this.active.size;
  }

  /** Creates and schedules a sequence. */
  add(spec: SequenceSpec): Sequence {
    const seq = new Sequence(this.model, this.tok, spec);
    this.active.add(seq);
    if (!this.running) {
      this.running = true;
      setImmediate(() => this.loop());
    }
    return seq;
  }

  /** Stops a sequence at once (its remaining steps are never run). */
  remove(seq: Sequence): void {
    seq.abort();
    this.active.delete(seq);
  }

  private loop(): void {
    const t0 = performance.now();
    const D = this.model.shape.hiddenSize;
    while (this.active.size > 0) {
      // one batch pass
      const skip = new Set<number>();
      for (const s of this.active) for (const l of badLayers(s.spec.steering, D)) skip.add(l);
      for (const s of [...this.active]) {
        if (!this.active.has(s)) continue;
        try {
          s.step(this.prefillChunk, skip);
        } catch (err) {
          s.abort();
          this.active.delete(s);
          s.spec.onStep({ tokenIds: [], logprobs: [], delta: "", finished: true });
          void err;
        }
        if (s.finished) this.active.delete(s);
      }
      if (performance.now() - t0 > this.sliceMs) break;
    }
    if (this.active.size > 0) setImmediate(() => this.loop());
    else this.running = false;
  }
}
