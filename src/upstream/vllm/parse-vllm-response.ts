import { ApiError } from "../../core/errors/index.js";
import { parseJsonOrdered } from "./parse-json-ordered.js";
import type {
  VllmActivations,
  VllmCompletion,
  VllmCompletionChoice,
  VllmCompletionChunk,
  VllmDetokenizeResponse,
  VllmLogprobs,
  VllmModel,
  VllmModelList,
  VllmPromptLogprob,
  VllmPromptLogprobs,
  VllmTokenizeResponse,
  VllmUsage,
} from "./types.js";

// Structural checks of Inference's JSON. Anything that does not fit is 502 `upstream_error`
// naming the path, so the converters can trust the wire types.

class Malformed extends Error {}

type Rec = Record<string, unknown>;

const fail = (path: string, expected: string): never => {
  throw new Malformed(`${path}: expected ${expected}`);
};
const rec = (v: unknown, path: string): Rec =>
  typeof v === "object" && v !== null && !Array.isArray(v) ? (v as Rec) : fail(path, "an object");
const arr = (v: unknown, path: string): unknown[] => (Array.isArray(v) ? v : fail(path, "an array"));
const str = (v: unknown, path: string): string => (typeof v === "string" ? v : fail(path, "a string"));
const num = (v: unknown, path: string): number =>
  typeof v === "number" && Number.isFinite(v) ? v : fail(path, "a number");
const int = (v: unknown, path: string): number =>
  Number.isSafeInteger(v) ? (v as number) : fail(path, "an integer");
const opt = <T>(v: unknown, path: string, f: (v: unknown, path: string) => T): T | null =>
  v === undefined || v === null ? null : f(v, path);
const ints = (v: unknown, path: string): number[] => arr(v, path).map((x, i) => int(x, `${path}[${i}]`));

function guard<T>(what: string, value: unknown, f: (v: unknown) => T): T {
  try {
    return f(value);
  } catch (err) {
    if (err instanceof Malformed) {
      throw new ApiError("upstream_error", `Inference sent a malformed ${what}.`, { cause: err });
    }
    throw err;
  }
}

function usage(v: unknown, path: string): VllmUsage {
  const o = rec(v, path);
  return {
    prompt_tokens: int(o.prompt_tokens, `${path}.prompt_tokens`),
    completion_tokens: int(o.completion_tokens ?? 0, `${path}.completion_tokens`),
    total_tokens: int(o.total_tokens, `${path}.total_tokens`),
  };
}

function logprobs(v: unknown, path: string): VllmLogprobs {
  const o = rec(v, path);
  const tokens = arr(o.tokens, `${path}.tokens`).map((x, i) => str(x, `${path}.tokens[${i}]`));
  const tokenLogprobs = arr(o.token_logprobs, `${path}.token_logprobs`).map((x, i) =>
    opt(x, `${path}.token_logprobs[${i}]`, num),
  );
  const textOffset = ints(o.text_offset, `${path}.text_offset`);
  const top = opt(o.top_logprobs, `${path}.top_logprobs`, arr)?.map((x, i) =>
    opt(x, `${path}.top_logprobs[${i}]`, (d, p) => {
      const dict = rec(d, p);
      for (const [k, lp] of Object.entries(dict)) num(lp, `${p}[${JSON.stringify(k)}]`);
      return dict as Record<string, number>;
    }),
  );
  if (tokenLogprobs.length !== tokens.length || textOffset.length !== tokens.length) {
    fail(path, "columns of equal length");
  }
  if (top !== undefined && top.length !== tokens.length) fail(`${path}.top_logprobs`, "one entry per token");
  return { tokens, token_logprobs: tokenLogprobs, text_offset: textOffset, top_logprobs: top ?? null };
}

