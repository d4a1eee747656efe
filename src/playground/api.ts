// The gateway's REST API as the playground calls it: GET /v1/models, POST /v1/completions
// (non-streamed JSON, or SSE read from fetch's body with eventsource-parser). Every refusal
// becomes an ApiRefusal holding the envelope of proto/API.md §7.
import { EventSourceParserStream } from "eventsource-parser/stream";

/** The error envelope of proto/API.md §7. */
export interface ErrorEnvelope {
  error: { message: string; type: string; param: string | null; code: string | null };
  request_id: string;
}

/** A refusal of the API: its HTTP status (0 for an SSE error event after the stream began) and envelope. */
export class ApiRefusal extends Error {
  override name = "ApiRefusal";
  constructor(
    readonly status: number,
    readonly envelope: ErrorEnvelope,
  ) {
    super(envelope.error.message);
  }
}

/** One model of GET /v1/models (the gateway's extra fields included). */
export interface ModelInfo {
  id: string;
  max_model_len: number;
  hidden_size: number;
  num_hidden_layers: number;
  aliases: string[];
}

/** The logprobs object of a choice or chunk (OpenAI's legacy completions shape). */
export interface Logprobs {
  tokens: string[];
}

/** One choice of a completion or a chunk. */
export interface Choice {
  index: number;
  text: string;
  logprobs: Logprobs | null;
  finish_reason: string | null;
}

/** A completion, or one chunk of a stream (`activations` only in the last chunk of its own). */
export interface Completion {
  id: string;
  choices: Choice[];
  usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number } | null;
  activations?: { residual_stream: unknown };
}

/** Fields of POST /v1/completions the playground sends (proto/API.md §2). */
export interface CompletionRequest {
  model: string;
  prompt: string;
  max_tokens: number;
  temperature: number;
  seed?: number;
  echo?: boolean;
  logprobs?: number;
  output_residual_stream?: number[];
  apply_steering_vectors?: SteeringVectorJson[];
}

/** A SteeringVector as the API's JSON takes it (proto/API.md §6), plain nested arrays. */
export interface SteeringVectorJson {
  activations: number[][];
  layer_indices: number[];
  scale: number;
  norm_match: boolean;
}

function isEnvelope(value: unknown): value is ErrorEnvelope {
  const error = (value as { error?: { message?: unknown } } | null)?.error;
  return typeof error?.message === "string";
}

/** Talks to the gateway at `baseUrl` ("" = the page's origin) with an optional key. */
export class GatewayClient {
  constructor(
    private readonly baseUrl: string,
    public key: string | undefined,
  ) {}

  private headers(): Record<string, string> {
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (this.key) headers.authorization = `Bearer ${this.key}`;
    return headers;
  }

  private async refusal(response: Response): Promise<ApiRefusal> {
    const text = await response.text();
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      body = undefined;
    }
    const envelope: ErrorEnvelope = isEnvelope(body)
      ? body
      : {
          error: {
            message: `HTTP ${response.status}: ${text.slice(0, 200)}`,
            type: "",
            param: null,
            code: null,
          },
          request_id: response.headers.get("x-request-id") ?? "",
        };
    return new ApiRefusal(response.status, envelope);
  }

  /** GET /v1/models. Throws ApiRefusal (e.g. 401 invalid_api_key with keys on). */
  async models(): Promise<ModelInfo[]> {
    const response = await fetch(`${this.baseUrl}/v1/models`, { headers: this.headers() });
    if (!response.ok) throw await this.refusal(response);
    return ((await response.json()) as { data: ModelInfo[] }).data;
  }

  /** POST /v1/completions without a stream. Throws ApiRefusal. */
  async complete(request: CompletionRequest, signal?: AbortSignal): Promise<Completion> {
    const response = await fetch(`${this.baseUrl}/v1/completions`, {
      method: "POST",
      headers: this.headers(),
      body: JSON.stringify(request),
      ...(signal ? { signal } : {}),
    });
    if (!response.ok) throw await this.refusal(response);
    return (await response.json()) as Completion;
  }

  /**
   * POST /v1/completions with `stream: true`: yields each chunk as it arrives, until `[DONE]`.
   * A refusal before the stream is an ApiRefusal with the HTTP status; an error event inside the
   * stream is an ApiRefusal with status 0.
   */
  async *stream(request: CompletionRequest, signal?: AbortSignal): AsyncGenerator<Completion> {
    const response = await fetch(`${this.baseUrl}/v1/completions`, {
      method: "POST",
      headers: this.headers(),
      body: JSON.stringify({ ...request, stream: true, stream_options: { include_usage: true } }),
      ...(signal ? { signal } : {}),
    });
    if (!response.ok || response.body === null) throw await this.refusal(response);
    const events = response.body
      .pipeThrough(new TextDecoderStream())
      .pipeThrough(new EventSourceParserStream());
    const reader = events.getReader();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return;
        if (value.data === "[DONE]") return;
        const chunk = JSON.parse(value.data) as unknown;
        if (isEnvelope(chunk)) throw new ApiRefusal(0, chunk);
        yield chunk as Completion;
      }
    } finally {
      reader.releaseLock();
    }
  }
}

/** "message (code, request req_…)" — how the page shows a refusal. */
export function describeRefusal(err: unknown): string {
  if (err instanceof ApiRefusal) {
    const { error, request_id } = err.envelope;
    const status = err.status === 0 ? "" : `${err.status} `;
    return `${status}${error.code ?? error.type}: ${error.message}${request_id ? ` (request ${request_id})` : ""}`;
  }
  return err instanceof Error ? err.message : String(err);
}
