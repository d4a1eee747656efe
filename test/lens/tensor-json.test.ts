import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { Compression, Dtype, TensorSchema } from "../../gen/acs/v1/lens_pb.js";
import { zstdCompress } from "../../src/lens/bounded-zstd.js";
import {
  checkLensShapes,
  decodeTensor,
  encodeTensor,
  MAX_REQUEST_TENSOR_ELEMENTS,
  MAX_STEERING_NUMBERS,
  parseTensorJson,
  type TensorDtype,
  tensorFromVllmLensJson,
  tensorToVllmLensJson,
} from "../../src/lens/index.js";
import { firstDifference, independentDecoders } from "../helpers/decode-tensor.js";
import { expectApiError } from "./api-error-expect.js";
import { rleZstdFrame } from "./zstd-frames.js";
import { watchInflation } from "./zstd-inflation.js";

const P = "apply_steering_vectors[0].activations";
const b64 = (bytes: Uint8Array): string => Buffer.from(bytes).toString("base64");
const f32bytes = (values: number[]): Uint8Array => new Uint8Array(Float32Array.from(values).buffer);

describe("parseTensorJson: nested arrays", () => {
  it("2D → FLOAT32 raw, C order", () => {
    const t = parseTensorJson(
      [
        [1, 2, 3],
        [4, 5, 6.5],
      ],
      P,
    );
    expect({ dtype: t.dtype, shape: t.shape, compression: t.compression }).toEqual({
      dtype: Dtype.FLOAT32,
      shape: [2, 3],
      compression: Compression.UNSPECIFIED,
    });
    expect(Array.from(decodeTensor(t))).toEqual([1, 2, 3, 4, 5, 6.5]);
  });

  it("3D", () => {
    const t = parseTensorJson([[[0.1, 2]], [[3, -1e-3]]], P);
    expect(t.shape).toEqual([2, 1, 2]);
    expect(Array.from(decodeTensor(t))).toEqual([Math.fround(0.1), 2, 3, Math.fround(-1e-3)]);
  });

  const refusals: Array<[string, unknown, string, string]> = [
    [
      "1D",
      [1, 2, 3],
      P,
      `Invalid value for '${P}': nested arrays of numbers must have 2 dimensions (layers, hidden) or 3 (layers, positions, hidden), not 1.`,
    ],
    [
      "4D",
      [[[[1]]]],
      P,
      `Invalid value for '${P}': nested arrays of numbers must have 2 dimensions (layers, hidden) or 3 (layers, positions, hidden), not 4.`,
    ],
    ["empty", [], P, `Invalid value for '${P}': the array is empty.`],
    ["empty row", [[]], P, `Invalid value for '${P}': the array at [0] is empty.`],
    [
      "ragged rows",
      [[1, 2], [3]],
      P,
      `Invalid value for '${P}': the arrays are not rectangular: [1] has 1 entry but [0] has 2.`,
    ],
    [
      "ragged 3D",
      [
        [
          [1, 2],
          [3, 4],
        ],
        [[1, 2], [3]],
      ],
      P,
      `Invalid value for '${P}': the arrays are not rectangular: [1][1] has 1 entry but [0][0] has 2.`,
    ],
    ["string element", [[1, "2"]], `${P}[0][1]`, `Invalid type for '${P}[0][1]': expected a number.`],
    ["null element", [[1, null]], `${P}[0][1]`, `Invalid type for '${P}[0][1]': expected a number.`],
    ["boolean element", [[true, 1]], `${P}[0][0]`, `Invalid type for '${P}[0][0]': expected a number.`],
    ["row not an array", [[1, 2], 3], `${P}[1]`, `Invalid type for '${P}[1]': expected an array.`],
    ["too deep somewhere", [[1, [2]]], `${P}[0][1]`, `Invalid type for '${P}[0][1]': expected a number.`],
    [
      "NaN",
      [[1, Number.NaN]],
      P,
      `Invalid value for '${P}': element [0][1] (NaN) is not a finite float32 number; every number must be finite.`,
    ],
    [
      "Infinity",
      [[Number.POSITIVE_INFINITY]],
      P,
      `Invalid value for '${P}': element [0][0] (Infinity) is not a finite float32 number; every number must be finite.`,
    ],
    [
      "beyond float32",
      [[1e39]],
      P,
      `Invalid value for '${P}': element [0][0] (1e+39) is not a finite float32 number; every number must be finite.`,
    ],
    [
      "a string",
      "abc",
      P,
      `Invalid type for '${P}': expected an array of arrays of numbers or a tensor object.`,
    ],
    ["a number", 5, P, `Invalid type for '${P}': expected an array of arrays of numbers or a tensor object.`],
    ["null", null, P, `Invalid type for '${P}': expected an array of arrays of numbers or a tensor object.`],
  ];
  it.each(refusals)("refuses %s", (_name, value, param, message) => {
    expectApiError(() => parseTensorJson(value, P), { code: "invalid_request", param, status: 400, message });
  });

  it("refuses more than 2^23 numbers before allocating", () => {
    const row = new Array(2 ** 12).fill(0);
    const big = new Array(2 ** 11 + 1).fill(row); // shares one row: cheap to build
    expectApiError(() => parseTensorJson([big], P), {
      code: "invalid_request",
      param: P,
      message: /more than 8388608/,
    });
  });

  it("a small ragged body whose first rows claim 2^23 numbers is refused without allocating them", () => {
    const first = [new Array(4096).fill(1)];
    const ragged = [first, ...new Array(2 ** 11 - 1).fill([[]])]; // 2048 × 1 × 4096 by its first rows
    const before = process.memoryUsage().arrayBuffers;
    expectApiError(() => parseTensorJson(ragged, P), {
      code: "invalid_request",
      param: P,
      message: /the array at \[1\]\[0\] is empty|not rectangular/,
    });
    expect(process.memoryUsage().arrayBuffers - before).toBeLessThan(16 * 1024 * 1024);
  });

  it("MAX_REQUEST_TENSOR_ELEMENTS is the request-wide steering cap", () => {
    expect(MAX_REQUEST_TENSOR_ELEMENTS).toBe(MAX_STEERING_NUMBERS);
  });
});

