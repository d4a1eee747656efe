// The one frame reader: FrameTally, fed a body in any cut of chunks, knows what splitFrames knows
// of the whole bytes (how many frames, the first one's flags, whether the body ends inside one).
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { FrameTally, frameEnd, splitFrames } from "../../../src/surfaces/rpc/frame-reader.js";
import { frame } from "../../helpers/rpc-wire.js";

/** What splitFrames says of `bytes`, in FrameTally's terms. */
function expected(bytes: Uint8Array) {
  const frames = splitFrames(bytes);
  return frames === "incomplete"
    ? { incomplete: true }
    : { incomplete: false, count: frames.length, firstFlags: frames[0]?.flags };
}

function tallied(bytes: Uint8Array, cuts: number[]) {
  const tally = new FrameTally(Number.POSITIVE_INFINITY);
  let from = 0;
  for (const at of [...cuts.filter((c) => c <= bytes.byteLength).sort((a, b) => a - b), bytes.byteLength]) {
    tally.push(bytes.subarray(from, at));
    from = at;
  }
  return tally.incomplete
    ? { incomplete: true }
    : { incomplete: false, count: tally.count, firstFlags: tally.firstFlags };
}

describe("frame reader", () => {
  it("frameEnd reads the header's flags and length; -1 for a cut header", () => {
    const f = frame(new Uint8Array(300), 0x80);
    expect(frameEnd(f, 0)).toBe(305);
    expect(frameEnd(f.subarray(0, 4), 0)).toBe(-1);
  });

  it("FrameTally agrees with splitFrames however the body is cut", () => {
    const body = fc
      .array(fc.tuple(fc.integer({ min: 0, max: 255 }), fc.uint8Array({ maxLength: 20 })), { maxLength: 4 })
      .chain((frames) => {
        const whole = Buffer.concat(frames.map(([flags, data]) => frame(data, flags)));
        return fc.tuple(fc.constant(whole), fc.integer({ min: 0, max: whole.byteLength }));
      })
      .map(([whole, keep]) => whole.subarray(0, keep));
    fc.assert(
      fc.property(body, fc.array(fc.nat({ max: 120 }), { maxLength: 6 }), (bytes, cuts) => {
        expect(tallied(bytes, cuts)).toEqual(expected(bytes));
      }),
    );
  });

  it("reads a header cut across chunks from the next chunk's start (fast-check seed -1826954862 found it)", () => {
    // Flags 0, length 1, and no payload byte: the body ends inside the frame.
    expect(tallied(Buffer.from([0, 0, 0, 0, 1]), [1])).toEqual({ incomplete: true });
    const whole = Buffer.concat([frame(new Uint8Array(2), 0x01), frame(new Uint8Array(0))]);
    expect(tallied(whole, [2, 3, 9])).toEqual({ incomplete: false, count: 2, firstFlags: 0x01 });
  });

  it("is not known once released or past its limit", () => {
    const tally = new FrameTally(6);
    tally.push(frame(new Uint8Array(1)));
    expect(tally.known).toBe(true);
    tally.push(new Uint8Array(1));
    expect(tally.known).toBe(false);
    const released = new FrameTally(100);
    released.release();
    expect(released.known).toBe(false);
  });
});
