// What the service needs from its collaborators, as interfaces (src/upstream/vllm and
// src/budget implement them; main.ts wires the real ones in).

/** A key that authenticate() accepted. */
export interface KeyInfo {
  readonly id: string;
}

/** The Budget ledger (src/budget): keys, Holds, settle. */
export interface Ledger {
  /** Throws ApiError 401 `invalid_api_key`. */
  authenticate(authorization: string | undefined): KeyInfo;
  /** Throws ApiError 403 `model_not_allowed` unless the key may use the model (by id or one of its aliases). */
  checkModel(key: KeyInfo, modelId: string, aliases?: readonly string[]): void;
  /**
   * Reserves promptTokens + prompts × n × maxTokens in one transaction, lowering maxTokens to what
   * the Budget holds (clamped: true); throws ApiError 429 `insufficient_quota` when not one token fits.
   */
  placeHold(
    key: KeyInfo,
    demand: { promptTokens: number; prompts: number; n: number; maxTokens: number },
  ): { holdId: string; maxTokens: number; clamped: boolean; heldTokens: number };
  /** Keeps a long stream's Hold from being reclaimed as stale. */
  renew(holdId: string): void;
  /** Charges the tokens used and releases the rest; exactly once (later calls are no-ops). */
  settle(holdId: string, usedTokens: number): void;
}
