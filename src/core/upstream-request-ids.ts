// The X-Request-Id of each upstream request: the gateway's request id, kept unique among the
// upstream requests this process has open (src/upstream/vllm/VLLM.md: vllm-lens keys its
// per-request state by this id, and two live requests with one id corrupt each other's steering).

/** Ids of the upstream requests open now (claimed and not released), process-wide. */
const live = new Set<string>();

/** A wanted id that has suffixed ids open: how many, and the next suffix to try. */
interface SuffixGroup {
  open: number;
  next: number;
}

/** By wanted id, while it has suffixed ids open (then deleted: nothing stays behind). */
const groups = new Map<string, SuffixGroup>();
/** Each open suffixed id → the wanted id it was claimed for. */
const suffixedOf = new Map<string, string>();

/**
 * The id to send for an upstream request that wants `wanted`: `wanted` itself when no open upstream
 * request of this process uses it, else `<wanted>-2`, `<wanted>-3`… — the next suffix of `wanted`
 * not used by an open request (suffixes count up while any suffixed id of `wanted` is open, and
 * start again at 2 once none is). Claimed until {@link releaseUpstreamRequestId}. A burst of N
 * overlapping requests with one X-Request-Id costs O(N), not O(N²). Suffixed ids a caller holds open
 * under X-Request-Ids of its own (`x-2`, `x-3`…) are skipped one by one each time the suffixes of
 * `x` start again at 2 (at most the requests that caller has open, each a running generation).
 */
export function claimUpstreamRequestId(wanted: string): string {
  if (!live.has(wanted)) {
    live.add(wanted);
    return wanted;
  }
  let group = groups.get(wanted);
  if (group === undefined) {
    group = { open: 0, next: 2 };
    groups.set(wanted, group);
  }
  let id = `${wanted}-${group.next++}`;
  // Taken only when a caller sent a suffixed id itself (`job-2` beside two `job`s).
  while (live.has(id)) id = `${wanted}-${group.next++}`;
  live.add(id);
  suffixedOf.set(id, wanted);
  group.open++;
  return id;
}

/** Releases an id {@link claimUpstreamRequestId} gave, once its upstream request has ended. */
export function releaseUpstreamRequestId(id: string): void {
  if (!live.delete(id)) return;
  const wanted = suffixedOf.get(id);
  if (wanted === undefined) return;
  suffixedOf.delete(id);
  const group = groups.get(wanted);
  if (group !== undefined && --group.open === 0) groups.delete(wanted);
}

/** Upstream request ids claimed now (for tests: none may stay behind). */
export function liveUpstreamRequestIds(): number {
  return live.size;
}

/** Wanted ids with suffixed ids open now (for tests: none may stay behind). */
export function upstreamRequestIdGroups(): number {
  return groups.size;
}
