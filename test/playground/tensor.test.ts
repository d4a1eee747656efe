// The page's tensor decoder (src/playground/tensor.ts, run here under Node) against the
// gateway's encoder: every dtype, raw and zstd, values exact; plain arrays; refusals.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { Compression, Dtype } from "../../gen/acs/v1/lens_pb.js";
import {
  encodeTensor,
  rawBytesToFloat32,
  tensorRawBytes,
  tensorToVllmLensJson,
} from "../../src/lens/index.js";
import { decodeTensor, halfToFloat, TensorDecodeError } from "../../src/playground/tensor.js";

const dtypes = [Dtype.BFLOAT16, Dtype.FLOAT16, Dtype.FLOAT32] as const;
const compressions = [Compression.UNSPECIFIED, Compression.ZSTD] as const;

describe("the playground's tensor decoder", () => {
  for (const dtype of dtypes) {
    for (const compression of compressions) {
      it(`reads what the gateway writes: dtype ${Dtype[dtype]}, compression ${Compression[compression]}`, () => {
        fc.assert(
          fc.property(
            fc.integer({ min: 1, max: 4 }),
            fc.integer({ min: 1, max: 9 }),
            fc.array(fc.float({ noNaN: true, min: -6e4, max: 6e4 }), { minLength: 36, maxLength: 36 }),
            (layers, hidden, pool) => {
              const values = Array.from({ length: layers * 2 * hidden }, (_, i) => pool[i % pool.length]!);
              const tensor = encodeTensor(values, [layers, 2, hidden], { dtype, compression });
              const json = tensorToVllmLensJson(tensor);
              const decoded = decodeTensor(JSON.parse(JSON.stringify(json)));
              expect(decoded.shape).toEqual([layers, 2, hidden]);
              // The gateway's own reading of the same bytes: identical float32 values.
              expect(decoded.values).toEqual(rawBytesToFloat32(tensorRawBytes(tensor), dtype));
            },
          ),
          { numRuns: 40 },
        );
      });
    }
  }

  it("reads every half-precision bit pattern as the gateway does", () => {
    const bits = new Uint16Array(65536).map((_, i) => i);
    const reference = rawBytesToFloat32(new Uint8Array(bits.buffer), Dtype.FLOAT16);
    for (let i = 0; i < 65536; i++) {
      const mine = halfToFloat(i);
      if (Number.isNaN(reference[i]!)) expect(mine).toBeNaN();
      else expect(Object.is(Math.fround(mine), reference[i]!)).toBe(true);
    }
  });

  it("reads plain nested arrays and refuses ragged ones", () => {
    expect(
      decodeTensor([
        [1, 2],
        [3, 4.5],
      ]),
    ).toEqual({ values: Float32Array.from([1, 2, 3, 4.5]), shape: [2, 2] });
    expect(() => decodeTensor([[1, 2], [3]])).toThrow(TensorDecodeError);
  });

  it("refuses bytes that do not match the shape", () => {
    const json = tensorToVllmLensJson(encodeTensor([1, 2, 3, 4], [4]));
    expect(() => decodeTensor({ ...json, shape: [5] })).toThrow(
      "shape [5] holds 5 numbers but the data has 16 bytes",
    );
  });
});