function promptLogprobs(v: unknown, path: string): VllmPromptLogprobs {
  return arr(v, path).map((pos, i) =>
    opt(pos, `${path}[${i}]`, (d, p) => {
      const dict = rec(d, p);
      for (const [id, cand] of Object.entries(dict)) {
        const cp = `${p}[${JSON.stringify(id)}]`;
        if (!/^(0|[1-9][0-9]*)$/.test(id)) fail(cp, "a token id key");
        const c = rec(cand, cp);
        num(c.logprob, `${cp}.logprob`);
        opt(c.rank, `${cp}.rank`, int);
        opt(c.decoded_token, `${cp}.decoded_token`, str);
      }
      return dict as Record<string, VllmPromptLogprob>;
    }),
  );
}

const finishReasons = new Set(["stop", "length", "abort"]);

// The checks below build a field's path only when it fails: they run per stream chunk.

/** `choices[i]` of a completion or chunk. */
function choice(v: unknown, i: number): VllmCompletionChoice {
  if (typeof v !== "object" || v === null || Array.isArray(v)) fail(`choices[${i}]`, "an object");
  const o = v as Rec;
  const f = o.finish_reason;
  let finish: VllmCompletionChoice["finish_reason"] = null;
  if (f !== undefined && f !== null) {
    if (typeof f !== "string") fail(`choices[${i}].finish_reason`, "a string");
    if (!finishReasons.has(f as string)) fail(`choices[${i}].finish_reason`, "stop, length, abort or null");
    finish = f as VllmCompletionChoice["finish_reason"];
  }
  const stopReason = o.stop_reason;
  if (
    stopReason !== undefined &&
    stopReason !== null &&
    typeof stopReason !== "string" &&
    !Number.isSafeInteger(stopReason)
  ) {
    fail(`choices[${i}].stop_reason`, "an integer");
  }
  const index = o.index;
  if (!Number.isSafeInteger(index)) fail(`choices[${i}].index`, "an integer");
  const text = o.text;
  if (typeof text !== "string") fail(`choices[${i}].text`, "a string");
  const lp = o.logprobs;
  const plp = o.prompt_logprobs;
  const pti = o.prompt_token_ids;
  const ti = o.token_ids;
  return {
    index: index as number,
    text: text as string,
    logprobs: lp === undefined || lp === null ? null : logprobs(lp, `choices[${i}].logprobs`),
    finish_reason: finish,
    stop_reason: (stopReason ?? null) as string | number | null,
    prompt_logprobs:
      plp === undefined || plp === null ? null : promptLogprobs(plp, `choices[${i}].prompt_logprobs`),
    prompt_token_ids: pti === undefined || pti === null ? null : ints(pti, `choices[${i}].prompt_token_ids`),
    token_ids: ti === undefined || ti === null ? null : ints(ti, `choices[${i}].token_ids`),
  };
}

function choices(v: unknown): VllmCompletionChoice[] {
  if (!Array.isArray(v)) fail("choices", "an array");
  const list = v as unknown[];
  const out = new Array<VllmCompletionChoice>(list.length);
  for (let i = 0; i < list.length; i++) out[i] = choice(list[i], i);
  return out;
}

/**
 * The fields a completion and a stream chunk share, checked in field order (the first bad field
 * is the one named). Written out, not spread: this runs once per streamed chunk.
 */
function chunkFields(o: Rec): VllmCompletionChunk {
  return {
    id: str(o.id ?? "", "id"),
    object: str(o.object ?? "", "object"),
    created: int(o.created ?? 0, "created"),
    model: str(o.model ?? "", "model"),
    choices: choices(o.choices),
    usage: opt(o.usage, "usage", usage),
  };
}

/** A non-streamed completion body (parsed JSON) → VllmCompletion; throws ApiError 502 when malformed. */
export function parseVllmCompletion(json: unknown): VllmCompletion {
  return guard("completion", json, (v) => {
    const o = rec(v, "$");
    // A chunk's fields, then `activations` set on the same object (last, as before): a spread
    // here cost ~2 µs per chunk.
    const completion = chunkFields(o) as VllmCompletion;
    completion.activations = opt(o.activations, "activations", rec) as VllmActivations | null;
    return completion;
  });
}

