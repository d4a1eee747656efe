/** Reading a gateway's Prometheus text in the integration tests. */

/** The value of each series of the metric `name` on `url`'s GET /metrics, by its label text (`""` without labels). */
export async function metricSeries(url: string, name: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    const m = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)$/.exec(line);
    if (m?.[1] === name) out.set(m[2] ?? "", Number(m[3]));
  }
  return out;
}

/** The value of the metric `name` on `url`'s GET /metrics, summed over its series (its labels). */
export async function metricTotal(url: string, name: string): Promise<number> {
  let sum = 0;
  for (const v of (await metricSeries(url, name)).values()) sum += v;
  return sum;
}
