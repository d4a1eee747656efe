// The X-Request-Id of each upstream request: the gateway's request id, kept unique among the
// upstream requests this process has open (src/upstream/vllm/VLLM.md: vllm-lens keys its
// per-request state by this id, and two live requests with one id corrupt each other's steering).

/** Ids of the upstream requests open now (claimed and not released), process-wide. */
const live = new Set<string>();

/**
 * The id to send for an upstream request that wants `wanted`: `wanted` itself when no open upstream
 * request of this process uses it, else the first of `<wanted>-2`, `<wanted>-3`… that none uses
 * (a caller that sends one X-Request-Id with overlapping requests). Claimed until
 * {@link releaseUpstreamRequestId}.
 */
export function claimUpstreamRequestId(wanted: string): string {
  let id = wanted;
  for (let n = 2; live.has(id); n++) id = `${wanted}-${n}`;
  live.add(id);
  return id;
}

/** Releases an id {@link claimUpstreamRequestId} gave, once its upstream request has ended. */
export function releaseUpstreamRequestId(id: string): void {
  live.delete(id);
}

/** Upstream request ids claimed now (for tests: none may stay behind). */
export function liveUpstreamRequestIds(): number {
  return live.size;
}
