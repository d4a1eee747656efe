// Raw HTTP/1.1 and HTTP/2 exchanges with the gateway, and an independent decoder of the error each
// surface answers with: the REST envelope, the Connect error JSON (unary body or end-stream frame),
// gRPC trailers and gRPC-Web trailer frames — google.rpc.Status decoded with our own generated
// code, not with connect-es (which the server encodes them with).
import http from "node:http";
import http2 from "node:http2";
import { fromBinary } from "@bufbuild/protobuf";
import { base64Decode } from "@bufbuild/protobuf/wire";
import { type ErrorEnvelope, ErrorEnvelopeSchema } from "../../gen/acs/v1/error_pb.js";
import { StatusSchema } from "../../gen/google/rpc/status_pb.js";

/** What a test sends: an HTTP/1.1 request, or an HTTP/2 (h2c prior knowledge) one for gRPC. */
export interface WireRequest {
  readonly http2?: boolean;
  readonly method?: string;
  readonly path: string;
  readonly headers?: Record<string, string>;
  /** The body; `chunks` are written one by one without Content-Length (chunked / h2 DATA). */
  readonly body?: Uint8Array | string;
  readonly chunks?: readonly Uint8Array[];
}

/** What came back: status, headers, body bytes and trailers (gRPC). */
export interface WireResponse {
  readonly status: number;
  readonly headers: Headers;
  readonly body: Buffer;
  readonly trailers: Headers;
}

function toHeaders(raw: Record<string, string | string[] | number | undefined>): Headers {
  const h = new Headers();
  for (const [k, v] of Object.entries(raw)) {
    if (k.startsWith(":") || v === undefined) continue;
    h.set(k, Array.isArray(v) ? v.join(", ") : String(v));
  }
  return h;
}

/** Sends `req` to `baseUrl` and reads the whole answer. A write error after the answer is ignored. */
export function exchange(baseUrl: string, req: WireRequest): Promise<WireResponse> {
  return req.http2 === true ? exchangeH2(baseUrl, req) : exchangeH1(baseUrl, req);
}

function exchangeH1(baseUrl: string, req: WireRequest): Promise<WireResponse> {
  const url = new URL(req.path, baseUrl);
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { ...req.headers };
    if (req.body !== undefined) headers["content-length"] = String(Buffer.byteLength(req.body));
    const out = http.request(url, { method: req.method ?? "POST", headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("error", reject);
      res.on("end", () =>
        resolve({
          status: res.statusCode ?? 0,
          headers: toHeaders(res.headers),
          body: Buffer.concat(chunks),
          trailers: toHeaders(res.trailers),
        }),
      );
    });
    out.on("error", (err) => {
      // The server may answer (413) and close before it has read everything: keep its answer.
      if (
        (err as NodeJS.ErrnoException).code !== "EPIPE" &&
        (err as NodeJS.ErrnoException).code !== "ECONNRESET"
      )
        reject(err);
    });
    if (req.chunks !== undefined) {
      void (async () => {
        for (const c of req.chunks ?? []) {
          if (out.destroyed) return;
          if (!out.write(c)) await new Promise((r) => out.once("drain", r));
        }
        out.end();
      })();
    } else {
      out.end(req.body);
    }
  });
}

function exchangeH2(baseUrl: string, req: WireRequest): Promise<WireResponse> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(baseUrl);
    session.on("error", reject);
    const stream = session.request({
      ":method": req.method ?? "POST",
      ":path": req.path,
      te: "trailers",
      ...req.headers,
    });
    let status = 0;
    let headers = new Headers();
    let trailers = new Headers();
    const chunks: Buffer[] = [];
    stream.on("response", (h) => {
      status = Number(h[":status"]);
      headers = toHeaders(h);
    });
    stream.on("trailers", (t) => {
      trailers = toHeaders(t);
    });
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("error", () => {}); // a refused upload resets the stream after the answer
    const done = (): void => {
      // The answer is complete (trailers, END_STREAM): stop sending, as gRPC clients do.
      if (!stream.closed) stream.close(http2.constants.NGHTTP2_CANCEL);
      session.close();
      resolve({ status, headers, body: Buffer.concat(chunks), trailers });
    };
    stream.on("end", done);
    stream.on("close", done);
    if (req.chunks !== undefined) {
      void (async () => {
        for (const c of req.chunks ?? []) {
          if (stream.destroyed || stream.closed) return;
          if (!stream.write(c)) await new Promise((r) => stream.once("drain", r));
        }
        if (!stream.destroyed) stream.end();
      })();
    } else {
      stream.end(req.body);
    }
  });
}

