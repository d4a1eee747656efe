// `text_offset` that point into the choice's own text.
//
// vLLM computes a choice's `text_offset` by adding up the lengths of the token strings before each
// token. Those strings are not the text: an echoed prompt starts with `<|begin_of_text|>`, which
// the echoed text does not contain; a skipped special token is in `tokens` but not in the text; the
// bytes of a character split over several tokens are each shown as U+FFFD; text held back for a
// possible stop string arrives in a later chunk; a stop string cut out of the text leaves its
// tokens. From the first such token on, every offset vLLM gives is too high. The gateway recomputes
// the offsets here from the token strings and the text itself.
//
// A token string can also lack text the token has: a decoder that drops a byte order mark at the
// start of what it decodes (TextDecoder's default, as the reference engine decodes each token
// alone) gives a token of a BOM's bytes the empty string, and one of a BOM and more (Llama 3 has
// `\uFEFFusing`) its string without the BOM, while the choice's text keeps the U+FEFF.

import { codePoints, holdsBytes, maxLookahead, spells, splitRuns, utf8Length } from "./text-runs.js";

/** U+FEFF, the byte order mark. */
const bom = 0xfeff;

/**
 * The offsets of one choice, as its text and tokens arrive (a stream: one call per chunk; a whole
 * answer: one call). Offsets are Unicode code points (Python `str` indices, as vLLM and OpenAI
 * count), never past the end of the text received so far, and never decreasing.
 *
 * The tracker keeps the position after the last token it placed, and the tokens since then that
 * it could not place yet. A token is placed where its string is in the text: at the position, or —
 * after tokens holding bytes of split characters (U+FFFD in their strings) — at the first place
 * within their length that leaves room for their bytes; the last token of a chunk also where the
 * text ends with the start of its string (the rest still to come). A token not placed gets the
 * position (not before its chunk's text: what earlier chunks carried is earlier tokens' text; for
 * the last token of a chunk, unless it holds bytes, the end of the text; for another token that
 * holds no bytes, not before the characters that the bytes of the tokens waiting before it surely
 * make up) and waits:
 * - its text may still arrive (held back for a possible stop string): it is placed when it does;
 * - it is absent from the text (a skipped special token, a token cut by a stop string): it is
 *   dropped, at zero width, once the text shows it;
 * - it holds bytes: the next token placed skips the characters it stands for.
 * A chunk has every token of a step (several with speculative decoding), and its text is what
 * vLLM has released, which may end in the middle of any of them: vLLM holds back the last
 * `max(len(stop)) - 1` characters until the choice's last chunk. So while the text ends in the
 * first waiting token that holds no bytes (or where it starts, after the characters that the
 * tokens waiting before it surely make up), the rest of that token is taken as still to come: the
 * tokens after it are not looked for, get the end of the text, and wait. Unless the strings of the
 * chunk's tokens from the one being placed on (some of them absent) make up the text from where it
 * starts: it is then taken as absent (a skipped special token followed by text that starts as its
 * string does) and dropped. The strings tell the two readings apart no further ("96" with "9"
 * sent, then "9": "96" is taken as absent; a skipped "<|eot_id|>" with "<" sent, then "<S": the
 * "<S" is taken as held back, past its place). The choice's last chunk and a whole answer (`final`)
 * hold nothing back: there every token is looked for.
 * An empty token string has zero width, or stands for a U+FEFF of the text (a BOM's bytes): the
 * next token is looked for past one U+FEFF per empty string before it. A token whose string is
 * found right after a U+FEFF that those empty strings (and a run of tokens holding bytes) leave
 * over starts at that U+FEFF: its string lost it.
 * A chunk's end tells a stream where the text of the tokens so far ends; a whole answer (one
 * call) does not have that, yet gives every token whose string is in the text where its bytes are
 * the offset a stream gives it, up to the end of the text the stream had (a token it cannot place
 * may get an earlier offset).
 * Tokens are looked for at most 4096 code units ahead of the position.
 * A run of tokens holding bytes, all put at its start, whose text is known within one call (from
 * after a token that holds no bytes, or the choice's first token, to the next token or the end of
 * a `final` text) is then split over its characters ({@link splitRun}): each token gets the
 * character its first byte belongs to, or the earliest one it may belong to when the strings
 * allow several readings.
 */
export class ChoiceTextOffsets {
  /** The choice's text from `pos` on (what came before it is never looked at again). */
  private text = "";
  /** UTF-16 index (into `text`) after the last token placed. */
  private pos = 0;
  /** `pos` in code points. */
  private posCodePoints = 0;
  /** Tokens since `pos` that are not placed, in order (never empty strings). */
  private waiting: string[] = [];
  /** Empty token strings since the last token placed that have not taken a U+FEFF of the text. */
  private empties = 0;
  /** The last offset given (code points). */
  private lastOffset = 0;
  /** Tokens given so far (all calls). */
  private tokensSeen = 0;

