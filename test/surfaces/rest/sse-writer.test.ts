import { once } from "node:events";
import { createServer, request as httpRequest, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { PassThrough, Writable } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import { afterEach, describe, expect, it, vi } from "vitest";
import { ApiError } from "../../../src/core/errors/index.js";
import { createSseWriter } from "../../../src/surfaces/rest/sse-writer.js";
import { sseDefaults } from "../../helpers/config-defaults.js";
import { parseSse, withoutKeepalives } from "../../helpers/parse-sse.js";

async function collect(stream: PassThrough): Promise<string> {
  let text = "";
  stream.setEncoding("utf8");
  for await (const part of stream) text += part;
  return text;
}

describe("createSseWriter on a PassThrough", () => {
  it("writes data events and [DONE], nothing else", async () => {
    const out = new PassThrough();
    const body = collect(out);
    const writer = createSseWriter(out, { ...sseDefaults, keepaliveIntervalMs: 60_000 });
    expect(await writer.send({ a: 1, text: "line\nbreak" })).toBe(true);
    expect(await writer.send({ b: "ü 🚀" })).toBe(true);
    await writer.done();
    expect(parseSse(await body)).toEqual([
      { kind: "data", data: { a: 1, text: "line\nbreak" } },
      { kind: "data", data: { b: "ü 🚀" } },
      { kind: "done" },
    ]);
    expect(await writer.send({ late: true })).toBe(false);
  });

  it("an error after the start is one envelope event, then [DONE]", async () => {
    const out = new PassThrough();
    const body = collect(out);
    const writer = createSseWriter(out, { ...sseDefaults, keepaliveIntervalMs: 60_000 });
    await writer.send({ chunk: 1 });
    const envelope = new ApiError("upstream_error", "Inference failed.").toEnvelope(`req_${"a".repeat(32)}`);
    await writer.fail(envelope);
    await writer.fail(envelope);
    expect(parseSse(await body)).toEqual([
      { kind: "data", data: { chunk: 1 } },
      {
        kind: "data",
        data: {
          error: { message: "Inference failed.", type: "server_error", param: null, code: "upstream_error" },
          request_id: `req_${"a".repeat(32)}`,
        },
      },
      { kind: "done" },
    ]);
  });

  it("writes a keepalive comment every interval while idle, and stops at the end", async () => {
    let blocks: ReturnType<typeof parseSse>;
    // vitest's clock: 110 ms are 5 intervals of 20 ms however busy the machine is
    vi.useFakeTimers({ toFake: ["setInterval", "clearInterval"] });
    try {
      const out = new PassThrough();
      const body = collect(out);
      const writer = createSseWriter(out, { ...sseDefaults, keepaliveIntervalMs: 20 });
      await writer.send({ first: true });
      vi.advanceTimersByTime(110);
      await writer.done();
      vi.advanceTimersByTime(60);
      expect(vi.getTimerCount()).toBe(0);
      blocks = parseSse(await body);
    } finally {
      vi.useRealTimers();
    }
    const keepalives = blocks.filter((b) => b.kind === "comment");
    expect(keepalives).toHaveLength(5);
    expect(new Set(keepalives.map((b) => (b.kind === "comment" ? b.text : "")))).toEqual(
      new Set(["keepalive"]),
    );
    expect(blocks.at(-1)).toEqual({ kind: "done" });
    expect(withoutKeepalives(blocks)).toEqual([{ kind: "data", data: { first: true } }, { kind: "done" }]);
  });

  it("waits for 'drain' when the destination is full (backpressure)", async () => {
    const written: string[] = [];
    let release: (() => void) | undefined;
    const slow = new Writable({
      highWaterMark: 16,
      write(chunk, _encoding, callback) {
        written.push(String(chunk));
        release = callback;
      },
    });
    const writer = createSseWriter(slow, { ...sseDefaults, keepaliveIntervalMs: 60_000 });
    let resolved = false;
    const sending = writer.send({ padding: "x".repeat(64) }).then(() => {
      resolved = true;
    });
    await sleep(20);
    expect(resolved).toBe(false);
    release?.();
    await sending;
    expect(resolved).toBe(true);
    expect(written).toEqual([`data: {"padding":"${"x".repeat(64)}"}\n\n`]);
    slow.destroy();
  });

  it("stops its timer and its writes when the destination closes (client gone)", async () => {
    const out = new PassThrough();
    let bytes = 0;
    out.on("data", (part: Buffer) => {
      bytes += part.length;
    });
    const writer = createSseWriter(out, { ...sseDefaults, keepaliveIntervalMs: 10 });
    await writer.send({ a: 1 });
    out.destroy();
    await once(out, "close");
    const before = bytes;
    await sleep(50);
    expect(writer.closed).toBe(true);
    expect(await writer.send({ b: 2 })).toBe(false);
    await writer.done();
    expect(bytes).toBe(before);
  });

  it("a send waiting for drain resolves false when the destination closes", async () => {
    const stuck = new Writable({ highWaterMark: 1, write() {} });
    const writer = createSseWriter(stuck, { ...sseDefaults, keepaliveIntervalMs: 60_000 });
    const sending = writer.send({ a: 1 });
    stuck.destroy();
    await expect(sending).resolves.toBe(false);
    expect(writer.closed).toBe(true);
    expect(writer.stalled).toBe(false);
  });

  it("a write that waits stallMs for 'drain' ends the stream: onStall once, the send resolves false", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "setInterval", "clearInterval"] });
    try {
      const stuck = new Writable({ highWaterMark: 1, write() {} });
      let stalls = 0;
      const writer = createSseWriter(stuck, {
        keepaliveIntervalMs: 60_000,
        stallMs: 1000,
        onStall: () => {
          stalls++;
          stuck.destroy();
        },
      });
      let result: boolean | undefined;
      const sending = writer.send({ a: 1 }).then((r) => {
        result = r;
      });
      vi.advanceTimersByTime(999);
      await Promise.resolve();
      expect(result).toBeUndefined();
      expect(stalls).toBe(0);
      vi.advanceTimersByTime(1);
      await sending;
      expect(result).toBe(false);
      expect(stalls).toBe(1);
      expect(writer.stalled).toBe(true);
      expect(writer.closed).toBe(true);
      expect(await writer.send({ b: 2 })).toBe(false);
      vi.advanceTimersByTime(10_000);
      expect(stalls).toBe(1);
    } finally {
      vi.useRealTimers();
    }
  });

  it("a caller that drains within stallMs each time is never ended, however long the stream", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "setInterval", "clearInterval"] });
    try {
      let release: (() => void) | undefined;
      const slow = new Writable({
        highWaterMark: 1,
        write(_chunk, _encoding, callback) {
          release = callback;
        },
      });
      let stalls = 0;
      const writer = createSseWriter(slow, {
        keepaliveIntervalMs: 60_000,
        stallMs: 1000,
        onStall: () => {
          stalls++;
        },
      });
      for (let i = 0; i < 5; i++) {
        const sending = writer.send({ i });
        vi.advanceTimersByTime(900); // 4,500 ms in all: only each wait counts
        release?.();
        expect(await sending).toBe(true);
      }
      expect(stalls).toBe(0);
      expect(writer.stalled).toBe(false);
      slow.destroy();
    } finally {
      vi.useRealTimers();
    }
  });
});

