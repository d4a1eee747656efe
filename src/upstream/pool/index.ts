// The replicas of a model: health (active + passive), least-outstanding choice, failover before
// the first byte. Knows nothing of completions.
export { chooseReplica, type ReplicaLoad } from "./choose-replica.js";
export {
  createUpstreamPool,
  type PoolLogger,
  type PoolReplica,
  type ReplicaErrorKind,
  type ReplicaState,
  type ReplicaStatus,
  type UpstreamPool,
  type UpstreamPoolOptions,
} from "./create-upstream-pool.js";
