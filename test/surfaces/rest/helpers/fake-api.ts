import { setTimeout as sleep } from "node:timers/promises";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import {
  type CreateCompletionRequest,
  CreateCompletionResponseSchema,
  DetokenizeResponseSchema,
  FinishReason,
  ListModelsResponseSchema,
  type StreamCompletionResponse,
  StreamCompletionResponseSchema,
  TokenizeResponseSchema,
} from "../../../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../../../src/core/errors/index.js";
import { modelNotFound } from "../../../../src/service/index.js";
import type { CallContext, CompletionsApi } from "../../../../src/service/types.js";

type StreamCompletionInit = Exclude<
  MessageInitShape<typeof StreamCompletionResponseSchema>,
  StreamCompletionResponse
>;

export const head = { id: "cmpl-0123456789abcdef0123456789abcdef", created: 1_700_000_000n };
export const headJson = { id: head.id, object: "text_completion", created: 1_700_000_000 };

/** Options of {@link createFakeApi}. */
export interface FakeApiOptions {
  /** The api's `authenticate` (default: accepts every caller). */
  authenticate?: (ctx: CallContext) => void;
  /** How long the `queued` and `late-refusal` streams wait before their first chunk or refusal. */
  firstChunkDelayMs?: number;
  /**
   * When given, the `queued` stream holds its first chunk, and the `keepalive` stream its second,
   * until this settles (instead of sleeping): a test can see what reaches the client meanwhile.
   */
  gate?: Promise<void>;
}

/** The refusal of the `late-refusal` stream (after `firstChunkDelayMs`). */
export const lateRefusal = () =>
  new ApiError("invalid_request", "Invalid value for 'max_tokens': too many.", { param: "max_tokens" });

/**
 * A CompletionsApi with canned protos (the interface's contract), steered by the request's model:
 * `missing` → 404 (the service's wording), `boom` → a non-ApiError, `clamp` sets a header, `fail-mid` fails after a chunk,
 * `slow` streams one chunk then waits for the caller to go away (however long), `queued` streams
 * after `firstChunkDelayMs` or `gate`, `keepalive` pauses 120 ms or until `gate` between its chunks, `late-refusal` refuses (400) after `firstChunkDelayMs`; `slow-check` refuses
 * and `slow-clamp` clamps while still checking, after `firstChunkDelayMs`.
 */
export function createFakeApi(options: FakeApiOptions = {}) {
  const { firstChunkDelayMs = 150 } = options;
  const calls: { method: string; request?: CreateCompletionRequest; ctx: CallContext }[] = [];
  const events: string[] = [];
  /** The contexts `authenticate` was called with, in order. */
  const authenticated: CallContext[] = [];
  const refuse = (model: string): void => {
    if (model === "missing") {
      throw modelNotFound(model);
    }
    if (model === "boom") throw new Error("secret internals");
  };
  const chunk = (init: Omit<StreamCompletionInit, "id" | "created" | "model">, model: string) =>
    create(StreamCompletionResponseSchema, { ...init, ...head, model });

  const api: CompletionsApi = {
    authenticate(ctx) {
      authenticated.push(ctx);
      options.authenticate?.(ctx);
    },
    async createCompletion(request, ctx) {
      calls.push({ method: "createCompletion", request, ctx });
      refuse(request.model);
      if (request.model === "clamp") ctx.setResponseHeader("X-Acs-Max-Tokens-Clamped", "7");
      return create(CreateCompletionResponseSchema, {
        ...head,
        model: request.model,
        choices: [
          {
            index: 0,
            text: " blue.",
            finishReason: FinishReason.STOP,
            stopReason: { case: "stopString", value: "\n" },
          },
        ],
        usage: { promptTokens: 4, completionTokens: 2, totalTokens: 6 },
      });
    },
    async *streamCompletion(request, ctx): AsyncGenerator<StreamCompletionResponse> {
      calls.push({ method: "streamCompletion", request, ctx });
      try {
        refuse(request.model);
        if (request.model === "clamp") ctx.setResponseHeader("X-Acs-Max-Tokens-Clamped", "7");
        // Checks that take longer than a keepalive interval (e.g. counting a huge prompt's tokens).
        if (request.model === "slow-check" || request.model === "slow-clamp") {
          await sleep(firstChunkDelayMs);
          if (request.model === "slow-check") throw lateRefusal();
          ctx.setResponseHeader("X-Acs-Max-Tokens-Clamped", "3");
        }
        // Like the service: every check passed, Inference is called next.
        ctx.onPrepared?.();
        if (request.model === "queued" && options.gate) {
          await options.gate;
        } else if (request.model === "queued" || request.model === "late-refusal") {
          await sleep(firstChunkDelayMs);
          if (request.model === "late-refusal") throw lateRefusal();
        }
        yield chunk({ choices: [{ index: 0, text: " blue" }] }, request.model);
        if (request.model === "fail-mid")
          throw new ApiError("upstream_error", "Inference failed mid-stream.");
        if (request.model === "slow") {
          await new Promise<void>((resolve) => {
            if (ctx.signal.aborted) resolve();
            ctx.signal.addEventListener("abort", () => resolve(), { once: true });
          });
          events.push("aborted");
          // As the real service does: an aborted call ends with `canceled`.
          throw new ApiError("canceled", "The call was canceled.");
        }
        if (request.model === "keepalive") await (options.gate ?? sleep(120));
        yield chunk({ choices: [{ index: 0, text: ".", finishReason: FinishReason.LENGTH }] }, request.model);
        if (request.streamOptions?.includeUsage) {
          yield chunk({ usage: { promptTokens: 4, completionTokens: 2, totalTokens: 6 } }, request.model);
        }
      } finally {
        events.push("finally");
      }
    },
    async listModels(ctx) {
      calls.push({ method: "listModels", ctx });
      return create(ListModelsResponseSchema, {
        data: [
          {
            id: "meta-llama/Llama-3.1-8B",
            created: 1_720_000_000n,
            ownedBy: "acs",
            aliases: ["llama-8b"],
            maxModelLen: 131072,
            hiddenSize: 4096,
            numHiddenLayers: 32,
          },
        ],
      });
    },
    async tokenize(request, ctx) {
      calls.push({ method: "tokenize", ctx });
      refuse(request.model);
      return create(TokenizeResponseSchema, { count: 2, maxModelLen: 131072, tokens: [128000, 9906] });
    },
    async detokenize(request, ctx) {
      calls.push({ method: "detokenize", ctx });
      refuse(request.model);
      return create(DetokenizeResponseSchema, { prompt: "Hello" });
    },
  };
  return { api, calls, events, authenticated };
}
