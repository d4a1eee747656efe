// The replicas of a model: health (active + passive), least-outstanding choice, failover before
// the first byte. Knows nothing of completions.
export { chooseReplica, type ReplicaLoad } from "./choose-replica.js";
export { createUpstreamPool } from "./create-upstream-pool.js";
export type {
  PoolLogger,
  PoolReplica,
  ReplicaErrorKind,
  ReplicaState,
  ReplicaStatus,
  UpstreamPool,
  UpstreamPoolOptions,
} from "./pool-types.js";
