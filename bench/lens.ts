/**
 * Benchmark of the lens tensor codec on a 2^25-number tensor (the capture cap: llama-8b, 32
 * layers × 256 positions × 4096): encode and decode throughput of bf16 + zstd and of f32 raw,
 * each next to plain `Buffer.toString("base64")` / `Buffer.from(b64, "base64")` of the same bytes
 * on the same machine.
 *
 *   npx tsx bench/lens.ts        prints the markdown section
 *   benchLens()                  returns it (for bench/run.ts)
 */
import { availableParallelism, cpus } from "node:os";
import { fileURLToPath } from "node:url";
import { Bench } from "tinybench";
import { Compression, Dtype } from "../gen/acs/v1/lens_pb.js";
import {
  decodeTensor,
  encodeTensor,
  type TensorDtype,
  tensorFromVllmLensJson,
  tensorToVllmLensJson,
  type VllmLensTensorJson,
} from "../src/lens/index.js";

const ELEMENTS = 2 ** 25;
const SHAPE = [32, 256, 4096];
const MIB = 1024 * 1024;

/** Activation-like values: a fixed-seed normal(0, 1) sample with a few large outliers. */
function activationLikeValues(count: number): Float32Array {
  let state = 0x9e3779b9;
  const uniform = (): number => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
  const out = new Float32Array(count);
  for (let i = 0; i < count; i += 2) {
    const r = Math.sqrt(-2 * Math.log(uniform() + 1e-12));
    const a = 2 * Math.PI * uniform();
    out[i] = r * Math.cos(a);
    if (i + 1 < count) out[i + 1] = r * Math.sin(a);
  }
  for (let i = 0; i < count; i += 4099) out[i] = (out[i] ?? 0) * 40;
  return out;
}

interface Row {
  name: string;
  /** Bytes of the tensor in its dtype (what MB/s counts). */
  bytes: number;
  fn: () => unknown;
  /** The baseline row this one is compared with. */
  baseline?: string;
}

