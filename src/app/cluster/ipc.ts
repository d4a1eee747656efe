// The messages between the cluster's primary and its workers (node:cluster's IPC channel), and
// the settings a worker is forked with. Every message carries `acs`, its kind; anything else on
// the channel (node:cluster's own) is not ours.
import type { ModelConfig } from "../../config/index.js";
import type { AdmissionDemand } from "../../service/admission.js";
import type { Readiness } from "../../surfaces/http/ops-server.js";
import type { MetricsJson } from "../worker-metrics.js";

/** The environment variable that carries a worker's settings from the primary (JSON). */
export const WORKER_ENV = "ACS_CLUSTER_WORKER";

/** What the primary hands each worker at fork (JSON in {@link WORKER_ENV}). */
export interface WorkerSettings {
  /** 1..N: the worker's place; a restarted worker takes the place of the one that died. */
  readonly slot: number;
  /** Its name in the Budget store: `<ACS_INSTANCE_ID or host:pid:random>/w<slot>`. */
  readonly instanceId: string;
  /** The embedded engine's model (the primary runs the engine); undefined with ACS_MODELS. */
  readonly embeddedModel: ModelConfig | undefined;
  /** Whether the embedded engine was alive when this worker was forked. */
  readonly engineAlive: boolean;
}

/** What a worker tells the primary once it listens. */
export interface ListeningInfo {
  readonly url: string;
  readonly port: number;
  readonly models: unknown;
}

/** A worker's messages to the primary. */
export type ToPrimary =
  | { readonly acs: "listening"; readonly info: ListeningInfo }
  | { readonly acs: "scrape"; readonly id: number }
  | { readonly acs: "metrics"; readonly id: number; readonly metrics: MetricsJson }
  | { readonly acs: "admit"; readonly id: number; readonly keyId: string; readonly demand: AdmissionDemand }
  | { readonly acs: "release"; readonly ticket: number }
  | { readonly acs: "readiness"; readonly readiness: Readiness }
  | { readonly acs: "starting" };

/**
 * The primary's answer to an `admit`: a ticket and its Inference requests, or the refusal's
 * message; neither when the primary failed to count it (the worker then counts it alone).
 */
export type AdmitAnswer = {
  readonly acs: "admit";
  readonly id: number;
  readonly ticket?: number;
  readonly upstreamRequests?: number;
  readonly refused?: string;
};

/** The primary's messages to a worker. */
export type ToWorker =
  | { readonly acs: "scrape"; readonly id: number; readonly text?: string; readonly error?: string }
  | { readonly acs: "metrics"; readonly id: number }
  | { readonly acs: "engine"; readonly alive: boolean }
  /** Drain and close (`now`: end the calls in flight at once), for the primary's `signal`. */
  | { readonly acs: "shutdown"; readonly signal: string; readonly now: boolean }
  | AdmitAnswer;

/** True for a message of ours (it has a string `acs`). */
export function isAcsMessage(m: unknown): m is { acs: string } {
  return typeof m === "object" && m !== null && typeof (m as { acs?: unknown }).acs === "string";
}

/**
 * Sends `m` to the primary, from a worker. A send after the primary died fails: told to the
 * callback (then 'disconnect' follows), not thrown as an 'error' on `process`, which would end
 * this worker with an uncaught error.
 */
export function sendToPrimary(m: ToPrimary): void {
  if (process.connected) process.send?.(m, undefined, undefined, () => undefined);
}
