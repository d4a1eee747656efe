/**
 * Incremental detokenization of one sequence with vLLM's stop-string rules.
 * Incomplete UTF-8 stays inside the streaming TextDecoder (never emitted as U+FFFD mid-stream);
 * text that could still become a stop string is held back from `emittable()`.
 */
import type { Tokenizer } from "./tokenizer.js";

export class OutputText {
  /** Decoded text so far (already truncated at a stop string once one matched). */
  text = "";
  private readonly decoder = new TextDecoder("utf-8");
  private emitted = 0;
  private finished = false;
  private readonly maxStop: number;

  constructor(
    private readonly tok: Tokenizer,
    private readonly skipSpecial: boolean,
    private readonly stops: readonly string[],
    private readonly includeStop: boolean,
  ) {
    this.maxStop = stops.reduce((m, s) => Math.max(m, s.length), 0);
  }

  /**
   * Appends one token's text. When `checkStops`, looks for a stop string in the new text
   * (matched across token boundaries) and returns it, truncating the text accordingly.
   */
  push(id: number, checkStops: boolean): string | null {
    if (this.finished) return null;
    if (this.skipSpecial && this.tok.isSpecial(id)) return null;
    const before = this.text.length;
    this.text += this.decoder.decode(this.tok.tokenBytes(id), { stream: true });
    if (!checkStops || this.stops.length === 0) return null;
    const from = Math.max(0, before - this.maxStop + 1);
    let best = -1;
    let which: string | null = null;
    for (const s of this.stops) {
      if (s.length === 0) continue;
      const at = this.text.indexOf(s, from);
      if (at >= 0 && (best < 0 || at < best)) {
        best = at;
        which = s;
      }
    }
    if (which === null) return null;
    this.text = this.text.slice(0, this.includeStop ? best + which.length : best);
    this.finished = true;
    return which;
  }

  /** Ends the sequence: flushes the decoder (trailing incomplete bytes become U+FFFD, as vLLM does). */
  finish(): void {
    if (!this.finished) this.text += this.decoder.decode();
    this.finished = true;
  }

  /** Returns the next text delta that is safe to stream and marks it emitted. */
  takeDelta(): string {
    let end = this.text.length;
    if (!this.finished && !this.includeStop && this.stops.length > 0) end -= this.holdback();
    if (end <= this.emitted) return "";
    const delta = this.text.slice(this.emitted, end);
    this.emitted = end;
    return delta;
  }

  /** Length of the longest suffix of the text that is a proper prefix of a stop string. */
  private holdback(): number {
    let hold = 0;
    const t = this.text;
    for (const s of this.stops) {
      for (let len = Math.min(s.length - 1, t.length); len > hold; len--) {
        if (t.endsWith(s.slice(0, len))) {
          hold = len;
          break;
        }
      }
    }
    return hold;
  }
}
