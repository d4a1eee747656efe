import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { Compression, Dtype } from "../../gen/acs/v1/lens_pb.js";
import { limits } from "../../src/config/index.js";
import {
  checkLensShapes,
  createSteeringBudget,
  encodeTensor,
  type LensModelFacts,
  MAX_STEERING_NUMBERS,
  type TensorDtype,
} from "../../src/lens/index.js";
import { steeringDefaults } from "../helpers/config-defaults.js";
import { expectApiError } from "./api-error-expect.js";

const MiB = 2 ** 20;

describe("createSteeringBudget", () => {
  it("the configuration's defaults: 32 MiB per request (2^23 float32), 256 MiB in all", () => {
    const budget = createSteeringBudget(steeringDefaults);
    expect(budget.requestBytes).toBe(MAX_STEERING_NUMBERS * 4);
    expect(budget.requestBytes).toBe(limits.steeringRequestBytes);
    expect(budget.processBytes).toBe(256 * MiB);
  });

  it("counts leases in flight and the peak; release gives everything back, once", () => {
    const budget = createSteeringBudget({ requestBytes: 10, processBytes: 25 });
    const a = budget.lease();
    const b = budget.lease();
    a.reserve(10);
    b.reserve(4);
    b.reserve(6);
    expect([budget.inFlight, budget.peak, a.bytes, b.bytes]).toEqual([20, 20, 10, 10]);
    a.release();
    a.release();
    expect([budget.inFlight, budget.peak, a.bytes]).toEqual([10, 20, 0]);
    b.release();
    expect([budget.inFlight, budget.peak]).toEqual([0, 20]);
  });

  it("past what is left now: 429 rate_limited with Retry-After 1, nothing taken", () => {
    const budget = createSteeringBudget({ requestBytes: 10, processBytes: 25 });
    budget.lease().reserve(10);
    budget.lease().reserve(10);
    const third = budget.lease();
    const err = expectApiError(() => third.reserve(6), { code: "rate_limited", param: null, status: 429 });
    expect(err.type).toBe("rate_limit_error");
    expect(err.retry).toEqual({ retry: true, afterSeconds: 1 });
    expect(err.message).toBe(
      "The server is busy decoding the steering vectors of other requests (20 of 25 bytes in use); this request needs 6. Retry in 1 s.",
    );
    expect([budget.inFlight, third.bytes]).toEqual([20, 0]);
    third.reserve(5); // what is left still fits
    expect(budget.inFlight).toBe(25);
  });

  it("more than one request may hold, or than the whole process holds: 413 request_too_large", () => {
    const perRequest = createSteeringBudget({ requestBytes: 10, processBytes: 100 });
    const err = expectApiError(() => perRequest.lease().reserve(11), {
      code: "request_too_large",
      param: "apply_steering_vectors",
      status: 413,
      message:
        "The steering vectors of this request decode to 11 bytes, more than the 10 bytes one request may hold.",
    });
    expect(err.retry).toBeUndefined();
    const small = createSteeringBudget({ requestBytes: 100, processBytes: 50 });
    expectApiError(() => small.lease().reserve(51), {
      code: "request_too_large",
      param: "apply_steering_vectors",
    });
    expect([perRequest.inFlight, small.inFlight]).toEqual([0, 0]);
  });

  it("refuses bounds that are not positive integers", () => {
    expect(() => createSteeringBudget({ ...steeringDefaults, requestBytes: 0 })).toThrow(RangeError);
    expect(() => createSteeringBudget({ ...steeringDefaults, processBytes: 1.5 })).toThrow(RangeError);
  });
});

describe("checkLensShapes with a lease", () => {
  const model: LensModelFacts = { hiddenSize: 4096, numLayers: 32, maxModelLen: 1024 };
  const request = (vectors: Array<{ shape: number[]; dtype: TensorDtype; data?: Uint8Array }>) =>
    create(CreateCompletionRequestSchema, {
      model: "m",
      prompt: { case: "text", value: "x" },
      applySteeringVectors: vectors.map((v, i) => {
        const activations = encodeTensor(new Float32Array(v.shape.reduce((a, b) => a * b, 1)), v.shape, {
          dtype: v.dtype,
          compression: Compression.ZSTD,
        });
        if (v.data !== undefined) activations.data = v.data;
        return { activations, layerIndices: Array.from({ length: v.shape[0]! }, (_, k) => (k + i) % 32) };
      }),
    });

  it("reserves every vector's elements × its dtype's width, whatever the compression", () => {
    const budget = createSteeringBudget(steeringDefaults);
    const lease = budget.lease();
    checkLensShapes(
      request([
        { shape: [2, 4096], dtype: Dtype.FLOAT32 },
        { shape: [3, 5, 4096], dtype: Dtype.BFLOAT16 },
      ]),
      model,
      lease,
    );
    expect(lease.bytes).toBe(2 * 4096 * 4 + 3 * 5 * 4096 * 2);
    expect(budget.inFlight).toBe(lease.bytes);
  });

  it("reserves before inflating: a busy process answers 429 even for a frame that is not zstd", () => {
    const budget = createSteeringBudget({ ...steeringDefaults, processBytes: 40_000 });
    budget.lease().reserve(30_000);
    const notZstd = request([{ shape: [1, 4096], dtype: Dtype.FLOAT32, data: new Uint8Array([1, 2, 3]) }]);
    expectApiError(() => checkLensShapes(notZstd, model, budget.lease()), {
      code: "rate_limited",
      param: null,
    });
    // with room, the same request gets the frame's own refusal
    expectApiError(() => checkLensShapes(notZstd, model, createSteeringBudget(steeringDefaults).lease()), {
      code: "invalid_request",
      param: "apply_steering_vectors[0].activations",
    });
  });

  it("a shape refusal (400) comes before the budget", () => {
    const budget = createSteeringBudget({ ...steeringDefaults, processBytes: 1 });
    expectApiError(
      () => checkLensShapes(request([{ shape: [1, 8], dtype: Dtype.FLOAT32 }]), model, budget.lease()),
      {
        code: "invalid_request",
        param: "apply_steering_vectors[0].activations",
      },
    );
  });
});
