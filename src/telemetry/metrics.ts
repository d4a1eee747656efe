import { Counter, Gauge, Histogram, type Registry } from "prom-client";

/** Labels of a request: protocol (rest, connect, grpc, grpc-web, ops) and route (REST route or RPC path). */
type RequestLabels = "protocol" | "route";

/** The per-request metrics the access log feeds (served at GET /metrics). */
export interface CallMetrics {
  /**
   * `acs_requests_total{protocol,route,model,status,grpc_code}`: requests answered. `status` is
   * the HTTP status, `grpc_code` the gRPC code of an RPC (`ok`, `resource_exhausted`, …; empty for
   * REST and ops), `model` the served model's id (empty when the request named none that exists).
   * A request the caller abandoned has `grpc_code` `canceled` (RPC) or `status` 499 (REST).
   */
  readonly requests: Counter<RequestLabels | "model" | "status" | "grpc_code">;
  /** `acs_request_duration_seconds{protocol,route}`: time from the request to the end of its response. */
  readonly duration: Histogram<RequestLabels>;
  /** `acs_requests_in_flight{protocol}`: requests whose response has not ended. */
  readonly inFlight: Gauge<"protocol">;
  /** `acs_streams_in_flight{protocol}`: streamed completions (SSE, StreamCompletion) past their checks and not ended. */
  readonly streamsInFlight: Gauge<"protocol">;
  /** `acs_prompt_tokens_total{model}`: prompt tokens of completions that reached Inference. */
  readonly promptTokens: Counter<"model">;
  /** `acs_completion_tokens_total{model}`: tokens generated (all choices). */
  readonly completionTokens: Counter<"model">;
  /** `acs_time_to_first_token_seconds{model}`: from the request to Inference's first generated token. */
  readonly timeToFirstToken: Histogram<"model">;
  /** `acs_time_per_output_token_seconds{model}`: (end − first token) / (completion tokens − 1), for two or more tokens. */
  readonly timePerOutputToken: Histogram<"model">;
  /** `acs_budget_refusals_total{model}`: requests refused 429 `insufficient_quota` (the Budget holds not one token). */
  readonly budgetRefusals: Counter<"model">;
  /** `acs_budget_clamps_total{model}`: requests whose max_tokens was lowered to what the Budget holds. */
  readonly budgetClamps: Counter<"model">;
}

/** Registers the {@link CallMetrics} on `registry`. */
export function createCallMetrics(registry: Registry): CallMetrics {
  const registers = [registry];
  return {
    requests: new Counter({
      name: "acs_requests_total",
      help: "Requests answered, by protocol, route or RPC, model, HTTP status and gRPC code.",
      labelNames: ["protocol", "route", "model", "status", "grpc_code"],
      registers,
    }),
    duration: new Histogram({
      name: "acs_request_duration_seconds",
      help: "Time from request to the end of the response, seconds.",
      labelNames: ["protocol", "route"],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900],
      registers,
    }),
    inFlight: new Gauge({
      name: "acs_requests_in_flight",
      help: "Requests whose response has not ended, by protocol.",
      labelNames: ["protocol"],
      registers,
    }),
    streamsInFlight: new Gauge({
      name: "acs_streams_in_flight",
      help: "Streamed completions past their checks and not ended, by protocol.",
      labelNames: ["protocol"],
      registers,
    }),
    promptTokens: new Counter({
      name: "acs_prompt_tokens_total",
      help: "Prompt tokens of the completions sent to Inference, by model.",
      labelNames: ["model"],
      registers,
    }),
    completionTokens: new Counter({
      name: "acs_completion_tokens_total",
      help: "Tokens generated (all choices), by model.",
      labelNames: ["model"],
      registers,
    }),
    timeToFirstToken: new Histogram({
      name: "acs_time_to_first_token_seconds",
      help: "Time from the request to the first generated token, seconds.",
      labelNames: ["model"],
      buckets: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
      registers,
    }),
    timePerOutputToken: new Histogram({
      name: "acs_time_per_output_token_seconds",
      help: "Time per generated token after the first, seconds.",
      labelNames: ["model"],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      registers,
    }),
    budgetRefusals: new Counter({
      name: "acs_budget_refusals_total",
      help: "Requests refused because the key's Budget holds not one token (429 insufficient_quota), by model.",
      labelNames: ["model"],
      registers,
    }),
    budgetClamps: new Counter({
      name: "acs_budget_clamps_total",
      help: "Requests whose max_tokens was lowered to what the key's Budget holds, by model.",
      labelNames: ["model"],
      registers,
    }),
  };
}