/** One message frame (gRPC, gRPC-Web, Connect streaming): flags byte, 4-byte length, data. */
export function frame(data: Uint8Array, flags = 0): Uint8Array {
  const out = Buffer.alloc(5 + data.byteLength);
  out.writeUInt8(flags, 0);
  out.writeUInt32BE(data.byteLength, 1);
  out.set(data, 5);
  return out;
}

/** The frames of an enveloped body. */
export function frames(body: Uint8Array): { flags: number; data: Buffer }[] {
  const buf = Buffer.from(body);
  const out: { flags: number; data: Buffer }[] = [];
  let offset = 0;
  while (offset + 5 <= buf.length) {
    const length = buf.readUInt32BE(offset + 1);
    out.push({ flags: buf.readUInt8(offset), data: buf.subarray(offset + 5, offset + 5 + length) });
    offset += 5 + length;
  }
  return out;
}

/** An error as a caller of one surface reads it. */
export interface SurfaceError {
  /** HTTP status (200 for the streaming protocols). */
  readonly httpStatus: number;
  /** The protocol's code: REST `error.code`; Connect code string; gRPC status number. */
  readonly protocolCode: string | number | null;
  /** The protocol's own message (REST: the envelope's; Connect: `message`; gRPC: grpc-message). */
  readonly protocolMessage: string;
  readonly envelope: {
    readonly message: string;
    readonly type: string;
    readonly param: string | null;
    readonly code: string | null;
    readonly requestId: string;
  };
  /** The X-Request-Id response header. */
  readonly requestIdHeader: string | null;
  /** Response headers and trailers (gRPC, gRPC-Web's trailer frame, Connect's end-stream metadata). */
  readonly metadata: Headers;
}

function fromProto(env: ErrorEnvelope): SurfaceError["envelope"] {
  return {
    message: env.error?.message ?? "",
    type: env.error?.type ?? "",
    param: env.error?.param ?? null,
    code: env.error?.code ?? null,
    requestId: env.requestId,
  };
}

/** The ErrorEnvelope among Connect JSON error details (`{type, value: base64}`). */
function envelopeOfConnectJson(error: { details?: { type: string; value: string }[] }): ErrorEnvelope {
  const detail = error.details?.find((d) => d.type === "acs.v1.ErrorEnvelope");
  if (detail === undefined) throw new Error(`no acs.v1.ErrorEnvelope detail in ${JSON.stringify(error)}`);
  return fromBinary(ErrorEnvelopeSchema, base64Decode(detail.value));
}

/** The ErrorEnvelope of a gRPC status (trailers or a gRPC-Web trailer frame), checked against it. */
function envelopeOfGrpc(trailers: Headers): { code: number; message: string; envelope: ErrorEnvelope } {
  const code = Number(trailers.get("grpc-status"));
  const message = decodeURIComponent(trailers.get("grpc-message") ?? "");
  const bin = trailers.get("grpc-status-details-bin");
  if (bin === null) throw new Error(`no grpc-status-details-bin in ${JSON.stringify([...trailers])}`);
  const status = fromBinary(StatusSchema, base64Decode(bin));
  if (status.code !== code || status.message !== message) {
    throw new Error(`google.rpc.Status ${status.code} '${status.message}' differs from the trailers`);
  }
  const any = status.details.find((d) => d.typeUrl === "type.googleapis.com/acs.v1.ErrorEnvelope");
  if (any === undefined) throw new Error("no acs.v1.ErrorEnvelope in google.rpc.Status.details");
  return { code, message, envelope: fromBinary(ErrorEnvelopeSchema, any.value) };
}

