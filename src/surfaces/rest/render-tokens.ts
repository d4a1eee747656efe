import type { DetokenizeResponse, TokenizeResponse } from "../../../gen/acs/v1/completions_pb.js";

/** vLLM's `POST /tokenize` answer. */
export interface TokenizeJson {
  count: number;
  max_model_len: number;
  tokens: number[];
  /** Each token's string when `return_token_strs` was true, else null (as vLLM writes it). */
  token_strs: string[] | null;
}

/** vLLM's `POST /detokenize` answer. */
export interface DetokenizeJson {
  prompt: string;
}

/** A TokenizeResponse in vLLM's JSON; `returnTokenStrs`: the request's `return_token_strs`. */
export function renderTokenize(response: TokenizeResponse, returnTokenStrs: boolean): TokenizeJson {
  return {
    count: response.count,
    max_model_len: response.maxModelLen,
    tokens: response.tokens,
    token_strs: returnTokenStrs ? response.tokenStrs : null,
  };
}

/** A DetokenizeResponse in vLLM's JSON. */
export function renderDetokenize(response: DetokenizeResponse): DetokenizeJson {
  return { prompt: response.prompt };
}
