// The lens fan-out's pieces: which requests fan out, the parts (prompt, n = 1, seed s + k, index
// p × n + k), and mergeLimited (at most `concurrency` sources at once; the first failure aborts
// the others and is thrown once they have ended; a consumer that stops early waits for them too).
import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../src/core/errors/index.js";
import { checkFanOutSeed, fanOutParts, isLensFanOut, mergeLimited } from "../../src/service/lens-fan-out.js";
import {
  type InferenceRequest,
  type VllmClient,
  type VllmCompletionRequest,
  VllmInference,
} from "../../src/upstream/index.js";
import { until } from "../helpers/hang-guard.js";

const body = (over: Partial<VllmCompletionRequest>): VllmCompletionRequest =>
  ({ model: "m", prompt: "x", max_tokens: 2, n: 1, stream: false, ...over }) as VllmCompletionRequest;

/** The parts of a vLLM body's fan-out (the translator's bodies, read back as vLLM bodies). */
const vllmParts = (b: VllmCompletionRequest, shape: { prompts: number; n: number }) =>
  fanOutParts(new VllmInference({} as VllmClient), b as unknown as InferenceRequest, shape).map((p) => ({
    ...p,
    body: p.body as unknown as VllmCompletionRequest,
  }));

describe("isLensFanOut", () => {
  const req = (init: Parameters<typeof create<typeof CreateCompletionRequestSchema>>[1]) =>
    create(CreateCompletionRequestSchema, { model: "m", prompt: { case: "text", value: "x" }, ...init });
  it.each([
    [
      "capture, 1 prompt, n = 1",
      req({ outputResidualStream: { allLayers: true } }),
      { prompts: 1, n: 1 },
      false,
    ],
    ["capture, n = 2", req({ outputResidualStream: { allLayers: true } }), { prompts: 1, n: 2 }, true],
    [
      "steering, 2 prompts",
      req({ applySteeringVectors: [{ layerIndices: [0] }] }),
      { prompts: 2, n: 1 },
      true,
    ],
    ["no lens fields, 3 prompts × n = 4", req({}), { prompts: 3, n: 4 }, false],
  ])("%s", (_name, request, shape, want) => {
    expect(isLensFanOut(request, shape)).toBe(want);
  });
});

describe("checkFanOutSeed", () => {
  const max = 2n ** 63n - 1n;
  const capture = (seed: bigint) =>
    create(CreateCompletionRequestSchema, {
      model: "m",
      prompt: { case: "text", value: "x" },
      seed,
      outputResidualStream: { allLayers: true },
    });
  it("accepts seeds whose last sample stays an int64, at the edge too", () => {
    expect(() => checkFanOutSeed(capture(max - 1n), { prompts: 1, n: 2 })).not.toThrow();
    expect(() => checkFanOutSeed(capture(-(2n ** 63n)), { prompts: 3, n: 128 })).not.toThrow();
    expect(() => checkFanOutSeed(capture(max), { prompts: 2, n: 1 })).not.toThrow(); // k is 0 only
  });
  it("refuses a seed whose sample k would pass 2^63 − 1: 400 invalid_request, param seed", () => {
    let err: unknown;
    try {
      checkFanOutSeed(capture(max), { prompts: 1, n: 2 });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ApiError);
    expect(err).toMatchObject({ code: "invalid_request", param: "seed", status: 400 });
    expect((err as ApiError).message).toBe(
      `A request that captures or steers with n = 2 runs its samples with seeds seed, seed + 1, …, seed + 1, so seed must be at most ${max - 1n}, but it is ${max}.`,
    );
  });
  it("leaves a request without lens fields alone (Inference samples n itself)", () => {
    const plain = create(CreateCompletionRequestSchema, {
      model: "m",
      prompt: { case: "text", value: "x" },
      seed: max,
    });
    expect(() => checkFanOutSeed(plain, { prompts: 1, n: 4 })).not.toThrow();
  });
});

