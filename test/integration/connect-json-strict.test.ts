// Connect JSON is read as strictly as REST's JSON (proto/API.md §1: nothing is validated in only
// one of the two paths; §2: seed is kept exact, never rounded through a double; §4: malformed
// JSON → 400): the same bytes get the same answer on both surfaces.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;

beforeAll(async () => {
  stack = await startStack();
});
afterAll(async () => {
  await stack.close();
});

const completion = (json: string) => `{"model":"tiny",${json},"max_tokens":6,"temperature":1}`;

interface Envelope {
  message: string;
  code: string;
  param: string | null;
}
/** A completion's answer: its first choice's text, or the error envelope. */
interface Answer {
  status: number;
  text?: string;
  error?: Envelope;
}

/** POSTs `body` as JSON to `path`; the envelope read as each surface carries it. */
async function post(path: string, body: string | Uint8Array): Promise<Answer> {
  const res = await fetch(`${stack.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  });
  const json = (await res.json()) as {
    choices?: Array<{ text: string }>;
    error?: Envelope;
    details?: Array<{ debug: { error: Envelope } }>;
  };
  const text = json.choices?.[0]?.text;
  const error = json.error ?? json.details?.[0]?.debug.error;
  return { status: res.status, ...(text === undefined ? {} : { text }), ...(error ? { error } : {}) };
}
const connectJson = (body: string | Uint8Array) => post("/acs.v1.CompletionsService/CreateCompletion", body);
const rest = (body: string | Uint8Array) => post("/v1/completions", body);

describe("Connect JSON: an int64 seed beyond 2^53 is kept exact", () => {
  it("seed 2^53 + 1 samples as REST does, not as 2^53", async () => {
    const exact = await connectJson(completion('"text":"Hi","seed":9007199254740993'));
    const asRest = await rest(completion('"prompt":"Hi","seed":9007199254740993'));
    const rounded = await connectJson(completion('"text":"Hi","seed":9007199254740992'));
    expect(exact.status, JSON.stringify(exact)).toBe(200);
    expect(asRest.status).toBe(200);
    expect(exact.text).toBe(asRest.text);
    // The reference engine's sampling differs for these two seeds (else this proves nothing).
    expect(rounded.text).not.toBe(exact.text);
  });

  it.each([
    ["2^63 − 1", "9223372036854775807"],
    ["−2^63", "-9223372036854775808"],
    // Integers written with a point or an exponent: protobuf JSON reads an int64 string as digits.
    ["1e17", "1e17"],
    ["2^53 + 1 with a point", "9007199254740993.0"],
    ["12345678901234567e1", "12345678901234567e1"],
  ])("seed %s as a JSON number is accepted and samples as over REST", async (_name, seed) => {
    const got = await connectJson(completion(`"text":"Hi","seed":${seed}`));
    const asRest = await rest(completion(`"prompt":"Hi","seed":${seed}`));
    expect(got.status, JSON.stringify(got)).toBe(200);
    expect(got.text).toBe(asRest.text);
  });

  it("seed 2^63 is refused with param seed on both surfaces", async () => {
    const got = await connectJson(completion('"text":"Hi","seed":9223372036854775808'));
    const asRest = await rest(completion('"prompt":"Hi","seed":9223372036854775808'));
    expect(asRest.status).toBe(400);
    expect(got.status).toBe(400);
    expect(got.error?.code).toBe("invalid_request");
    expect(got.error?.param).toBe("seed");
  });
});

describe("Connect JSON refuses what REST refuses as malformed, with REST's message", () => {
  const received = () => stack.engine?.stats.received ?? Number.NaN;
  const bom = Uint8Array.from([0xef, 0xbb, 0xbf]);
  const utf8 = (s: string) => new TextEncoder().encode(s);
  const join = (...parts: Uint8Array[]) => Uint8Array.from(parts.flatMap((p) => [...p]));
  it.each([
    [
      "invalid UTF-8",
      join(utf8('{"model":"tiny","text":"a'), Uint8Array.from([0xff]), utf8('b","max_tokens":1}')),
    ],
    ["a byte order mark", join(bom, utf8('{"model":"tiny","text":"a","max_tokens":1}'))],
    ["a key repeated with another value", utf8('{"model":"tiny","text":"a","max_tokens":1,"max_tokens":2}')],
  ])("%s → 400 invalid_request; Inference never sees it", async (_name, bytes) => {
    const before = received();
    const got = await connectJson(bytes);
    const restBody = new TextDecoder().decode(bytes).includes('"text"')
      ? Buffer.from(bytes).toString("latin1").replace('"text"', '"prompt"')
      : "";
    const asRest = await rest(Buffer.from(restBody, "latin1"));
    expect(asRest.status).toBe(400);
    expect(got.status, JSON.stringify(got)).toBe(400);
    expect(got.error?.code).toBe("invalid_request");
    expect(got.error?.param ?? null).toBeNull(); // proto3: an unset param is left out
    // The same words; a byte offset differs by the length of "prompt" against "text".
    const words = (m: string | undefined) => m?.replace(/position \d+/, "position N");
    expect(words(got.error?.message)).toBe(words(asRest.error?.message));
    expect(received()).toBe(before);
  });
});

describe("Connect JSON accepts what REST accepts: a key repeated with the same value", () => {
  it("is kept once, and the completion is REST's (protobuf-es alone refuses every repeated key)", async () => {
    const got = await connectJson(completion('"text":"Hi","seed":7,"seed":7,"stop":["x"],"stop":["x"]'));
    const asRest = await rest(completion('"prompt":"Hi","seed":7,"seed":7,"stop":["x"],"stop":["x"]'));
    const once = await rest(completion('"prompt":"Hi","seed":7,"stop":["x"]'));
    expect(asRest.status, JSON.stringify(asRest)).toBe(200);
    expect(got.status, JSON.stringify(got)).toBe(200);
    expect(got.text).toBe(asRest.text);
    expect(got.text).toBe(once.text);
  });
});

describe("Connect JSON: an integer field's string holds an integer as REST reads priority's", () => {
  const received = () => stack.engine?.stats.received ?? Number.NaN;
  it('`-?digits` is read as that integer: seed "42" samples as seed 42', async () => {
    const inString = await connectJson(completion('"text":"Hi","seed":"42"'));
    const asNumber = await connectJson(completion('"text":"Hi","seed":42'));
    expect(inString.status, JSON.stringify(inString)).toBe(200);
    expect(inString.text).toBe(asNumber.text);
  });

  it.each([
    // protobuf-es reads these with Number()/BigInt(), which take hex, binary, octal and padding.
    ['"priority":"0x10"', "priority", "a number"],
    ['"priority":"+2"', "priority", "a number"],
    ['"n":"0b11"', "n", "a number"],
    ['"top_k":"0o17"', "top_k", "a number"],
    ['"seed":" 5"', "seed", "a number"],
    // A decimal numeral is not an integer's string (BigInt refused "1e2" with no param before).
    ['"seed":"1e2"', "seed", "an integer"],
    ['"seed":"2.0"', "seed", "an integer"],
    ['"token_ids":{"values":[1,"0x10"]}', "prompt", "a number"], // inside the prompt oneof: REST's name
  ])("%s → 400 invalid_request, param %s; Inference never sees it", async (field, param, expected) => {
    const before = received();
    const body = field.startsWith('"token_ids"')
      ? `{"model":"tiny",${field},"max_tokens":2}`
      : completion(`"text":"Hi",${field}`);
    const got = await connectJson(body);
    expect(got.status, JSON.stringify(got)).toBe(400);
    expect(got.error?.code).toBe("invalid_request");
    expect(got.error?.param).toBe(param);
    expect(got.error?.message).toBe(`Invalid type for '${param}': expected ${expected}.`);
    expect(received()).toBe(before);
  });

  it.each([
    ['"n":"2"', "n"],
    ['"max_tokens":"2"', "max_tokens"],
    ['"logprobs":"1"', "logprobs"],
    ['"temperature":"1"', "temperature"],
    ['"top_p":"0.5"', "top_p"],
    ['"temperature":"NaN"', "temperature"],
  ])(
    "a number in a string is not a number outside int64 and priority (§4): %s → REST's 400",
    async (field, param) => {
      const before = received();
      const got = await connectJson(`{"model":"tiny","text":"Hi",${field}}`);
      const asRest = await rest(`{"model":"tiny","prompt":"Hi",${field}}`);
      expect(asRest.status).toBe(400);
      expect(got.status, JSON.stringify(got)).toBe(400);
      expect(got.error).toEqual(asRest.error);
      expect(got.error?.param).toBe(param);
      expect(received()).toBe(before);
    },
  );

  it('priority "5" is read as 5 on both surfaces', async () => {
    const got = await connectJson(
      '{"model":"tiny","text":"Hi","priority":"5","max_tokens":6,"temperature":0}',
    );
    const asRest = await rest('{"model":"tiny","prompt":"Hi","priority":"5","max_tokens":6,"temperature":0}');
    expect(got.status, JSON.stringify(got)).toBe(200);
    expect(asRest.status).toBe(200);
    expect(got.text).toBe(asRest.text);
  });

  it("a 32-bit integer given a fraction whose double is an integer is refused, as REST refuses it", async () => {
    const got = await connectJson(completion('"text":"Hi","n":1.0000000000000000001'));
    const asRest = await rest(completion('"prompt":"Hi","n":1.0000000000000000001'));
    expect(asRest.status).toBe(400);
    expect(got.status, JSON.stringify(got)).toBe(400);
    expect(got.error).toEqual(asRest.error);
  });

  it('priority "0x10" gets the same answer from REST', async () => {
    const got = await connectJson(completion('"text":"Hi","priority":"0x10"'));
    const asRest = await rest(completion('"prompt":"Hi","priority":"0x10"'));
    expect(asRest.status).toBe(400);
    expect(got.error).toEqual(asRest.error);
  });
});
