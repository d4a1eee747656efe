/** What the choice of a replica looks at. */
export interface ReplicaLoad {
  /** Requests sent to it and not finished yet. */
  readonly outstanding: number;
  /** Its share relative to the others (≥ 1). */
  readonly weight: number;
  /**
   * Requests sent to it, as a virtual clock: set level with the others when it comes back, so a
   * returning replica does not take every request until it has caught up.
   */
  readonly sent: number;
}

/**
 * The index of the replica a request goes to: the fewest outstanding requests per unit of weight;
 * among equals, the fewest completions sent per unit of weight (so idle replicas share sequential completions in
 * proportion to their weights); then the first. -1 when `replicas` is empty. Every replica is
 * looked at: a model has a handful, so no sampling (power of two choices) is needed.
 */
export function chooseReplica(replicas: readonly ReplicaLoad[]): number {
  let best = -1;
  let bestLoad = 0;
  let bestSent = 0;
  for (const [i, r] of replicas.entries()) {
    const load = r.outstanding / r.weight;
    const sent = r.sent / r.weight;
    if (best === -1 || load < bestLoad || (load === bestLoad && sent < bestSent)) {
      best = i;
      bestLoad = load;
      bestSent = sent;
    }
  }
  return best;
}
