import type { Writable } from "node:stream";
import type { ErrorEnvelopeJson } from "../../core/errors/index.js";

/** Options of {@link createSseWriter}. */
export interface SseWriterOptions {
  /** Milliseconds between `: keepalive` comment lines (ACS_KEEPALIVE_MS). */
  keepaliveIntervalMs: number;
  /**
   * Milliseconds a write may wait for 'drain' (the caller does not read: the write buffer stays
   * full). Past it the stream is stalled: `onStall` runs once (it should destroy the connection),
   * the writer counts as closed and the pending `send` resolves false (ACS_STREAM_STALL_MS).
   */
  stallMs: number;
  /** Called once when a write waited `stallMs` for 'drain'. @default destroys `out` */
  onStall?: () => void;
}

/**
 * Writes an SSE response body as proto/API.md §5 describes: only `data:` events and `: keepalive`
 * comments — never `event:`, `id:` or `retry:` lines.
 */
export interface SseWriter {
  /**
   * Writes `data: <JSON.stringify(data)>\n\n`. Resolves once the destination can take more bytes
   * (it waits for 'drain' when the write buffer is full), or at once when the client is gone.
   * @returns false when the client is gone (nothing was written), or went away or stalled while
   * the write waited for 'drain'; true otherwise.
   */
  send(data: unknown): Promise<boolean>;
  /** Ends the stream: `data: [DONE]\n\n`, then end(). Stops the keepalive timer. */
  done(): Promise<void>;
  /** An error after the stream started: one `data: <envelope>` event, then `data: [DONE]`, then end(). */
  fail(envelope: ErrorEnvelopeJson): Promise<void>;
  /** True once the destination closed (client disconnected, or the stream ended) or stalled. */
  readonly closed: boolean;
  /** True once a write waited `stallMs` for 'drain' (the stream was ended for it). */
  readonly stalled: boolean;
}

/** Settled answers of a write, shared by every writer (a settled promise holds no state). */
const TRUE = Promise.resolve(true);
const FALSE = Promise.resolve(false);

/**
 * An SSE writer on `out` (an HTTP response, or a PassThrough piped into one). The keepalive timer
 * starts at once and stops when the stream ends or `out` closes (e.g. the client disconnects);
 * no keepalive is written while a write waits for 'drain'.
 */
export function createSseWriter(out: Writable, options: SseWriterOptions): SseWriter {
  return new Writer(out, options);
}

/**
 * {@link createSseWriter}'s writer: one object per stream, its methods shared (a stream lives for
 * minutes, many at once: no closures per stream beyond its two listeners).
 */
class Writer implements SseWriter {
  readonly #out: Writable;
  readonly #stallMs: number;
  readonly #onStall: (() => void) | undefined;
  #closed = false;
  #ended = false;
  #stalled = false;
  readonly #timer: NodeJS.Timeout;
  /** Stops the writer: on 'close' and 'error' of `out`, and at a stall. */
  readonly #stop = (): void => {
    this.#closed = true;
    clearInterval(this.#timer);
  };

  constructor(out: Writable, options: SseWriterOptions) {
    this.#out = out;
    this.#stallMs = options.stallMs;
    this.#onStall = options.onStall;
    this.#timer = setInterval(Writer.#keepalive, options.keepaliveIntervalMs, this);
    out.on("close", this.#stop); // emitted once (`once` would add a wrapper per stream)
    // An error on the destination (e.g. EPIPE, a write after end) also ends the stream; 'close'
    // follows it. `on`, not `once`: a second error must not go unheard (an HTTP response written
    // directly has no pipe of fastify's listening to it).
    out.on("error", this.#stop);
  }

  static #keepalive(writer: Writer): void {
    if (writer.#isGone()) {
      writer.#stop();
      return;
    }
    if (!writer.#out.writableNeedDrain) writer.#out.write(": keepalive\n\n");
  }

  #isGone(): boolean {
    return this.#closed || this.#out.destroyed || this.#out.writableEnded;
  }

  /** Resolves on 'drain' (true), or when `out` closes or the wait passed `stallMs` (false). */
  #drained(): Promise<boolean> {
    const out = this.#out;
    return new Promise((resolve) => {
      const settle = (): void => {
        clearTimeout(stallTimer);
        out.off("drain", settle);
        out.off("close", settle);
        out.off("error", settle);
        resolve(!this.#isGone());
      };
      const stallTimer = setTimeout(() => {
        this.#stalled = true;
        this.#stop();
        settle();
        if (this.#onStall === undefined) out.destroy();
        else this.#onStall();
      }, this.#stallMs);
      out.on("drain", settle);
      out.on("close", settle);
      out.on("error", settle);
    });
  }

  // No promise is made for a write the destination took at once (the usual case: one per chunk).
  #write(text: string): Promise<boolean> {
    if (this.#isGone()) {
      this.#stop();
      return FALSE;
    }
    return this.#out.write(text) ? TRUE : this.#drained();
  }

  async #end(): Promise<void> {
    if (this.#ended) return;
    this.#ended = true;
    await this.#write("data: [DONE]\n\n");
    clearInterval(this.#timer);
    if (!this.#isGone()) this.#out.end();
  }

  send(data: unknown): Promise<boolean> {
    return this.#ended ? FALSE : this.#write(`data: ${JSON.stringify(data)}\n\n`);
  }

  done(): Promise<void> {
    return this.#end();
  }

  async fail(envelope: ErrorEnvelopeJson): Promise<void> {
    if (this.#ended) return;
    await this.#write(`data: ${JSON.stringify(envelope)}\n\n`);
    await this.#end();
  }

  get closed(): boolean {
    return this.#closed || this.#out.destroyed;
  }

  get stalled(): boolean {
    return this.#stalled;
  }
}
