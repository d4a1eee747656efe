import { PassThrough } from "node:stream";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import type { StreamCompletionResponse } from "../../../gen/acs/v1/completions_pb.js";
import { pumpChunks } from "../../../src/surfaces/rest/completion-stream.js";
import { createSseWriter } from "../../../src/surfaces/rest/sse-writer.js";
import { sseDefaults } from "../../helpers/config-defaults.js";

/** An iterator of the service's chunks whose next() gives `next` and which counts return() calls. */
function serviceChunks(next: () => Promise<IteratorResult<StreamCompletionResponse>>) {
  const calls = { return: 0 };
  const chunks: AsyncIterator<StreamCompletionResponse> = {
    next,
    async return() {
      calls.return++;
      return { value: undefined, done: true };
    },
  };
  return { chunks, calls };
}

/** Runs pumpChunks into a PassThrough; resolves with what the caller would have read. */
async function pump(
  first: Promise<IteratorResult<StreamCompletionResponse>>,
  chunks: AsyncIterator<StreamCompletionResponse>,
): Promise<string> {
  const out = new PassThrough();
  const read: Buffer[] = [];
  out.on("data", (b: Buffer) => read.push(b));
  const writer = createSseWriter(out, { ...sseDefaults, keepaliveIntervalMs: 3_600_000 });
  await pumpChunks(first, chunks, writer, {
    render: { returnTokenIds: false },
    requestId: "req_0123456789abcdef0123456789abcdef",
    shutdown: new AbortController().signal,
    log: pino({ level: "silent" }),
  });
  return Buffer.concat(read).toString("utf8");
}

describe("pumpChunks", () => {
  it("a chunk it cannot render: the service's iterator is closed (its Hold settles), the caller gets the envelope and [DONE]", async () => {
    const { chunks, calls } = serviceChunks(async () => ({ value: undefined, done: true }));
    // A chunk the renderer cannot read stands for a bug on this side of the iterator.
    const broken = null as unknown as StreamCompletionResponse;
    const text = await pump(Promise.resolve({ value: broken, done: false }), chunks);
    expect(calls.return).toBe(1);
    const events = text.split("\n\n").filter((e) => e !== "");
    expect(events).toHaveLength(2);
    expect(JSON.parse((events[0] as string).slice("data: ".length))).toMatchObject({
      error: { code: "internal_error", type: "server_error" },
    });
    expect(events[1]).toBe("data: [DONE]");
  });

  it("an iterator that threw has ended: it is not closed again, and the caller gets its error and [DONE]", async () => {
    const { chunks, calls } = serviceChunks(async () => {
      throw new Error("upstream went away");
    });
    const text = await pump(Promise.reject(new Error("upstream went away")), chunks);
    expect(calls.return).toBe(0);
    expect(text).toMatch(/^data: \{"error":/);
    expect(text.endsWith("data: [DONE]\n\n")).toBe(true);
  });

  it("a stream read to its end is not closed: [DONE] only", async () => {
    const { chunks, calls } = serviceChunks(async () => ({ value: undefined, done: true }));
    const text = await pump(Promise.resolve({ value: undefined, done: true }), chunks);
    expect(calls.return).toBe(0);
    expect(text).toBe("data: [DONE]\n\n");
  });
});
