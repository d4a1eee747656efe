// Real servers on loopback for integration tests: the reference engine (or any upstream URL),
// and the gateway built exactly as main.ts builds it, listening on 127.0.0.1:0.
import type { AddressInfo, Server } from "node:net";
import { pino } from "pino";
import { type BudgetLedger, createBudgetLedger } from "../../src/budget/index.js";
import { limits, type ModelConfig } from "../../src/config/index.js";
import { type RunningEngine, startEngine } from "../../src/engine/index.js";
import { buildServer, type OnePortTimeouts } from "../../src/server/index.js";
import { createCompletionsService, createModelRegistry } from "../../src/service/index.js";
import { createVllmClient } from "../../src/upstream/index.js";

export interface StackOptions {
  /** Engine preset. @default "tiny" */
  preset?: "tiny" | "llama-8b";
  /** Use this upstream instead of starting an engine (fault tests). */
  upstreamUrl?: string;
  /** Facts of the model when upstreamUrl is set. */
  model?: Partial<ModelConfig>;
  /** SQLite file: keys and Budgets on. */
  dbPath?: string;
  keepaliveIntervalMs?: number;
  nonStreamDeadlineMs?: number;
  timeouts?: Partial<OnePortTimeouts>;
}

export interface Stack {
  /** http://127.0.0.1:PORT of the gateway. */
  url: string;
  /** The gateway's listening server (its 'connection' events give the server side of a socket). */
  server: Server;
  engine: RunningEngine | undefined;
  ledger: BudgetLedger | undefined;
  /** The model id and alias the stack serves. */
  modelId: string;
  alias: string;
  close(): Promise<void>;
}

/** Starts engine (unless upstreamUrl) + gateway; close() stops both and waits for connections to drain. */
export async function startStack(opts: StackOptions = {}): Promise<Stack> {
  const engine =
    opts.upstreamUrl === undefined ? await startEngine({ preset: opts.preset ?? "tiny" }) : undefined;
  const alias = opts.preset === "llama-8b" ? "llama-8b" : "tiny";
  const modelConfig: ModelConfig = {
    id: engine?.model.id ?? "acs/fake",
    aliases: [alias],
    upstreamUrl: engine?.url ?? opts.upstreamUrl ?? "",
    servedModelName: engine?.model.id ?? "acs/fake",
    upstreamApiKey: undefined,
    maxModelLen: engine?.model.maxModelLen ?? 512,
    hiddenSize: engine?.model.hiddenSize ?? 64,
    numLayers: engine?.model.numLayers ?? 4,
    ownedBy: "acs-test",
    ...opts.model,
  };
  const client = createVllmClient({ baseUrl: modelConfig.upstreamUrl });
  const models = await createModelRegistry([modelConfig], () => client);
  const ledger =
    opts.dbPath === undefined ? undefined : createBudgetLedger({ path: opts.dbPath, reclaimIntervalMs: 0 });
  const api = createCompletionsService({
    models,
    ledger,
    nonStreamDeadlineMs: opts.nonStreamDeadlineMs ?? limits.nonStreamDeadlineMs,
  });
  const { app } = await buildServer({
    config: { keepaliveIntervalMs: opts.keepaliveIntervalMs ?? 5000, bodyLimitBytes: limits.bodyLimitBytes },
    api,
    logger: pino({ level: "silent" }),
    isReady: () => true,
    ...(opts.timeouts ? { timeouts: opts.timeouts } : {}),
    onClose: async () => {
      await client.close();
      ledger?.close();
    },
  });
  await app.listen({ host: "127.0.0.1", port: 0 });
  const port = (app.server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    server: app.server,
    engine,
    ledger,
    modelId: modelConfig.id,
    alias,
    async close() {
      await app.close();
      await engine?.close();
    },
  };
}
