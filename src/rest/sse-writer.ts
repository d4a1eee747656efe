import type { Writable } from "node:stream";
import { limits } from "../config/index.js";
import type { ErrorEnvelopeJson } from "../errors/index.js";

/** Options of {@link createSseWriter}. */
export interface SseWriterOptions {
  /** Milliseconds between `: keepalive` comment lines; default 5000. */
  keepaliveIntervalMs?: number;
  /**
   * Milliseconds a write may wait for 'drain' (the caller does not read: the write buffer stays
   * full). Past it the stream is stalled: `onStall` runs once (it should destroy the connection),
   * the writer counts as closed and the pending `send` resolves false. @default limits.streamStallMs
   */
  stallMs?: number;
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
export function createSseWriter(out: Writable, options: SseWriterOptions = {}): SseWriter {
  const intervalMs = options.keepaliveIntervalMs ?? limits.keepaliveIntervalMs;
  const stallMs = options.stallMs ?? limits.streamStallMs;
  const onStall = options.onStall ?? (() => out.destroy());
  let closed = false;
  let ended = false;
  let stalled = false;

  const stop = (): void => {
    closed = true;
    clearInterval(timer);
  };
  const isGone = (): boolean => closed || out.destroyed || out.writableEnded;

  const timer = setInterval(() => {
    if (isGone()) {
      stop();
      return;
    }
    if (!out.writableNeedDrain) out.write(": keepalive\n\n");
  }, intervalMs);
  out.once("close", stop);
  // An error on the destination (e.g. EPIPE, a write after end) also ends the stream; 'close'
  // follows it. `on`, not `once`: a second error must not go unheard (an HTTP response written
  // directly has no pipe of fastify's listening to it).
  out.on("error", stop);

  /** Resolves on 'drain' (true), or when `out` closes or the wait passed `stallMs` (false). */
  const drained = (): Promise<boolean> =>
    new Promise((resolve) => {
      const settle = (): void => {
        clearTimeout(stallTimer);
        out.off("drain", settle);
        out.off("close", settle);
        out.off("error", settle);
        resolve(!isGone());
      };
      const stallTimer = setTimeout(() => {
        stalled = true;
        stop();
        settle();
        onStall();
      }, stallMs);
      out.on("drain", settle);
      out.on("close", settle);
      out.on("error", settle);
    });

  // No promise is made for a write the destination took at once (the usual case: one per chunk).
  const write = (text: string): Promise<boolean> => {
    if (isGone()) {
      stop();
      return FALSE;
    }
    return out.write(text) ? TRUE : drained();
  };

  const end = async (): Promise<void> => {
    if (ended) return;
    ended = true;
    await write("data: [DONE]\n\n");
    clearInterval(timer);
    if (!isGone()) out.end();
  };

  return {
    send: (data) => (ended ? FALSE : write(`data: ${JSON.stringify(data)}\n\n`)),
    done: end,
    async fail(envelope) {
      if (ended) return;
      await write(`data: ${JSON.stringify(envelope)}\n\n`);
      await end();
    },
    get closed() {
      return closed || out.destroyed;
    },
    get stalled() {
      return stalled;
    },
  };
}
