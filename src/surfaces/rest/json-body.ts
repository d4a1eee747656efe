// The JSON body of a REST POST route: its Content-Type checked (JSON only, 415), its
// Content-Encoding decoded under the 8 MiB cap (src/core/content-encoding.ts).
import type { FastifyRequest } from "fastify";
import { limits } from "../../config/index.js";
import { ApiError } from "../../core/errors/index.js";
import { decodeContentEncoding } from "../../core/index.js";

/** The body the JSON parser kept (its bytes); none (no body, or no parser ran) → empty. */
function bodyBytes(body: unknown): Uint8Array {
  return body instanceof Uint8Array ? body : new Uint8Array(0);
}

/** `application/json`, with or without `; charset=utf-8`; anything else → 415. */
function assertJsonContentType(contentType: string | undefined): void {
  // What clients send (no allocation for it).
  if (contentType === "application/json") return;
  const [essence = "", ...parameters] = (contentType ?? "")
    .split(";")
    .map((part) => part.trim().toLowerCase());
  const charset = parameters
    .find((p) => p.startsWith("charset="))
    ?.slice("charset=".length)
    .replace(/"/g, "");
  if (
    essence !== "application/json" ||
    (charset !== undefined && charset !== "utf-8" && charset !== "utf8")
  ) {
    throw new ApiError(
      "unsupported_media_type",
      "Unsupported Content-Type: send the request body as JSON with 'Content-Type: application/json'.",
    );
  }
}

/**
 * The JSON body of a POST route, after its key was checked: `Content-Type` JSON (else 415), its
 * `Content-Encoding` decoded (the 8 MiB cap on the decoded size). The request lets go of the body.
 */
export async function takeJsonBody(request: FastifyRequest): Promise<Uint8Array> {
  assertJsonContentType(request.headers["content-type"]);
  const raw = bodyBytes(request.body);
  // The request lives as long as its response (a stream's: minutes); its body is not read again.
  request.body = undefined;
  return decodeContentEncoding(raw, request.headers["content-encoding"], limits.bodyLimitBytes);
}
