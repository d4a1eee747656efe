/** Test helpers for the engine's HTTP contract: JSON posts and SSE parsing into events. */
import { createParser } from "eventsource-parser";

export interface SseEvent {
  /** The raw `data:` payload. */
  data: string;
  /** Parsed JSON, or null for `[DONE]`. */
  json: Record<string, unknown> | null;
  /** Field names other than data seen on this event (must stay empty: no event:/id: lines). */
  event: string | undefined;
  id: string | undefined;
}

export async function postJson(
  url: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; json: Record<string, unknown>; headers: Headers }> {
  const r = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
  return { status: r.status, json: (await r.json()) as Record<string, unknown>, headers: r.headers };
}

export function parseSse(text: string): SseEvent[] {
  const events: SseEvent[] = [];
  const parser = createParser({
    onEvent(ev) {
      events.push({
        data: ev.data,
        json: ev.data === "[DONE]" ? null : (JSON.parse(ev.data) as Record<string, unknown>),
        event: ev.event,
        id: ev.id,
      });
    },
  });
  parser.feed(text);
  return events;
}

export async function postSse(
  url: string,
  body: unknown,
): Promise<{ status: number; events: SseEvent[]; contentType: string | null }> {
  const r = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const text = await r.text();
  return { status: r.status, events: parseSse(text), contentType: r.headers.get("content-type") };
}

export interface StreamChoice {
  index: number;
  text: string;
  finish_reason: string | null;
  stop_reason: string | number | null;
  logprobs: unknown;
  token_ids?: number[];
}

/** Chunks' choices of all JSON events (each chunk must hold at most one choice). */
export function chunkChoices(events: SseEvent[]): StreamChoice[] {
  const out: StreamChoice[] = [];
  for (const e of events) {
    const choices = (e.json?.choices ?? []) as StreamChoice[];
    out.push(...choices);
  }
  return out;
}
