// The gRPC code an RPC ended with, read from what the client is sent (Connect, gRPC, gRPC-Web),
// for the access log and the metrics: a wrapper of connect-es's universal handlers.
import { type Code, type ConnectRouter, createContextKey } from "@connectrpc/connect";
import type {
  UniversalHandler,
  UniversalServerRequest,
  UniversalServerResponse,
} from "@connectrpc/connect/protocol";
import { codeToString, endStreamFlag } from "@connectrpc/connect/protocol-connect";
import { findTrailerError } from "@connectrpc/connect/protocol-grpc";
import { trailerFlag, trailerParse } from "@connectrpc/connect/protocol-grpc-web";
import { asHandlerOf, type CallRecord, decodeContentEncoding } from "../core/index.js";

/** Where a wrapped handler writes the code its RPC ended with (`ok`, `invalid_argument`, …). */
export interface RpcOutcome {
  grpcCode?: string;
}

/**
 * The call's record (src/telemetry/request-telemetry.ts): the service fills it in, and the code
 * the RPC ended with lands in it. Set through the Connect plugin's `contextValues`.
 */
export const callRecordKey = createContextKey<(CallRecord & RpcOutcome) | undefined>(undefined, {
  description: "acs call record",
});

/** Most bytes of a last frame (trailers, end-stream) read to find its code. */
const MAX_LAST_FRAME = 1024 * 1024;

/**
 * Passes `body` through unchanged and calls `onLast` with the payload of the frame whose flags
 * `isLast` picks (the gRPC-Web trailer frame, the Connect end-stream message), however the frames
 * are split over chunks.
 */
function watchLastFrame(
  body: AsyncIterable<Uint8Array>,
  isLast: (flags: number) => boolean,
  onLast: (flags: number, data: Uint8Array) => Promise<void>,
): AsyncIterable<Uint8Array> {
  return {
    [Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
      const it = body[Symbol.asyncIterator]();
      const header = new Uint8Array(5);
      let headerBytes = 0;
      let remaining = 0;
      let flags = 0;
      let last: Uint8Array[] | undefined;
      const scan = async (chunk: Uint8Array): Promise<void> => {
        let offset = 0;
        while (offset < chunk.byteLength) {
          if (remaining === 0 && headerBytes < 5) {
            const take = Math.min(5 - headerBytes, chunk.byteLength - offset);
            header.set(chunk.subarray(offset, offset + take), headerBytes);
            headerBytes += take;
            offset += take;
            if (headerBytes < 5) return;
            flags = header[0] as number;
            remaining = new DataView(header.buffer).getUint32(1);
            last = isLast(flags) && remaining <= MAX_LAST_FRAME ? [] : undefined;
            if (remaining === 0) {
              headerBytes = 0;
              if (last !== undefined) await onLast(flags, new Uint8Array(0));
            }
            continue;
          }
          const take = Math.min(remaining, chunk.byteLength - offset);
          last?.push(chunk.subarray(offset, offset + take));
          remaining -= take;
          offset += take;
          if (remaining === 0) {
            headerBytes = 0;
            if (last !== undefined) await onLast(flags, Buffer.concat(last));
            last = undefined;
          }
        }
      };
      return {
        async next(): Promise<IteratorResult<Uint8Array>> {
          const r = await it.next();
          if (r.done !== true) await scan(r.value);
          return r;
        },
        return: (value?: unknown) => it.return?.(value) ?? Promise.resolve({ done: true, value: undefined }),
        throw: (err?: unknown) => it.throw?.(err) ?? Promise.reject(err),
      };
    },
  };
}

/** Passes `body` through and runs `atEnd` once it has ended. */
function atEnd(body: AsyncIterable<Uint8Array>, end: () => void): AsyncIterable<Uint8Array> {
  return {
    [Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
      const it = body[Symbol.asyncIterator]();
      return {
        async next(): Promise<IteratorResult<Uint8Array>> {
          const r = await it.next();
          if (r.done === true) end();
          return r;
        },
        return: (value?: unknown) => it.return?.(value) ?? Promise.resolve({ done: true, value: undefined }),
        throw: (err?: unknown) => it.throw?.(err) ?? Promise.reject(err),
      };
    },
  };
}