describe("parseTensorJson: the vllm-lens dict", () => {
  const values = [0.5, -1.25, 3, 1e-3, 2 ** -20, 65504];
  for (const [name, dtype] of [
    ["bf16", Dtype.BFLOAT16],
    ["f16", Dtype.FLOAT16],
    ["f32", Dtype.FLOAT32],
  ] as Array<[string, TensorDtype]>) {
    for (const compression of [Compression.UNSPECIFIED, Compression.ZSTD]) {
      it(`${name} ${compression === Compression.ZSTD ? "zstd" : "raw"}: our dict reads back to the same values`, () => {
        const original = encodeTensor(values, [2, 3], { dtype, compression });
        const json = JSON.parse(JSON.stringify(tensorToVllmLensJson(original)));
        const parsed = parseTensorJson(json, P);
        expect(parsed.dtype).toBe(dtype);
        expect(parsed.shape).toEqual([2, 3]);
        expect(parsed.compression).toBe(compression); // kept as sent; checkLensShapes inflates within the total
        expect(Array.from(decodeTensor(parsed))).toEqual(Array.from(decodeTensor(original)));
      });
    }
  }

  it("accepts the legacy form (no original_dtype, no compression) and int16 without original_dtype as bf16", () => {
    expect(
      Array.from(
        decodeTensor(parseTensorJson({ data: b64(f32bytes([1, 2])), dtype: "float32", shape: [1, 2] }, P)),
      ),
    ).toEqual([1, 2]);
    const bf = parseTensorJson(
      {
        data: b64(Uint8Array.of(0x80, 0x3f)),
        dtype: "int16",
        shape: [1, 1],
        compression: null,
        original_dtype: null,
      },
      P,
    );
    expect(bf.dtype).toBe(Dtype.BFLOAT16);
    expect(Array.from(decodeTensor(bf))).toEqual([1]);
  });

  const good = {
    data: b64(f32bytes([1, 2, 3, 4])),
    dtype: "float32",
    original_dtype: "torch.float32",
    shape: [2, 2],
    compression: null,
  };
  const refusals: Array<[string, Record<string, unknown>, string, string | RegExp]> = [
    [
      "unknown key",
      { ...good, device: "cuda" },
      P,
      `Invalid value for '${P}': unknown field 'device': a tensor object has only data, dtype, original_dtype, shape and compression.`,
    ],
    [
      "data missing",
      { ...good, data: undefined },
      `${P}.data`,
      `Invalid type for '${P}.data': expected a string.`,
    ],
    ["data a number", { ...good, data: 12 }, `${P}.data`, `Invalid type for '${P}.data': expected a string.`],
    [
      "dtype a number",
      { ...good, dtype: 3 },
      `${P}.dtype`,
      `Invalid type for '${P}.dtype': expected a string.`,
    ],
    [
      "shape a string",
      { ...good, shape: "2,2" },
      `${P}.shape`,
      `Invalid type for '${P}.shape': expected an array.`,
    ],
    [
      "shape of strings",
      { ...good, shape: ["2", "2"] },
      `${P}.shape[0]`,
      `Invalid type for '${P}.shape[0]': expected an integer.`,
    ],
    [
      "original_dtype a number",
      { ...good, original_dtype: 1 },
      `${P}.original_dtype`,
      /^Invalid type for '.*\.original_dtype': expected a string\.$/,
    ],
    [
      "compression true",
      { ...good, compression: true },
      `${P}.compression`,
      /^Invalid type for '.*\.compression': expected a string\.$/,
    ],
    [
      "dtype float64",
      { ...good, dtype: "float64" },
      P,
      `Invalid value for '${P}': dtype "float64" is not one of "float32", "float16", "int16" (bfloat16 bits).`,
    ],
    ["dtype bfloat16", { ...good, dtype: "bfloat16" }, P, /dtype "bfloat16" is not one of/],
    [
      "int16 that is not bf16",
      { ...good, dtype: "int16", original_dtype: "torch.int16" },
      P,
      `Invalid value for '${P}': dtype "int16" goes with original_dtype "torch.bfloat16" (or none), not "torch.int16".`,
    ],
    [
      "float32 said to be bf16",
      { ...good, original_dtype: "torch.bfloat16" },
      P,
      /dtype "float32" goes with original_dtype "torch.float32"/,
    ],
    [
      "compression gzip",
      { ...good, compression: "gzip" },
      P,
      `Invalid value for '${P}': compression "gzip" is not "zstd" or null.`,
    ],
    ["shape with a fraction", { ...good, shape: [2, 1.5] }, P, /shape dimension 1.5 is not an integer/],
    ["shape negative", { ...good, shape: [-2, -2] }, P, /shape dimension -2 is not an integer ≥ 0/],
    [
      "base64 with a space",
      { ...good, data: `${good.data.slice(0, 4)} ${good.data.slice(4)}` },
      P,
      /data is not strict base64/,
    ],
    ["base64 url-safe", { ...good, data: "AAA_AAAA" }, P, /data is not strict base64/],
    ["base64 without padding", { ...good, data: "AAAAAA" }, P, /data is not strict base64/],
    ["base64 with a bad character", { ...good, data: "AAAA!AAA" }, P, /data is not strict base64/],
    ["padding in the middle", { ...good, data: "AA==AAAA" }, P, /data is not strict base64/],
  ];
  it.each(refusals)("refuses %s", (_name, value, param, message) => {
    expectApiError(() => parseTensorJson(value, P), { code: "invalid_request", param, status: 400, message });
  });
});

