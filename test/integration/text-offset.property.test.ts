// `text_offset` points into each choice's own text: generated requests (echo with BOS, special
// tokens skipped or kept, stop strings with and without include_stop_str_in_output, several
// prompts, n > 1, stream and non-stream, prompt_logprobs) against the real reference engine
// through the gateway, checked against an oracle that places each token by its bytes (the
// engine's tokenizer), on both presets: llama-8b (the Llama 3 tokenizer: special tokens,
// multi-byte tokens) and tiny (one token per byte: every non-ASCII character is split).
import fc from "fast-check";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { loadPreset } from "../../src/engine/index.js";
import type {
  CompletionChunkJson,
  CompletionJson,
  LogprobsJson,
} from "../../src/surfaces/rest/render-completion.js";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
import { sseChunks } from "../helpers/parse-sse.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { expectOffsetsIntoText, type OracleToken } from "../helpers/text-offsets-oracle.js";

const presets = ["tiny", "llama-8b"] as const;
type Preset = (typeof presets)[number];
const stacks = new Map<Preset, Stack>();

beforeAll(async () => {
  for (const p of presets) stacks.set(p, await startStack({ preset: p }));
}, 120_000);
afterAll(async () => {
  for (const s of stacks.values()) await s.close();
});
// Every REST response also conforms to /openapi.json (test/helpers/openapi-check.ts).
afterEach(assertConforming);

