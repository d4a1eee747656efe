// Response bodies of connect-es's handlers, passed on with their last frame (a Connect end-stream
// message, a gRPC-Web trailer frame) rewritten, or with work done once they have ended (gRPC
// trailers): what src/surfaces/rpc/error-envelopes.ts rewrites errors with.
import { frameEnd, frameHeaderBytes } from "./frame-reader.js";

/** Picks a last frame by its flags. */
type IsLast = (flags: number) => boolean;

/** Gives a last frame's replacement (a whole frame), or undefined to keep it. */
type FixFrame = (flags: number, data: Uint8Array) => Promise<Uint8Array | undefined>;

/** True when `chunk` holds only whole frames, none of them one `isLast` picks. */
function wholeFramesNoLast(chunk: Uint8Array, isLast: IsLast): boolean {
  let offset = 0;
  while (offset < chunk.byteLength) {
    const end = frameEnd(chunk, offset);
    if (end < 0 || isLast(chunk[offset] as number)) return false;
    offset = end;
  }
  return offset === chunk.byteLength;
}

/** Where {@link fixLastFrame} is in its body. */
interface LastFrameState {
  readonly it: AsyncIterator<Uint8Array>;
  readonly isLast: IsLast;
  readonly fix: FixFrame;
  /** Bytes of a frame not yet whole. */
  pending: Uint8Array;
  /** Pieces ready to pass on. */
  readonly queue: Uint8Array[];
  ended: boolean;
}

/** Cuts `chunk` (after what is pending) into pieces to pass on, the last frame fixed. */
async function split(state: LastFrameState, chunk: Uint8Array): Promise<void> {
  const { pending, queue } = state;
  const buf = pending.byteLength === 0 ? chunk : Buffer.concat([pending, chunk]);
  let offset = 0;
  let passFrom = 0;
  for (;;) {
    const end = frameEnd(buf, offset);
    if (end < 0 || end > buf.byteLength) break;
    const flags = buf[offset] as number;
    if (state.isLast(flags)) {
      if (offset > passFrom) queue.push(buf.subarray(passFrom, offset));
      const data = buf.subarray(offset + frameHeaderBytes, end);
      queue.push((await state.fix(flags, data)) ?? buf.subarray(offset, end));
      passFrom = end;
    }
    offset = end;
  }
  if (offset > passFrom) queue.push(buf.subarray(passFrom, offset));
  state.pending = offset === buf.byteLength ? new Uint8Array(0) : buf.slice(offset);
}

async function nextPiece(state: LastFrameState): Promise<IteratorResult<Uint8Array>> {
  for (;;) {
    const queued = state.queue.shift();
    if (queued !== undefined) return { done: false, value: queued };
    if (state.ended) return { done: true, value: undefined };
    const r = await state.it.next();
    if (r.done === true) {
      state.ended = true;
      if (state.pending.byteLength > 0) state.queue.push(state.pending);
      continue;
    }
    if (state.pending.byteLength === 0 && wholeFramesNoLast(r.value, state.isLast)) return r;
    await split(state, r.value);
  }
}

/** `next` of `it`'s consumer, with `return` and `throw` reaching `it`. */
function passingOn(
  it: AsyncIterator<Uint8Array>,
  next: () => Promise<IteratorResult<Uint8Array>>,
): AsyncIterator<Uint8Array> {
  return {
    next,
    return: (value?: unknown) => it.return?.(value) ?? Promise.resolve({ done: true, value: undefined }),
    throw: (err?: unknown) => it.throw?.(err) ?? Promise.reject(err),
  };
}

/**
 * Passes an enveloped body through, replacing the last frame (the one `isLast` says by its flags)
 * with what `fix` returns (undefined: kept). A chunk that holds only whole frames and no last
 * frame — what connect-es yields for each message — is passed on as it is, with no copy and one
 * await; other chunks are split into frames. `return` and `throw` reach the inner iterator, so a
 * write error still reaches connect-es's handler.
 */
export function fixLastFrame(
  body: AsyncIterable<Uint8Array>,
  isLast: IsLast,
  fix: FixFrame,
): AsyncIterable<Uint8Array> {
  return {
    [Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
      const it = body[Symbol.asyncIterator]();
      const state: LastFrameState = { it, isLast, fix, pending: new Uint8Array(0), queue: [], ended: false };
      return passingOn(it, () => nextPiece(state));
    },
  };
}

/** Passes `body` through and runs `atEnd` once it has ended, before reporting the end. */
export function thenAtEnd(
  body: AsyncIterable<Uint8Array>,
  atEnd: () => Promise<void>,
): AsyncIterable<Uint8Array> {
  return {
    [Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
      const it = body[Symbol.asyncIterator]();
      return passingOn(it, async () => {
        const r = await it.next();
        if (r.done === true) await atEnd();
        return r;
      });
    },
  };
}
