import { getEventListeners } from "node:events";
import { request as httpRequest } from "node:http";
import type { AddressInfo } from "node:net";
import Fastify, { type FastifyInstance } from "fastify";
import { afterEach, describe, expect, it } from "vitest";
import { ApiError } from "../../../src/core/errors/index.js";
import type { CallRecord } from "../../../src/core/index.js";
import { createShutdownLink, type ShutdownLink } from "../../../src/core/index.js";
import type { CallContext } from "../../../src/service/types.js";
import { createCallContext } from "../../../src/surfaces/rest/call-context.js";

let app: FastifyInstance | undefined;
afterEach(async () => {
  await app?.close();
  app = undefined;
});

/**
 * A fastify app whose routes build their CallContext with the REST layer's createCallContext on
 * `link`: `/done` answers at once; `/wait` answers when its signal aborts (with the reason's code).
 */
async function build(link: ShutdownLink) {
  const contexts: CallContext[] = [];
  app = Fastify();
  app.post("/done", async (request, reply) => {
    contexts.push(createCallContext(request, reply, link));
    return reply.code(401).send({ error: "no key" });
  });
  app.get("/wait", async (request, reply) => {
    const ctx = createCallContext(request, reply, link);
    contexts.push(ctx);
    await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
    const reason = ctx.signal.reason as ApiError;
    return reply.code(reason.status).send({ code: reason.code });
  });
  await app.listen({ host: "127.0.0.1", port: 0 });
  return { url: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`, contexts };
}

/** Until `check` holds (the server sees a client's close a moment after the client). */
async function until(check: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !check(); i++) await new Promise((r) => setTimeout(r, 10));
  expect(check()).toBe(true);
}

describe("createCallContext: the shutdown link", () => {
  it("after 2,000 finished calls nothing lingers: one listener on the shutdown signal, no open call", async () => {
    const shutdown = new AbortController();
    const link = createShutdownLink(shutdown.signal);
    const { contexts } = await build(link);
    expect(getEventListeners(shutdown.signal, "abort")).toHaveLength(1);
    for (let batch = 0; batch < 20; batch++) {
      await Promise.all(
        Array.from({ length: 100 }, async () => {
          const res = await app!.inject({ method: "POST", url: "/done", payload: {} });
          expect(res.statusCode).toBe(401);
        }),
      );
    }
    expect(contexts).toHaveLength(2000);
    await until(() => link.openCalls === 0);
    expect(getEventListeners(shutdown.signal, "abort")).toHaveLength(1);
    // A later shutdown leaves the finished calls alone.
    shutdown.abort(new ApiError("upstream_unavailable", "closing"));
    expect(contexts.every((c) => !c.signal.aborted)).toBe(true);
  });

  it("a call in flight is open on the link, and the shutdown aborts it with its reason", async () => {
    const shutdown = new AbortController();
    const link = createShutdownLink(shutdown.signal);
    const { url, contexts } = await build(link);
    const answer = fetch(`${url}/wait`);
    await until(() => contexts.length === 1);
    expect(link.openCalls).toBe(1);
    expect(getEventListeners(shutdown.signal, "abort")).toHaveLength(1);
    shutdown.abort(new ApiError("upstream_unavailable", "The server is shutting down."));
    const res = await answer;
    expect(res.status).toBe(503);
    expect(await res.json()).toEqual({ code: "upstream_unavailable" });
    await until(() => link.openCalls === 0);
  });

  it("a client that goes away aborts its call with `canceled` and unties it", async () => {
    const shutdown = new AbortController();
    const link = createShutdownLink(shutdown.signal);
    const { url, contexts } = await build(link);
    const req = httpRequest(`${url}/wait`);
    req.on("error", () => {});
    req.end();
    await until(() => contexts.length === 1);
    expect(link.openCalls).toBe(1);
    req.destroy();
    await until(() => contexts[0]!.signal.aborted);
    expect((contexts[0]!.signal.reason as ApiError).code).toBe("canceled");
    await until(() => link.openCalls === 0);
    expect(shutdown.signal.aborted).toBe(false);
  });

  it("a call that starts after the shutdown is aborted at once and never tied", () => {
    const shutdown = new AbortController();
    const link = createShutdownLink(shutdown.signal);
    shutdown.abort(new ApiError("upstream_unavailable", "closing"));
    const controller = new AbortController();
    const untie = link.tie(controller);
    expect(controller.signal.aborted).toBe(true);
    expect((controller.signal.reason as ApiError).code).toBe("upstream_unavailable");
    expect(link.openCalls).toBe(0);
    untie();
  });

  it("shown: the shutdown's error replaces only the `canceled` it caused, and the record gets its code", () => {
    const shutdown = new AbortController();
    const link = createShutdownLink(shutdown.signal);
    const canceled = new ApiError("canceled", "The client canceled the request.");
    const record: CallRecord = { errorCode: "canceled" };
    // Before the shutdown, a cancel is the caller's own.
    expect(link.shown(canceled, record)).toBe(canceled);
    expect(record.errorCode).toBe("canceled");
    const reason = new ApiError("upstream_unavailable", "The server is shutting down; retry the request.");
    shutdown.abort(reason);
    const failed = new ApiError("upstream_error", "Inference failed.");
    expect(link.shown(failed, record)).toBe(failed);
    expect(record.errorCode).toBe("canceled");
    expect(link.shown(canceled, record)).toBe(reason);
    expect(record.errorCode).toBe("upstream_unavailable");
    expect(link.shown(canceled)).toBe(reason);
  });
});
