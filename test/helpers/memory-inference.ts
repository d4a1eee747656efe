// An Inference port (src/upstream/port.ts) in memory, for the service's own suite: every choice
// generates `tokens` tokens, one per chunk (choices in turn), prompts are counted as their UTF-8
// bytes + 1 (BOS), and each call is recorded with what it delivered — so a test can say what the
// caller got and what the request must be charged without reading the service's meter.
import { create } from "@bufbuild/protobuf";
import {
  CompletionChoiceSchema,
  type CreateCompletionRequest,
  CreateCompletionResponseSchema,
  DetokenizeResponseSchema,
  FinishReason,
  type StreamCompletionResponse,
  StreamCompletionResponseSchema,
  type TokenizeRequest,
  TokenizeResponseSchema,
  UsageSchema,
} from "../../gen/acs/v1/completions_pb.js";
import { ActivationsSchema, Dtype, TensorSchema } from "../../gen/acs/v1/lens_pb.js";
import { ApiError } from "../../src/core/errors/index.js";
import type {
  CompleteAnswer,
  CompleteCall,
  Inference,
  InferenceCall,
  InferenceCompletion,
  InferenceRequest,
  ReplayAnswer,
  StreamCall,
  TokenCount,
} from "../../src/upstream/index.js";

/** One request as this port keeps it: each prompt's tokens, n, max_tokens. */
interface MemoryRequest {
  readonly completion: InferenceCompletion;
  /** Each prompt's tokens (BOS included for a text prompt). */
  readonly prompts: readonly number[];
  readonly n: number;
}

/** A call the service made, and what it delivered. */
export interface MemoryCall {
  readonly kind: "stream" | "complete" | "replay";
  /** Σ prompt tokens of the call (each prompt once, as vLLM counts them). */
  readonly promptTokens: number;
  /** Tokens the call delivered to the service (chunks it yielded, or the whole answer). */
  generated: number;
  /** How it ended; "open" while it runs. */
  end: "open" | "done" | "failed" | "closed";
  readonly upstreamRequestId: string;
}

/** What the port does. */
export interface MemoryScript {
  /** Tokens each choice generates (at most max_tokens). @default 3 */
  tokens?: number;
  /** Whether Inference reports usage (the usage chunk, a whole answer's usage). @default true */
  usage?: boolean;
  /**
   * Fails call `call` (0-based, in the order they were made) with `error`: a stream from its
   * `chunk`-th `next()` (0 = before any chunk), a whole answer at once.
   */
  fail?: { readonly call: number; readonly chunk: number; readonly error: ApiError };
  /** Told each time a stream call yields a chunk (call index, chunks yielded so far). */
  onChunk?: (call: number, chunks: number) => void;
  /**
   * Call `call` (0-based) hangs until its signal aborts, then fails with the signal's error (an
   * Inference that does not answer): a stream at its `chunk`-th `next()`, a whole answer at once.
   */
  hang?: { readonly call: number; readonly chunk: number };
}

/** The prompt tokens of a text: its UTF-8 bytes + BOS. */
export const memoryPromptTokens = (text: string, addSpecialTokens = true): number =>
  Buffer.byteLength(text, "utf8") + (addSpecialTokens ? 1 : 0);

function promptsOf(request: CreateCompletionRequest): number[] {
  const p = request.prompt;
  const special = request.addSpecialTokens ?? true;
  switch (p.case) {
    case "text":
      return [memoryPromptTokens(p.value, special)];
    case "texts":
      return p.value.values.map((t) => memoryPromptTokens(t, special));
    case "tokenIds":
      return [p.value.values.length];
    case "tokenIdsList":
      return p.value.values.map((v) => v.values.length);
    default:
      throw new Error("memory Inference: no prompt");
  }
}

const kept = (request: InferenceRequest): MemoryRequest => request as unknown as MemoryRequest;
const handle = (request: MemoryRequest): InferenceRequest => request as unknown as InferenceRequest;

const sum = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0);

