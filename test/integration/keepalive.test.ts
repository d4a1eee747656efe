// `: keepalive` comments in a real stream: where they fall on the wire, and that the openai SDK
// skips them. A scripted Inference sends one chunk, then stays silent until the test has seen
// keepalives go out, then sends the last chunk: their positions are decided by the test, not by a
// clock.
import http from "node:http";
import type { AddressInfo } from "node:net";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseSse, type SseBlock } from "../helpers/parse-sse.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { answerVllmOps } from "../upstream/fake-upstream.js";

/** Inference that streams "a", waits for `release()`, then streams "b" and [DONE]. */
function createSilentUpstream() {
  const waiting: (() => void)[] = [];
  const chunk = (text: string, finish: string | null) =>
    `data: ${JSON.stringify({
      id: "cmpl-x",
      object: "text_completion",
      created: 1,
      model: "acs/fake",
      choices: [{ index: 0, text, logprobs: null, finish_reason: finish, stop_reason: null, token_ids: [1] }],
      usage: null,
    })}\n\n`;
  const server = http.createServer((req, res) => {
    req.resume(); // the body is not read: every completion gets the same script
    req.on("end", () => {
      if (answerVllmOps(req, res)) return;
      if (req.url === "/tokenize") {
        res.setHeader("content-type", "application/json");
        res.end(JSON.stringify({ count: 2, max_model_len: 512, tokens: [1, 2] }));
        return;
      }
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(chunk("a", null));
      waiting.push(() => res.end(`${chunk("b", "length")}data: [DONE]\n\n`));
    });
  });
  return {
    server,
    /** Lets every held stream go on. */
    release() {
      for (const go of waiting.splice(0)) go();
    },
  };
}

let upstream: ReturnType<typeof createSilentUpstream>;
let stack: Stack;
beforeAll(async () => {
  upstream = createSilentUpstream();
  await new Promise<void>((r) => upstream.server.listen(0, "127.0.0.1", r));
  const port = (upstream.server.address() as AddressInfo).port;
  stack = await startStack({ upstreamUrl: `http://127.0.0.1:${port}`, keepaliveIntervalMs: 10 });
});
afterAll(async () => {
  await stack.close();
  upstream.server.closeAllConnections();
  await new Promise<void>((r) => upstream.server.close(() => r()));
});

const body = { model: "tiny", prompt: "Hi", max_tokens: 2, stream: true };

/**
 * A fetch that passes the body through unchanged and calls `onKeepalives` once `n` keepalive
 * comments have gone by after the first data event (for a client that cannot see comments).
 */
function fetchCountingKeepalives(n: number, onKeepalives: () => void): typeof fetch {
  return async (input, init) => {
    const res = await fetch(input, init);
    if (res.body === null) return res;
    let raw = "";
    let fired = false;
    const decoder = new TextDecoder();
    const counting = new TransformStream<Uint8Array, Uint8Array>({
      transform(bytes, controller) {
        raw += decoder.decode(bytes, { stream: true });
        const afterData = raw.slice(raw.indexOf("data: ") + 1);
        if (!fired && raw.includes("data: ") && afterData.split(": keepalive\n\n").length - 1 >= n) {
          fired = true;
          onKeepalives();
        }
        controller.enqueue(bytes);
      },
    });
    return new Response(res.body.pipeThrough(counting), { status: res.status, headers: res.headers });
  };
}

describe("keepalive", () => {
  it("comments go out between data events while Inference is silent, never inside an event, none after [DONE]", async () => {
    const res = await fetchCountingKeepalives(3, () => upstream.release())(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    expect(res.status).toBe(200);
    // parseSse is strict: a comment inside an event (a block of two lines, or data that is not
    // JSON) throws.
    const blocks = parseSse(await res.text());
    const kinds = blocks.map((b: SseBlock) => (b.kind === "data" ? `data:${dataText(b.data)}` : b.kind));
    const a = kinds.indexOf("data:a");
    const b = kinds.indexOf("data:b");
    // The silence between "a" and "b" held at least the three keepalives the test waited for.
    expect(a).toBeGreaterThanOrEqual(0);
    expect(kinds.slice(a + 1, b).filter((k) => k === "comment").length).toBeGreaterThanOrEqual(3);
    expect(kinds.slice(a + 1, b).every((k) => k === "comment")).toBe(true);
    // Comments are only keepalives; the stream ends with [DONE] and nothing after it.
    for (const block of blocks) if (block.kind === "comment") expect(block.text).toBe("keepalive");
    expect(kinds.filter((k) => k.startsWith("data:"))).toEqual(["data:a", "data:b"]);
    expect(kinds.at(-1)).toBe("done");
    expect(kinds.indexOf("done")).toBe(kinds.length - 1);
  });

  it("the openai SDK reads the text through keepalives", async () => {
    let seen = false;
    const client = new OpenAI({
      baseURL: `${stack.url}/v1`,
      apiKey: "unused",
      maxRetries: 0,
      fetch: fetchCountingKeepalives(3, () => {
        seen = true;
        upstream.release();
      }),
    });
    const stream = await client.completions.create(body as OpenAI.CompletionCreateParamsStreaming);
    let text = "";
    for await (const chunk of stream) text += chunk.choices.map((c) => c.text).join("");
    expect(seen).toBe(true); // three keepalives went through the SDK's parser
    expect(text).toBe("ab");
  });
});

function dataText(data: unknown): string {
  const choices = (data as { choices?: { text: string }[] }).choices ?? [];
  return choices.map((c) => c.text).join("");
}