describe("the vllm-lens dict, checked by checkLensShapes (the same words for REST and Connect)", () => {
  const good = {
    data: b64(f32bytes([1, 2, 3, 4])),
    dtype: "float32",
    original_dtype: "torch.float32",
    shape: [2, 2],
    compression: null,
  };
  const bomb = b64(rleZstdFrame(8192));
  /** Parses a REST dict, then runs the checks both surfaces share, on a model shaped to fit it. */
  function parseAndCheck(value: Record<string, unknown>): void {
    const tensor = parseTensorJson(value, P);
    const layers = Math.max(1, tensor.shape[0] ?? 1);
    const request = create(CreateCompletionRequestSchema, {
      model: "m",
      prompt: { case: "text", value: "x" },
      applySteeringVectors: [
        { activations: tensor, layerIndices: Array.from({ length: layers }, (_, i) => i) },
      ],
    });
    const hiddenSize = tensor.shape[tensor.shape.length - 1] ?? 1;
    checkLensShapes(request, { hiddenSize, numLayers: layers, maxModelLen: 1024 });
  }
  const refusals: Array<[string, Record<string, unknown>, string, string | RegExp]> = [
    ["shape 4D", { ...good, shape: [1, 1, 2, 2] }, P, /must be 2D \(layers, hidden\) or 3D/],
    ["shape empty", { ...good, shape: [] }, P, /must be 2D \(layers, hidden\) or 3D/],
    [
      "too few bytes",
      { ...good, data: b64(new Uint8Array(100)), shape: [2, 4096] },
      P,
      `Invalid value for '${P}': shape [2, 4096] holds 8192 numbers (32768 bytes as float32) but data has 100 bytes.`,
    ],
    [
      "too many bytes",
      { ...good, shape: [2, 1] },
      P,
      `Invalid value for '${P}': shape [2, 1] holds 2 numbers (8 bytes as float32) but data has 16 bytes.`,
    ],
    [
      "bf16 width",
      { ...good, dtype: "int16", original_dtype: "torch.bfloat16" },
      P,
      /shape \[2, 2\] holds 4 numbers \(8 bytes as bfloat16\) but data has 16 bytes/,
    ],
    [
      "zstd that is not zstd",
      { ...good, compression: "zstd" },
      P,
      /holds 4 numbers \(16 bytes as float32\) but data is not a zstd frame/,
    ],
    [
      "zstd of the wrong size",
      { ...good, data: b64(zstdCompress(new Uint8Array(12))), compression: "zstd" },
      P,
      /but the zstd frame declares 12 bytes/,
    ],
    [
      "zstd bomb",
      { ...good, data: bomb, compression: "zstd" },
      P,
      `Invalid value for '${P}': shape [2, 2] holds 4 numbers (16 bytes as float32) but data inflates to more than 16 bytes.`,
    ],
    [
      "over 2^23 numbers",
      { ...good, shape: [4096, 4097] },
      "apply_steering_vectors",
      /hold 16781312 numbers in all, more than the 8388608/,
    ],
  ];
  it.each(refusals)("refuses %s", (_name, value, param, message) => {
    expectApiError(() => parseAndCheck(value), { code: "invalid_request", param, status: 400, message });
  });

  it("inflates a zstd frame only after the request's total of numbers passed (a bomb costs nothing)", () => {
    // 1 KiB that inflates to the 32 MiB its shape needs: 48 of them would be 1.5 GiB
    const frame = b64(rleZstdFrame(256));
    const many = create(CreateCompletionRequestSchema, {
      model: "m",
      prompt: { case: "text", value: "x" },
      applySteeringVectors: Array.from({ length: 48 }, (_, i) => ({
        activations: parseTensorJson(
          { data: frame, dtype: "float32", shape: [1, 2048, 4096], compression: "zstd" },
          P,
        ),
        layerIndices: [i % 32],
      })),
    });
    const before = process.memoryUsage().rss;
    const inflation = watchInflation();
    try {
      expectApiError(() => checkLensShapes(many, { hiddenSize: 4096, numLayers: 32, maxModelLen: 4096 }), {
        code: "invalid_request",
        param: "apply_steering_vectors",
        status: 400,
        message: /hold 402653184 numbers in all, more than the 8388608/,
      });
      expect(inflation.calls).toBe(0);
    } finally {
      inflation.stop();
    }
    expect(process.memoryUsage().rss - before).toBeLessThan(64 << 20);
  });
});