/** One stream event's JSON → VllmCompletionChunk; throws ApiError 502 when malformed. */
export function parseVllmCompletionChunk(json: unknown): VllmCompletionChunk {
  return guard("stream chunk", json, (v) => chunkFields(rec(v, "$")));
}

/** A `GET /v1/models` body → VllmModelList; throws ApiError 502 when malformed. */
export function parseVllmModelList(json: unknown): VllmModelList {
  return guard("model list", json, (v) => {
    const o = rec(v, "$");
    return {
      object: str(o.object ?? "list", "object"),
      data: arr(o.data, "data").map((m, i): VllmModel => {
        const p = `data[${i}]`;
        const r = rec(m, p);
        return {
          id: str(r.id, `${p}.id`),
          object: str(r.object ?? "model", `${p}.object`),
          created: int(r.created ?? 0, `${p}.created`),
          owned_by: str(r.owned_by ?? "vllm", `${p}.owned_by`),
          root: opt(r.root, `${p}.root`, str),
          parent: opt(r.parent, `${p}.parent`, str),
          max_model_len: opt(r.max_model_len, `${p}.max_model_len`, int),
        };
      }),
    };
  });
}

/** A `POST /tokenize` body → VllmTokenizeResponse; throws ApiError 502 when malformed. */
export function parseVllmTokenizeResponse(json: unknown): VllmTokenizeResponse {
  return guard("tokenize response", json, (v) => {
    const o = rec(v, "$");
    const tokens = ints(o.tokens, "tokens");
    const count = int(o.count, "count");
    if (count !== tokens.length) fail("count", "the number of tokens");
    const strs = opt(o.token_strs, "token_strs", (s, p) => arr(s, p).map((x, i) => str(x, `${p}[${i}]`)));
    if (strs !== null && strs.length !== tokens.length) fail("token_strs", "one string per token");
    return { count, tokens, max_model_len: int(o.max_model_len, "max_model_len"), token_strs: strs };
  });
}

/** A `POST /detokenize` body → VllmDetokenizeResponse; throws ApiError 502 when malformed. */
export function parseVllmDetokenizeResponse(json: unknown): VllmDetokenizeResponse {
  return guard("detokenize response", json, (v) => ({ prompt: str(rec(v, "$").prompt, "prompt") }));
}

const INTEGER_KEY = /^(?:0|[1-9][0-9]{0,9})$/;

function hasIntegerKey(dict: unknown): boolean {
  if (typeof dict !== "object" || dict === null) return false;
  for (const k in dict) if (INTEGER_KEY.test(k)) return true;
  return false;
}

/**
 * JSON text of a completion or chunk from Inference → its value. Uses the native JSON.parse, and
 * parses again with {@link parseJsonOrdered} only when a logprob dict has integer-like keys (whose
 * source order JSON.parse loses): every prompt_logprobs, and top_logprobs holding a token like
 * "1". Throws SyntaxError for invalid JSON.
 */
export function parseVllmJson(text: string): unknown {
  const json: unknown = JSON.parse(text);
  const choices = (json as { choices?: unknown } | null)?.choices;
  if (!Array.isArray(choices)) return json;
  for (const c of choices) {
    if (typeof c !== "object" || c === null) continue;
    const { logprobs, prompt_logprobs } = c as {
      logprobs?: { top_logprobs?: unknown } | null;
      prompt_logprobs?: unknown;
    };
    const top = logprobs?.top_logprobs;
    if (
      (Array.isArray(top) && top.some(hasIntegerKey)) ||
      (Array.isArray(prompt_logprobs) && prompt_logprobs.some(hasIntegerKey))
    ) {
      return parseJsonOrdered(text);
    }
  }
  return json;
}
