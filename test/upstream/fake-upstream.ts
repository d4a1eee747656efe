import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";

/** One request the fake upstream received, and how its response closed. */
export interface SeenRequest {
  method: string;
  url: string;
  headers: IncomingMessage["headers"];
  body: string;
  /** Resolves when the response closed; `aborted` when the client went away before it ended. */
  closed: Promise<{ aborted: boolean }>;
}

/** A scripted upstream on 127.0.0.1:0 (node:http): `handler` writes whatever misbehaviour a test needs. */
export interface FakeUpstream {
  url: string;
  requests: SeenRequest[];
  /** TCP connections accepted so far (a client that reuses its connections opens few). */
  readonly connections: number;
  close(): Promise<void>;
}

export async function startFakeUpstream(
  handler: (req: IncomingMessage, res: ServerResponse, body: string) => unknown,
): Promise<FakeUpstream> {
  const requests: SeenRequest[] = [];
  const sockets = new Set<Socket>();
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    const closed = new Promise<{ aborted: boolean }>((resolve) => {
      res.on("close", () => resolve({ aborted: !res.writableFinished }));
    });
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8");
      requests.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body, closed });
      void Promise.resolve(handler(req, res, body)).catch(() => res.destroy());
    });
  });
  let connections = 0;
  server.on("connection", (s: Socket) => {
    connections++;
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    get connections() {
      return connections;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/**
 * A handler that answers as Inference does on its ops routes — `GET /health` (200) and
 * `GET /v1/models` (`servedModelName` with `maxModelLen`), which the gateway's replica check
 * reads — and passes every other request to `handler`.
 */
export function withVllmOps(
  handler: (req: IncomingMessage, res: ServerResponse, body: string) => unknown,
  servedModelName = "acs/fake",
  maxModelLen = 512,
): (req: IncomingMessage, res: ServerResponse, body: string) => unknown {
  return (req, res, body) =>
    answerVllmOps(req, res, servedModelName, maxModelLen) ? undefined : handler(req, res, body);
}

/**
 * Answers vLLM's `GET /health` (200) and `GET /v1/models` (the one served model) — what the
 * gateway's replica pool checks before it serves a replica — and returns true; false (nothing
 * written) for any other request.
 */
export function answerVllmOps(
  req: IncomingMessage,
  res: ServerResponse,
  servedModelName = "acs/fake",
  maxModelLen = 512,
): boolean {
  if (req.method === "GET" && req.url === "/health") {
    res.end();
    return true;
  }
  if (req.method === "GET" && req.url === "/v1/models") {
    res.setHeader("content-type", "application/json");
    const data = [{ id: servedModelName, object: "model", owned_by: "vllm", max_model_len: maxModelLen }];
    res.end(JSON.stringify({ object: "list", data }));
    return true;
  }
  return false;
}

/** A port with nothing listening (bound, then closed). */
export async function closedPortUrl(): Promise<string> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return `http://127.0.0.1:${port}`;
}

/** SSE text for vLLM-style events (`data: <json>` + blank line) ending with `data: [DONE]`. */
export function sse(events: unknown[], done = true): string {
  return (
    events.map((e) => `data: ${typeof e === "string" ? e : JSON.stringify(e)}\n\n`).join("") +
    (done ? "data: [DONE]\n\n" : "")
  );
}

/** A vLLM stream chunk with one choice. */
export function chunk(
  index: number,
  text: string,
  finish: string | null = null,
  extra: Record<string, unknown> = {},
) {
  return {
    id: "cmpl-upstream",
    object: "text_completion",
    created: 1_700_000_000,
    model: "served/model",
    choices: [{ index, text, logprobs: null, finish_reason: finish, stop_reason: null, ...extra }],
    usage: null,
  };
}

/** One vLLM choice as its stream chunks build it up (the fields the gateway reads). */
interface CollectedChoice {
  index: number;
  text: string;
  logprobs: null;
  finish_reason: string | null;
  stop_reason: string | number | null;
  prompt_token_ids?: number[] | null | undefined;
  token_ids?: number[] | null | undefined;
}

/**
 * vLLM's non-streamed answer (`stream: false`) equal to the stream chunks `events` (objects as
 * {@link chunk} builds them; no logprobs): per index the texts and token ids appended, the last
 * finish and stop reason, prompt token ids as sent; `usage` from the chunk that carries one.
 */
export function collected(events: readonly unknown[]) {
  const choices = new Map<number, CollectedChoice>();
  let usage: unknown = null;
  let created = 1_700_000_000;
  for (const e of events) {
    const c = e as { created: number; choices: CollectedChoice[]; usage: unknown };
    created = c.created;
    if (c.usage !== null && c.usage !== undefined) usage = c.usage;
    for (const piece of c.choices) {
      const had = choices.get(piece.index);
      if (had === undefined) {
        choices.set(piece.index, {
          ...piece,
          token_ids: piece.token_ids ? [...piece.token_ids] : piece.token_ids,
        });
        continue;
      }
      had.text += piece.text;
      if (piece.token_ids) had.token_ids = [...(had.token_ids ?? []), ...piece.token_ids];
      if (piece.prompt_token_ids) had.prompt_token_ids = piece.prompt_token_ids;
      if (piece.finish_reason !== null) {
        had.finish_reason = piece.finish_reason;
        had.stop_reason = piece.stop_reason;
      }
    }
  }
  return {
    id: "cmpl-upstream",
    object: "text_completion",
    created,
    model: "served/model",
    choices: [...choices.values()].sort((a, b) => a.index - b.index),
    usage,
  };
}

/**
 * Answers a completion request as Inference does: `events` as SSE when the request body asks for
 * `stream: true`, else their {@link collected} non-streamed answer as JSON. (The gateway asks for a
 * stream with keys on, and for the non-streamed answer with keys off.)
 */
export function answerCompletion(res: ServerResponse, requestBody: string, events: unknown[]): void {
  const streamed = (JSON.parse(requestBody) as { stream?: unknown }).stream === true;
  res.setHeader("content-type", streamed ? "text/event-stream" : "application/json");
  res.end(streamed ? sse(events) : JSON.stringify(collected(events)));
}

/** Resolves once `res` can take more ('drain') or has closed: a fake's wait after a full write. */
export function drainedOrClosed(res: ServerResponse): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = () => {
      res.off("drain", done);
      res.off("close", done);
      resolve();
    };
    res.on("drain", done);
    res.on("close", done);
  });
}