describe("tensorToVllmLensJson", () => {
  const cases: Array<[string, TensorDtype, Compression, object]> = [
    [
      "bf16 zstd",
      Dtype.BFLOAT16,
      Compression.ZSTD,
      { dtype: "int16", original_dtype: "torch.bfloat16", compression: "zstd" },
    ],
    [
      "bf16 raw",
      Dtype.BFLOAT16,
      Compression.UNSPECIFIED,
      { dtype: "int16", original_dtype: "torch.bfloat16", compression: null },
    ],
    [
      "f16 raw",
      Dtype.FLOAT16,
      Compression.UNSPECIFIED,
      { dtype: "float16", original_dtype: "torch.float16", compression: null },
    ],
    [
      "f32 zstd",
      Dtype.FLOAT32,
      Compression.ZSTD,
      { dtype: "float32", original_dtype: "torch.float32", compression: "zstd" },
    ],
  ];
  it.each(cases)("%s", (_name, dtype, compression, names) => {
    const tensor = encodeTensor([1, 2, 3, 4, 5, 6], [1, 2, 3], { dtype, compression });
    const json = tensorToVllmLensJson(tensor);
    expect(json).toEqual({ ...names, shape: [1, 2, 3], data: b64(tensor.data) });
    expect(Object.keys(json).sort()).toEqual(["compression", "data", "dtype", "original_dtype", "shape"]);
  });
});

