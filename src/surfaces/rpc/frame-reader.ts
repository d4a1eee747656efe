// The one reader of gRPC, gRPC-Web and Connect streaming frames ("enveloped messages"): a 5-byte
// header — one byte of flags, a 32-bit big-endian length — and as many bytes of payload. The
// request side (src/surfaces/rpc/explain-protocol-error.ts, src/surfaces/rpc/prompt-list-wire-count.ts) and
// the response side (src/surfaces/rpc/response-frames.ts) read frames with it. Allocates nothing.

/** Bytes of a frame's header: flags (1), payload length (4). */
export const frameHeaderBytes = 5;

/** Bit 0 of a frame's flags: its payload is compressed. */
export const compressedFlag = 0b1;

/**
 * Where the frame that starts at `offset` of `bytes` ends (header and payload, may be past the
 * end of `bytes` when the frame is cut), or -1 when fewer than 5 bytes are left for its header.
 * Its flags are `bytes[offset]`.
 */
export function frameEnd(bytes: Uint8Array, offset: number): number {
  if (bytes.byteLength - offset < frameHeaderBytes) return -1;
  const length =
    (bytes[offset + 1] as number) * 0x1000000 +
    ((bytes[offset + 2] as number) << 16) +
    ((bytes[offset + 3] as number) << 8) +
    (bytes[offset + 4] as number);
  return offset + frameHeaderBytes + length;
}

/** One frame of an enveloped body: its flags and its payload (a view into the body). */
export interface Frame {
  readonly flags: number;
  readonly data: Uint8Array;
}

/** The frames of an enveloped body, or `"incomplete"` when it ends inside a frame. */
export function splitFrames(bytes: Uint8Array): Frame[] | "incomplete" {
  const frames: Frame[] = [];
  let offset = 0;
  while (offset < bytes.byteLength) {
    const end = frameEnd(bytes, offset);
    if (end < 0 || end > bytes.byteLength) return "incomplete";
    frames.push({ flags: bytes[offset] as number, data: bytes.subarray(offset + frameHeaderBytes, end) });
    offset = end;
  }
  return frames;
}

/** What is known of an enveloped body's frames without its bytes (see {@link FrameTally}). */
export interface FrameFacts {
  /** Frames whose header was read. */
  readonly count: number;
  /** The flags of the first frame; undefined when there is none. */
  readonly firstFlags: number | undefined;
  /** True when the body (so far) ends inside a frame, its header or its payload. */
  readonly incomplete: boolean;
}

/**
 * Counts the frames of an enveloped body as its chunks pass, keeping none of their bytes (only a
 * header cut across chunks): the {@link FrameFacts} that {@link splitFrames} would give of the
 * bytes pushed so far. Past `limit` bytes, or once released, they are not `known`, as a kept body
 * would not be.
 */
export class FrameTally implements FrameFacts {
  count = 0;
  firstFlags: number | undefined;
  /** True once more than the limit was pushed. */
  overflowed = false;
  /** True once released (the message was parsed): the facts are no longer known. */
  released = false;

  constructor(private readonly limit: number) {}

  /** Bytes pushed. */
  #size = 0;
  /** Where the next frame's header starts, from the body's start. */
  #next = 0;
  readonly #head = new Uint8Array(frameHeaderBytes);
  #headBytes = 0;

  /** True while the facts hold: not released, not past the limit. */
  get known(): boolean {
    return !this.overflowed && !this.released;
  }

  release(): void {
    this.released = true;
  }

  get incomplete(): boolean {
    return this.#size !== this.#next;
  }

  push(chunk: Uint8Array): void {
    const start = this.#size;
    this.#size += chunk.byteLength;
    if (this.#size > this.limit) this.overflowed = true;
    // A header cut across chunks goes on at this chunk's start (`#next` is where it began).
    let at = this.#headBytes > 0 ? 0 : this.#next - start;
    while (at < chunk.byteLength) {
      const take = Math.min(frameHeaderBytes - this.#headBytes, chunk.byteLength - at);
      this.#head.set(chunk.subarray(at, at + take), this.#headBytes);
      this.#headBytes += take;
      at += take;
      if (this.#headBytes < frameHeaderBytes) return;
      this.#headBytes = 0;
      this.count++;
      this.firstFlags ??= this.#head[0] as number;
      this.#next += frameEnd(this.#head, 0);
      at = this.#next - start;
    }
  }
}