/** A tiny capture: one float32 value per position (what the service passes on is all a test checks). */
function activationsOf(positions: number) {
  return create(ActivationsSchema, {
    residualStream: create(TensorSchema, {
      dtype: Dtype.FLOAT32,
      shape: [1, positions, 1],
      data: new Uint8Array(4 * positions),
    }),
  });
}

/** The error an aborted call throws: the signal's reason when it is an ApiError, else `canceled`. */
function abortError(signal: AbortSignal): ApiError {
  return signal.reason instanceof ApiError
    ? signal.reason
    : new ApiError("canceled", "The caller went away.");
}

/** Resolves once `signal` aborts. */
function aborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
}

/** The in-memory Inference port; `calls` records every call in order. */
export class MemoryInference implements Inference {
  readonly calls: MemoryCall[] = [];
  readonly prepared: InferenceCompletion[] = [];

  constructor(private readonly script: MemoryScript = {}) {}

  /** True while at least one replica is up (the model registry asks). */
  serving(): boolean {
    return true;
  }

  prepare(completion: InferenceCompletion): InferenceRequest {
    this.prepared.push(completion);
    return handle({ completion, prompts: promptsOf(completion.request), n: completion.request.n ?? 1 });
  }

  fanOut(request: InferenceRequest, prompts: number, n: number): InferenceRequest[] {
    const r = kept(request);
    if (r.prompts.length !== prompts || r.n !== n)
      throw new Error("memory Inference: fan-out of another shape");
    return r.prompts.flatMap((tokens) =>
      Array.from({ length: n }, () => handle({ ...r, prompts: [tokens], n: 1 })),
    );
  }

