/**
 * Soak section `steering`: the memory a tiny request can make the gateway hold. Ten requests in
 * parallel, each ~1.6 KB of JSON whose zstd steering tensor inflates to the legal maximum of 2^23
 * float32 numbers (32 MiB), against a scripted Inference that leaves each large body unread for a
 * while (so every request is in flight at once). Meanwhile an ordinary request must be served.
 * Reported: the gateway's peak RSS over its baseline, the answers, and the gateway's own count of
 * in-flight steering bytes (`acs_steering_bytes_in_flight_peak`, when it has one).
 */
import { zstdCompress } from "../src/lens/index.js";
import { mib, soakModel, startGatewayChild, startScriptedUpstream } from "./soak-gateway.js";

const PARALLEL = 10;
/** How long the scripted Inference leaves a steering request's body unread, ms. */
const HOLD_MS = 4000;
/** Bodies above this are held (an ordinary request's body is a few hundred bytes). */
const LARGE_BODY = 1 << 20;
/** The largest RSS growth that passes: the default budget (256 MiB) and room for the rest. */
const MAX_RSS_GROWTH = 448 * 2 ** 20;

/** A [32, 64, 4096] float32 tensor (2^23 numbers, 32 MiB) of a repeating pattern, zstd, as REST JSON. */
function maxSteeringBody(): string {
  const [layers, positions, hidden] = [soakModel.numLayers, 64, soakModel.hiddenSize];
  const values = new Float32Array(layers * positions * hidden);
  for (let i = 0; i < values.length; i++) values[i] = ((i % 7) - 3) * 0.25;
  const frame = zstdCompress(new Uint8Array(values.buffer));
  return JSON.stringify({
    model: soakModel.id,
    prompt: "The sky is",
    max_tokens: 1,
    apply_steering_vectors: [
      {
        activations: {
          data: frame.toString("base64"),
          dtype: "float32",
          shape: [layers, positions, hidden],
          compression: "zstd",
        },
        layer_indices: Array.from({ length: layers }, (_, i) => i),
        position_indices: Array.from({ length: positions }, (_, i) => i),
      },
    ],
  });
}

async function post(url: string, body: string) {
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  });
  const text = await res.text();
  let code: string | undefined;
  try {
    code = (JSON.parse(text) as { error?: { code?: string } }).error?.code;
  } catch {}
  return { status: res.status, code, retryAfter: res.headers.get("retry-after") };
}

/** A gauge's value from Prometheus text, or undefined when the gateway has no such metric. */
function gauge(text: string, name: string): number | undefined {
  const line = text.split("\n").find((l) => l.startsWith(`${name} `));
  return line === undefined ? undefined : Number(line.slice(name.length + 1));
}

export async function soakSteering() {
  const body = maxSteeringBody();
  const upstreamBodies: number[] = [];
  const upstream = await startScriptedUpstream({
    holdBodyMs: HOLD_MS,
    holdWhen: (contentLength) => contentLength === undefined || contentLength > LARGE_BODY,
    onBody: (bytes) => upstreamBodies.push(bytes),
  });
  const gateway = await startGatewayChild(upstream.url);
  try {
    const before = await gateway.probe();
    const started = Date.now();
    const heavy = Promise.all(Array.from({ length: PARALLEL }, () => post(gateway.url, body)));
    await new Promise((r) => setTimeout(r, 1000));
    const plainStarted = Date.now();
    const plain = await post(
      gateway.url,
      JSON.stringify({ model: soakModel.id, prompt: "The sky is", max_tokens: 1 }),
    );
    const plainMs = Date.now() - plainStarted;
    const answers = await heavy;
    const elapsed = Date.now() - started;
    const after = await gateway.probe();
    const metrics = await (await fetch(`${gateway.url}/metrics`)).text();
    const peakSteering = gauge(metrics, "acs_steering_bytes_in_flight_peak");
    const inFlight = gauge(metrics, "acs_steering_bytes_in_flight");
    const count = (p: (a: (typeof answers)[number]) => boolean) => answers.filter(p).length;
    const ok200 = count((a) => a.status === 200);
    const limited = count((a) => a.status === 429 && a.code === "rate_limited" && a.retryAfter !== null);
    const other = PARALLEL - ok200 - limited;
    const growth = after.maxRss - before.rss;
    const ok =
      gateway.alive() &&
      other === 0 &&
      ok200 > 0 &&
      plain.status === 200 &&
      growth <= MAX_RSS_GROWTH &&
      (inFlight ?? 0) === 0;
    const statuses = answers.map((a) => `${a.status}${a.code ? ` ${a.code}` : ""}`).sort();
    const lines = [
      "## steering: ten maximal zstd steering tensors at once",
      "",
      `${PARALLEL} parallel POST /v1/completions of ${body.length} bytes each, whose zstd tensor [32, 64, 4096] inflates to 2^23 float32 (32 MiB); the scripted Inference leaves each body over 1 MiB unread for ${HOLD_MS} ms. After 1 s an ordinary request (no steering) is sent. The gateway (src/main.ts, default limits) runs in a child process; RSS read in it (bench/heap-probe.ts).`,
      "",
      "| figure | value |",
      "|---|---:|",
      `| gateway RSS before | ${mib(before.rss)} MiB |`,
      `| gateway peak RSS | ${mib(after.maxRss)} MiB |`,
      `| peak RSS − RSS before | ${mib(growth)} MiB |`,
      `| steering bytes in flight, peak (gauge) | ${peakSteering === undefined ? "no gauge" : `${mib(peakSteering)} MiB`} |`,
      `| answers | ${[...new Set(statuses)].map((s) => `${statuses.filter((x) => x === s).length} × ${s}`).join(", ")} |`,
      `| bodies Inference received | ${upstreamBodies.length}, ${[...new Set(upstreamBodies)].map((b) => `${mib(b)} MiB`).join(", ")} each |`,
      `| ordinary request meanwhile | ${plain.status} in ${plainMs} ms |`,
      `| all ten answered after | ${elapsed} ms |`,
      "",
      `${ok ? "PASS" : "FAIL"}: RSS growth ${mib(growth)} MiB (bound ${mib(MAX_RSS_GROWTH)} MiB); ${ok200} served, ${limited} × 429 rate_limited with Retry-After, ${other} other; gateway ${gateway.alive() ? "alive" : "DEAD"}.`,
    ];
    return { text: lines.join("\n"), ok };
  } finally {
    await gateway.stop();
    await upstream.close();
  }
}
