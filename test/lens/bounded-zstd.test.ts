import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { compress, decompress } from "zstd-napi";
import { zstdCompress, zstdDecompressExact } from "../../src/lens/bounded-zstd.js";
import { TensorRefusal } from "../../src/lens/tensor-refusal.js";
import { rleZstdFrame } from "./zstd-frames.js";
import { type Inflation, watchInflation } from "./zstd-inflation.js";

function refusal(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(TensorRefusal);
    return (err as Error).message;
  }
  return expect.fail("expected a TensorRefusal");
}

const payload = Buffer.from(Array.from({ length: 10_000 }, (_, i) => (i * 7919) % 251));

describe("zstdCompress / zstdDecompressExact", () => {
  it("round-trips, writes the content size, and matches zstd-napi's own decoder", () => {
    const frame = zstdCompress(payload);
    expect(frame.length).toBeLessThan(payload.length);
    expect(Buffer.from(decompress(frame)).equals(payload)).toBe(true);
    expect(Buffer.from(zstdDecompressExact(frame, payload.length)).equals(payload)).toBe(true);
    // content size in the header: bytes 5…6 hold it for this size (FCS flag in the descriptor)
    expect(frame[4]! >> 6).toBeGreaterThan(0);
  });

  it("reads a frame that declares no content size (streaming compressors)", () => {
    const frame = rleZstdFrame(3, 0x41);
    expect(decompress(frame).length).toBe(3 * 131072); // the hand-built frame is valid zstd
    const out = zstdDecompressExact(frame, 3 * 131072);
    expect(out.every((b) => b === 0x41)).toBe(true);
  });

  it("reads an empty payload", () => {
    expect(zstdDecompressExact(zstdCompress(new Uint8Array(0)), 0).length).toBe(0);
  });

  const cases: Array<[string, () => Uint8Array, number, RegExp]> = [
    ["declared size too big", () => compress(payload), 100, /the zstd frame declares 10000 bytes/],
    ["declared size too small", () => compress(payload), 20_000, /the zstd frame declares 10000 bytes/],
    ["undeclared, inflates to more", () => rleZstdFrame(2), 131072, /inflates to more than 131072 bytes/],
    ["undeclared, inflates to less", () => rleZstdFrame(2), 3 * 131072, /truncated|inflates to only/],
    ["truncated frame", () => compress(payload).subarray(0, 20), 10_000, /truncated|not a valid zstd frame/],
    ["not zstd at all", () => Buffer.from("hello world, not zstd"), 10, /not a zstd frame/],
    ["empty input", () => new Uint8Array(0), 10, /not a zstd frame|truncated/],
    [
      "bytes after the frame",
      () => Buffer.concat([compress(payload), Buffer.from([1, 2, 3])]),
      10_000,
      /3 bytes follow/,
    ],
    [
      "two frames",
      () => Buffer.concat([compress(payload), compress(payload)]),
      10_000,
      /bytes follow the zstd frame/,
    ],
  ];
  it.each(cases)("refuses: %s", (_name, frame, expected, message) => {
    expect(refusal(() => zstdDecompressExact(frame(), expected))).toMatch(message);
  });
});

describe("zstd bombs", () => {
  let inflation: Inflation;
  beforeEach(() => {
    inflation = watchInflation();
  });
  afterEach(() => inflation.stop());

  it("a 32 KiB frame that inflates to 1 GiB (no declared size) is refused once the cap is passed", () => {
    const bomb = rleZstdFrame(8192);
    expect(bomb.length).toBeLessThan(33 * 1024);
    const before = process.memoryUsage().arrayBuffers;
    expect(refusal(() => zstdDecompressExact(bomb, 16_384))).toMatch(/inflates to more than 16384 bytes/);
    // inflating stopped at the cap: one 128 KiB RLE block read at most, not 8192; the bytes
    // produced are the 16384 expected plus the few that showed the excess
    expect(inflation.consumed).toBeLessThanOrEqual(6 + 4);
    expect(inflation.produced).toBeGreaterThan(16_384);
    expect(inflation.produced).toBeLessThanOrEqual(16_384 + 64);
    expect(process.memoryUsage().arrayBuffers - before).toBeLessThan(8 * 1024 * 1024);
  });

  it("a frame that declares 4 GiB is refused from its header, before inflating anything", () => {
    const bomb = rleZstdFrame(8, 0, 2n ** 32n);
    expect(refusal(() => zstdDecompressExact(bomb, 32_768))).toMatch(/declares 4294967296 bytes/);
    expect(inflation.calls).toBe(0);
  });

  it("a frame that declares the expected size but inflates to 1 GiB is refused", () => {
    const bomb = rleZstdFrame(8192, 0, 16_384n);
    expect(refusal(() => zstdDecompressExact(bomb, 16_384))).toMatch(
      /inflates to more than|not a valid zstd/,
    );
  });

  it("a frame asking for a 64 MiB window (zstd's default limit allows 128 MiB) is refused for a small tensor", () => {
    const frame = rleZstdFrame(1);
    frame[5] = 16 << 3; // windowLog 26
    expect(decompress(frame).length).toBe(131072); // valid for an unbounded decoder
    expect(refusal(() => zstdDecompressExact(frame, 131072))).toMatch(/not a valid zstd frame \(.*memory/i);
  });
});
