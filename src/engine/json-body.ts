/**
 * Request bodies as vLLM (Python `json` + pydantic) reads them, where JavaScript's JSON.parse
 * would lose information: an integer `seed` outside ±2^53 is kept exactly, as a bigint.
 *
 * Everything else keeps JSON.parse semantics (fastify's default parser: duplicate keys → the last
 * one wins, as in Python; `__proto__` / `constructor.prototype` removed), and other numbers stay
 * numbers, so every other field keeps its validation. A whole-body lossless parse (lossless-json)
 * is not used: it rejects duplicate keys, and it is several times slower than JSON.parse on the
 * large number arrays of steering vectors. Instead, only when the parsed top-level `seed` is a
 * number that is not a safe integer, the raw text of that value is found by a small scan of the
 * top-level object and re-read exactly.
 */
import type { FastifyInstance } from "fastify";

/** Top-level keys whose integer values are kept exactly (bigint when outside the safe range). */
const EXACT_INT_KEYS = ["seed"] as const;

/**
 * Raw text of the last value of top-level `key` in `text`, which must be a valid JSON object
 * (already accepted by JSON.parse); null when the key is absent or `text` is not an object.
 */
export function topLevelRawValue(text: string, key: string): string | null {
  let i = 0;
  const n = text.length;
  const ws = (): void => {
    while (i < n && (text[i] === " " || text[i] === "\t" || text[i] === "\n" || text[i] === "\r")) i++;
  };
  const skipString = (): void => {
    i++; // opening quote
    while (i < n && text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
    i++; // closing quote
  };
  ws();
  if (text[i] !== "{") return null;
  i++;
  let found: string | null = null;
  for (;;) {
    ws();
    if (i >= n || text[i] === "}") return found;
    const keyStart = i;
    skipString();
    const k = JSON.parse(text.slice(keyStart, i)) as string;
    ws();
    i++; // ':'
    ws();
    const start = i;
    if (text[i] === '"') skipString();
    else if (text[i] === "{" || text[i] === "[") {
      let depth = 0;
      while (i < n) {
        const c = text[i];
        if (c === '"') {
          skipString();
          continue;
        }
        if (c === "{" || c === "[") depth++;
        else if (c === "}" || c === "]") depth--;
        i++;
        if (depth === 0) break;
      }
    } else {
      while (i < n && !/[\s,}]/.test(text[i]!)) i++;
    }
    if (k === key) found = text.slice(start, i);
    ws();
    if (text[i] === ",") i++;
  }
}

const INT_LITERAL = /^-?\d+$/;

/**
 * Replaces `body[key]` by the exact bigint of its literal when JSON.parse rounded it (an integer
 * literal outside ±2^53). Float literals (`1e19`, `5.0`) stay numbers, as Python reads them.
 */
export function keepExactIntegers(body: unknown, text: string): unknown {
  if (typeof body !== "object" || body === null || Array.isArray(body)) return body;
  const obj = body as Record<string, unknown>;
  for (const key of EXACT_INT_KEYS) {
    const v = obj[key];
    if (typeof v !== "number" || Number.isSafeInteger(v) || !Number.isFinite(v)) continue;
    const raw = topLevelRawValue(text, key);
    if (raw !== null && INT_LITERAL.test(raw)) obj[key] = BigInt(raw);
  }
  return body;
}

/** Installs the `application/json` parser: fastify's own (proto poisoning removed) + exact integers. */
export function installJsonParser(app: FastifyInstance): void {
  const base = app.getDefaultJsonParser("remove", "remove");
  app.removeContentTypeParser("application/json");
  app.addContentTypeParser("application/json", { parseAs: "string" }, (req, body, done) => {
    base(req, body as string, (err, value) => {
      if (err) {
        done(err, undefined);
        return;
      }
      done(null, keepExactIntegers(value, body as string));
    });
  });
}