  #tokens(r: MemoryRequest): number {
    return Math.min(this.script.tokens ?? 3, r.completion.maxTokens);
  }

  #record(
    kind: MemoryCall["kind"],
    promptTokens: number,
    call: InferenceCall,
  ): { index: number; call: MemoryCall } {
    const record: MemoryCall = {
      kind,
      promptTokens,
      generated: 0,
      end: "open",
      upstreamRequestId: call.upstreamRequestId,
    };
    this.calls.push(record);
    return { index: this.calls.length - 1, call: record };
  }

  /** Waits for `signal` to abort when call `index` hangs at `chunk` ({@link MemoryScript.hang}). */
  async #hang(index: number, chunk: number, signal: AbortSignal): Promise<void> {
    const hang = this.script.hang;
    if (hang !== undefined && hang.call === index && hang.chunk === chunk) await aborted(signal);
  }

  #failure(index: number, chunk: number): ApiError | undefined {
    const fail = this.script.fail;
    return fail !== undefined && fail.call === index && fail.chunk === chunk ? fail.error : undefined;
  }

  stream(request: InferenceRequest, call: StreamCall): AsyncIterator<StreamCompletionResponse> {
    const r = kept(request);
    const { index, call: record } = this.#record("stream", sum(r.prompts), call);
    const choices = r.prompts.length * r.n;
    const tokens = this.#tokens(r);
    const chunks: StreamCompletionResponse[] = [];
    for (let t = 0; t < tokens; t++) {
      for (let c = 0; c < choices; c++) {
        const prompt = r.prompts[Math.floor(c / r.n)] ?? 0;
        chunks.push(
          create(StreamCompletionResponseSchema, {
            ...call.ids,
            choices: [
              create(CompletionChoiceSchema, {
                index: c,
                text: `t${t}`,
                tokenIds: [100 + t],
                promptTokenIds: t === 0 ? Array.from({ length: prompt }, (_, i) => i + 1) : [],
                finishReason: t === tokens - 1 ? FinishReason.LENGTH : FinishReason.UNSPECIFIED,
              }),
            ],
          }),
        );
      }
    }
    if (this.script.usage ?? true) {
      const completion = tokens * choices;
      const promptTokens = sum(r.prompts);
      chunks.push(
        create(StreamCompletionResponseSchema, {
          ...call.ids,
          choices: [],
          usage: create(UsageSchema, {
            promptTokens,
            completionTokens: completion,
            totalTokens: promptTokens + completion,
          }),
        }),
      );
    }
    let next = 0;
    const script = this.script;
    const failure = (chunk: number) => this.#failure(index, chunk);
    const hang = (chunk: number) => this.#hang(index, chunk, call.signal);
    return {
      async next(): Promise<IteratorResult<StreamCompletionResponse>> {
        await Promise.resolve();
        await hang(next);
        if (record.end !== "open") return { done: true, value: undefined };
        if (call.signal.aborted) {
          record.end = "failed";
          throw abortError(call.signal);
        }
        const err = failure(next);
        if (err !== undefined) {
          record.end = "failed";
          throw err;
        }
        const chunk = chunks[next++];
        if (chunk === undefined) {
          record.end = "done";
          return { done: true, value: undefined };
        }
        record.generated += chunk.choices.length;
        script.onChunk?.(index, next);
        return { done: false, value: chunk };
      },
      async return(): Promise<IteratorResult<StreamCompletionResponse>> {
        if (record.end === "open") record.end = "closed";
        return { done: true, value: undefined };
      },
    };
  }

  async complete(request: InferenceRequest, model: string, call: CompleteCall): Promise<CompleteAnswer> {
    const r = kept(request);
    const { index, call: record } = this.#record("complete", sum(r.prompts), call);
    await Promise.resolve();
    await this.#hang(index, 0, call.signal);
    const err = call.signal.aborted ? abortError(call.signal) : this.#failure(index, 0);
    if (err !== undefined) {
      record.end = "failed";
      throw err;
    }
    const tokens = this.#tokens(r);
    const choices = Array.from({ length: r.prompts.length * r.n }, (_, c) =>
      create(CompletionChoiceSchema, {
        index: c,
        text: Array.from({ length: tokens }, (_, t) => `t${t}`).join(""),
        tokenIds: Array.from({ length: tokens }, (_, t) => 100 + t),
        promptTokenIds: Array.from({ length: r.prompts[Math.floor(c / r.n)] ?? 0 }, (_, i) => i + 1),
        finishReason: FinishReason.LENGTH,
      }),
    );
    record.generated = tokens * choices.length;
    record.end = "done";
    const promptTokens = sum(r.prompts);
    const response = create(CreateCompletionResponseSchema, {
      id: "cmpl-memory",
      created: 1n,
      model,
      choices,
      ...((this.script.usage ?? true)
        ? {
            usage: create(UsageSchema, {
              promptTokens,
              completionTokens: record.generated,
              totalTokens: promptTokens + record.generated,
            }),
          }
        : {}),
    });
    return { response, activations: () => activationsOf(sum(r.prompts) + tokens - 1) };
  }

  async replay(
    _request: InferenceRequest,
    _continuousUsage: boolean,
    promptIds: readonly number[],
    generatedIds: readonly number[],
    call: CompleteCall,
  ): Promise<ReplayAnswer> {
    const positions = promptIds.length + generatedIds.length - 1;
    const { index, call: record } = this.#record("replay", positions, call);
    await Promise.resolve();
    await this.#hang(index, 0, call.signal);
    const err = call.signal.aborted ? abortError(call.signal) : this.#failure(index, 0);
    if (err !== undefined) {
      record.end = "failed";
      throw err;
    }
    record.end = "done";
    return { promptTokens: positions, activations: () => activationsOf(positions) };
  }

  async tokenize(_model: string, prompt: string, addSpecialTokens: boolean): Promise<TokenCount> {
    const count = memoryPromptTokens(prompt, addSpecialTokens);
    return { count, tokens: Array.from({ length: count }, (_, i) => i + 1), maxModelLen: 4096 };
  }

  async tokenizeText(_model: string, request: TokenizeRequest) {
    const { count, tokens } = await this.tokenize("", request.prompt ?? "", request.addSpecialTokens ?? true);
    return create(TokenizeResponseSchema, { count, tokens: [...tokens], maxModelLen: 4096 });
  }

  async detokenize(_model: string, request: { tokens: number[] }) {
    return create(DetokenizeResponseSchema, { prompt: request.tokens.map((t) => `<${t}>`).join("") });
  }
}