describe("tensorFromVllmLensJson (Inference → proto)", () => {
  it("keeps a zstd frame's bytes as they are", () => {
    const frame = zstdCompress(new Uint8Array(new Uint16Array([0x3f80, 0xc000, 0x3dcd, 0x0000]).buffer));
    const t = tensorFromVllmLensJson({
      data: b64(frame),
      dtype: "int16",
      original_dtype: "torch.bfloat16",
      shape: [1, 2, 2],
      compression: "zstd",
    });
    expect({ dtype: t.dtype, shape: t.shape, compression: t.compression }).toEqual({
      dtype: Dtype.BFLOAT16,
      shape: [1, 2, 2],
      compression: Compression.ZSTD,
    });
    expect(Buffer.from(t.data).equals(frame)).toBe(true);
    expect(Array.from(decodeTensor(t))).toEqual([1, -2, Math.fround(0.10009765625), 0]);
  });

  it("ignores keys it does not know (e.g. a future transport field)", () => {
    const t = tensorFromVllmLensJson({ data: b64(f32bytes([7])), dtype: "float32", shape: [1], extra: 1 });
    expect(Array.from(decodeTensor(t))).toEqual([7]);
  });

  it("compresses again, with its size, a frame that declares none", () => {
    const t = tensorFromVllmLensJson({
      data: b64(rleZstdFrame(1, 0)),
      dtype: "float32",
      shape: [32768],
      compression: "zstd",
    });
    expect(t.compression).toBe(Compression.ZSTD);
    expect(t.data.length).toBeLessThan(1000);
    expect(t.data[4]! >> 6).toBeGreaterThan(0); // Frame_Content_Size_Flag set
    expect(decodeTensor(t).every((v) => v === 0)).toBe(true);
  });

  const malformed: Array<[string, unknown, RegExp]> = [
    ["not an object", "abc", /expected a tensor object, got a string/],
    ["binary transport handle", { handle: "h1", dtype: "int16", shape: [1] }, /\(data\): expected a string/],
    ["bad base64", { data: "@@@@", dtype: "float32", shape: [1] }, /not strict base64/],
    [
      "wrong length",
      { data: b64(f32bytes([1, 2])), dtype: "float32", shape: [3] },
      /holds 3 numbers \(12 bytes as float32\) but data decodes to 8 bytes/,
    ],
    [
      "declared size mismatch",
      { data: b64(zstdCompress(new Uint8Array(8))), dtype: "float32", shape: [3], compression: "zstd" },
      /declares 8 bytes/,
    ],
    ["unknown dtype", { data: "", dtype: "uint8", shape: [0] }, /dtype "uint8"/],
    ["huge shape", { data: "", dtype: "int16", shape: [64, 32768, 4096] }, /more than 33554432/],
    [
      "bomb without a size",
      { data: b64(rleZstdFrame(8192)), dtype: "float32", shape: [4], compression: "zstd" },
      /inflates to more than 16 bytes/,
    ],
  ];
  it.each(malformed)("502 for %s", (_name, value, message) => {
    const err = expectApiError(() => tensorFromVllmLensJson(value), {
      code: "upstream_error",
      param: null,
      status: 502,
      message,
    });
    expect(err.message).toMatch(/^Inference sent a malformed activations tensor/);
  });
});