describe("fanOutParts", () => {
  it("gives prompt p, sample k index p × n + k, that prompt alone, n = 1 and seed s + k", () => {
    const parts = vllmParts(body({ prompt: ["a", "b"], n: 3, seed: 10n }), { prompts: 2, n: 3 });
    expect(parts.map((p) => [p.index, p.prompt, p.body.prompt, p.body.n, p.body.seed])).toEqual([
      [0, 0, "a", 1, 10n],
      [1, 0, "a", 1, 11n],
      [2, 0, "a", 1, 12n],
      [3, 1, "b", 1, 10n],
      [4, 1, "b", 1, 11n],
      [5, 1, "b", 1, 12n],
    ]);
  });

  it("keeps one prompt whole (a token list is one prompt), sets no seed without one, and adds exactly past int64", () => {
    const ids = vllmParts(body({ prompt: [5, 6, 7], n: 2 }), { prompts: 1, n: 2 });
    expect(ids.map((p) => p.body.prompt)).toEqual([
      [5, 6, 7],
      [5, 6, 7],
    ]);
    expect(ids.every((p) => p.body.seed === undefined && !("seed" in p.body))).toBe(true);
    const lists = vllmParts(body({ prompt: [[1], [2, 3]] }), { prompts: 2, n: 1 });
    expect(lists.map((p) => p.body.prompt)).toEqual([[1], [2, 3]]);
    const max = 2n ** 63n - 1n;
    const big = vllmParts(body({ prompt: "x", n: 2, seed: max }), { prompts: 1, n: 2 });
    expect(big.map((p) => p.body.seed)).toEqual([max, max + 1n]);
  });
});

/** A source that yields `items` once `gate` opens, counting how many sources run at once. */
function gated(
  state: { running: number; most: number; aborted: number },
  gate: Promise<void>,
  items: number[],
) {
  return async function* (signal: AbortSignal) {
    state.running++;
    state.most = Math.max(state.most, state.running);
    try {
      await Promise.race([
        gate,
        new Promise<void>((_, reject) => signal.addEventListener("abort", () => reject(signal.reason))),
      ]);
      yield* items;
    } catch (err) {
      state.aborted++;
      throw err;
    } finally {
      state.running--;
    }
  };
}

describe("mergeLimited", () => {
  it("runs at most `concurrency` sources at once and yields every item", async () => {
    const state = { running: 0, most: 0, aborted: 0 };
    let open = (): void => {};
    const gate = new Promise<void>((resolve) => {
      open = resolve;
    });
    const sources = [0, 1, 2, 3, 4].map((i) => gated(state, gate, [i * 10, i * 10 + 1]));
    const got: number[] = [];
    const done = (async () => {
      for await (const item of mergeLimited(sources, 2, new AbortController().signal)) got.push(item);
    })();
    await until(() => state.running >= 2, "two sources running");
    expect(state.most).toBe(2);
    open();
    await done;
    expect(state.most).toBe(2);
    expect(got.sort((a, b) => a - b)).toEqual([0, 1, 10, 11, 20, 21, 30, 31, 40, 41]);
  });

  it("aborts the others on the first failure and throws it once they have ended", async () => {
    const state = { running: 0, most: 0, aborted: 0 };
    const never = new Promise<void>(() => {});
    const boom = new Error("boom");
    const sources = [
      gated(state, never, [1]),
      gated(state, never, [2]),
      async function* () {
        await until(() => state.running === 2, "both others running");
        yield 3;
        throw boom;
      },
    ];
    await expect(
      (async () => {
        for await (const _ of mergeLimited(sources, 3, new AbortController().signal)) {
          // drain
        }
      })(),
    ).rejects.toBe(boom);
    expect(state.aborted).toBe(2);
    expect(state.running).toBe(0);
  });

  it("aborts every source when the caller's signal aborts, and when the consumer stops early", async () => {
    const state = { running: 0, most: 0, aborted: 0 };
    const never = new Promise<void>(() => {});
    const caller = new AbortController();
    const reason = new Error("caller went away");
    const run = (async () => {
      for await (const _ of mergeLimited(
        [gated(state, never, [1]), gated(state, never, [2])],
        2,
        caller.signal,
      )) {
        // drain
      }
    })();
    await until(() => state.running === 2, "both running");
    caller.abort(reason);
    await expect(run).rejects.toBe(reason);
    expect([state.aborted, state.running]).toEqual([2, 0]);

    const early = { running: 0, most: 0, aborted: 0 };
    const it = mergeLimited(
      [gated(early, Promise.resolve(), [1]), gated(early, never, [2])],
      2,
      new AbortController().signal,
    );
    expect((await it.next()).value).toBe(1);
    await it.return(undefined);
    expect([early.aborted, early.running]).toEqual([1, 0]);
  });
});
