// Gateway replicas as child processes on one PostgreSQL database, in front of the reference engine
// (preset `tiny`, served as `acs/tiny` alias `tiny`): for the tests of leases across replicas.
import type { ChildProcess } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { freePort, startTs, waitForOk } from "./processes.js";

/** Where a replica keeps its models file, which database it uses, and who kills it at the end. */
export interface ReplicaSetup {
  /** A directory of the test's own. */
  readonly dir: string;
  /** The test database (its url is read when a replica starts, after create()). */
  readonly database: { readonly url: string };
  /** Every replica started is pushed here (the test's afterAll kills them). */
  readonly children: ChildProcess[];
}

/**
 * A gateway process (src/main.ts, one worker: its Holds and leases carry exactly `instanceId`) on
 * the test database, its models file pointing at `upstreamUrl`. Short lease TTL (`leaseTtlMs`,
 * 2 s by default) and Hold renewals every 100 ms, so that expiries and reclaims happen within a
 * test. A replica whose store answers a lease's step later than the lease's margin (an eighth of
 * the TTL at least) fails the request closed (500), as it should: a test that does not wait for
 * expiries passes a longer TTL, so that a loaded machine does not turn its requests into 500s.
 */
export async function startReplica(
  setup: ReplicaSetup,
  upstreamUrl: string,
  instanceId: string,
  leaseTtlMs = 2000,
): Promise<{ url: string; child: ChildProcess }> {
  const modelsFile = join(setup.dir, `models-${instanceId}.json`);
  writeFileSync(
    modelsFile,
    JSON.stringify({
      models: [
        {
          id: "acs/tiny",
          aliases: ["tiny"],
          upstream_url: upstreamUrl,
          hidden_size: 64,
          num_hidden_layers: 4,
        },
      ],
    }),
  );
  const port = await freePort();
  const child = startTs(["src/main.ts"], {
    ACS_DB: setup.database.url,
    ACS_MODELS: modelsFile,
    ACS_INSTANCE_ID: instanceId,
    ACS_WORKERS: "1",
    ACS_LEASE_TTL_MS: String(leaseTtlMs),
    ACS_HOLD_RENEW_MS: "100",
    PORT: String(port),
    ACS_LOG_LEVEL: "warn",
  });
  setup.children.push(child);
  const url = `http://127.0.0.1:${port}`;
  await waitForOk(`${url}/healthz`);
  return { url, child };
}

/** A non-streamed completion of `tiny` ("Hi", greedy, ignore_eos) with `body` on top: status, clamp header, JSON. */
export async function completeTiny(url: string, key: string, body: Record<string, unknown>) {
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({ model: "tiny", prompt: "Hi", temperature: 0, ignore_eos: true, ...body }),
  });
  const json = (await res.json()) as {
    usage?: { total_tokens: number };
    error?: { code: string; type: string; message: string };
  };
  return { status: res.status, clamped: res.headers.get("x-acs-max-tokens-clamped"), ...json };
}
