// `: keepalive` comments in a real stream: present on the wire, skipped by the openai SDK.
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseSse } from "../helpers/parse-sse.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
beforeAll(async () => {
  stack = await startStack({ keepaliveIntervalMs: 20 });
});
afterAll(async () => {
  await stack.close();
});

const body = { model: "tiny", prompt: "Hi", max_tokens: 300, ignore_eos: true, stream: true, temperature: 0 };

describe("keepalive", () => {
  it("comments go out while the stream runs, between data events", async () => {
    const res = await fetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    const blocks = parseSse(await res.text());
    const keepalives = blocks.filter((b) => b.kind === "comment");
    expect(keepalives.length).toBeGreaterThan(0);
    for (const k of keepalives) expect(k).toEqual({ kind: "comment", text: "keepalive" });
    expect(blocks[blocks.length - 1]).toEqual({ kind: "done" });
  });

  it("the openai SDK reads the same text with keepalives in the stream", async () => {
    const client = new OpenAI({ baseURL: `${stack.url}/v1`, apiKey: "unused", maxRetries: 0 });
    const stream = await client.completions.create(body as OpenAI.CompletionCreateParamsStreaming);
    let text = "";
    for await (const chunk of stream) text += chunk.choices.map((c) => c.text).join("");
    const full = await client.completions.create({
      ...body,
      stream: false,
    } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(text).toBe(full.choices[0]?.text);
  });
});
