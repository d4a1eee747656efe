// OpenTelemetry traces: a span per gateway request (its parent: the caller's `traceparent`) and a
// span per upstream call (its child), whose context Inference gets as `traceparent`.
import {
  type Attributes,
  type Context,
  context,
  INVALID_SPAN_CONTEXT,
  isSpanContextValid,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  type TextMapGetter,
  type Tracer,
  trace,
} from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import {
  BasicTracerProvider,
  BatchSpanProcessor,
  SimpleSpanProcessor,
  type SpanExporter,
} from "@opentelemetry/sdk-trace-base";
import { ApiError } from "../core/errors/index.js";
import type { UpstreamCallTrace, UpstreamTracer } from "../core/index.js";

/** Options of {@link createTracing}. */
export interface TracingOptions {
  /**
   * OTLP/HTTP traces URL (`…/v1/traces`, src/config `otlpEndpoint`): spans are batched and sent
   * there. @default none: no span is recorded (the caller's `traceparent` still reaches Inference)
   */
  readonly otlpTracesUrl?: string | undefined;
  /** An exporter of its own (tests: the SDK's InMemorySpanExporter), each span exported as it ends. */
  readonly exporter?: SpanExporter;
  /** `service.name` of the spans. @default "acs-gateway" */
  readonly serviceName?: string;
}

/** The gateway's tracing: spans when an exporter is set, `traceparent` propagation always. */
export interface Tracing {
  /** True when spans are recorded and exported. */
  readonly recording: boolean;
  /**
   * Starts the span of one gateway request (kind SERVER), child of the request's W3C
   * `traceparent` (and `tracestate`) when it sends a valid one.
   */
  startRequest(
    name: string,
    headers: Readonly<Record<string, string | string[] | undefined>>,
    attributes: Attributes,
  ): Span;
  /**
   * The upstream tracer of a request whose span is `parent`: each upstream call gets a span (kind
   * CLIENT, name `upstream POST /v1/completions`) and the headers that carry its context
   * (`traceparent`, `tracestate`). Without recording, those headers carry the caller's own
   * `traceparent` unchanged (or none).
   */
  upstreamTracer(parent: Span): UpstreamTracer;
  /** Exports what is left and stops (app.close()). */
  shutdown(): Promise<void>;
}

const propagator = new W3CTraceContextPropagator();

const headerGetter: TextMapGetter<Readonly<Record<string, string | string[] | undefined>>> = {
  keys: (carrier) => Object.keys(carrier),
  get: (carrier, key) => carrier[key.toLowerCase()],
};

/** Marks `span` failed with `err` (ApiError code as `error.type`). */
function failSpan(span: Span, err: unknown): void {
  const type = err instanceof ApiError ? err.code : err instanceof Error ? err.name : "error";
  span.setAttribute("error.type", type);
  span.setStatus({
    code: SpanStatusCode.ERROR,
    message: err instanceof Error ? err.message : String(err),
  });
}

/** The span of a request nothing records and no caller's context names (a no-op span). */
const invalidSpan: Span = trace.wrapSpanContext(INVALID_SPAN_CONTEXT);

/** An upstream call of such a request: no span, no header. */
const untracedCall: UpstreamTracer = () => ({ headers: {}, end() {} });

/**
 * The gateway's tracing. Spans are recorded only with `exporter` or `otlpTracesUrl`; the provider
 * is the gateway's own (not registered globally), and contexts are passed explicitly, so several
 * gateways in one process (tests) keep their spans apart.
 */
export function createTracing(options: TracingOptions = {}): Tracing {
  const processors =
    options.exporter !== undefined
      ? [new SimpleSpanProcessor(options.exporter)]
      : options.otlpTracesUrl !== undefined
        ? [new BatchSpanProcessor(new OTLPTraceExporter({ url: options.otlpTracesUrl }))]
        : [];
  const provider =
    processors.length === 0
      ? undefined
      : new BasicTracerProvider({
          resource: resourceFromAttributes({ "service.name": options.serviceName ?? "acs-gateway" }),
          spanProcessors: processors,
        });
  // Without a provider: the API's no-op tracer, whose spans carry their parent's context.
  const tracer: Tracer = provider?.getTracer("acs-gateway") ?? trace.getTracer("acs-gateway-noop");

  const recording = provider !== undefined;
  return {
    recording,
    startRequest(name, headers, attributes) {
      // Nothing recorded and no caller context to pass on: the one invalid span, no work at all.
      if (!recording && headers.traceparent === undefined) return invalidSpan;
      const parent = propagator.extract(ROOT_CONTEXT, headers, headerGetter);
      return tracer.startSpan(name, { kind: SpanKind.SERVER, attributes }, parent);
    },
    upstreamTracer(parent) {
      // Not recording and no valid caller context: no span, no traceparent (inject writes none).
      if (!recording && !isSpanContextValid(parent.spanContext())) return untracedCall;
      const parentContext: Context = trace.setSpan(context.active(), parent);
      return (call): UpstreamCallTrace => {
        const span = tracer.startSpan(
          "upstream POST /v1/completions",
          {
            kind: SpanKind.CLIENT,
            attributes: {
              "http.request.method": "POST",
              "url.full": `${call.replica.replace(/\/+$/, "")}/v1/completions`,
              "acs.model": call.model,
              "acs.upstream.replica": call.replica,
              "acs.upstream.request_id": call.upstreamRequestId,
              "acs.upstream.attempt": call.attempt,
              "acs.upstream.stream": call.stream,
            },
          },
          parentContext,
        );
        const headers: Record<string, string> = {};
        propagator.inject(trace.setSpan(ROOT_CONTEXT, span), headers, {
          set: (carrier, key, value) => {
            carrier[key] = value;
          },
        });
        let ended = false;
        return {
          headers,
          end(error) {
            if (ended) return;
            ended = true;
            if (error !== undefined) failSpan(span, error);
            span.end();
          },
        };
      };
    },
    async shutdown() {
      await provider?.shutdown();
    },
  };
}

export { failSpan };