async function post(preset: Preset, body: Record<string, unknown>): Promise<Response> {
  const stack = stacks.get(preset) as Stack;
  return checkedFetch(`${stack.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: stack.alias, ...body }),
  });
}

/** One choice as the caller saw it: its text, and per chunk the text so far and the tokens. */
interface SeenChoice {
  text: string;
  promptIds: number[];
  ids: number[];
  logprobs: { tokens: string[]; text_offset: number[]; received: number[] };
}

function seenChoice(): SeenChoice {
  return { text: "", promptIds: [], ids: [], logprobs: { tokens: [], text_offset: [], received: [] } };
}

function add(seen: SeenChoice, part: { text: string; logprobs: LogprobsJson | null }, ids: number[]) {
  seen.text += part.text;
  seen.ids.push(...ids);
  const received = [...seen.text].length;
  for (const [i, token] of (part.logprobs?.tokens ?? []).entries()) {
    seen.logprobs.tokens.push(token);
    seen.logprobs.text_offset.push(part.logprobs?.text_offset[i] as number);
    seen.logprobs.received.push(received);
  }
}

/** Sends the request (stream or not) and gives each choice as the caller saw it. */
async function choicesOf(preset: Preset, body: Record<string, unknown>): Promise<SeenChoice[]> {
  const res = await post(preset, body);
  const text = await res.text();
  expect(res.status, text).toBe(200);
  const seen = new Map<number, SeenChoice>();
  const of = (i: number) => seen.get(i) ?? (seen.set(i, seenChoice()).get(i) as SeenChoice);
  if (body.stream === true) {
    for (const chunk of sseChunks<CompletionChunkJson>(text)) {
      for (const c of chunk.choices) {
        const s = of(c.index);
        if (c.prompt_token_ids) s.promptIds = c.prompt_token_ids;
        add(s, c, c.token_ids ?? []);
      }
    }
  } else {
    for (const c of (JSON.parse(text) as CompletionJson).choices) {
      const s = of(c.index);
      s.promptIds = c.prompt_token_ids ?? [];
      add(s, c, c.token_ids ?? []);
    }
  }
  return [...seen.entries()].sort(([a], [b]) => a - b).map(([, s]) => s);
}

/** The oracle's view of a choice's tokens: the echoed prompt's, then the generated ones. */
function oracleTokens(preset: Preset, body: Record<string, unknown>, c: SeenChoice): OracleToken[] {
  const tok = loadPreset(preset).tokenizer;
  const addSpecial = body.add_special_tokens !== false;
  const skip = body.skip_special_tokens !== false;
  const ids = body.echo === true ? [...c.promptIds, ...c.ids] : c.ids;
  expect(c.logprobs.tokens).toHaveLength(ids.length);
  return ids.map((id, i) => {
    const prompt = body.echo === true && i < c.promptIds.length;
    return {
      str: c.logprobs.tokens[i] as string,
      bytes: tok.tokenBytes(id),
      // An echoed prompt is the prompt string: the BOS the tokenizer added is not in it.
      inText: prompt ? i > 0 || !addSpecial : !(skip && tok.isSpecial(id)),
      receivedCodePoints: c.logprobs.received[i] as number,
      outputStart: i === (body.echo === true ? c.promptIds.length : 0),
    };
  });
}

describe("text_offset points into the choice's own text", () => {
  it("the issue's request: echo on llama-8b, the BOS has zero width and the continuation starts at the prompt's end", async () => {
    const body = {
      prompt: "The sky is blue",
      max_tokens: 1,
      temperature: 0,
      echo: true,
      logprobs: 0,
      return_token_ids: true,
    };
    for (const stream of [false, true]) {
      const [c] = await choicesOf("llama-8b", { ...body, stream });
      const choice = c as SeenChoice;
      expect(choice.logprobs.tokens.slice(0, 5)).toEqual([
        "<|begin_of_text|>",
        "The",
        " sky",
        " is",
        " blue",
      ]);
      expect(choice.logprobs.text_offset).toEqual([0, 0, 3, 7, 10, 15]);
      expect(choice.text.slice(15).startsWith(choice.logprobs.tokens[5] as string)).toBe(true);
      expectOffsetsIntoText(choice.text, oracleTokens("llama-8b", body, choice), choice.logprobs.text_offset);
    }
  });

  const piece = fc.oneof(
    fc.string({ unit: "grapheme-ascii", maxLength: 8 }),
    fc.string({ unit: "binary", maxLength: 3 }),
    fc.constantFrom("é", "😀", "中文", "\uFFFD", " the", "<|eot_id|>", "Four score"),
  );
  const prompt = fc
    .array(piece, { minLength: 1, maxLength: 4 })
    .map((parts) => parts.join(""))
    .filter((p) => p.length > 0);
  const request = fc
    .record({
      preset: fc.constantFrom<Preset>(...presets),
      prompt: fc.oneof(prompt, fc.array(prompt, { minLength: 2, maxLength: 2 })),
      max_tokens: fc.integer({ min: 1, max: 6 }),
      n: fc.constantFrom(1, 2),
      seed: fc.integer({ min: 0, max: 1000 }),
      greedy: fc.boolean(),
      logprobs: fc.integer({ min: 0, max: 2 }),
      echo: fc.boolean(),
      stop: fc.array(fc.constantFrom("e", " t", "th", "o ", "\n", "é", "<|"), { maxLength: 2 }),
      include_stop_str_in_output: fc.boolean(),
      skip_special_tokens: fc.boolean(),
      spaces_between_special_tokens: fc.boolean(),
      add_special_tokens: fc.boolean(),
      ignore_eos: fc.boolean(),
      stream: fc.boolean(),
      prompt_logprobs: fc.option(fc.constant(1), { nil: undefined }),
    })
    .map(({ preset, greedy, n, prompt_logprobs, ...r }) => ({
      preset,
      body: {
        ...r,
        n: greedy ? 1 : n,
        temperature: greedy ? 0 : 1,
        return_token_ids: true,
        // prompt_logprobs is refused with a stream; without one it takes Inference's non-streamed answer.
        ...(prompt_logprobs !== undefined && !r.stream ? { prompt_logprobs } : {}),
      } as Record<string, unknown>,
    }));

  it("for generated requests on both presets, stream and non-stream (property)", async () => {
    await fc.assert(
      fc.asyncProperty(request, async ({ preset, body }) => {
        const choices = await choicesOf(preset, body);
        const prompts = Array.isArray(body.prompt) ? body.prompt.length : 1;
        expect(choices).toHaveLength(prompts * (body.n as number));
        for (const c of choices) {
          expectOffsetsIntoText(c.text, oracleTokens(preset, body, c), c.logprobs.text_offset);
        }
      }),
      { numRuns: 60 },
    );
  }, 600_000);
});
