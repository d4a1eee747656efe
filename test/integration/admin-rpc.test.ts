// acs.v1.AdminService over Connect (JSON and binary), gRPC and gRPC-Web through the real gateway,
// on SQLite and PostgreSQL: the same operations, answers and refusals as REST's /v1/admin/ (one
// implementation), the envelope's codes and params, and the REST answers equal to Connect's.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { FieldMaskSchema } from "@bufbuild/protobuf/wkt";
import { type Client, Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import {
  createConnectTransport,
  createGrpcTransport,
  createGrpcWebTransport,
  Http2SessionManager,
} from "@connectrpc/connect-node";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import {
  AdminService,
  type ApiKey,
  KeySettingsSchema,
  ModelListSchema,
  RateLimitsSchema,
} from "../../gen/acs/v1/admin_pb.js";
import { CompletionsService } from "../../gen/acs/v1/completions_pb.js";
import { ErrorEnvelopeSchema } from "../../gen/acs/v1/error_pb.js";
import type { BudgetLedger } from "../../src/budget/index.js";
import { renderApiKey, renderAuditLog } from "../../src/surfaces/rest/render-admin.js";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
import { testDatabase } from "../helpers/postgres.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

afterEach(assertConforming);

/** The error a call ends with: its Connect code and the envelope's code and param. */
async function refusal(p: Promise<unknown>): Promise<{ code: Code; errorCode?: string; param?: string }> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => ConnectError.from(e),
  );
  if (err === undefined) throw new Error("expected the call to fail");
  const envelope = err.findDetails(ErrorEnvelopeSchema)[0]?.error;
  return {
    code: err.code,
    ...(envelope?.code === undefined ? {} : { errorCode: envelope.code }),
    ...(envelope?.param === undefined ? {} : { param: envelope.param }),
  };
}

const stores = [
  { kind: "sqlite" as const, database: undefined },
  { kind: "postgres" as const, database: testDatabase("adminrpc") },
];

