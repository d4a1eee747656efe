import { ApiError } from "./api-error.js";

const MIB = 1024 * 1024;

/** Longest piece of a header value echoed in a message. */
const MAX_ECHO = 64;

function echo(value: string): string {
  return value.length <= MAX_ECHO ? value : `${value.slice(0, MAX_ECHO)}…`;
}

/**
 * 413 `request_too_large` for a body over `limitBytes` (after decompression, where it was
 * compressed): the one message of every 413, on every surface. E.g. for 8 MiB:
 * `The request body is too large: at most 8388608 bytes (8 MiB).`
 */
export function requestTooLarge(limitBytes: number, cause?: unknown): ApiError {
  const mib = limitBytes % MIB === 0 && limitBytes > 0 ? ` (${limitBytes / MIB} MiB)` : "";
  return new ApiError(
    "request_too_large",
    `The request body is too large: at most ${limitBytes} bytes${mib}.`,
    cause === undefined ? {} : { cause },
  );
}

/**
 * The request compressions every surface accepts: REST's `Content-Encoding`, Connect's
 * `Content-Encoding` / `Connect-Content-Encoding`, gRPC's and gRPC-Web's `grpc-encoding`.
 */
export const requestEncodings = ["identity", "gzip", "deflate", "br"] as const;

/**
 * 415 `unsupported_media_type` for a request compressed with `name` (e.g. `zstd`), one message on
 * every surface: `Unsupported request compression 'zstd': send the body uncompressed (identity)
 * or compressed with gzip, deflate or br.`
 */
export function unsupportedEncoding(name: string): ApiError {
  return new ApiError(
    "unsupported_media_type",
    `Unsupported request compression '${echo(name)}': send the body uncompressed (identity) or compressed with gzip, deflate or br.`,
  );
}

/**
 * 400 `invalid_request` for a body that does not decompress as `name` says (gzip, deflate, br).
 */
export function corruptEncoding(name: string, cause?: unknown): ApiError {
  return new ApiError(
    "invalid_request",
    `The request body is not valid ${echo(name)} data.`,
    cause === undefined ? {} : { cause },
  );
}

/**
 * 504 `deadline_exceeded` for a call whose caller-set deadline (Connect-Timeout-Ms, grpc-timeout)
 * passed: `The deadline the caller set (800 ms) passed before the request finished.`
 */
export function callerDeadlineExceeded(timeoutMs: number | undefined): ApiError {
  const set = timeoutMs === undefined ? "" : ` (${timeoutMs} ms)`;
  return new ApiError(
    "deadline_exceeded",
    `The deadline the caller set${set} passed before the request finished.`,
  );
}

/**
 * 504 `deadline_exceeded` for a non-streamed call Inference did not finish within the API's wait
 * (`deadlineMs`, proto/API.md §5: 14 minutes): `Inference did not answer within 840000 ms.`
 */
export function inferenceDeadlineExceeded(deadlineMs: number, cause?: unknown): ApiError {
  return new ApiError(
    "deadline_exceeded",
    `Inference did not answer within ${deadlineMs} ms.`,
    cause === undefined ? {} : { cause },
  );
}
