// ledger.standing() when PostgreSQL is partitioned away (packets dropped, not refused: the
// connections stay open): the request fails closed once what is left of the lease's life passed,
// rather than waiting until TCP gives up. (The vitest hang guard is the only limit here.)

import type { AddressInfo } from "node:net";
import { connect, createServer, type Server, type Socket } from "node:net";
import { afterAll, beforeAll, expect, it } from "vitest";
import { type BudgetLedger, createBudgetLedger } from "../../src/budget/index.js";
import { testDatabase } from "../helpers/postgres.js";

const database = testDatabase("fence_partition");
let proxy: Server | undefined;
let partitioned = false;
const sockets: Socket[] = [];

beforeAll(async () => {
  await database.create();
  if (database.skipReason !== undefined) return;
  const target = new URL(database.url);
  proxy = createServer((client) => {
    const server = connect(Number(target.port || 5432), target.hostname);
    sockets.push(client, server);
    // A partition drops the bytes both ways; the TCP connections stay up.
    client.on("data", (d) => partitioned || server.write(d));
    server.on("data", (d) => partitioned || client.write(d));
    client.on("error", () => server.destroy());
    server.on("error", () => client.destroy());
    client.on("close", () => server.destroy());
    server.on("close", () => client.destroy());
  });
  await new Promise<void>((r) => proxy!.listen(0, "127.0.0.1", r));
});
afterAll(async () => {
  for (const s of sockets) s.destroy();
  await new Promise<void>((r) => (proxy ? proxy.close(() => r()) : r()));
  await database.drop();
});

it("a partition from the store during standing() fails the request closed, not a hang", async (ctx) => {
  if (database.skipReason !== undefined) ctx.skip(database.skipReason);
  const url = new URL(database.url);
  url.port = String((proxy!.address() as AddressInfo).port);
  let clock = 1_900_000_000_000;
  const a: BudgetLedger = await createBudgetLedger({
    postgresUrl: url.toString(),
    instanceId: "a",
    reclaimIntervalMs: 0,
    authCacheTtlMs: 0,
    now: () => clock,
    // A short TTL: the wait is what is left of the lease's life (a quarter of it here).
    leases: { ttlMs: 8000, drainPollMs: 3_600_000 },
  });
  const { key } = await a.createKey({ budgetTokens: 10_000 });
  const h = await a.placeHold(await a.authenticate(`Bearer ${key}`), {
    promptTokens: 0,
    prompts: 1,
    n: 1,
    maxTokens: 100,
  });
  partitioned = true;
  clock += (3 * 8000) / 4 + 1;
  const standing = a.standing(h.holdId) as Promise<boolean>;
  const outcome = await standing.then(
    (v) => `resolved ${v}`,
    (e: unknown) => `rejected ${String(e)}`,
  );
  partitioned = false;
  for (const s of sockets) s.destroy(); // let the stuck statements fail so the ledger can close
  await a.close().catch(() => undefined);
  expect(outcome).toMatch(/^rejected Error: Budget store: lease lease_\w+ was not renewed within \d+ ms$/);
});
