// Request bodies in gzip, deflate and br are decoded with the size cap applied to the decoded
// bytes while inflating: a compression bomb stops within one zlib chunk of the cap.
import * as zlib from "node:zlib";
import { describe, expect, it } from "vitest";
import { ApiError } from "../../src/core/errors/index.js";
import { decodeContentEncoding, inflateBounded, parseContentEncoding } from "../../src/core/index.js";

const text = new TextEncoder().encode(JSON.stringify({ model: "tiny", prompt: "Hello ".repeat(100) }));
const MIB = 1024 * 1024;

async function refusal(p: Promise<unknown>): Promise<ApiError> {
  try {
    await p;
  } catch (err) {
    if (err instanceof ApiError) return err;
    throw err;
  }
  throw new Error("not refused");
}

/** A gzip bomb: `members` gzip members of 1 MiB of zeros each, concatenated (valid gzip). */
function gzipBomb(members: number): Buffer {
  const member = zlib.gzipSync(Buffer.alloc(MIB), { level: 9 });
  return Buffer.concat(Array.from({ length: members }, () => member));
}

describe("decodeContentEncoding", () => {
  it.each([
    ["gzip", zlib.gzipSync(text)],
    ["x-gzip", zlib.gzipSync(text)],
    ["deflate", zlib.deflateSync(text)],
    ["br", zlib.brotliCompressSync(text)],
    ["identity", Buffer.from(text)],
    ["GZIP", zlib.gzipSync(text)],
  ])("%s", async (name, body) => {
    expect(Buffer.from(await decodeContentEncoding(body, name, MIB)).equals(Buffer.from(text))).toBe(true);
  });

  it("no header: the body as sent", async () => {
    expect(await decodeContentEncoding(text, undefined, MIB)).toBe(text);
  });

  it("undoes stacked codings in reverse order (gzip, then br)", async () => {
    const body = zlib.brotliCompressSync(zlib.gzipSync(text));
    expect(Buffer.from(await decodeContentEncoding(body, "gzip, br", MIB)).equals(Buffer.from(text))).toBe(
      true,
    );
  });

  it.each([
    ["zstd", "zstd"],
    ["compress", "compress"],
    ["gzip, zstd", "zstd"],
  ])("'%s' is 415 unsupported_media_type", (header, refused) => {
    let caught: unknown;
    try {
      parseContentEncoding(header);
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(ApiError);
    expect((caught as ApiError).code).toBe("unsupported_media_type");
    expect((caught as ApiError).status).toBe(415);
    expect((caught as ApiError).message).toBe(
      `Unsupported request compression '${refused}': send the body uncompressed (identity) or compressed with gzip, deflate or br.`,
    );
  });

  it.each([
    ["br", Buffer.from(text)],
    ["gzip", Buffer.from(text)],
    ["deflate", zlib.gzipSync(text)],
    ["gzip", zlib.gzipSync(text).subarray(0, 20)],
  ])("a body that is not %s is 400 invalid_request", async (name, body) => {
    const err = await refusal(decodeContentEncoding(body, name, MIB));
    expect(err.code).toBe("invalid_request");
    expect(err.message).toBe(`The request body is not valid ${name} data.`);
  });

  it("the cap is on the decoded size: 1 MiB + 1 decoded from 1 KiB is refused, 1 MiB is not", async () => {
    expect((await decodeContentEncoding(zlib.gzipSync(Buffer.alloc(MIB)), "gzip", MIB)).byteLength).toBe(MIB);
    const err = await refusal(decodeContentEncoding(zlib.gzipSync(Buffer.alloc(MIB + 1)), "gzip", MIB));
    expect(err.code).toBe("request_too_large");
    expect(err.status).toBe(413);
  });
});

describe("compression bombs stop while inflating", () => {
  const limit = 8 * MIB;
  it.each([
    ["gzip", () => gzipBomb(1024)], // 1 GiB from ~1 MiB
    ["deflate", () => zlib.deflateSync(Buffer.alloc(64 * MIB), { level: 1 })], // 64 MiB from ~300 KiB
    // 256 MiB from ~48 KiB (quality 1: fast to make)
    [
      "br",
      () =>
        zlib.brotliCompressSync(Buffer.alloc(256 * MIB), {
          params: { [zlib.constants.BROTLI_PARAM_QUALITY]: 1 },
        }),
    ],
  ] as const)("%s", async (coding, make) => {
    const bomb = make();
    expect(bomb.byteLength).toBeLessThan(2 * MIB);
    const err = await refusal(inflateBounded(bomb, coding, limit));
    expect(err.code).toBe("request_too_large");
    expect(err.message).toBe("The request body is too large: at most 8388608 bytes (8 MiB).");
    // Inflating stopped within a zlib chunk or two of the cap, not at the bomb's size.
    const { decodedBytes } = err.cause as { decodedBytes: number };
    expect(decodedBytes).toBeGreaterThan(limit);
    expect(decodedBytes).toBeLessThanOrEqual(limit + 256 * 1024);
  });
});
