/**
 * Tokenizers: a byte-level one (tiny preset) and the Llama 3 one (llama-8b preset).
 * Both expose each token's raw bytes so that text can be decoded incrementally (UTF-8 held back).
 */
import llama3Tokenizer from "llama3-tokenizer-js";

/** A tokenizer as the engine needs it. Token ids are integers in [0, vocabSize). */
export interface Tokenizer {
  readonly vocabSize: number;
  readonly bosId: number;
  readonly eosId: number;
  /** Encodes text; prepends BOS when `addSpecialTokens`. */
  encode(text: string, addSpecialTokens: boolean): number[];
  /** Raw bytes of one token (a special token's bytes are its literal name). */
  tokenBytes(id: number): Uint8Array;
  /** True for BOS/EOS and other control tokens (dropped by skip_special_tokens). */
  isSpecial(id: number): boolean;
  /** Decodes a list of ids (invalid UTF-8 becomes U+FFFD). */
  decode(ids: readonly number[], skipSpecialTokens: boolean): string;
}

const utf8 = new TextEncoder();

function decodeWith(
  tok: Pick<Tokenizer, "tokenBytes" | "isSpecial">,
  ids: readonly number[],
  skip: boolean,
): string {
  const parts: Uint8Array[] = [];
  let total = 0;
  for (const id of ids) {
    if (skip && tok.isSpecial(id)) continue;
    const b = tok.tokenBytes(id);
    parts.push(b);
    total += b.length;
  }
  const all = new Uint8Array(total);
  let off = 0;
  for (const p of parts) {
    all.set(p, off);
    off += p.length;
  }
  return new TextDecoder().decode(all);
}

/** Byte-level tokenizer: ids 0–255 are bytes, 256 is BOS `<|begin_of_text|>`, 257 is EOS `<|end_of_text|>`. */
export function createByteTokenizer(): Tokenizer {
  const specials = [utf8.encode("<|begin_of_text|>"), utf8.encode("<|end_of_text|>")];
  const singles = Array.from({ length: 256 }, (_, i) => Uint8Array.of(i));
  const tok: Tokenizer = {
    vocabSize: 258,
    bosId: 256,
    eosId: 257,
    encode(text, addSpecialTokens) {
      const bytes = Array.from(utf8.encode(text));
      return addSpecialTokens ? [256, ...bytes] : bytes;
    },
    tokenBytes(id) {
      return id < 256 ? singles[id]! : (specials[id - 256] ?? new Uint8Array(0));
    },
    isSpecial(id) {
      return id >= 256;
    },
    decode(ids, skip) {
      return decodeWith(tok, ids, skip);
    },
  };
  return tok;
}

/** GPT-2 byte ↔ printable-character table used by tiktoken-style vocabularies. */
function unicodeToBytes(): Map<string, number> {
  const bs: number[] = [];
  for (let i = 33; i <= 126; i++) bs.push(i);
  for (let i = 161; i <= 172; i++) bs.push(i);
  for (let i = 174; i <= 255; i++) bs.push(i);
  const cs = [...bs];
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n);
      n++;
    }
  }
  const map = new Map<string, number>();
  bs.forEach((b, i) => {
    map.set(String.fromCharCode(cs[i]!), b);
  });
  return map;
}

/** The Llama 3 tokenizer (vocab 128256, BOS 128000, EOS 128001). Ids ≥ 128000 are special. */
export function createLlama3Tokenizer(): Tokenizer {
  const vocab = llama3Tokenizer.vocabById;
  const u2b = unicodeToBytes();
  const cache = new Map<number, Uint8Array>();
  const tok: Tokenizer = {
    vocabSize: 128256,
    bosId: 128000,
    eosId: 128001,
    encode(text, addSpecialTokens) {
      return llama3Tokenizer.encode(text, { bos: addSpecialTokens, eos: false });
    },
    tokenBytes(id) {
      let b = cache.get(id);
      if (b) return b;
      const s = vocab[id] ?? "";
      if (id >= 128000) {
        b = utf8.encode(s);
      } else {
        const out: number[] = [];
        for (const ch of s) out.push(u2b.get(ch) ?? 63);
        b = Uint8Array.from(out);
      }
      cache.set(id, b);
      return b;
    },
    isSpecial(id) {
      return id >= 128000;
    },
    decode(ids, skip) {
      return decodeWith(tok, ids, skip);
    },
  };
  return tok;
}
