import type { CreateCompletionRequest } from "../../gen/acs/v1/completions_pb.js";
import type { Inference } from "../upstream/index.js";

/** Most `/tokenize` calls one request has in flight at once. */
export const MAX_CONCURRENT_TOKENIZE = 8;

/**
 * The tokens of each prompt of `request`, as the Hold counts them (BOS included when
 * add_special_tokens): token-id prompts by their length; text prompts by Inference's `/tokenize`
 * (cached by the port). Identical texts of one request are counted once, and at most
 * {@link MAX_CONCURRENT_TOKENIZE} calls run at a time. Throws the client's ApiError (e.g. 503
 * when Inference is down, `canceled` on `signal`).
 */
export async function countPromptTokens(
  client: Pick<Inference, "tokenize">,
  servedModelName: string,
  request: CreateCompletionRequest,
  signal: AbortSignal,
): Promise<number[]> {
  const p = request.prompt;
  if (p.case === "tokenIds") return [p.value.values.length];
  if (p.case === "tokenIdsList") return p.value.values.map((v) => v.values.length);
  const addSpecialTokens = request.addSpecialTokens ?? true;
  // One text (the usual request): one call, without the de-duplication and workers below.
  if (p.case === "text") {
    return [(await client.tokenize(servedModelName, p.value, addSpecialTokens, signal)).count];
  }
  const texts = p.case === "texts" ? p.value.values : [];
  const unique = [...new Set(texts)];
  const counts = new Map<string, number>();
  let next = 0;
  let failed = false;
  const worker = async (): Promise<void> => {
    while (next < unique.length && !failed) {
      const text = unique[next++]!;
      try {
        counts.set(text, (await client.tokenize(servedModelName, text, addSpecialTokens, signal)).count);
      } catch (err) {
        failed = true; // the other workers stop after their current call
        throw err;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(MAX_CONCURRENT_TOKENIZE, unique.length) }, worker));
  return texts.map((text) => counts.get(text)!);
}

/**
 * An upper bound of each prompt's tokens, without Inference: a token-id prompt by its length; a
 * text prompt by its UTF-8 bytes plus `specialTokens` (the special tokens the tokenizer adds, e.g.
 * BOS; pass 0 for `add_special_tokens: false`). Sound for a byte-level BPE without a normalizer,
 * where every token of text covers at least one byte (a special token written in the text covers
 * many). Tokens, in the request's order.
 */
export function boundPromptTokens(request: CreateCompletionRequest, specialTokens: number): number[] {
  const p = request.prompt;
  if (p.case === "tokenIds") return [p.value.values.length];
  if (p.case === "tokenIdsList") return p.value.values.map((v) => v.values.length);
  const texts = p.case === "text" ? [p.value] : p.case === "texts" ? p.value.values : [];
  return texts.map((text) => Buffer.byteLength(text, "utf8") + specialTokens);
}

/**
 * The special tokens a model's tokenizer adds to a text prompt with `add_special_tokens` (BOS…),
 * learned once per served model from Inference's `/tokenize` of `""` and kept (a tokenizer adds
 * the same ones to every text). A failed call is not kept: the next request asks again. Throws
 * the client's ApiError.
 */
export function createSpecialTokenCounter(): (
  client: Pick<Inference, "tokenize">,
  servedModelName: string,
  signal: AbortSignal,
) => Promise<number> {
  const known = new WeakMap<object, Map<string, number>>();
  return async (client, servedModelName, signal) => {
    let byModel = known.get(client);
    const hit = byModel?.get(servedModelName);
    if (hit !== undefined) return hit;
    const { count } = await client.tokenize(servedModelName, "", true, signal);
    if (byModel === undefined) {
      byModel = new Map();
      known.set(client, byModel);
    }
    byModel.set(servedModelName, count);
    return count;
  };
}
