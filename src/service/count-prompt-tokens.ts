import type { CreateCompletionRequest } from "../../gen/acs/v1/completions_pb.js";
import type { VllmClient } from "../upstream/index.js";

/** Most `/tokenize` calls one request has in flight at once. */
export const MAX_CONCURRENT_TOKENIZE = 8;

/**
 * The tokens of each prompt of `request`, as the Hold counts them (BOS included when
 * add_special_tokens): token-id prompts by their length; text prompts by Inference's `/tokenize`
 * (the client caches answers). Identical texts of one request are counted once, and at most
 * {@link MAX_CONCURRENT_TOKENIZE} calls run at a time. Throws the client's ApiError (e.g. 503
 * when Inference is down, `canceled` on `signal`).
 */
export async function countPromptTokens(
  client: Pick<VllmClient, "tokenize">,
  servedModelName: string,
  request: CreateCompletionRequest,
  signal: AbortSignal,
): Promise<number[]> {
  const p = request.prompt;
  if (p.case === "tokenIds") return [p.value.values.length];
  if (p.case === "tokenIdsList") return p.value.values.map((v) => v.values.length);
  const texts = p.case === "text" ? [p.value] : p.case === "texts" ? p.value.values : [];
  const addSpecialTokens = request.addSpecialTokens ?? true;
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