function fmt(n: number, digits = 0): string {
  return n.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

/** Runs the benchmark and returns a markdown section (`## Lens tensor codec …`). */
export async function benchLens(): Promise<string> {
  const values = activationLikeValues(ELEMENTS);
  const sized = (dtype: TensorDtype, compression: Compression) => {
    const tensor = encodeTensor(values, SHAPE, { dtype, compression });
    const json: VllmLensTensorJson = tensorToVllmLensJson(tensor);
    return { tensor, json };
  };
  const bf16Zstd = sized(Dtype.BFLOAT16, Compression.ZSTD);
  const f32Raw = sized(Dtype.FLOAT32, Compression.UNSPECIFIED);
  const bf16Raw = encodeTensor(values, SHAPE, { dtype: Dtype.BFLOAT16 }).data;
  const bf16RawBuffer = Buffer.from(bf16Raw.buffer, bf16Raw.byteOffset, bf16Raw.byteLength);
  const f32RawBuffer = Buffer.from(
    f32Raw.tensor.data.buffer,
    f32Raw.tensor.data.byteOffset,
    f32Raw.tensor.data.byteLength,
  );
  const bf16B64 = bf16RawBuffer.toString("base64");
  const f32B64 = f32RawBuffer.toString("base64");
  const bf16Bytes = ELEMENTS * 2;
  const f32Bytes = ELEMENTS * 4;

  const rows: Row[] = [
    {
      name: "base64 encode, 64 MiB (bf16 bytes)",
      bytes: bf16Bytes,
      fn: () => bf16RawBuffer.toString("base64"),
    },
    {
      name: "base64 decode, 64 MiB (bf16 bytes)",
      bytes: bf16Bytes,
      fn: () => Buffer.from(bf16B64, "base64"),
    },
    {
      name: "base64 encode, 128 MiB (f32 bytes)",
      bytes: f32Bytes,
      fn: () => f32RawBuffer.toString("base64"),
    },
    { name: "base64 decode, 128 MiB (f32 bytes)", bytes: f32Bytes, fn: () => Buffer.from(f32B64, "base64") },
    {
      name: "encode bf16 + zstd: float32 → bf16 → zstd → base64 dict",
      bytes: bf16Bytes,
      baseline: "base64 encode, 64 MiB (bf16 bytes)",
      fn: () =>
        tensorToVllmLensJson(
          encodeTensor(values, SHAPE, { dtype: Dtype.BFLOAT16, compression: Compression.ZSTD }),
        ),
    },
    {
      name: "decode bf16 + zstd: dict → checks → inflate → float32 (tensorFromVllmLensJson + decodeTensor)",
      bytes: bf16Bytes,
      baseline: "base64 decode, 64 MiB (bf16 bytes)",
      fn: () => decodeTensor(tensorFromVllmLensJson(bf16Zstd.json)),
    },
    {
      name: "pass-through bf16 + zstd: Inference dict → proto → REST dict (no inflate)",
      bytes: bf16Bytes,
      baseline: "base64 decode, 64 MiB (bf16 bytes)",
      fn: () => tensorToVllmLensJson(tensorFromVllmLensJson(bf16Zstd.json)),
    },
    {
      name: "encode f32 raw: float32 → base64 dict",
      bytes: f32Bytes,
      baseline: "base64 encode, 128 MiB (f32 bytes)",
      fn: () => tensorToVllmLensJson(encodeTensor(values, SHAPE)),
    },
    {
      name: "decode f32 raw: dict → checks → float32 (tensorFromVllmLensJson + decodeTensor)",
      bytes: f32Bytes,
      baseline: "base64 decode, 128 MiB (f32 bytes)",
      fn: () => decodeTensor(tensorFromVllmLensJson(f32Raw.json)),
    },
  ];

  const bench = new Bench({ iterations: 7, time: 0, warmup: true, warmupIterations: 1, warmupTime: 0 });
  for (const row of rows) bench.add(row.name, row.fn);
  await bench.run();

  const median = new Map<string, number>();
  for (const task of bench.tasks) {
    const r = task.result;
    if (r.state === "completed") median.set(task.name, r.latency.p50);
  }
  const zstdBytes = Buffer.from(bf16Zstd.json.data, "base64").length;
  const lines = [
    "## Lens tensor codec (src/lens): a 2^25-number tensor",
    "",
    `Shape ${JSON.stringify(SHAPE)} (${fmt(ELEMENTS)} numbers, the capture cap), activation-like values ` +
      `(normal(0, 1), fixed seed, every 4099th ×40). bf16 + zstd level 1: ${fmt(zstdBytes / MIB, 1)} MiB compressed ` +
      `of ${fmt(bf16Bytes / MIB)} MiB (ratio ${fmt(bf16Bytes / zstdBytes, 2)}). ` +
      `Node ${process.version}, ${availableParallelism()} CPUs (${cpus()[0]?.model ?? "unknown"}); tinybench, ` +
      "7 runs after 1 warmup, median. MB/s counts the tensor's bytes in its dtype (MiB = 2^20 bytes); " +
      "the ratio is the row's median time over plain base64 of the same bytes. A request's steering " +
      "vectors hold at most 2^23 numbers in all, so the 2^25 decode rows use Inference's path " +
      "(tensorFromVllmLensJson); requests run the same strict-base64 scan, length checks and bounded " +
      "inflate (parseTensorJson, then checkLensShapes).",
    "",
    "| operation | median ms | MiB/s | Mnumbers/s | × base64 time |",
    "|---|---:|---:|---:|---:|",
  ];
  for (const row of rows) {
    const ms = median.get(row.name);
    if (ms === undefined) {
      lines.push(`| ${row.name} | failed | | | |`);
      continue;
    }
    const base = row.baseline === undefined ? undefined : median.get(row.baseline);
    const ratio = base === undefined ? "—" : fmt(ms / base, 2);
    lines.push(
      `| ${row.name} | ${fmt(ms, 1)} | ${fmt(row.bytes / MIB / (ms / 1000))} | ${fmt(ELEMENTS / 1e6 / (ms / 1000), 1)} | ${ratio} |`,
    );
  }
  return `${lines.join("\n")}\n`;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  process.stdout.write(await benchLens());
}
