// The ops port (ACS_OPS_PORT) of a cluster, answered by the primary: its event loop does none of
// the requests' work. Live and ready count the listening workers heard from lately (a stalled
// one is neither); /metrics is the cluster's aggregate (metrics.ts).
import { listenOps, opsListenRefusal, type Readiness } from "../../surfaces/http/ops-server.js";
import { aggregate } from "./metrics.js";
import type { Primary, Slot } from "./primary-state.js";

/**
 * A worker not heard from this long (its event loop stalled, or stopped) does not count as live
 * on the ops port's /healthz, ms. Far above a busy loop's lag (seconds at most under the streams
 * bench's ramp), so that a loaded gateway is not restarted for being loaded.
 */
export const WORKER_SILENT_MS = 10_000;

/**
 * Listens on ACS_OPS_PORT (nothing without one) and logs its line; false, with the refusal's one
 * line on stderr, when the port cannot be bound (the primary then exits 2).
 */
export async function servePrimaryOps(primary: Primary): Promise<boolean> {
  const { config, logger } = primary;
  if (config.opsPort === undefined) return true;
  try {
    const ops = await listenOps(
      {
        live: () => heard(primary).length > 0,
        readiness: () => primaryReadiness(primary),
        metrics: async () => ({
          contentType: primary.scrapes.registry.contentType,
          text: await aggregate(primary),
        }),
      },
      { host: config.host, port: config.opsPort, logger },
    );
    logger.info({ url: ops.url, port: ops.port }, `ops routes (/healthz, /readyz, /metrics) on ${ops.url}`);
    return true;
  } catch (err) {
    process.stderr.write(`acs-gateway: ${opsListenRefusal(err, config.opsPort, config.host)}\n`);
    return false;
  }
}

/** The listening workers heard from within {@link WORKER_SILENT_MS}. */
function heard(primary: Primary): Slot[] {
  return primary.slots.filter((s) => s.listening && performance.now() - s.heardAt < WORKER_SILENT_MS);
}

/** The cluster's readiness; closing: not ready at once, whatever a stalled worker last said. */
function primaryReadiness(primary: Primary): Readiness {
  const r = clusterReadiness(heard(primary));
  if (!primary.closing) return r;
  const reasons = r.ready ? [] : (r.reasons ?? []);
  const draining = "draining: the gateway is shutting down";
  return {
    ...r,
    ready: false,
    reasons: reasons.includes(draining) ? reasons : [draining, ...reasons],
  };
}

/**
 * The cluster's readiness from its live workers' reports: ready when one of them is (it takes
 * requests on the shared port); a model serves when it serves on one of them (as a single
 * process's /readyz lists its models, ready or not).
 */
function clusterReadiness(live: readonly Slot[]): Readiness {
  const models: Record<string, "serving" | "not_serving"> = {};
  const reasons = new Set<string>();
  let ready = false;
  for (const { readiness } of live) {
    if (readiness === undefined) continue;
    ready ||= readiness.ready;
    for (const reason of readiness.reasons ?? []) reasons.add(reason);
    for (const [id, state] of Object.entries(readiness.models))
      if (models[id] !== "serving") models[id] = state;
  }
  if (ready) return { ready, models };
  if (reasons.size === 0)
    reasons.add(
      live.length === 0
        ? "no worker has reported recently (stalled, or not started yet)"
        : "no worker is ready",
    );
  return { ready, models, reasons: [...reasons] };
}
