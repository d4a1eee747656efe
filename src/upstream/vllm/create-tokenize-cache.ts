/** A cached tokenization: the prompt's token ids and the model's max_model_len. */
export interface TokenizeEntry {
  readonly tokens: readonly number[];
  readonly maxModelLen: number;
}

/** An LRU cache of `/tokenize` results, bounded by entries and by (estimated) bytes. */
export interface TokenizeCache {
  /** The entry for (model, addSpecialTokens, prompt), marked most recently used; or undefined. */
  get(model: string, addSpecialTokens: boolean, prompt: string): TokenizeEntry | undefined;
  /** Stores an entry, evicting least recently used ones until both bounds hold. */
  set(model: string, addSpecialTokens: boolean, prompt: string, entry: TokenizeEntry): void;
  /** Entries held. */
  readonly size: number;
  /** Estimated bytes held. */
  readonly bytes: number;
}

/**
 * An LRU cache for tokenizations. Safe because tokenization is deterministic per model and
 * add_special_tokens. Size estimate per entry: 2 bytes per key character (UTF-16) plus 8 bytes
 * per token plus 64 bytes of overhead. An entry larger than `maxBytes` is not stored.
 * Defaults: 4,096 entries, 64 MiB.
 */
export function createTokenizeCache(options: { maxEntries?: number; maxBytes?: number } = {}): TokenizeCache {
  const maxEntries = options.maxEntries ?? 4096;
  const maxBytes = options.maxBytes ?? 64 * 1024 * 1024;
  const map = new Map<string, { entry: TokenizeEntry; bytes: number }>();
  let bytes = 0;
  // The model name cannot contain "\u0000" in practice; the length prefix makes the key unambiguous anyway.
  const keyOf = (model: string, add: boolean, prompt: string): string =>
    `${model.length}:${model}\u0000${add ? 1 : 0}\u0000${prompt}`;
  return {
    get(model, addSpecialTokens, prompt) {
      const key = keyOf(model, addSpecialTokens, prompt);
      const hit = map.get(key);
      if (hit === undefined) return undefined;
      map.delete(key);
      map.set(key, hit);
      return hit.entry;
    },
    set(model, addSpecialTokens, prompt, entry) {
      const key = keyOf(model, addSpecialTokens, prompt);
      const size = key.length * 2 + entry.tokens.length * 8 + 64;
      const old = map.get(key);
      if (old !== undefined) {
        map.delete(key);
        bytes -= old.bytes;
      }
      if (size > maxBytes || maxEntries < 1) return;
      const frozen: TokenizeEntry = Object.freeze({
        tokens: Object.freeze([...entry.tokens]),
        maxModelLen: entry.maxModelLen,
      });
      map.set(key, { entry: frozen, bytes: size });
      bytes += size;
      while (map.size > maxEntries || bytes > maxBytes) {
        const oldest = map.keys().next();
        if (oldest.done) break;
        bytes -= map.get(oldest.value)?.bytes ?? 0;
        map.delete(oldest.value);
      }
    },
    get size() {
      return map.size;
    },
    get bytes() {
      return bytes;
    },
  };
}