/** gRPC-Web's trailer frame: `name: value` lines. */
function parseTrailerFrame(data: Uint8Array): Headers {
  const h = new Headers();
  for (const line of Buffer.from(data).toString("latin1").split("\r\n")) {
    const i = line.indexOf(":");
    if (i > 0) h.append(line.slice(0, i).trim(), line.slice(i + 1).trim());
  }
  return h;
}

/** How a surface carries its errors. */
export type ErrorForm = "rest" | "connect" | "connect-stream" | "grpc" | "grpc-web";

/** Decodes the error of `res` in `form`; throws when it is not an error with the envelope. */
export function decodeError(form: ErrorForm, res: WireResponse): SurfaceError {
  const requestIdHeader = res.headers.get("x-request-id");
  switch (form) {
    case "rest": {
      const json = JSON.parse(res.body.toString("utf8")) as {
        error: { message: string; type: string; param: string | null; code: string | null };
        request_id: string;
      };
      const keys = Object.keys(json.error).sort();
      if (keys.join() !== "code,message,param,type") throw new Error(`envelope keys ${keys.join()}`);
      return {
        httpStatus: res.status,
        protocolCode: json.error.code,
        protocolMessage: json.error.message,
        envelope: { ...json.error, requestId: json.request_id },
        requestIdHeader,
        metadata: res.headers,
      };
    }
    case "connect": {
      const json = JSON.parse(res.body.toString("utf8")) as {
        code: string;
        message: string;
        details?: { type: string; value: string }[];
      };
      return {
        httpStatus: res.status,
        protocolCode: json.code,
        protocolMessage: json.message,
        envelope: fromProto(envelopeOfConnectJson(json)),
        requestIdHeader,
        metadata: res.headers,
      };
    }
    case "connect-stream": {
      const end = frames(res.body).find((f) => (f.flags & 0b10) !== 0);
      if (end === undefined) throw new Error("no end-stream frame");
      const json = JSON.parse(end.data.toString("utf8")) as {
        error?: { code: string; message: string; details?: { type: string; value: string }[] };
        metadata?: Record<string, string[]>;
      };
      if (json.error === undefined) throw new Error("end-stream without an error");
      const metadata = new Headers(res.headers);
      for (const [k, vs] of Object.entries(json.metadata ?? {})) for (const v of vs) metadata.append(k, v);
      return {
        httpStatus: res.status,
        protocolCode: json.error.code,
        protocolMessage: json.error.message,
        envelope: fromProto(envelopeOfConnectJson(json.error)),
        requestIdHeader,
        metadata,
      };
    }
    case "grpc": {
      // Trailers, or the headers of a trailers-only answer.
      const trailers = res.trailers.has("grpc-status") ? res.trailers : res.headers;
      const { code, message, envelope } = envelopeOfGrpc(trailers);
      const metadata = new Headers(res.headers);
      trailers.forEach((v, k) => {
        metadata.set(k, v);
      });
      return {
        httpStatus: res.status,
        protocolCode: code,
        protocolMessage: message,
        envelope: fromProto(envelope),
        requestIdHeader,
        metadata,
      };
    }
    case "grpc-web": {
      const trailerFrame = frames(res.body).find((f) => (f.flags & 0x80) !== 0);
      const trailers = trailerFrame === undefined ? res.headers : parseTrailerFrame(trailerFrame.data);
      const { code, message, envelope } = envelopeOfGrpc(trailers);
      const metadata = new Headers(res.headers);
      trailers.forEach((v, k) => {
        metadata.set(k, v);
      });
      return {
        httpStatus: res.status,
        protocolCode: code,
        protocolMessage: message,
        envelope: fromProto(envelope),
        requestIdHeader,
        metadata,
      };
    }
  }
}
