// Per-key admission: caps on requests, streams and a model's share, each refusal a 429 that names
// its cap; every ticket gives its place back exactly once.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { ApiError } from "../../src/core/errors/index.js";
import {
  ADMISSION_RETRY_AFTER_SECONDS,
  type AdmissionTicket,
  createAdmission,
  upstreamShareCap,
} from "../../src/service/index.js";
import { admissionDefaults } from "../helpers/config-defaults.js";

const model = { modelId: "acs/tiny", modelCapacity: 1000 };
const unary = { ...model, stream: false };
const stream = { ...model, stream: true };

function refusal(fn: () => unknown): ApiError {
  try {
    fn();
  } catch (err) {
    if (err instanceof ApiError) return err;
    throw err;
  }
  throw new Error("admitted");
}

describe("createAdmission", () => {
  it("refuses the request past the per-key request cap with a 429 that names it, and admits again after a release", () => {
    const admission = createAdmission({
      maxRequestsPerKey: 3,
      maxStreamsPerKey: 0,
      maxUpstreamSharePerKey: 1,
    });
    const held = [admission.admit("k", unary), admission.admit("k", stream), admission.admit("k", unary)];
    const err = refusal(() => admission.admit("k", unary));
    expect(err.code).toBe("rate_limited");
    expect(err.status).toBe(429);
    expect(err.type).toBe("rate_limit_error");
    expect(err.param).toBeNull();
    expect(err.retry).toEqual({ retry: true, afterSeconds: ADMISSION_RETRY_AFTER_SECONDS });
    expect(err.message).toBe(
      "This key already has 3 requests in flight: the per-key request cap is 3 concurrent requests (streamed or not). Retry when one of them has finished.",
    );
    // Another key is not affected.
    admission.admit("other", unary).release();
    held[1]?.release();
    const again = admission.admit("k", unary);
    expect(admission.inFlight("k").requests).toBe(3);
    for (const t of [...held, again]) t.release();
    expect(admission.inFlight("k")).toEqual({ requests: 0, streams: 0, byModel: new Map() });
    expect(admission.activeKeys).toBe(0);
  });

  it("caps streams apart from requests: a stream past the stream cap is refused, a unary request is not", () => {
    const admission = createAdmission({
      maxRequestsPerKey: 10,
      maxStreamsPerKey: 2,
      maxUpstreamSharePerKey: 1,
    });
    admission.admit("k", stream);
    admission.admit("k", stream);
    const err = refusal(() => admission.admit("k", stream));
    expect(err.code).toBe("rate_limited");
    expect(err.message).toBe(
      "This key already has 2 streams open: the per-key stream cap is 2 concurrent streams. Retry when one of them has finished.",
    );
    expect(() => admission.admit("k", unary)).not.toThrow();
    expect(admission.inFlight("k")).toMatchObject({ requests: 3, streams: 2 });
  });

  it("caps a key's requests on one model at its share of the model's capacity, per model", () => {
    const admission = createAdmission({
      maxRequestsPerKey: 0,
      maxStreamsPerKey: 0,
      maxUpstreamSharePerKey: 0.5,
    });
    const small = { modelId: "m", modelCapacity: 5, stream: false };
    admission.admit("k", small);
    admission.admit("k", small);
    const err = refusal(() => admission.admit("k", { ...small, stream: true }));
    expect(err.code).toBe("rate_limited");
    expect(err.message).toBe(
      "This key already has 2 requests in flight on m: the per-key share of a model's capacity is 50% of its 5 concurrent requests, 2 requests. Retry when one of them has finished.",
    );
    // Another model, another key: their own counts.
    expect(() => admission.admit("k", { ...small, modelId: "n" })).not.toThrow();
    expect(() => admission.admit("j", small)).not.toThrow();
    expect(admission.inFlight("k").byModel).toEqual(
      new Map([
        ["m", 2],
        ["n", 1],
      ]),
    );
  });

  it("says each count in the singular when it is 1 (a cap of 1)", () => {
    const admission = createAdmission({
      maxRequestsPerKey: 1,
      maxStreamsPerKey: 1,
      maxUpstreamSharePerKey: 0.5,
    });
    const one = { modelId: "m", modelCapacity: 1, stream: false };
    const first = admission.admit("k", one);
    expect(refusal(() => admission.admit("k", one)).message).toBe(
      "This key already has 1 request in flight: the per-key request cap is 1 concurrent request (streamed or not). Retry when one of them has finished.",
    );
    first.release();
    const loose = createAdmission({ maxRequestsPerKey: 0, maxStreamsPerKey: 1, maxUpstreamSharePerKey: 0.5 });
    loose.admit("k", { ...one, modelCapacity: 10, stream: true });
    expect(refusal(() => loose.admit("k", { ...one, modelCapacity: 10, stream: true })).message).toBe(
      "This key already has 1 stream open: the per-key stream cap is 1 concurrent stream. Retry when one of them has finished.",
    );
    const small = { ...one, modelId: "p" };
    loose.admit("k", small);
    expect(refusal(() => loose.admit("k", small)).message).toBe(
      "This key already has 1 request in flight on p: the per-key share of a model's capacity is 50% of its 1 concurrent request, 1 request. Retry when one of them has finished.",
    );
  });

  it("counts a lens fan-out's Inference requests in the share, at most the share itself", () => {
    const admission = createAdmission({
      maxRequestsPerKey: 0,
      maxStreamsPerKey: 0,
      maxUpstreamSharePerKey: 0.5,
    });
    const on = { modelId: "m", modelCapacity: 8, stream: false }; // share: 4 Inference requests
    const fanOut = admission.admit("k", { ...on, upstreamRequests: 3 });
    expect(fanOut.upstreamRequests).toBe(3);
    expect(refusal(() => admission.admit("k", { ...on, upstreamRequests: 3 })).code).toBe("rate_limited");
    const one = admission.admit("k", on); // 3 + 1 = 4
    expect(admission.inFlight("k").byModel.get("m")).toBe(4);
    expect(refusal(() => admission.admit("k", on)).code).toBe("rate_limited");
    fanOut.release();
    one.release();
    // A fan-out wider than the share runs at the share: admitted alone, not beside anything.
    const wide = admission.admit("k", { ...on, upstreamRequests: 100 });
    expect(wide.upstreamRequests).toBe(4);
    expect(refusal(() => admission.admit("k", on)).code).toBe("rate_limited");
    wide.release();
    expect(admission.inFlight("k").byModel.size).toBe(0);
  });

  it("names the first cap broken: requests, then streams, then the share", () => {
    const admission = createAdmission({
      maxRequestsPerKey: 1,
      maxStreamsPerKey: 1,
      maxUpstreamSharePerKey: 0.001,
    });
    admission.admit("k", stream);
    expect(refusal(() => admission.admit("k", stream)).message).toContain("per-key request cap is 1");
  });

  it("a share cap is ⌊share × capacity⌋, at least 1", () => {
    expect(upstreamShareCap(0.5, 16_384)).toBe(8192);
    expect(upstreamShareCap(0.5, 5)).toBe(2);
    expect(upstreamShareCap(0.1, 3)).toBe(1);
    expect(upstreamShareCap(1, 7)).toBe(7);
  });

  it("0 means no cap for counts; bad limits are refused", () => {
    const admission = createAdmission({
      maxRequestsPerKey: 0,
      maxStreamsPerKey: 0,
      maxUpstreamSharePerKey: 1,
    });
    for (let i = 0; i < 500; i++) admission.admit("k", stream);
    expect(admission.inFlight("k").streams).toBe(500);
    expect(() => createAdmission({ ...admissionDefaults, maxRequestsPerKey: -1 })).toThrow(RangeError);
    expect(() => createAdmission({ ...admissionDefaults, maxStreamsPerKey: 1.5 })).toThrow(RangeError);
    expect(() => createAdmission({ ...admissionDefaults, maxUpstreamSharePerKey: 0 })).toThrow(RangeError);
    expect(() => createAdmission({ ...admissionDefaults, maxUpstreamSharePerKey: 1.5 })).toThrow(RangeError);
  });

  it("property: any interleaving of admits and (repeated) releases keeps exact counts within the caps", () => {
    type Op =
      | { kind: "admit"; key: number; stream: boolean; model: number }
      | { kind: "release"; pick: number };
    const op: fc.Arbitrary<Op> = fc.oneof(
      fc.record({
        kind: fc.constant("admit" as const),
        key: fc.integer({ min: 0, max: 2 }),
        stream: fc.boolean(),
        model: fc.integer({ min: 0, max: 1 }),
      }),
      fc.record({ kind: fc.constant("release" as const), pick: fc.nat() }),
    );
    fc.assert(
      fc.property(fc.array(op, { maxLength: 200 }), (ops) => {
        const limits = { maxRequestsPerKey: 5, maxStreamsPerKey: 3, maxUpstreamSharePerKey: 0.5 };
        const admission = createAdmission(limits);
        const tickets: Array<{ t: AdmissionTicket; key: string; stream: boolean; model: string }> = [];
        const live = new Set<number>();
        for (const o of ops) {
          if (o.kind === "admit") {
            const key = `k${o.key}`;
            const m = `m${o.model}`;
            const now = [...live].map((i) => tickets[i]).filter((x) => x?.key === key);
            const expectOk =
              now.length < 5 &&
              (!o.stream || now.filter((x) => x?.stream).length < 3) &&
              now.filter((x) => x?.model === m).length < 4;
            try {
              const t = admission.admit(key, { stream: o.stream, modelId: m, modelCapacity: 8 });
              expect(expectOk).toBe(true);
              tickets.push({ t, key, stream: o.stream, model: m });
              live.add(tickets.length - 1);
            } catch (err) {
              expect(expectOk).toBe(false);
              expect((err as ApiError).code).toBe("rate_limited");
            }
          } else if (tickets.length > 0) {
            const i = o.pick % tickets.length;
            tickets[i]?.t.release(); // a second release of the same ticket changes nothing
            live.delete(i);
          }
        }
        for (const k of ["k0", "k1", "k2"]) {
          const now = [...live].map((i) => tickets[i]).filter((x) => x?.key === k);
          const f = admission.inFlight(k);
          expect(f.requests).toBe(now.length);
          expect(f.streams).toBe(now.filter((x) => x?.stream).length);
        }
        for (const i of live) tickets[i]?.t.release();
        expect(admission.activeKeys).toBe(0);
      }),
      { numRuns: 300 },
    );
  });
});
