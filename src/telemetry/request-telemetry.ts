// One place sees every request end: the access log line, the request metrics and the gateway span.
import type { Span } from "@opentelemetry/api";
import { SpanStatusCode } from "@opentelemetry/api";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import type { CallRecord } from "../core/index.js";
import type { CallMetrics } from "./metrics.js";
import type { RpcOutcome } from "./rpc-outcome.js";
import type { Tracing } from "./tracing.js";

/**
 * How a request came: REST (OpenAI JSON/SSE), one of the three RPC protocols, a page for people
 * (the playground, the API reference and its OpenAPI document), or anything else: an ops route
 * (/healthz, /readyz, /metrics) or an unknown one.
 */
export type Protocol = "rest" | "connect" | "grpc" | "grpc-web" | "page" | "ops";

/** What {@link observeRequests} needs. */
export interface RequestTelemetryDeps {
  readonly metrics: CallMetrics;
  readonly tracing: Tracing;
}

/** What is known of one request while it runs. */
interface RequestState {
  readonly record: CallRecord & RpcOutcome;
  readonly start: number;
  readonly protocol: Protocol;
  readonly route: string;
  readonly span: Span;
  streaming: boolean;
  finished: boolean;
  /** The response has closed (its line is written, or waits for the service). */
  closed: boolean;
}

const states = new WeakMap<FastifyRequest, RequestState>();

/**
 * The record of a request the service fills in (model, key name, tokens, first token, clamp,
 * error) and the RPC outcome lands in; undefined for a request {@link observeRequests} did not see.
 */
export function callRecordOf(request: FastifyRequest): (CallRecord & RpcOutcome) | undefined {
  return states.get(request)?.record;
}

/** The path of an RPC: /<package>.<Service>/<Method>. */
const rpcPath = /^\/[A-Za-z_][\w.]*\.[A-Za-z_]\w*\/[A-Za-z_]\w*$/;

/** Routes whose lines are logged at debug: probes and scrapes come every few seconds. */
const probeRoutes = new Set([
  "/healthz",
  "/health",
  "/readyz",
  "/metrics",
  "/grpc.health.v1.Health/Check",
  "/grpc.health.v1.Health/Watch",
]);

/** The protocol of a request, from its Content-Type and path. */
export function protocolOf(path: string, contentType: string | undefined): Protocol {
  const type = (contentType ?? "").toLowerCase();
  if (type.startsWith("application/grpc-web")) return "grpc-web";
  if (type.startsWith("application/grpc")) return "grpc";
  if (type.startsWith("application/connect+")) return "connect";
  // An RPC path's first segment holds a dot (`/<package>.<Service>/…`): `/v1/…` is never one.
  if (path.startsWith("/v1/") || path === "/tokenize" || path === "/detokenize") return "rest";
  if (rpcPath.test(path)) return "connect";
  if (isPagePath(path)) return "page";
  return "ops";
}

/** The pages' paths: /playground and /docs with what is under them, and /openapi.json. */
function isPagePath(path: string): boolean {
  if (path === "/openapi.json") return true;
  for (const page of ["/playground", "/docs"]) {
    if (path === page || path.startsWith(`${page}/`)) return true;
  }
  return false;
}

/** Connect, gRPC and gRPC-Web: the calls that have a gRPC code and an RPC span. */
const isRpc = (protocol: Protocol): boolean =>
  protocol === "connect" || protocol === "grpc" || protocol === "grpc-web";

/** gRPC codes that say the server failed (the others are the caller's doing). */
const serverFailures = new Set(["unknown", "internal", "unavailable", "data_loss", "deadline_exceeded"]);

/**
 * The `{protocol}` label set of each protocol, made once (prom-client keeps the object of a series'
 * first observation and only reads it: prom-client 15's `.labels()` children hash the labels on
 * every call all the same, so they would save nothing more).
 */
const protocolLabels: Readonly<Record<Protocol, { readonly protocol: Protocol }>> = {
  rest: { protocol: "rest" },
  connect: { protocol: "connect" },
  grpc: { protocol: "grpc" },
  "grpc-web": { protocol: "grpc-web" },
  page: { protocol: "page" },
  ops: { protocol: "ops" },
};

/** Milliseconds, rounded to 0.1. */
const ms = (x: number) => Math.round(x * 10) / 10;

/** How a response ended, as its `close` found it. */
interface Ending {
  /** `performance.now()` at the close. */
  readonly end: number;
  readonly canceled: boolean;
  /** RPCs: the gRPC code; undefined for HTTP. */
  readonly grpcCode: string | undefined;
  readonly status: number;
}

