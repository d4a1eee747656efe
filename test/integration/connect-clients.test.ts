// Connect, gRPC (h2c) and gRPC-Web clients against the same port as REST; errors carry the
// same envelope as REST.
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import {
  createConnectTransport,
  createGrpcTransport,
  createGrpcWebTransport,
  Http2SessionManager,
} from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CompletionsService, CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ErrorEnvelopeSchema } from "../../gen/acs/v1/error_pb.js";
import { Health, HealthCheckResponse_ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
let h2: Http2SessionManager;
const transports: Record<string, Transport> = {};

beforeAll(async () => {
  stack = await startStack();
  h2 = new Http2SessionManager(stack.url);
  transports.grpc = createGrpcTransport({ baseUrl: stack.url, sessionManager: h2 });
  transports.connectJson = createConnectTransport({
    baseUrl: stack.url,
    httpVersion: "1.1",
    useBinaryFormat: false,
  });
  transports.connectBinaryH2 = createConnectTransport({
    baseUrl: stack.url,
    httpVersion: "2",
    sessionManager: h2,
  });
  transports.grpcWeb = createGrpcWebTransport({ baseUrl: stack.url, httpVersion: "1.1" });
});
afterAll(async () => {
  h2.abort(); // connect-node keeps HTTP/2 sessions open; close them so the server can drain
  await stack.close();
});

const greedy = (text: string, maxTokens: number) =>
  create(CreateCompletionRequestSchema, {
    model: "tiny",
    prompt: { case: "text", value: text },
    maxTokens,
    temperature: 0,
    ignoreEos: true,
  });

/** The ConnectError a call fails with (fails the test when the call succeeds). */
async function connectError(call: Promise<unknown>): Promise<ConnectError> {
  return call.then(
    () => {
      throw new Error("expected the call to fail");
    },
    (e: unknown) => ConnectError.from(e),
  );
}

async function restText(prompt: string, maxTokens: number): Promise<string> {
  const res = await fetch(`${stack.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny", prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true }),
  });
  const json = (await res.json()) as { choices: Array<{ text: string }> };
  return json.choices[0]?.text ?? "";
}

describe.each(["grpc", "connectJson", "connectBinaryH2", "grpcWeb"])("%s", (name) => {
  it("CreateCompletion returns what REST returns", async () => {
    const client = createClient(CompletionsService, transports[name] as Transport);
    let requestId: string | null = null;
    const res = await client.createCompletion(greedy("Hello", 5), {
      onHeader: (h) => {
        requestId = h.get("x-request-id");
      },
    });
    expect(res.id).toMatch(/^cmpl-[0-9a-f]{32}$/);
    expect(res.choices[0]?.text).toBe(await restText("Hello", 5));
    expect(res.usage?.completionTokens).toBe(5);
    expect(requestId).toMatch(/^req_[0-9a-f]{32}$/);
  });

  it("StreamCompletion yields the chunks of the same text", async () => {
    const client = createClient(CompletionsService, transports[name] as Transport);
    let text = "";
    let finishes = 0;
    for await (const chunk of client.streamCompletion(greedy("Hello", 5))) {
      for (const c of chunk.choices) {
        text += c.text;
        if (c.finishReason !== 0) finishes++;
      }
    }
    expect(text).toBe(await restText("Hello", 5));
    expect(finishes).toBe(1);
  });

  it("errors carry the ErrorEnvelope detail, identical to the REST envelope", async () => {
    const client = createClient(CompletionsService, transports[name] as Transport);
    const bad = create(CreateCompletionRequestSchema, {
      model: "tiny",
      prompt: { case: "text", value: "x" },
      maxTokens: 16001,
      n: 2,
    });
    const ce = await connectError(client.createCompletion(bad));
    expect(ce.code).toBe(Code.InvalidArgument);
    const [envelope] = ce.findDetails(ErrorEnvelopeSchema);
    const message =
      "At most 32000 generated tokens in all: n = 2 times max_tokens = 16001 for each of 1 prompts is 32002.";
    expect(ce.rawMessage).toBe(message);
    expect(envelope?.error?.message).toBe(message);
    expect(envelope?.error?.param).toBe("max_tokens");
    expect(envelope?.error?.code).toBe("invalid_request");
    expect(envelope?.error?.type).toBe("invalid_request_error");
    expect(envelope?.requestId).toMatch(/^req_[0-9a-f]{32}$/);
    expect(ce.metadata.get("x-request-id")).toBe(envelope?.requestId);

    const rest = await fetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny", prompt: "x", max_tokens: 16001, n: 2 }),
    });
    const restEnvelope = (await rest.json()) as { error: Record<string, unknown> };
    expect(rest.status).toBe(400);
    expect(restEnvelope.error).toEqual({
      message: envelope?.error?.message,
      type: envelope?.error?.type,
      param: envelope?.error?.param,
      code: envelope?.error?.code,
    });
  });
});

describe("gRPC errors map to the catalogue's codes", () => {
  it("unknown model → NOT_FOUND with model_not_found", async () => {
    const client = createClient(CompletionsService, transports.grpc as Transport);
    const err = await connectError(
      client.createCompletion(
        create(CreateCompletionRequestSchema, { model: "nope", prompt: { case: "text", value: "x" } }),
      ),
    );
    expect(err.code).toBe(Code.NotFound);
    expect(err.findDetails(ErrorEnvelopeSchema)[0]?.error?.code).toBe("model_not_found");
  });

  it("ListModels lists the model with its lens facts", async () => {
    const client = createClient(CompletionsService, transports.grpc as Transport);
    const res = await client.listModels({});
    expect(res.data[0]?.id).toBe(stack.modelId);
    expect(res.data[0]?.aliases).toEqual(["tiny"]);
    expect(res.data[0]?.hiddenSize).toBe(stack.engine?.model.hiddenSize);
    expect(res.data[0]?.numHiddenLayers).toBe(stack.engine?.model.numLayers);
  });
});

describe("Connect GET (ListModels is marked NO_SIDE_EFFECTS)", () => {
  // connect-es clients send it so with `useHttpGet: true`; the request travels in the query.
  it("a GET with the request in the query answers 200 with the JSON list", async () => {
    const query = new URLSearchParams({ connect: "v1", encoding: "json", message: "{}" });
    const res = await fetch(`${stack.url}/acs.v1.CompletionsService/ListModels?${query}`);
    expect(res.status).toBe(200);
    expect(res.headers.get("x-request-id")).toMatch(/^req_[0-9a-f]{32}$/);
    const body = (await res.json()) as { data: Array<{ id: string; hiddenSize: number }> };
    expect(body.data[0]?.id).toBe(stack.modelId);
    expect(body.data[0]?.hiddenSize).toBe(stack.engine?.model.hiddenSize);
  });
});

describe("gRPC health (grpc.health.v1.Health)", () => {
  it("reports SERVING for the server and the completions service, NOT_FOUND for others", async () => {
    const health = createClient(Health, transports.grpc as Transport);
    expect((await health.check({ service: "" })).status).toBe(HealthCheckResponse_ServingStatus.SERVING);
    expect((await health.check({ service: "acs.v1.CompletionsService" })).status).toBe(
      HealthCheckResponse_ServingStatus.SERVING,
    );
    const err = await connectError(health.check({ service: "nope" }));
    expect(err.code).toBe(Code.NotFound);
    expect(err.findDetails(ErrorEnvelopeSchema)[0]?.error?.code).toBe("unknown_service");
  });

  it("Watch sends the current status first", async () => {
    expect.assertions(2);
    const health = createClient(Health, transports.grpc as Transport);
    /** The first message of a Watch (undefined when the stream ends without one). */
    const firstStatus = async (service: string) => {
      const controller = new AbortController();
      try {
        for await (const res of health.watch({ service }, { signal: controller.signal })) return res.status;
        return undefined;
      } finally {
        controller.abort();
      }
    };
    expect(await firstStatus("")).toBe(HealthCheckResponse_ServingStatus.SERVING);
    expect(await firstStatus("nope")).toBe(HealthCheckResponse_ServingStatus.SERVICE_UNKNOWN);
  });
});
