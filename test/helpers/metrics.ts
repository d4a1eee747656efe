/** Reading a gateway's Prometheus text in the integration tests. */

/** The value of the metric `name` on `url`'s GET /metrics, summed over its series (its labels). */
export async function metricTotal(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  let sum = 0;
  for (const line of text.split("\n")) {
    const m = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)$/.exec(line);
    if (m?.[1] === name) sum += Number(m[3]);
  }
  return sum;
}
