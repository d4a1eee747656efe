import { promisify } from "node:util";
import * as zlib from "node:zlib";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Compression } from "@connectrpc/connect/protocol";
import { ApiError } from "../../core/errors/index.js";
import { inflateBounded } from "../../core/index.js";

const deflate = promisify(zlib.deflate);

/**
 * `deflate` (the zlib format, as gRPC and HTTP mean it) for connect-es, beside connect-node's gzip
 * and br, so that Connect, gRPC and gRPC-Web accept the same request compressions as REST. Inflating
 * stops as soon as the output passes `readMaxBytes` (ResourceExhausted); data that is not deflate
 * is InvalidArgument.
 */
export const compressionDeflate: Compression = {
  name: "deflate",
  async compress(bytes) {
    return new Uint8Array(await deflate(bytes));
  },
  async decompress(bytes, readMaxBytes) {
    if (bytes.byteLength === 0) return new Uint8Array(0);
    try {
      return new Uint8Array(await inflateBounded(bytes, "deflate", readMaxBytes));
    } catch (err) {
      const tooLarge = err instanceof ApiError && err.code === "request_too_large";
      throw new ConnectError(
        tooLarge
          ? `message is larger than ${readMaxBytes} bytes after decompression`
          : "decompression failed",
        tooLarge ? Code.ResourceExhausted : Code.InvalidArgument,
        undefined,
        undefined,
        err,
      );
    }
  },
};
