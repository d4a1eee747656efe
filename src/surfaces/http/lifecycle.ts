// The gateway's life from serving to closed, one process (or one worker) at a time: drain (not
// ready, still accepting), stop (no new work, in-flight work finishes within a grace), end (what is
// left gets the in-band shutdown error). app/process-shutdown.ts runs it on SIGTERM/SIGINT; build-server.ts
// wires it into readiness, gRPC health, the REST and Connect calls and fastify's close.
import { setTimeout as sleep } from "node:timers/promises";
import type { FastifyInstance } from "fastify";
import type { Logger } from "pino";
import { ApiError } from "../../core/errors/index.js";
import { createShutdownLink, type ShutdownLink } from "../../core/index.js";

/**
 * - `serving`: ready, accepting.
 * - `draining`: not ready (`/readyz` 503, gRPC health NOT_SERVING), still accepting and serving
 *   everything normally, so that load balancers notice before connections are refused.
 * - `stopping`: no new connections, no new requests (503 `upstream_unavailable` envelope); calls
 *   in flight go on for the grace; open `grpc.health.v1.Health/Watch` streams end.
 * - `ending`: the grace is over: calls still running end with the shutdown error (an SSE error
 *   event, a Connect/gRPC error with the envelope, a 503 envelope), their Holds settled.
 */
export type LifecyclePhase = "serving" | "draining" | "stopping" | "ending";

/** The error a call gets when the server shuts down under it: 503 `upstream_unavailable`, gRPC UNAVAILABLE. */
export function shutdownError(): ApiError {
  return new ApiError("upstream_unavailable", "The server is shutting down; retry the request.");
}

/** Options of {@link createLifecycle}. */
export interface LifecycleOptions {
  /**
   * How long calls in flight may go on once the listener stops accepting, ms; then they end with
   * {@link shutdownError}. 0 ends them at once. @default 0 (env ACS_SHUTDOWN_GRACE_MS, src/app/process-shutdown.ts)
   */
  readonly graceMs?: number;
}

/** See {@link createLifecycle}. */
export interface Lifecycle {
  readonly phase: LifecyclePhase;
  /** True while `serving` (readiness: `/readyz`, gRPC health). */
  readonly ready: boolean;
  /** True from `stopping` on: new requests are refused. */
  readonly stopped: boolean;
  /**
   * The calls the end of the grace aborts (reason: {@link shutdownError}), one listener for all
   * (REST and Connect calls tie their AbortController to it while they run).
   */
  readonly link: ShutdownLink;
  /** `serving` → `draining`. Idempotent. */
  drain(): void;
  /** → `stopping` (from `serving` or `draining`), and `ending` after the grace. Idempotent. */
  stop(): void;
  /** → `ending` now: calls still running end with the shutdown error. Idempotent. */
  end(): void;
  /** Calls `listener` after each change of phase; returns the function that removes it. */
  onChange(listener: (phase: LifecyclePhase) => void): () => void;
  /** Clears the grace timer (app.close() is done). */
  dispose(): void;
}

/** The phases in order, and a {@link Lifecycle} at `serving`. */
export function createLifecycle(options: LifecycleOptions = {}): Lifecycle {
  const graceMs = options.graceMs ?? 0;
  let phase: LifecyclePhase = "serving";
  const listeners = new Set<(phase: LifecyclePhase) => void>();
  const ending = new AbortController();
  const link = createShutdownLink(ending.signal);
  let graceTimer: NodeJS.Timeout | undefined;
  const enter = (next: LifecyclePhase) => {
    phase = next;
    for (const listener of [...listeners]) listener(next);
  };
  const lifecycle: Lifecycle = {
    get phase() {
      return phase;
    },
    get ready() {
      return phase === "serving";
    },
    get stopped() {
      return phase === "stopping" || phase === "ending";
    },
    link,
    drain() {
      if (phase === "serving") enter("draining");
    },
    stop() {
      if (phase !== "serving" && phase !== "draining") return;
      enter("stopping");
      if (graceMs <= 0) lifecycle.end();
      else graceTimer = setTimeout(() => lifecycle.end(), graceMs);
    },
    end() {
      if (phase === "ending") return;
      clearTimeout(graceTimer);
      enter("ending");
      ending.abort(shutdownError());
    },
    onChange(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    dispose() {
      clearTimeout(graceTimer);
    },
  };
  return lifecycle;
}

/** Options of {@link drainAndClose}. */
export interface DrainOptions {
  /** How long the listener keeps accepting after readiness turns false, ms (env ACS_DRAIN_DELAY_MS). */
  readonly drainDelayMs: number;
  readonly logger: Logger;
  /** Aborting it skips the rest of the drain delay (a second signal). */
  readonly signal?: AbortSignal;
}

/**
 * A graceful stop of one gateway process: readiness false at once (`draining`), the drain delay,
 * then `app.close()`, which stops accepting and gives calls in flight the lifecycle's grace (see
 * {@link LifecyclePhase}) before ending what is left; resolves once every connection is closed and
 * the app's onClose hooks (pools, ledger, embedded engine) have run. Rejects when app.close() does.
 */
export async function drainAndClose(
  app: FastifyInstance,
  lifecycle: Lifecycle,
  options: DrainOptions,
): Promise<void> {
  const { logger, drainDelayMs } = options;
  lifecycle.drain();
  logger.info(
    { drainDelayMs },
    "draining: /readyz and gRPC health say NOT_SERVING; still accepting for the drain delay",
  );
  if (drainDelayMs > 0) await sleep(drainDelayMs, undefined, { signal: options.signal }).catch(() => {});
  logger.info("stopping: no new connections or requests; calls in flight finish within the grace");
  await app.close();
  logger.info("stopped");
}