/** How the response of `state` ended, read at its `close`. */
function endingOf(reply: FastifyReply, state: RequestState): Ending {
  const { record, protocol } = state;
  const rpc = isRpc(protocol);
  // The caller went away: the response did not finish, or (HTTP/2 reports a reset stream as
  // finished) an RPC's last frame or trailers never went out, or the service saw the cancel.
  const canceled =
    !state.finished || (rpc && record.grpcCode === undefined) || record.errorCode === "canceled";
  return {
    end: performance.now(),
    canceled,
    // gRPC's `canceled`, or nginx's 499 for HTTP.
    grpcCode: rpc ? (canceled ? "canceled" : (record.grpcCode ?? "unknown")) : undefined,
    status: canceled && !rpc ? 499 : reply.raw.statusCode,
  };
}

/**
 * How long the access line of a request whose caller went away waits for the service to record
 * its tokens ({@link CallRecord.running}), ms. Inference's request is aborted at once, so the
 * service ends within milliseconds; what waits longer (a count of the prompt from a slow
 * Inference, a Connect stream whose generator connect-es leaves suspended until the stall timer)
 * is written without them, as it was at the close.
 */
const serviceEndWaitMs = 5_000;

function finish(request: FastifyRequest, state: RequestState, deps: RequestTelemetryDeps, ending: Ending) {
  const { end, canceled, grpcCode, status } = ending;
  const { record, protocol, route, span } = state;
  const { metrics } = deps;
  const model = record.model ?? "";
  const durationMs = end - state.start;
  const ttftMs = record.firstTokenAt === undefined ? undefined : record.firstTokenAt - state.start;
  const completion = record.completionTokens;

  metrics.requests.inc({ protocol, route, model, status: String(status), grpc_code: grpcCode ?? "" });
  metrics.duration.observe({ protocol, route }, durationMs / 1000);
  metrics.inFlight.dec(protocolLabels[protocol]);
  if (state.streaming) metrics.streamsInFlight.dec(protocolLabels[protocol]);
  if (record.promptTokens !== undefined) metrics.promptTokens.inc({ model }, record.promptTokens);
  if (completion !== undefined) metrics.completionTokens.inc({ model }, completion);
  if (ttftMs !== undefined) {
    metrics.timeToFirstToken.observe({ model }, ttftMs / 1000);
    if (completion !== undefined && completion >= 2 && record.firstTokenAt !== undefined) {
      metrics.timePerOutputToken.observe({ model }, (end - record.firstTokenAt) / 1000 / (completion - 1));
    }
  }
  if (record.errorCode === "insufficient_quota") metrics.budgetRefusals.inc({ model });
  if (record.clamped === true) metrics.budgetClamps.inc({ model });

  // Built field by field in the line's order (no object spread per optional field).
  const line: Record<string, unknown> = { method: request.method, route, protocol, status };
  if (grpcCode !== undefined) line.grpcCode = grpcCode;
  if (record.errorCode !== undefined) line.error = record.errorCode;
  if (record.model !== undefined) line.model = record.model;
  if (record.keyName !== undefined) line.keyName = record.keyName;
  if (record.promptTokens !== undefined) line.promptTokens = record.promptTokens;
  if (completion !== undefined) line.completionTokens = completion;
  if (ttftMs !== undefined) line.ttftMs = ms(ttftMs);
  line.durationMs = ms(durationMs);
  if (state.streaming) line.stream = true;
  if (record.clamped === true) line.clamped = true;
  if (canceled) line.canceled = true;
  if (probeRoutes.has(route)) request.log.debug(line, "request");
  else request.log.info(line, "request");

  if (!span.isRecording()) return;
  span.setAttributes({
    "http.response.status_code": status,
    ...(grpcCode === undefined ? {} : { "rpc.grpc.status_code_name": grpcCode }),
    ...(record.model === undefined ? {} : { "acs.model": record.model }),
    ...(record.promptTokens === undefined ? {} : { "gen_ai.usage.input_tokens": record.promptTokens }),
    ...(completion === undefined ? {} : { "gen_ai.usage.output_tokens": completion }),
    ...(record.errorCode === undefined ? {} : { "error.type": record.errorCode }),
    ...(canceled ? { "acs.canceled": true } : {}),
  });
  if (status >= 500 || (grpcCode !== undefined && serverFailures.has(grpcCode))) {
    span.setStatus({ code: SpanStatusCode.ERROR, message: record.errorCode ?? grpcCode ?? String(status) });
  }
  span.end();
}

