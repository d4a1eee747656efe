/**
 * Tokenizers: a byte-level one (tiny preset) and the Llama 3 one (llama-8b preset).
 * Both expose each token's raw bytes so that text can be decoded incrementally (UTF-8 held back).
 */
import { setImmediate as yieldToLoop } from "node:timers/promises";
import llama3Tokenizer from "llama3-tokenizer-js";

/** A tokenizer as the engine needs it. Token ids are integers in [0, vocabSize). */
export interface Tokenizer {
  readonly vocabSize: number;
  readonly bosId: number;
  readonly eosId: number;
  /** Encodes text; prepends BOS when `addSpecialTokens`. */
  encode(text: string, addSpecialTokens: boolean): number[];
  /**
   * Same ids as `encode`, but gives the event loop a turn (setImmediate) every few milliseconds
   * of work, so a huge prompt does not block other requests while it is tokenized.
   */
  encodeAsync(text: string, addSpecialTokens: boolean): Promise<number[]>;
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
      // no spread: `[256, ...bytes]` overflows the stack for prompts of ~100 k bytes and more
      const bytes = utf8.encode(text);
      const off = addSpecialTokens ? 1 : 0;
      const out = new Array<number>(bytes.length + off);
      if (addSpecialTokens) out[0] = 256;
      for (let i = 0; i < bytes.length; i++) out[i + off] = bytes[i]!;
      return out;
    },
    async encodeAsync(text, addSpecialTokens) {
      return tok.encode(text, addSpecialTokens);
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
function byteChars(): string[] {
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
  const out = new Array<string>(256);
  bs.forEach((b, i) => {
    out[b] = String.fromCharCode(cs[i]!);
  });
  return out;
}

/** Special tokens recognised in text (the same list as llama3-tokenizer-js's encode). */
const SPECIAL_RE =
  /<\|(?:begin_of_text|end_of_text|start_header_id|end_header_id|eot_id|eom_id|python_tag|finetune_right_pad_id|reserved_special_token_(?:[0-9]|[1-9][0-9]|1[0-9][0-9]|2[0-3][0-9]|24[0-7]))\|>/g;
/** Llama 3's pre-tokenizer regex, as llama3-tokenizer-js rewrites it for JavaScript. */
const PRETOKEN_RE =
  /(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;

/** Pieces of `text` split by `re`, keeping the matches (text between matches included). */
function* splitKeep(text: string, re: RegExp): Generator<{ piece: string; matched: boolean }> {
  let prev = 0;
  for (const m of text.matchAll(re)) {
    const i = m.index ?? 0;
    if (prev < i) yield { piece: text.slice(prev, i), matched: false };
    if (m[0].length > 0) yield { piece: m[0], matched: true };
    prev = i + m[0].length;
  }
  if (prev < text.length) yield { piece: text.slice(prev), matched: false };
}

/** Pieces cached across calls (short ones only); cleared when full. */
const PIECE_CACHE_MAX = 100_000;
const PIECE_CACHE_LEN = 64;
/** Work units (pre-tokens, BPE merges) between checks of the time slice. */
const WORK_PER_CHECK = 4096;

/**
 * Llama 3 BPE over llama3-tokenizer-js's vocabulary and merges, giving the same ids as its
 * `encode` (special tokens in text, `ignore_merges`, merges by rank then leftmost position), but
 * linear in memory and O(n log n) in a pre-token's length, without spreading arrays (the library
 * overflows the stack on a pre-token of ~1 M characters and builds a node object per character).
 * `steps` yields every few thousand units of work so that a caller can give the event loop a turn.
 */
class Llama3Encoder {
  private readonly byteId = new Int32Array(256);
  private readonly byteChar = byteChars();
  /** (left id · 2^17 + right id) → rank · 2^17 + merged id. */
  private readonly pairs = new Map<number, number>();
  private readonly maxTokenChars: number;
  private readonly cache = new Map<string, number | number[]>();
  private buf = new Uint8Array(1024);
  private readonly small = newBpeState(SMALL_PIECE);

  constructor(
    private readonly vocab: ReadonlyMap<string, number>,
    merges: ReadonlyMap<string, number>,
  ) {
    for (let b = 0; b < 256; b++) this.byteId[b] = vocab.get(this.byteChar[b]!)!;
    let maxLen = 0;
    for (const s of vocab.keys()) if (s.length > maxLen) maxLen = s.length;
    this.maxTokenChars = maxLen;
    for (const [key, rank] of merges) {
      const sp = key.indexOf(" ");
      const l = key.slice(0, sp);
      const r = key.slice(sp + 1);
      const a = vocab.get(l);
      const b = vocab.get(r);
      const m = vocab.get(l + r);
      if (a === undefined || b === undefined || m === undefined) continue;
      this.pairs.set(a * 131072 + b, rank * 131072 + m);
    }
  }

  /** Encodes `text` into `out`; yields after every WORK_PER_CHECK units of work. */
  *steps(text: string, bos: boolean, out: number[]): Generator<void, void, void> {
    if (bos) out.push(BOS_ID);
    let work = 0;
    for (const seg of splitKeep(text, SPECIAL_RE)) {
      if (seg.matched) {
        out.push(this.vocab.get(seg.piece)!);
        continue;
      }
      for (const { piece } of splitKeep(seg.piece, PRETOKEN_RE)) {
        if (++work % WORK_PER_CHECK === 0) yield;
        const cached = this.cache.get(piece);
        if (cached !== undefined) {
          if (typeof cached === "number") out.push(cached);
          else for (const id of cached) out.push(id);
          continue;
        }
        const start = out.length;
        yield* this.piece(piece, out);
        if (piece.length <= PIECE_CACHE_LEN) {
          if (this.cache.size >= PIECE_CACHE_MAX) this.cache.clear();
          this.cache.set(piece, out.length - start === 1 ? out[start]! : out.slice(start));
        }
      }
    }
  }

  /** One pre-token: a whole vocabulary entry (ignore_merges), else byte-level BPE. */
  private *piece(piece: string, out: number[]): Generator<void, void, void> {
    if (this.buf.length < piece.length * 3) this.buf = new Uint8Array(piece.length * 3);
    const n = utf8.encodeInto(piece, this.buf).written;
    const bytes = this.buf;
    if (n <= this.maxTokenChars) {
      let s = "";
      for (let i = 0; i < n; i++) s += this.byteChar[bytes[i]!];
      const id = this.vocab.get(s);
      if (id !== undefined) {
        out.push(id);
        return;
      }
    }
    if (n === 1) {
      out.push(this.byteId[bytes[0]!]!);
      return;
    }
    // A short pre-token never yields, so it can use the shared scratch arrays.
    const st = n <= SMALL_PIECE ? this.small : newBpeState(n);
    const { ids, next } = st;
    for (let i = 0; i < n; i++) {
      ids[i] = this.byteId[bytes[i]!]!;
      next[i] = i + 1 < n ? i + 1 : -1;
      st.prev[i] = i - 1;
    }
    // queue every adjacent pair that has a merge, then heapify (O(n), no per-push sifting)
    let size = 0;
    const heap = st.heap;
    for (let i = 0; i + 1 < n; i++) {
      if (i % (16 * WORK_PER_CHECK) === 16 * WORK_PER_CHECK - 1) yield;
      const v = this.pairs.get(ids[i]! * 131072 + ids[i + 1]!);
      if (v !== undefined) heap[size++] = Math.floor(v / 131072) * 4294967296 + i;
    }
    st.size = size;
    for (let i = (size >> 1) - 1; i >= 0; i--) siftDown(heap, size, i, heap[i]!);
    while (!this.merge(st, WORK_PER_CHECK)) yield;
    for (let i = 0; i >= 0; i = next[i]!) out.push(ids[i]!);
  }

  /** Queues the pair starting at symbol `pos` (if it has a merge) as rank · 2^32 + pos. */
  private consider(st: BpeState, pos: number): void {
    const r = st.next[pos]!;
    if (r < 0) return;
    const v = this.pairs.get(st.ids[pos]! * 131072 + st.ids[r]!);
    if (v === undefined) return;
    const key = Math.floor(v / 131072) * 4294967296 + pos;
    if (st.size === st.heap.length) {
      const h = new Float64Array(st.heap.length * 2);
      h.set(st.heap);
      st.heap = h;
    }
    const heap = st.heap;
    let i = st.size++;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (heap[p]! <= key) break;
      heap[i] = heap[p]!;
      i = p;
    }
    heap[i] = key;
  }

  /** Applies up to `maxPops` queue entries (lowest rank, then leftmost first); true when done. */
  private merge(st: BpeState, maxPops: number): boolean {
    const { ids, next, prev } = st;
    for (let k = 0; k < maxPops; k++) {
      if (st.size === 0) return true;
      const heap = st.heap;
      const key = heap[0]!;
      const last = heap[--st.size]!;
      siftDown(heap, st.size, 0, last);
      const pos = key % 4294967296;
      const rank = (key - pos) / 4294967296;
      const r = next[pos]!;
      if (ids[pos]! < 0 || r < 0) continue;
      const v = this.pairs.get(ids[pos]! * 131072 + ids[r]!);
      if (v === undefined || Math.floor(v / 131072) !== rank) continue; // stale entry
      ids[pos] = v % 131072;
      ids[r] = -1;
      const rn = next[r]!;
      next[pos] = rn;
      if (rn >= 0) prev[rn] = pos;
      if (prev[pos]! >= 0) this.consider(st, prev[pos]!);
      this.consider(st, pos);
    }
    return st.size === 0;
  }
}

/** Places `key` at `i` in the min-heap `heap[0, size)`, moving it down to its place. */
function siftDown(heap: Float64Array, size: number, i: number, key: number): void {
  for (;;) {
    let c = 2 * i + 1;
    if (c >= size) break;
    if (c + 1 < size && heap[c + 1]! < heap[c]!) c++;
    if (heap[c]! >= key) break;
    heap[i] = heap[c]!;
    i = c;
  }
  heap[i] = key;
}

/** Symbols of one pre-token (ids[i] = -1 once merged into its left neighbour) and its merge queue. */
interface BpeState {
  ids: Int32Array;
  next: Int32Array;
  prev: Int32Array;
  heap: Float64Array;
  size: number;
}

function newBpeState(n: number): BpeState {
  return {
    ids: new Int32Array(n),
    next: new Int32Array(n),
    prev: new Int32Array(n),
    heap: new Float64Array(Math.max(16, 3 * n)), // ≤ (n − 1) + 2 per merge entries: never grows
    size: 0,
  };
}

/** Pre-tokens up to this many bytes use shared scratch arrays (they finish without yielding). */
const SMALL_PIECE = 1024;

const BOS_ID = 128000;
/** Longest stretch of tokenization between two turns of the event loop (encodeAsync). */
const SLICE_MS = 8;

/** The Llama 3 tokenizer (vocab 128256, BOS 128000, EOS 128001). Ids ≥ 128000 are special. */
export function createLlama3Tokenizer(): Tokenizer {
  const vocab = llama3Tokenizer.vocabById;
  const u2b = new Map(byteChars().map((ch, b) => [ch, b]));
  const encoder = new Llama3Encoder(llama3Tokenizer.vocabByString, llama3Tokenizer.merges);
  const cache = new Map<number, Uint8Array>();
  const tok: Tokenizer = {
    vocabSize: 128256,
    bosId: 128000,
    eosId: 128001,
    encode(text, addSpecialTokens) {
      const out: number[] = [];
      for (const _ of encoder.steps(text, addSpecialTokens, out));
      return out;
    },
    async encodeAsync(text, addSpecialTokens) {
      const out: number[] = [];
      let sliceStart = performance.now();
      for (const _ of encoder.steps(text, addSpecialTokens, out)) {
        if (performance.now() - sliceStart >= SLICE_MS) {
          await yieldToLoop();
          sliceStart = performance.now();
        }
      }
      return out;
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