/** A frame's payload, inflated when its compressed flag is set. */
async function framePayload(flags: number, data: Uint8Array, encoding: string | null): Promise<Uint8Array> {
  if ((flags & 0b1) === 0 || encoding === null) return data;
  return decodeContentEncoding(data, encoding, MAX_LAST_FRAME);
}

/** The `code` of a Connect error JSON (`{"code": "…"}`), or `unknown`. */
function connectErrorCode(json: Uint8Array): string {
  try {
    const code = (JSON.parse(new TextDecoder().decode(json)) as { code?: unknown }).code;
    return typeof code === "string" ? code : "unknown";
  } catch {
    return "unknown";
  }
}

async function readAll(body: AsyncIterable<Uint8Array>): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  for await (const chunk of body) chunks.push(chunk);
  return Buffer.concat(chunks);
}

/** Wraps one universal handler so that the code of its RPC lands in the call's {@link RpcOutcome}. */
function observe(handler: UniversalHandler): UniversalHandler {
  async function observed(req: UniversalServerRequest): Promise<UniversalServerResponse> {
    const res = await handler(req);
    const outcome = req.contextValues?.get(callRecordKey);
    if (outcome === undefined) return res;
    const set = (code: string) => {
      outcome.grpcCode = code;
    };
    const type = (req.header.get("content-type") ?? "").toLowerCase();
    const header = new Headers(res.header);
    if (type.startsWith("application/grpc-web")) {
      if (res.body === undefined) return res;
      const encoding = header.get("grpc-encoding");
      const body = watchLastFrame(
        res.body,
        (f) => (f & trailerFlag) === trailerFlag,
        async (f, data) => {
          const trailer = trailerParse(await framePayload(f, data, encoding));
          set(codeName(findTrailerError(trailer)?.code));
        },
      );
      return { ...res, body };
    }
    if (type.startsWith("application/grpc")) {
      const trailer = res.trailer;
      if (res.body === undefined || trailer === undefined) return res;
      return { ...res, body: atEnd(res.body, () => set(codeName(findTrailerError(trailer)?.code))) };
    }
    if (type.startsWith("application/connect+")) {
      if (res.body === undefined) return res;
      const encoding = header.get("connect-content-encoding");
      const body = watchLastFrame(
        res.body,
        (f) => (f & endStreamFlag) === endStreamFlag,
        async (f, data) => {
          const json = await framePayload(f, data, encoding);
          try {
            const end = JSON.parse(new TextDecoder().decode(json)) as { error?: { code?: unknown } };
            set(end.error === undefined ? "ok" : String(end.error.code ?? "unknown"));
          } catch {
            set("unknown");
          }
        },
      );
      return { ...res, body };
    }
    // Connect unary (and GET): 200 is OK; an error is a small JSON body with its code.
    if (res.status === 200) {
      set("ok");
      return res;
    }
    if (res.body === undefined) {
      set("unknown");
      return res;
    }
    const raw = await readAll(res.body);
    const encoding = header.get("content-encoding");
    const json = encoding === null ? raw : await decodeContentEncoding(raw, encoding, MAX_LAST_FRAME);
    set(connectErrorCode(json));
    return {
      ...res,
      body: (async function* () {
        yield raw;
      })(),
    };
  }
  return asHandlerOf(handler, observed);
}

/** A gRPC code as its lower-case name (`ok` for none), as Connect writes it. */
function codeName(code: Code | undefined): string {
  return code === undefined ? "ok" : codeToString(code);
}

/**
 * Wraps `routes` (put it outermost, around withErrorEnvelopes) so that the gRPC code each RPC ends
 * with — as the client receives it: gRPC trailers, the gRPC-Web trailer frame, the Connect
 * end-stream message, or the Connect unary status and error body — is written to the call's
 * {@link RpcOutcome} (context value {@link callRecordKey}). A call cut off before its end has none.
 */
export function withRpcOutcome(routes: (router: ConnectRouter) => void): (router: ConnectRouter) => void {
  return (router) => {
    routes(router);
    const wrapped = router.handlers.map((h) => observe(h));
    router.handlers.splice(0, router.handlers.length, ...wrapped);
  };
}
