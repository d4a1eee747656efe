// The models file against its schema: every mistake is one line naming the file, the entry and
// the key; the shorthand and the list of replicas give the same ModelConfig shape.
import { describe, expect, it } from "vitest";
import { ConfigError, parseModelsFile } from "../../src/config/index.js";

const base = { id: "m", upstream_url: "http://10.0.0.5:8000", hidden_size: 64, num_hidden_layers: 4 };
const file = (...models: unknown[]) => JSON.stringify({ models });

function refusal(text: string): string {
  try {
    parseModelsFile(text, "models.json");
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    const message = (err as Error).message;
    expect(message).not.toContain("\n");
    return message;
  }
  throw new Error("parseModelsFile accepted it");
}

describe("parseModelsFile", () => {
  it("reads the one-replica shorthand as one upstream of weight 1", () => {
    expect(parseModelsFile(file({ ...base, upstream_api_key: "k", aliases: ["a"] }), "f")).toEqual([
      {
        id: "m",
        aliases: ["a"],
        upstreams: [{ url: "http://10.0.0.5:8000", apiKey: "k", weight: 1 }],
        servedModelName: "m",
        maxModelLen: undefined,
        hiddenSize: 64,
        numLayers: 4,
        ownedBy: "acs",
        byteLevelTokenizer: false,
      },
    ]);
  });

  it("reads byte_level_tokenizer, and refuses a value that is not a boolean", () => {
    expect(parseModelsFile(file({ ...base, byte_level_tokenizer: true }), "f")[0]?.byteLevelTokenizer).toBe(
      true,
    );
    expect(() => parseModelsFile(file({ ...base, byte_level_tokenizer: "yes" }), "f")).toThrow(
      /byte_level_tokenizer.*must be true or false/,
    );
  });

  it("reads a list of upstreams with their keys and weights", () => {
    const { upstream_url: _, ...rest } = base;
    const [m] = parseModelsFile(
      file({
        ...rest,
        max_model_len: 4096,
        upstreams: [
          { url: "http://a:8000" },
          { url: "http://b:8000", api_key: "kb", weight: 3 },
          { url: "https://c/prefix" },
        ],
      }),
      "f",
    );
    expect(m?.upstreams).toEqual([
      { url: "http://a:8000", apiKey: undefined, weight: 1 },
      { url: "http://b:8000", apiKey: "kb", weight: 3 },
      { url: "https://c/prefix", apiKey: undefined, weight: 1 },
    ]);
    expect(m?.maxModelLen).toBe(4096);
  });

  it.each([
    [
      "a typo in a model's key",
      file({ ...base, upstream_ulr: "x" }),
      /^models\.json: models\[0\]: unknown key "upstream_ulr" \(allowed: id, aliases, upstream_url, /,
    ],
    [
      "an unknown top-level key",
      JSON.stringify({ models: [base], model: [] }),
      /^models\.json: unknown key "model" \(allowed: models\)$/,
    ],
    [
      "a typo in an upstream's key",
      file({ id: "m", hidden_size: 1, num_hidden_layers: 1, upstreams: [{ url: "http://a", apikey: "k" }] }),
      /^models\.json: models\[0\]\.upstreams\[0\]: unknown key "apikey" \(allowed: url, api_key, weight\)$/,
    ],
    [
      "a missing key",
      file({ ...base, hidden_size: undefined }),
      /^models\.json: models\[0\]\.hidden_size is required$/,
    ],
    [
      "a wrong type",
      file({ ...base, num_hidden_layers: "4" }),
      /models\[0\]\.num_hidden_layers must be a positive integer$/,
    ],
    [
      "both upstream_url and upstreams",
      file({ ...base, upstreams: [{ url: "http://b" }] }),
      /models\[0\] needs exactly one of upstream_url \(one replica\) and upstreams/,
    ],
    [
      "neither",
      file({ id: "m", hidden_size: 1, num_hidden_layers: 1 }),
      /models\[0\] needs exactly one of upstream_url/,
    ],
    [
      "upstream_api_key with upstreams",
      file({
        id: "m",
        hidden_size: 1,
        num_hidden_layers: 1,
        upstream_api_key: "k",
        upstreams: [{ url: "http://b" }],
      }),
      /models\[0\]\.upstream_api_key goes with upstream_url; with upstreams, give each its api_key$/,
    ],
    [
      "an upstream listed twice",
      file({
        id: "m",
        hidden_size: 1,
        num_hidden_layers: 1,
        upstreams: [{ url: "http://b:1" }, { url: "http://b:1/" }],
      }),
      /models\[0\]\.upstreams\[1\]\.url is listed twice$/,
    ],
    [
      "a weight of 0",
      file({ id: "m", hidden_size: 1, num_hidden_layers: 1, upstreams: [{ url: "http://b", weight: 0 }] }),
      /models\[0\]\.upstreams\[0\]\.weight must be an integer from 1 to 1000$/,
    ],
    [
      "an empty list of upstreams",
      file({ id: "m", hidden_size: 1, num_hidden_layers: 1, upstreams: [] }),
      /upstreams must list at least one upstream/,
    ],
    [
      "a URL that is not http",
      file({ ...base, upstream_url: "ftp://x" }),
      /models\[0\]\.upstream_url must be an http:\/\/ or https:\/\/ URL/,
    ],
    [
      "a name used twice",
      file(base, { ...base, id: "n", aliases: ["m"] }),
      /models\[1\] uses the name m twice$/,
    ],
    ["no models", JSON.stringify({ models: [] }), /^models\.json: models must list at least one model$/],
    ["not JSON", "{models: [", /^models\.json: not JSON/],
  ])("refuses %s in one line", (_, text, expected) => {
    expect(refusal(text)).toMatch(expected);
  });

  it("reads max_model_len null as not set", () => {
    expect(parseModelsFile(file({ ...base, max_model_len: null }), "f")[0]?.maxModelLen).toBeUndefined();
  });
});