describe.each(independentDecoders().map((d) => [d.name, d] as const))(
  "an independent decoder, %s, reads our dicts",
  (_name, decoder) => {
    it("bf16/f16/f32, raw and zstd, special values bit for bit", () => {
      const values = [
        0,
        -0,
        1,
        -2.5,
        0.1,
        2 ** -24,
        2 ** -133,
        2 ** -149,
        65504,
        1e5,
        3.4e38,
        Infinity,
        -Infinity,
        NaN,
        1e-8,
        -7.75,
      ];
      const tensors = [Dtype.BFLOAT16, Dtype.FLOAT16, Dtype.FLOAT32].flatMap((dtype) =>
        [Compression.UNSPECIFIED, Compression.ZSTD].map((compression) =>
          encodeTensor(values, [2, 2, 4], { dtype: dtype as TensorDtype, compression }),
        ),
      );
      // and a bigger one with random bf16 bits, as vllm-lens captures come
      const random = new Float32Array(3 * 5 * 4096).map(() => (Math.random() - 0.5) * 8);
      tensors.push(
        encodeTensor(random, [3, 5, 4096], { dtype: Dtype.BFLOAT16, compression: Compression.ZSTD }),
      );
      const decoded = decoder.decode(tensors.map(tensorToVllmLensJson));
      expect(decoded).toHaveLength(tensors.length);
      tensors.forEach((tensor, i) => {
        const ours = decodeTensor(tensor);
        const theirs = decoded[i]!.values;
        expect(decoded[i]!.shape).toEqual(tensor.shape);
        expect(theirs.length).toBe(ours.length);
        const at = firstDifference(ours, theirs);
        expect(at, `tensor ${i} at ${at}: ${theirs[at]} vs ${ours[at]}`).toBe(-1);
      });
    });

    it("refuses what vllm-lens's decoder refuses: base64url, a zstd frame without its content size", () => {
      const dict = tensorToVllmLensJson(encodeTensor([1, 2, 3, 4.5], [4], { dtype: Dtype.FLOAT32 }));
      expect(decoder.decode([dict])[0]!.values).toEqual(Float32Array.from([1, 2, 3, 4.5]));
      // bytes whose standard base64 is "++++": as base64url they read "----"
      const bytes = new Uint8Array([0xfb, 0xef, 0xbe, 0x3f, 0, 0, 0x80, 0x3f]);
      const standard = { data: b64(bytes), dtype: "float32", shape: [2] };
      expect(standard.data).toMatch(/^\+\+\+\+/);
      expect(decoder.decode([standard])[0]!.values).toEqual(new Float32Array(bytes.buffer));
      const urlSafe = { ...standard, data: standard.data.replaceAll("+", "-") };
      expect(() => decoder.decode([urlSafe])).toThrow();
      const undeclared = {
        data: b64(rleZstdFrame(1, 0)),
        dtype: "float32",
        shape: [32768],
        compression: "zstd",
      };
      expect(() => decoder.decode([undeclared])).toThrow();
    });
  },
);

it("parseTensorJson keeps the proto shape of create(TensorSchema) (plain message)", () => {
  const t = parseTensorJson([[1]], P);
  expect(t).toEqual(create(TensorSchema, { dtype: Dtype.FLOAT32, shape: [1, 1], data: f32bytes([1]) }));
});