describe.each(stores)("acs.v1.AdminService on $kind", ({ kind, database }) => {
  let stack: Stack;
  let dir: string;
  let h2: Http2SessionManager;
  let admin: string;
  let adminId: string;
  let transports: Record<string, Transport>;
  const ledger = (): BudgetLedger => {
    if (stack.ledger === undefined) throw new Error("no ledger");
    return stack.ledger;
  };
  const client = (name = "connectJson"): Client<typeof AdminService> =>
    createClient(AdminService, transports[name] as Transport);
  const auth = () => ({ headers: { authorization: `Bearer ${admin}` } });
  const rest = async (method: string, path: string) =>
    (
      await checkedFetch(`${stack.url}${path}`, { method, headers: { authorization: `Bearer ${admin}` } })
    ).json();

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "acs-admin-rpc-"));
    if (database !== undefined) {
      await database.create();
      if (database.skipReason !== undefined) return;
    }
    stack = await startStack(
      kind === "sqlite"
        ? { dbPath: join(dir, "acs.db") }
        : { db: { kind: "postgres", url: database?.url ?? "" } },
    );
    h2 = new Http2SessionManager(stack.url);
    transports = {
      connectJson: createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1", useBinaryFormat: false }),
      connectBinary: createConnectTransport({ baseUrl: stack.url, httpVersion: "2", sessionManager: h2 }),
      grpc: createGrpcTransport({ baseUrl: stack.url, sessionManager: h2 }),
      grpcWeb: createGrpcWebTransport({ baseUrl: stack.url, httpVersion: "1.1" }),
    };
    const created = await ledger().createAdminKey({ name: "ops" });
    admin = created.key;
    adminId = created.id;
  });
  beforeEach(({ skip }) => {
    if (database?.skipReason !== undefined) skip(database.skipReason);
  });
  afterAll(async () => {
    h2?.abort();
    await stack?.close();
    await database?.drop();
    rmSync(dir, { recursive: true, force: true });
  });

  it.each(["connectJson", "connectBinary", "grpc", "grpcWeb"])(
    "%s: create, get, update (update_mask), rotate, revoke; REST answers the same",
    async (transport) => {
      const c = client(transport);
      const created = await c.createKey(
        {
          settings: create(KeySettingsSchema, {
            name: transport,
            budgetTokens: 500n,
            models: create(ModelListSchema, { ids: ["tiny"] }),
            rateLimits: create(RateLimitsSchema, { requestsPerMinute: 60n }),
            metadata: { via: transport },
          }),
        },
        auth(),
      );
      const id = created.apiKey?.id ?? "";
      expect(created.key).toMatch(/^acs-[A-Za-z0-9_-]{43}$/);
      expect(created.apiKey).toMatchObject({
        name: transport,
        budgetTokens: 500n,
        metadata: { via: transport },
      });
      const viaRest = await rest("GET", `/v1/admin/keys/${id}`);
      expect(viaRest).toEqual(renderApiKey(created.apiKey));
      expect((await c.getKey({ id }, auth())).apiKey).toEqual(created.apiKey);
      const updated = await c.updateKey(
        {
          id,
          settings: create(KeySettingsSchema, { name: "renamed" }),
          updateMask: create(FieldMaskSchema, { paths: ["name", "rate_limits"] }),
          addBudgetTokens: 5n,
        },
        auth(),
      );
      expect(updated.apiKey).toMatchObject({
        name: "renamed",
        budgetTokens: 505n,
        metadata: { via: transport },
      });
      expect(updated.apiKey?.rateLimits).toBeUndefined();
      expect(updated.apiKey?.models?.ids).toEqual(["tiny"]);
      const rotated = await c.rotateKey({ id }, auth());
      expect(rotated.apiKey?.id).toBe(id);
      expect(rotated.key).not.toBe(created.key);
      expect((await ledger().authenticate(`Bearer ${rotated.key}`)).id).toBe(id);
      const revoked = await c.revokeKey({ id }, auth());
      expect(revoked.apiKey?.revokedAt).toBeTypeOf("bigint");
      expect(await rest("GET", `/v1/admin/keys/${id}`)).toEqual(renderApiKey(revoked.apiKey));
    },
  );

  it("refusals: UNAUTHENTICATED, PERMISSION_DENIED both ways, NOT_FOUND, INVALID_ARGUMENT with the param", async () => {
    const c = client();
    const { key } = await ledger().createKey({ budgetTokens: 10 });
    expect(await refusal(c.listKeys({}))).toMatchObject({
      code: Code.Unauthenticated,
      errorCode: "invalid_api_key",
    });
    expect(await refusal(c.listKeys({}, { headers: { authorization: `Bearer ${key}` } }))).toMatchObject({
      code: Code.PermissionDenied,
      errorCode: "permission_denied",
    });
    const completions = createClient(CompletionsService, transports.grpc as Transport);
    expect(await refusal(completions.listModels({}, auth()))).toMatchObject({
      code: Code.PermissionDenied,
      errorCode: "permission_denied",
    });
    expect(await refusal(c.getKey({ id: "key_000000000000" }, auth()))).toMatchObject({
      code: Code.NotFound,
      errorCode: "key_not_found",
      param: "id",
    });
    const bad = create(KeySettingsSchema, { metadata: { ["k".repeat(65)]: "v" } });
    expect(await refusal(c.createKey({ settings: bad }, auth()))).toMatchObject({
      code: Code.InvalidArgument,
      param: "metadata",
    });
    expect(
      await refusal(
        c.updateKey(
          { id: "key_000000000000", updateMask: create(FieldMaskSchema, { paths: ["spent_tokens"] }) },
          auth(),
        ),
      ),
    ).toMatchObject({ code: Code.InvalidArgument, param: "update_mask" });
    expect(await refusal(c.listKeys({ limit: 101 }, auth()))).toMatchObject({
      code: Code.InvalidArgument,
      param: "limit",
    });
    // Connect JSON is strict as REST is: an unknown field is refused with its param.
    const res = await fetch(`${stack.url}/acs.v1.AdminService/ListKeys`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${admin}` },
      body: JSON.stringify({ limit: 2, order: "asc" }),
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { details?: unknown[] }).details).toBeDefined();
  });

  it("pages keys and the audit log as REST does; the audit rows are the RPC's actions", async () => {
    const c = client("grpc");
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await c.createKey(
        { settings: create(KeySettingsSchema, { name: `rpc-${i}`, budgetTokens: 1n }) },
        auth(),
      );
      ids.push(r.apiKey?.id ?? "");
    }
    const all: ApiKey[] = [];
    let after: string | undefined;
    let pages = 0;
    for (;;) {
      const page = await c.listKeys({ limit: 2, ...(after === undefined ? {} : { after }) }, auth());
      all.push(...page.data);
      pages++;
      const viaRest = await rest(
        "GET",
        `/v1/admin/keys?limit=2${after === undefined ? "" : `&after=${after}`}`,
      );
      expect(viaRest).toEqual({
        object: "list",
        data: page.data.map((k) => renderApiKey(k)),
        first_id: page.firstId ?? null,
        last_id: page.lastId ?? null,
        has_more: page.hasMore,
      });
      if (!page.hasMore) break;
      after = page.lastId;
    }
    expect(pages).toBeGreaterThan(1);
    expect(all.map((k) => k.id).filter((id) => ids.includes(id))).toEqual([...ids].reverse());
    const audit = await c.listAuditLogs({ limit: 3 }, auth());
    expect(audit.data.map((e) => [e.actor, e.action, e.targetId])).toEqual(
      [...ids].reverse().map((id) => [adminId, "api_key.created", id]),
    );
    expect(audit.data[0]?.after).toMatchObject({ name: "rpc-2", budget_tokens: 1 });
    expect(audit.data[0]?.before).toBeUndefined();
    const viaRest = (await rest("GET", "/v1/admin/audit_logs?limit=3")) as { data: unknown[] };
    expect(viaRest.data).toEqual(audit.data.map(renderAuditLog));
  });
});

describe("acs.v1.AdminService without keys", () => {
  let stack: Stack;
  beforeAll(async () => {
    stack = await startStack({});
  });
  afterAll(() => stack.close());

  it("answers UNIMPLEMENTED unknown_route", async () => {
    const c = createClient(AdminService, createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1" }));
    expect(await refusal(c.listKeys({}, { headers: { authorization: "Bearer acs-admin-x" } }))).toMatchObject(
      {
        code: Code.Unimplemented,
        errorCode: "unknown_route",
      },
    );
  });
});
