// SIGKILL the gateway (with its embedded engine) while requests hold Budget; a restart on the
// same SQLite file reclaims the stale Holds, and nothing is charged twice.
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { createBudgetLedger } from "../../src/budget/index.js";
import { freePort, startTs, waitForOk } from "../helpers/processes.js";

const dir = mkdtempSync(join(tmpdir(), "acs-crash-"));
const dbPath = join(dir, "acs.db");
const children: ChildProcess[] = [];

afterAll(() => {
  for (const c of children) c.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});

async function startGateway(port: number): Promise<ChildProcess> {
  const child = startTs(["src/main.ts"], {
    ACS_DB: dbPath,
    ACS_ENGINE_PRESET: "tiny",
    PORT: String(port),
    ACS_LOG_LEVEL: "warn",
  });
  children.push(child);
  await waitForOk(`http://127.0.0.1:${port}/healthz`);
  return child;
}

describe("crash", () => {
  it("reclaims the Holds of a SIGKILLed gateway on restart, charging nothing twice", async () => {
    const admin = await createBudgetLedger({ path: dbPath, reclaimIntervalMs: 0 });
    const { id, key } = await admin.createKey({ budgetTokens: 100_000 });
    const port = await freePort();
    const url = `http://127.0.0.1:${port}/v1/completions`;
    const headers = { "content-type": "application/json", authorization: `Bearer ${key}` };

    // One finished request: charged its usage.
    let gateway = await startGateway(port);
    const done = (await (
      await fetch(url, {
        method: "POST",
        headers,
        body: JSON.stringify({ model: "tiny", prompt: "Hi", max_tokens: 3 }),
      })
    ).json()) as { usage: { total_tokens: number } };
    expect((await admin.usage(id)).spentTokens).toBe(done.usage.total_tokens);

    // Five streams in flight, then SIGKILL.
    const streams = await Promise.all(
      Array.from({ length: 5 }, async () => {
        const res = await fetch(url, {
          method: "POST",
          headers,
          body: JSON.stringify({
            model: "tiny",
            prompt: "Hi",
            max_tokens: 400,
            ignore_eos: true,
            stream: true,
          }),
        });
        const reader = res.body?.getReader();
        await reader?.read();
        return reader;
      }),
    );
    expect((await admin.usage(id)).openHolds).toBe(5);
    gateway.kill("SIGKILL");
    await new Promise((r) => gateway.once("exit", r));
    for (const r of streams) await r?.cancel().catch(() => undefined);
    expect((await admin.usage(id)).openHolds).toBe(5); // nobody settled them

    gateway = await startGateway(port);
    const after = await admin.usage(id);
    expect(after.openHolds).toBe(0);
    expect(after.reclaimedHolds).toBe(5);
    expect(after.spentTokens).toBe(done.usage.total_tokens);
    expect(after.availableTokens).toBe(100_000 - done.usage.total_tokens);
    gateway.kill("SIGTERM");
    await admin.close();
  });
});
