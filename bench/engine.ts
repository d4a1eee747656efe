/**
 * Engine throughput over real HTTP (loopback): greedy tokens/s for each preset, single and
 * 4 concurrent requests, plus the llama-8b 5-second check (max_tokens = max_model_len − prompt).
 * `benchEngine()` returns a markdown section for bench/RESULTS.md.
 */
import { PRESET_NAMES, type PresetName, startEngine } from "../src/engine/index.js";

interface Usage {
  completion_tokens: number;
}

async function complete(url: string, body: Record<string, unknown>): Promise<number> {
  const r = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const j = (await r.json()) as { usage?: Usage };
  if (!j.usage) throw new Error(`engine error: ${JSON.stringify(j)}`);
  return j.usage.completion_tokens;
}

/** The llama-8b full-context request should take at most this much CPU time (src/engine/README.md), s. */
const FULL_CONTEXT_TARGET_S = 5;

async function timed(fn: () => Promise<number>): Promise<{ tokens: number; ms: number }> {
  const t0 = performance.now();
  const tokens = await fn();
  return { tokens, ms: performance.now() - t0 };
}

/** Runs the engine benchmark; returns a markdown section. */
export async function benchEngine(): Promise<string> {
  const rows: string[] = [];
  let fullCheck = "";
  for (const name of PRESET_NAMES as readonly PresetName[]) {
    const engine = await startEngine({ preset: name });
    const tokens = name === "tiny" ? 400 : 256;
    const body = { prompt: "Alice was beginning to", max_tokens: tokens, temperature: 0, ignore_eos: true };
    await complete(engine.url, { ...body, max_tokens: 16 }); // warm-up (JIT)
    const single = await timed(() => complete(engine.url, body));
    const sampled = await timed(() => complete(engine.url, { ...body, temperature: 1, top_p: 0.9, seed: 1 }));
    const conc = await timed(async () => {
      const all = await Promise.all(
        [0, 1, 2, 3].map((i) => complete(engine.url, { ...body, temperature: 1, seed: i })),
      );
      return all.reduce((a, b) => a + b, 0);
    });
    const tps = (x: { tokens: number; ms: number }) => ((x.tokens * 1000) / x.ms).toFixed(0);
    rows.push(`| ${name} | ${engine.model.maxModelLen} | ${tps(single)} | ${tps(sampled)} | ${tps(conc)} |`);
    if (name === "llama-8b") {
      const prompt = "Four score and seven";
      const n = engine.model.tokenize(prompt).length;
      // The engine runs in this process: its CPU time is what the request costs the machine,
      // whatever else shares the cores; wall time also counts the other processes.
      const cpu0 = process.cpuUsage();
      const full = await timed(() =>
        complete(engine.url, {
          prompt,
          max_tokens: engine.model.maxModelLen - n,
          temperature: 0,
          ignore_eos: true,
        }),
      );
      const cpu = process.cpuUsage(cpu0);
      const cpuS = (cpu.user + cpu.system) / 1e6;
      const verdict = cpuS < FULL_CONTEXT_TARGET_S ? "within" : "OVER";
      fullCheck = `llama-8b full-context check (the 5-second rule): ${full.tokens} greedy tokens (max_model_len ${engine.model.maxModelLen} − ${n} prompt tokens) in ${(full.ms / 1000).toFixed(2)} s wall, ${cpuS.toFixed(2)} s CPU: ${verdict} the ${FULL_CONTEXT_TARGET_S} s target.`;
    }
    await engine.close();
  }
  return [
    "## Engine (reference model over loopback HTTP)",
    "",
    "| preset | max_model_len | greedy tokens/s | sampled (T=1, top_p 0.9) tokens/s | 4 concurrent, total tokens/s |",
    "|---|---|---|---|---|",
    ...rows,
    "",
    fullCheck,
    "",
  ].join("\n");
}

if (import.meta.url === `file://${process.argv[1]}`) {
  console.log(await benchEngine());
}
