// The cluster of ACS_WORKERS > 1 (node:cluster): the primary (primary.ts) and a worker's side
// (worker.ts); what src/main.ts and src/app/gateway-process.ts use of it.

export { runPrimary } from "./primary.js";
export { WORKER_SILENT_MS } from "./primary-ops.js";
export type { PrimaryEngine, PrimaryOptions } from "./primary-state.js";
export { type ClusterWorker, joinCluster, READINESS_CHECK_MS } from "./worker.js";
export { ADMIT_ANSWER_MS } from "./worker-admission.js";