describe("createSseWriter on a real HTTP response", () => {
  let close: (() => Promise<void>) | undefined;
  afterEach(async () => {
    await close?.();
    close = undefined;
  });

  async function serve(handler: (res: ServerResponse) => Promise<void>): Promise<number> {
    const server = createServer((_req: IncomingMessage, res: ServerResponse) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      void handler(res);
    });
    server.listen(0, "127.0.0.1");
    await once(server, "listening");
    close = async () => {
      server.closeAllConnections();
      server.close();
      await once(server, "close");
    };
    return (server.address() as AddressInfo).port;
  }

  it("streams events, keepalives and [DONE] to an HTTP client", async () => {
    let sawKeepalives = () => {};
    const twoKeepalives = new Promise<void>((resolve) => {
      sawKeepalives = resolve;
    });
    const port = await serve(async (res) => {
      const writer = createSseWriter(res, { ...sseDefaults, keepaliveIntervalMs: 15 });
      await writer.send({ n: 1 });
      await twoKeepalives; // idle until the client has read two keepalives
      await writer.send({ n: 2 });
      await writer.done();
    });
    const response = await fetch(`http://127.0.0.1:${port}/`);
    let text = "";
    const decoder = new TextDecoder();
    for await (const part of response.body!) {
      text += decoder.decode(part, { stream: true });
      if (text.split(": keepalive\n\n").length > 2) sawKeepalives();
    }
    const blocks = parseSse(text);
    expect(withoutKeepalives(blocks)).toEqual([
      { kind: "data", data: { n: 1 } },
      { kind: "data", data: { n: 2 } },
      { kind: "done" },
    ]);
    expect(blocks.filter((b) => b.kind === "comment").length).toBeGreaterThanOrEqual(2);
  });

  it("notices a client that disconnects mid-stream", async () => {
    const observed: { closed: boolean; sent: boolean }[] = [];
    let finished!: () => void;
    const done = new Promise<void>((resolve) => {
      finished = resolve;
    });
    const port = await serve(async (res) => {
      const writer = createSseWriter(res, { ...sseDefaults, keepaliveIntervalMs: 5 });
      await writer.send({ n: 1 });
      await once(res, "close");
      observed.push({ closed: writer.closed, sent: await writer.send({ n: 2 }) });
      finished();
    });
    const req = httpRequest({ port, host: "127.0.0.1", path: "/" });
    req.end();
    const [res] = (await once(req, "response")) as [IncomingMessage];
    await once(res, "data");
    req.destroy();
    await done;
    expect(observed).toEqual([{ closed: true, sent: false }]);
  });
});