/** What {@link observeRequests} gives back. */
export interface RequestObserver {
  /**
   * Writes now the access lines (and metrics, and spans) of callers gone while the service still
   * runs their calls, without the tokens they wait for; returns how many it wrote. The app's close
   * does it in its onClose hook; a process that exits without the close having got there (the
   * forced exit of a shutdown that did not finish, src/main.ts) calls it first.
   */
  flushWaiting(): number;
}

/**
 * Registers the root hook that follows every request from its start to the end of its response
 * (the response's `close`, which also comes when the caller goes away first): the in-flight gauge,
 * the gateway span (child of the caller's `traceparent`), a {@link CallRecord} for the service, and
 * at the end one access log line (info; debug for probes and scrapes), the request metrics and the
 * span's end. When the caller went away while the service still runs the call
 * ({@link CallRecord.running}), these wait until it has recorded the tokens the call used (at
 * most 5 s, and no later than the server's close, or {@link RequestObserver.flushWaiting}).
 * Register it before any hook that may answer early.
 */
export function observeRequests(app: FastifyInstance, deps: RequestTelemetryDeps): RequestObserver {
  const { metrics, tracing } = deps;
  /** The lines of callers gone while the service still runs their calls (see the close handler). */
  const waiting = new Set<() => void>();
  const flushWaiting = (): number => {
    const lines = [...waiting];
    for (const write of lines) write();
    return lines.length;
  };
  app.addHook("onClose", (_app, done) => {
    flushWaiting();
    done();
  });
  // A callback hook: an async one costs a promise per request.
  app.addHook("onRequest", (request, reply, done) => {
    const url = request.url;
    const query = url.indexOf("?");
    const path = query === -1 ? url : url.slice(0, query);
    const protocol = protocolOf(path, request.headers["content-type"]);
    const route = request.routeOptions.url ?? "unknown";
    const span =
      tracing.recording || request.headers.traceparent !== undefined
        ? startSpan(tracing, request, path, protocol, route)
        : tracing.startRequest("", request.headers, noAttributes);
    const state: RequestState = {
      record: {
        traceUpstream: tracing.upstreamTracer(span),
        streamStarted() {
          // A stream whose caller went away during its checks is not counted in flight: its line
          // was written at the close, so nothing would take it off the gauge again.
          if (state.streaming || state.closed) return;
          state.streaming = true;
          metrics.streamsInFlight.inc(protocolLabels[protocol]);
        },
      },
      start: performance.now(),
      protocol,
      route,
      span,
      streaming: false,
      finished: false,
      closed: false,
    };
    states.set(request, state);
    metrics.inFlight.inc(protocolLabels[protocol]);
    const res = reply.raw;
    res.on("finish", () => {
      state.finished = true;
    });
    res.on("close", () => {
      state.closed = true;
      const ending = endingOf(reply, state);
      const record = state.record;
      if (record.running !== true) return finish(request, state, deps, ending);
      // The caller went away while the service still runs the call: the line and the metrics
      // wait for the tokens it used, at most serviceEndWaitMs, and are written when the server
      // closes at the latest.
      let done = false;
      const once = () => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        delete record.onEnd;
        waiting.delete(once);
        finish(request, state, deps, ending);
      };
      const timer = setTimeout(once, serviceEndWaitMs);
      timer.unref();
      record.onEnd = once;
      waiting.add(once);
    });
    done();
  });
  return { flushWaiting };
}

/** No attributes: the span of a request when nothing records it. */
const noAttributes: Readonly<Record<string, never>> = {};

/** The gateway span of a request, with its attributes. */
function startSpan(
  tracing: Tracing,
  request: FastifyRequest,
  path: string,
  protocol: Protocol,
  route: string,
): Span {
  const rpc = isRpc(protocol);
  const name = rpc && route !== "unknown" ? route.slice(1) : `${request.method} ${route}`;
  return tracing.startRequest(name, request.headers, {
    "http.request.method": request.method,
    "http.route": route,
    "url.path": path,
    "acs.protocol": protocol,
    "acs.request_id": request.id,
    ...(rpc && route !== "unknown"
      ? {
          "rpc.system": protocol === "connect" ? "connect_rpc" : "grpc",
          "rpc.service": route.slice(1).split("/")[0],
          "rpc.method": route.split("/")[2],
        }
      : {}),
  });
}