  /**
   * Appends `textDelta` (the choice's next text) and returns one offset per token of that text.
   *
   * @param tokens the token strings of `logprobs.tokens` that came with `textDelta` (empty when
   *   the request has no logprobs: the text is still recorded).
   * @param final the choice's last chunk (its finish_reason is set) or its whole answer: no text
   *   is held back any more.
   */
  next(textDelta: string, tokens: readonly string[], final = false): number[] {
    const chunkStart = this.text.length;
    this.text += textDelta;
    // This call's text from the position on, and the position's code point (for splitRuns).
    const callText = this.text;
    const callStart = this.posCodePoints;
    const firstCall = this.tokensSeen === 0;
    this.tokensSeen += tokens.length;
    // With nothing waiting, text of earlier chunks after the position is empty strings' U+FEFFs
    // (or text without tokens): the position moves past it.
    if (this.pos < chunkStart && this.waiting.length === 0) {
      this.moveTo(chunkStart);
      this.empties = 0;
    }
    const offsets: number[] = [];
    for (const [i, token] of tokens.entries()) {
      const lastOfChunk = i === tokens.length - 1;
      this.placeWaiting();
      if (token === "") {
        // Zero width, or a U+FEFF at the position: the next token placed decides.
        offsets.push(this.posCodePoints + codePoints(this.text, this.pos, Math.max(this.pos, chunkStart)));
        this.empties++;
        continue;
      }
      this.takeBoms();
      // After a token whose text is still arriving, the tokens come after the end of the text.
      const held = !final && this.held(tokens, i);
      const found = held ? undefined : this.locate(token, this.waiting.length, chunkStart, lastOfChunk);
      if (found === undefined) {
        let floor = Math.max(this.pos, chunkStart);
        if (held || (lastOfChunk && !holdsBytes(token))) floor = this.text.length;
        else if (!holdsBytes(token)) floor = Math.max(floor, this.afterRun());
        offsets.push(this.posCodePoints + codePoints(this.text, this.pos, floor));
        this.waiting.push(token);
        continue;
      }
      this.moveTo(found.at);
      // A U+FEFF of its own, before its string, is where it starts.
      offsets.push(found.bom ? this.posCodePoints - 1 : this.posCodePoints);
      this.empties = 0;
      if (found.whole) {
        this.moveTo(found.at + token.length);
        this.waiting = [];
      } else {
        this.waiting = [token]; // the rest of its text is still to come
      }
    }
    // Never decreasing: a token after one that had to be put at the end of the text is not before it.
    for (const [i, offset] of offsets.entries()) {
      this.lastOffset = Math.max(this.lastOffset, offset);
      offsets[i] = this.lastOffset;
    }
    splitRuns(tokens, offsets, callText, callStart, firstCall, final);
    for (const offset of offsets) this.lastOffset = Math.max(this.lastOffset, offset);
    // Nothing before the position is read again: only the text from it on is kept (a long stream
    // would otherwise hold its whole text).
    if (this.pos > 0) {
      this.text = this.text.slice(this.pos);
      this.pos = 0;
    }
    return offsets;
  }

  /**
   * Places waiting tokens whose text has arrived (in order) and drops those the text shows absent;
   * stops at a token whose text may still arrive, or that cannot be placed after a run of tokens
   * holding bytes.
   */
  private placeWaiting(): void {
    let run = 0; // waiting[0, run) hold bytes
    while (run < this.waiting.length) {
      const token = this.waiting[run] as string;
      if (holdsBytes(token)) {
        run++;
        continue;
      }
      const found = this.locate(token, run, this.pos, false);
      if (found !== undefined) {
        this.moveTo(found.at + token.length);
        this.waiting.splice(0, run + 1);
        run = 0;
      } else if (run > 0 || this.mayStillArrive(token)) {
        return;
      } else {
        this.waiting.shift();
      }
    }
  }

  /**
   * Empty token strings right after the position (nothing waits) take the U+FEFFs there, one
   * each: the position moves past them.
   */
  private takeBoms(): void {
    if (this.waiting.length > 0) return;
    while (this.empties > 0 && this.text.charCodeAt(this.pos) === bom) {
      this.moveTo(this.pos + 1);
      this.empties--;
    }
  }

  /**
   * True when the text ends in the first waiting token that holds no bytes (or where it starts):
   * the rest of its text is still to come (held back for a possible stop string), and the tokens
   * after it come after the end of the text. But when the text from where it starts is the
   * strings of the chunk's `tokens` from the `i`th (the one being placed) on, some of them absent,
   * it is absent itself (a skipped special token): it is dropped.
   */
  private held(tokens: readonly string[], i: number): boolean {
    let runBytes = 0;
    for (const [w, t] of this.waiting.entries()) {
      if (holdsBytes(t)) {
        runBytes += utf8Length(t, 1);
        continue;
      }
      const rest = this.text.slice(this.afterBytes(runBytes));
      if (rest.length >= t.length || !t.startsWith(rest)) return false;
      if (rest === "" || !spells(tokens, i, rest)) return true;
      this.waiting.splice(w, 1);
      return false;
    }
    return false;
  }

