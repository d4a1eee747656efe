import * as zlib from "node:zlib";
import { corruptEncoding, requestTooLarge, unsupportedEncoding } from "./errors/index.js";

/** A compression a request body may come in (`identity` aside). */
export type BodyEncoding = "gzip" | "deflate" | "br";

/** Names of `Content-Encoding` (RFC 9110 §8.4.1; `x-gzip` is gzip). */
const encodingNames: Readonly<Record<string, BodyEncoding | "identity">> = {
  identity: "identity",
  gzip: "gzip",
  "x-gzip": "gzip",
  deflate: "deflate",
  br: "br",
};

/**
 * The codings of a `Content-Encoding` header in the order they were applied (`gzip, br`: gzip
 * first), `identity` left out; [] for none.
 *
 * @throws ApiError 415 `unsupported_media_type` for a coding other than identity, gzip, deflate, br.
 */
export function parseContentEncoding(header: string | undefined | null): BodyEncoding[] {
  if (header === undefined || header === null || header.trim() === "") return [];
  const codings: BodyEncoding[] = [];
  for (const raw of header.split(",")) {
    const name = raw.trim().toLowerCase();
    const coding = encodingNames[name];
    if (coding === undefined) throw unsupportedEncoding(raw.trim());
    if (coding !== "identity") codings.push(coding);
  }
  return codings;
}

/** zlib's streaming decoder for `coding` (`deflate` is the zlib format, as HTTP and gRPC mean it). */
function decoder(coding: BodyEncoding): zlib.Gunzip | zlib.Inflate | zlib.BrotliDecompress {
  switch (coding) {
    case "gzip":
      return zlib.createGunzip();
    case "deflate":
      return zlib.createInflate();
    case "br":
      return zlib.createBrotliDecompress();
  }
}

/**
 * Inflates `bytes` compressed with `coding`, stopping as soon as the output passes `limitBytes`:
 * a compression bomb costs at most `limitBytes` plus one zlib chunk (16 KiB) of work and memory.
 *
 * @throws ApiError 413 `request_too_large` past the limit (its `cause` holds `decodedBytes`, the
 *   bytes inflated when it stopped); 400 `invalid_request` when `bytes` is not valid `coding` data.
 */
export function inflateBounded(bytes: Uint8Array, coding: BodyEncoding, limitBytes: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const stream = decoder(coding);
    const chunks: Buffer[] = [];
    let decodedBytes = 0;
    let settled = false;
    stream.on("data", (chunk: Buffer) => {
      if (settled) return;
      decodedBytes += chunk.byteLength;
      if (decodedBytes > limitBytes) {
        settled = true;
        stream.destroy();
        reject(requestTooLarge(limitBytes, { decodedBytes, coding }));
        return;
      }
      chunks.push(chunk);
    });
    stream.on("error", (err) => {
      if (settled) return;
      settled = true;
      reject(corruptEncoding(coding, err));
    });
    stream.on("end", () => {
      if (settled) return;
      settled = true;
      resolve(Buffer.concat(chunks, decodedBytes));
    });
    stream.end(bytes);
  });
}

/**
 * A request body as sent, decoded per its `Content-Encoding` header (gzip, deflate, br, each
 * applied coding undone in reverse order; identity or no header: unchanged), with `limitBytes`
 * (8 MiB on the API) applied to each decoded size while inflating.
 *
 * @throws ApiError 415 `unsupported_media_type` for another coding; 413 `request_too_large` when
 *   the decoded body passes the limit; 400 `invalid_request` for a body that is not valid data of
 *   its coding.
 */
export async function decodeContentEncoding(
  bytes: Uint8Array,
  header: string | undefined | null,
  limitBytes: number,
): Promise<Uint8Array> {
  const codings = parseContentEncoding(header);
  let body = bytes;
  for (const coding of codings.reverse()) body = await inflateBounded(body, coding, limitBytes);
  return body;
}
