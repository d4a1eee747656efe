// Several replicas of a model behind one gateway, all real servers on 127.0.0.1: reference engines
// (in this process, or child processes that can be frozen and killed), the gateway from buildApp.
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CompletionsService, CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ErrorEnvelopeSchema } from "../../gen/acs/v1/error_pb.js";
import { Health, HealthCheckResponse_ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { buildApp } from "../../src/app/index.js";
import type { ModelConfig } from "../../src/config/index.js";
import { type RunningEngine, startEngine } from "../../src/engine/index.js";
import { configDefaults } from "../helpers/config-defaults.js";
import { until } from "../helpers/hang-guard.js";
import { parseSse, withoutKeepalives } from "../helpers/parse-sse.js";
import { freePort, startTs, waitForOk } from "../helpers/processes.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { closedPortUrl } from "../upstream/fake-upstream.js";

/** One streamed completion as its caller sees it: status, and each data event in order. */
interface Seen {
  status: number;
  /** Data events before [DONE] (chunks, then an error envelope if the stream was cut). */
  events: Array<Record<string, unknown>>;
}

/** Starts a streamed completion; `firstChunk` resolves when its first data event arrived. */
function streamCompletion(url: string, body: Record<string, unknown>, headers: Record<string, string> = {}) {
  let onFirst: () => void = () => {};
  const firstChunk = new Promise<void>((r) => {
    onFirst = r;
  });
  const done = (async (): Promise<Seen> => {
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify({ ...body, stream: true }),
    });
    let text = "";
    const decoder = new TextDecoder();
    for await (const part of res.body ?? []) {
      text += decoder.decode(part as Uint8Array, { stream: true });
      if (text.includes("data: ")) onFirst();
    }
    onFirst();
    if (res.status !== 200)
      return { status: res.status, events: [JSON.parse(text) as Record<string, unknown>] };
    const blocks = withoutKeepalives(parseSse(text));
    expect(blocks.at(-1)).toEqual({ kind: "done" });
    return {
      status: res.status,
      events: blocks.flatMap((b) => (b.kind === "data" ? [b.data as Record<string, unknown>] : [])),
    };
  })();
  return { firstChunk, done };
}

const isError = (e: Record<string, unknown>) => "error" in e;
const tokenIds = (e: Record<string, unknown>): number =>
  ((e.choices as Array<{ token_ids?: number[] }> | undefined) ?? []).reduce(
    (n, c) => n + (c.token_ids?.length ?? 0),
    0,
  );

/** `acs_upstream_replica_up{model,replica}` from the gateway's /metrics, by replica URL. */
async function replicaUp(url: string): Promise<Record<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const up: Record<string, number> = {};
  for (const m of text.matchAll(/^acs_upstream_replica_up\{model="[^"]*",replica="([^"]+)"\} (\d+)$/gm)) {
    up[m[1] as string] = Number(m[2]);
  }
  return up;
}