  /**
   * The end of the characters after the position that the bytes of the waiting tokens that hold
   * bytes surely make up: a token after them starts no earlier.
   */
  private afterRun(): number {
    let runBytes = 0;
    for (const t of this.waiting) if (holdsBytes(t)) runBytes += utf8Length(t, 1);
    return this.afterBytes(runBytes);
  }

  /**
   * The end of the characters after the position that `bytes` bytes (counted low: U+FFFD of a
   * token string as 1 byte) surely make up (the text's counted high, its U+FFFD as 3).
   */
  private afterBytes(bytes: number): number {
    let at = this.pos;
    while (at < this.text.length) {
      const ch = String.fromCodePoint(this.text.codePointAt(at) as number);
      bytes -= utf8Length(ch, 3);
      if (bytes < 0) break;
      at += ch.length;
    }
    return at;
  }

  /** True when the text after the position is the start of `token` (the rest may still come). */
  private mayStillArrive(token: string): boolean {
    return this.text.length - this.pos < token.length && token.startsWith(this.text.slice(this.pos));
  }

  /**
   * Where `token` is in the text, after the first `run` waiting tokens (which hold bytes or wait)
   * and not before `from`: the whole string, or (when `tail`) the start of it at the end of the
   * text; `bom` when the U+FEFF right before it is its own (it starts there). Undefined when it is
   * not found, and for tokens that hold bytes (their U+FFFD may be several tokens' bytes).
   */
  private locate(
    token: string,
    run: number,
    from: number,
    tail: boolean,
  ): { at: number; whole: boolean; bom: boolean } | undefined {
    if (token === "" || holdsBytes(token)) return undefined;
    const start = Math.max(this.pos, from);
    let ahead = 0;
    let runBytes = 0;
    for (const t of this.waiting.slice(0, run)) {
      ahead += t.length;
      if (holdsBytes(t)) runBytes += utf8Length(t, 1);
    }
    // The empty strings after the run (the token comes after all the waiting ones) may each stand
    // for a U+FEFF in it (with no run, `takeBoms` has moved past theirs).
    const empties = run === this.waiting.length ? this.empties : 0;
    let last = Math.max(start, this.pos + Math.min(ahead + (run > 0 ? empties : 0), maxLookahead));
    if (this.text.charCodeAt(last) === bom) last++; // a U+FEFF of its own
    const candidates: { at: number; whole: boolean; bom: boolean }[] = [];
    for (
      let at = this.text.indexOf(token, start);
      at >= 0 && at <= last;
      at = this.text.indexOf(token, at + 1)
    ) {
      candidates.push({ at, whole: true, bom: false });
    }
    const tailEnd = tail ? Math.min(last, this.text.length - 1) : -1;
    for (let at = Math.max(start, this.text.length - token.length + 1); at <= tailEnd; at++) {
      if (token.startsWith(this.text.slice(at))) candidates.push({ at, whole: false, bom: false });
    }
    // Only a U+FEFF of its own at the end of the text: none of its string yet.
    const end = this.text.length;
    if (tail && end > start && end <= last && this.text.charCodeAt(end - 1) === bom) {
      candidates.push({ at: end, whole: false, bom: false });
    }
    candidates.sort((a, b) => a.at - b.at);
    // The first place that leaves room for the run's bytes: the run's bytes are counted low
    // (U+FFFD as 1 byte), the text's high (U+FFFD as 3), so the true place qualifies. When none
    // does, only the token's whole string is evidence enough: the start of it at the end of the
    // text, or a U+FEFF there (none of its string), is not — the run's bytes are not all in the
    // text yet, so the token waits behind them (a skipped special token inside a character whose
    // bytes are still arriving, after a U+FEFF).
    const found =
      candidates.find((c) => utf8Length(this.text.slice(this.pos, c.at), 3) >= runBytes) ??
      candidates.find((c) => c.whole);
    if (found === undefined || found.at <= start || this.text.charCodeAt(found.at - 1) !== bom) {
      return found;
    }
    // The U+FEFF right before it is its own when the U+FEFFs since the position outnumber the
    // empty strings' and the text before it surely holds the run's bytes and the empty strings'
    // U+FEFFs (3 bytes each): the text's bytes counted low here (its U+FFFD as 1 byte, as the
    // run's are).
    let boms = 0;
    for (let i = this.pos; i < found.at; i++) if (this.text.charCodeAt(i) === bom) boms++;
    found.bom =
      boms > empties && utf8Length(this.text.slice(this.pos, found.at - 1), 1) >= runBytes + 3 * empties;
    return found;
  }

  private moveTo(to: number): void {
    this.posCodePoints += codePoints(this.text, this.pos, to);
    this.pos = to;
  }
}

/** The offset trackers of every choice of one completion, by choice index. */
export class TextOffsets {
  /** Made on first use: a stream without logprobs never needs one. */
  private choices: Map<number, ChoiceTextOffsets> | undefined;

  /** The tracker of choice `index` (created on first use). */
  of(index: number): ChoiceTextOffsets {
    this.choices ??= new Map();
    let tracker = this.choices.get(index);
    if (tracker === undefined) {
      tracker = new ChoiceTextOffsets();
      this.choices.set(index, tracker);
    }
    return tracker;
  }
}