describe("load spreads over equal replicas", () => {
  let engines: RunningEngine[] = [];
  let stack: Stack;
  beforeAll(async () => {
    engines = await Promise.all([0, 1, 2].map(() => startEngine({ preset: "tiny" })));
    stack = await startStack({
      upstreams: engines.map((e) => ({ url: e.url })),
      model: { id: "acs/tiny", servedModelName: "acs/tiny" },
    });
  });
  afterAll(async () => {
    await stack?.close();
    for (const e of engines) await e.close();
  });

  it("within 20% of the mean, 6 callers at a time", async () => {
    const total = 60;
    let next = 0;
    const caller = async () => {
      while (next < total) {
        next++;
        const res = await fetch(`${stack.url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: stack.alias, prompt: `Hello ${next % 7}`, max_tokens: 4 }),
        });
        expect(res.status).toBe(200);
        await res.arrayBuffer();
      }
    };
    await Promise.all(Array.from({ length: 6 }, caller));
    const counts = engines.map((e) => e.stats.completed);
    expect(counts.reduce((a, b) => a + b, 0)).toBe(total);
    for (const n of counts) expect(Math.abs(n - total / 3)).toBeLessThanOrEqual((total / 3) * 0.2);
  });
});

describe("a replica killed under load", () => {
  const dir = mkdtempSync(join(tmpdir(), "acs-replicas-"));
  const ports: number[] = [];
  const children: Array<ChildProcess | undefined> = [];
  let stack: Stack;
  let key: string;
  let keyId: string;

  const startEngineProcess = async (i: number) => {
    const port = ports[i] as number;
    children[i] = startTs(["src/engine/main.ts", "--preset", "tiny", "--port", String(port)], {});
    await waitForOk(`http://127.0.0.1:${port}/health`, 120_000, 100);
  };

  beforeAll(async () => {
    for (let i = 0; i < 3; i++) ports.push(await freePort());
    await Promise.all([0, 1, 2].map(startEngineProcess));
    stack = await startStack({
      upstreams: ports.map((p) => ({ url: `http://127.0.0.1:${p}` })),
      model: { id: "acs/tiny", servedModelName: "acs/tiny", maxModelLen: undefined },
      dbPath: join(dir, "acs.db"),
      // Passive checks only while the victim is frozen; a replica taken out is checked again soon.
      healthIntervalMs: 0,
      pool: { backoff: { initialMs: 100, maxMs: 400 }, checkTimeoutMs: 2000 },
    });
    const created = await stack.ledger?.createKey({ budgetTokens: 1_000_000 });
    if (created === undefined) throw new Error("no ledger");
    ({ key, id: keyId } = created);
  }, 180_000);
  afterAll(async () => {
    await stack?.close();
    for (const c of children) c?.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  });

  it("no caller whose stream had not started sees an error; streams cut mid-way end with the in-band error; each request is charged once", async () => {
    const victim = 2;
    const victimUrl = `http://127.0.0.1:${ports[victim]}`;
    const pool = stack.registry.resolve("acs/tiny").client.upstream;
    const outstanding = () => pool.replicas()[victim]?.outstanding ?? 0;
    const auth = { authorization: `Bearer ${key}` };
    const body = (maxTokens: number) => ({
      model: "acs/tiny",
      prompt: "Hi",
      max_tokens: maxTokens,
      ignore_eos: true,
      return_token_ids: true,
      stream_options: { include_usage: true },
    });

    // Six long streams, about two per replica, each streaming: 500 of tiny's 512 tokens, so that
    // the victim's are still running when it is frozen (the tiny preset makes ~2,000 tokens/s:
    // 150-token streams ended first on an idle machine). How evenly they spread is the test above.
    const running = Array.from({ length: 6 }, () => streamCompletion(stack.url, body(500), auth));
    await Promise.all(running.map((s) => s.firstChunk));

    // Freeze the victim: it accepts connections and answers nothing. More streams, one at a time,
    // each until it streams or waits on the victim, until two wait there (the others, busy with
    // theirs, reach the victim's count of outstanding requests every so often).
    children[victim]?.kill("SIGSTOP");
    // Counted once frozen: a stream may have ended on the victim just before (the tiny preset is
    // fast); what is outstanding now can only end when the victim is killed.
    const cutOnVictim = outstanding();
    expect(cutOnVictim).toBeGreaterThanOrEqual(1);
    const waiting: Array<ReturnType<typeof streamCompletion>> = [];
    while (outstanding() - cutOnVictim < 2 && waiting.length < 40) {
      const before = outstanding();
      const s = streamCompletion(stack.url, body(40), auth);
      let streaming = false;
      void s.firstChunk.then(() => {
        streaming = true;
      });
      await until(() => streaming || outstanding() > before, "the stream streams or waits on the victim");
      waiting.push(s);
    }
    const waitingOnVictim = outstanding() - cutOnVictim;
    expect(waitingOnVictim).toBeGreaterThanOrEqual(1);

    children[victim]?.kill("SIGKILL");
    const seen = await Promise.all([...running, ...waiting].map((s) => s.done));

    // Nobody saw an error before a chunk: every answer is 200, and an error only after text.
    for (const s of seen) {
      expect(s.status).toBe(200);
      expect(isError(s.events[0] ?? {})).toBe(false);
    }
    const cut = seen.filter((s) => s.events.some(isError));
    expect(cut).toHaveLength(cutOnVictim);
    for (const s of cut) {
      expect(s.events.at(-1)).toMatchObject({ error: { code: "upstream_error" } });
      expect(s.events.filter(isError)).toHaveLength(1);
    }
    // The waiting ones went to another replica and finished whole.
    for (const s of seen.slice(running.length)) {
      expect(s.events.some(isError)).toBe(false);
      expect(s.events.at(-1)).toMatchObject({ usage: { completion_tokens: 40 } });
    }
    const failovers = pool.failovers();
    expect(failovers).toBeGreaterThanOrEqual(waitingOnVictim);
    const metrics = await (await fetch(`${stack.url}/metrics`)).text();
    expect(metrics).toContain(`acs_upstream_failovers_total{model="acs/tiny"} ${failovers}`);
    const victimErrors = [
      ...metrics.matchAll(
        /^acs_upstream_replica_errors_total\{model="acs\/tiny",replica="([^"]+)",kind="[a-z_]+"\} (\d+)$/gm,
      ),
    ].reduce((n, m) => n + (m[1] === victimUrl ? Number(m[2]) : 0), 0);
    expect(victimErrors).toBeGreaterThanOrEqual(cutOnVictim + waitingOnVictim);
    expect(metrics).toMatch(
      new RegExp(
        `^acs_upstream_replica_outstanding_requests\\{model="acs/tiny",replica="${victimUrl}"\\} 0$`,
        "m",
      ),
    );

    // Charged once each: whole answers their usage, cut ones prompt + the tokens streamed.
    const usages = seen.flatMap((s) => s.events.filter((e) => "usage" in e && e.usage !== null));
    const promptTokens = (usages[0]?.usage as { prompt_tokens: number } | undefined)?.prompt_tokens ?? 0;
    expect(promptTokens).toBeGreaterThan(0);
    const expected =
      usages.reduce((n, e) => n + (e.usage as { total_tokens: number }).total_tokens, 0) +
      cut.reduce((n, s) => n + promptTokens + s.events.reduce((m, e) => m + tokenIds(e), 0), 0);
    await until(async () => (await stack.ledger?.usage(keyId))?.heldTokens === 0, "every Hold settled");
    expect((await stack.ledger?.usage(keyId))?.spentTokens).toBe(expected);

    // The dead replica is out; back on the same port, it is put back and gets requests again.
    await until(async () => (await replicaUp(stack.url))[victimUrl] === 0, "the dead replica is out");
    await startEngineProcess(victim);
    await until(async () => (await replicaUp(stack.url))[victimUrl] === 1, "the replica is back");
    for (let i = 0; i < 6; i++) {
      const res = await fetch(`${stack.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...auth },
        body: JSON.stringify({ model: "acs/tiny", prompt: "Hi", max_tokens: 2 }),
      });
      expect(res.status).toBe(200);
    }
    const engineMetrics = await (await fetch(`${victimUrl}/metrics`)).text();
    expect(Number(/^acs_engine_completed_total (\d+)$/m.exec(engineMetrics)?.[1])).toBeGreaterThanOrEqual(1);
  }, 120_000);
});

describe("every replica down", () => {
  let stack: Stack;
  let h2: Http2SessionManager;
  beforeAll(async () => {
    stack = await startStack({
      upstreams: [{ url: await closedPortUrl() }, { url: await closedPortUrl() }],
      pool: { backoff: { initialMs: 60_000 } },
    });
    h2 = new Http2SessionManager(stack.url);
  });
  afterAll(async () => {
    h2.abort();
    await stack?.close();
  });

  it("REST and SSE: 503 upstream_unavailable in the envelope", async () => {
    for (const stream of [false, true]) {
      const res = await fetch(`${stack.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: stack.alias, prompt: [1, 2, 3], max_tokens: 4, stream }),
      });
      expect(res.status).toBe(503);
      expect(await res.json()).toEqual({
        error: {
          message: "Inference is unavailable: no replica of acs/fake is up.",
          type: "server_error",
          param: null,
          code: "upstream_unavailable",
        },
        request_id: res.headers.get("x-request-id"),
      });
    }
  });

  it("Connect and gRPC: Unavailable with the envelope", async () => {
    const request = create(CreateCompletionRequestSchema, {
      model: stack.alias,
      prompt: { case: "text", value: "Hi" },
      maxTokens: 4,
    });
    const connect = createClient(
      CompletionsService,
      createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1" }),
    );
    const grpc = createClient(
      CompletionsService,
      createGrpcTransport({ baseUrl: stack.url, sessionManager: h2 }),
    );
    const calls = [
      connect.createCompletion(request),
      (async () => {
        for await (const _ of grpc.streamCompletion(request)) {
        }
      })(),
    ];
    for (const call of calls) {
      const err = await call.then(
        () => {
          throw new Error("expected a failure");
        },
        (e: unknown) => ConnectError.from(e),
      );
      expect(err.code).toBe(Code.Unavailable);
      expect(err.findDetails(ErrorEnvelopeSchema)[0]?.error?.code).toBe("upstream_unavailable");
    }
  });
});

describe("a model whose upstream is down or serves another model at start-up", () => {
  let engine: RunningEngine;
  let late: RunningEngine | undefined;
  let latePort: number;
  let app: Awaited<ReturnType<typeof buildApp>>["app"];
  let url: string;
  let h2: Http2SessionManager;
  const lines: Array<Record<string, unknown>> = [];

  const model = (id: string, upstream: string, servedModelName = id): ModelConfig => ({
    id,
    aliases: [],
    upstreams: [{ url: upstream, apiKey: undefined, weight: 1 }],
    servedModelName,
    maxModelLen: undefined,
    hiddenSize: 64,
    numLayers: 4,
    ownedBy: "acs-test",
  });

  beforeAll(async () => {
    engine = await startEngine({ preset: "tiny" });
    latePort = await freePort();
    const logger = pino(
      { level: "info" },
      new Writable({
        write(chunk: Buffer, _enc, cb) {
          for (const line of chunk.toString("utf8").split("\n")) if (line) lines.push(JSON.parse(line));
          cb();
        },
      }),
    );
    ({ app } = await buildApp(
      {
        ...configDefaults,
        models: [
          model("acs/tiny", engine.url),
          model("late/model", `http://127.0.0.1:${latePort}`),
          model("wrong/model", engine.url, "other/model"),
        ],
        db: undefined,
        nonStreamDeadlineMs: 60_000,
      },
      { logger, healthIntervalMs: 0, pool: { backoff: { initialMs: 50, maxMs: 200 } } },
    ));
    await app.listen({ host: "127.0.0.1", port: 0 });
    url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
    h2 = new Http2SessionManager(url);
  });
  afterAll(async () => {
    h2?.abort();
    await app?.close();
    await engine?.close();
    await late?.close();
  });

  const complete = (modelName: string) =>
    fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: modelName, prompt: "Hi", max_tokens: 2 }),
    });

  it("serves the others, logs which and why, and reports each model's readiness", async () => {
    expect((await complete("acs/tiny")).status).toBe(200);
    for (const name of ["late/model", "wrong/model"]) {
      const res = await complete(name);
      expect(res.status).toBe(503);
      expect(((await res.json()) as { error: { code: string; message: string } }).error).toMatchObject({
        code: "upstream_unavailable",
        message: `The model \`${name}\` is not available yet: Inference has not answered since the gateway started.`,
      });
    }
    const wrong = lines.find((l) => l.model === "wrong/model" && l.level === 40);
    expect(wrong?.msg).toBe(
      `replica of wrong/model at ${engine.url} is down: it serves acs/tiny, not other/model (model wrong/model)`,
    );
    const readyz = await fetch(`${url}/readyz`);
    expect([readyz.status, await readyz.json()]).toEqual([
      200,
      {
        status: "ready",
        models: { "acs/tiny": "serving", "late/model": "not_serving", "wrong/model": "not_serving" },
      },
    ]);
    const health = createClient(Health, createGrpcTransport({ baseUrl: url, sessionManager: h2 }));
    expect((await health.check({ service: "acs/tiny" })).status).toBe(
      HealthCheckResponse_ServingStatus.SERVING,
    );
    expect((await health.check({ service: "late/model" })).status).toBe(
      HealthCheckResponse_ServingStatus.NOT_SERVING,
    );
    const models = (await (await fetch(`${url}/v1/models`)).json()) as { data: Array<{ id: string }> };
    expect(models.data.map((m) => m.id)).toEqual(["acs/tiny"]);
  });

  it("serves a model once its upstream comes up, with the max_model_len it reports", async () => {
    late = await startEngine({
      preset: "tiny",
      port: latePort,
      servedModelName: "late/model",
      maxModelLen: 300,
    });
    await until(async () => (await complete("late/model")).status === 200, "the late model is served");
    const res = await fetch(`${url}/v1/models/late%2Fmodel`);
    expect(((await res.json()) as { max_model_len: number }).max_model_len).toBe(300);
  });
});
