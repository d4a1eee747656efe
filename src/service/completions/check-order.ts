// The order of checks of a completion request (proto/API.md §3 "Order of checks", which lists these
// names), as data: each step a named function that refuses the request (throws its ApiError) or fills
// in what it decided on one Draft. `runChecks` runs them in order; a test holds the names to the list.
import type { CreateCompletionRequest } from "../../../gen/acs/v1/completions_pb.js";
import type { SteeringLease } from "../../lens/index.js";
import { captureLayers, captureLayerTokenLimit, checkCaptureCap, checkLensShapes } from "../../lens/index.js";
import type { Inference } from "../../upstream/index.js";
import type { Admission, AdmissionTicket } from "../admission.js";
import {
  checkContextLength,
  checkDeadlineFeasible,
  checkGeneratedTokensCap,
  checkMaxTokensGiven,
  checkMinTokens,
  checkPromptCount,
  checkStreamOnlyFields,
  type RequestShape,
  requestShape,
  resolveMaxTokens,
} from "../checks.js";
import { boundPromptTokens, countPromptTokens } from "../count-prompt-tokens.js";
import { checkFanOutSeed, isLensFanOut } from "../lens-fan-out.js";
import type { ModelRegistry, ServedModel } from "../model-registry.js";
import type { KeyInfo, Ledger } from "../ports.js";
import type { CallContext } from "../types.js";
import { validateRequest } from "../validate-request.js";
import { type RateLimitStore, type RateReservation, reserveRate } from "./rate-limits.js";

/** Header that reports a max_tokens lowered to what the Budget holds (proto/API.md §3). */
export const clampedHeader = "X-Acs-Max-Tokens-Clamped";

/** A Hold on a key's Budget: its id, the tokens it reserves and its key's id. */
export interface Hold {
  readonly id: string;
  readonly tokens: number;
  readonly keyId: string;
}

/** What the checks have decided of one request so far; each step fills in its part. */
export interface Draft {
  readonly request: CreateCompletionRequest;
  readonly ctx: CallContext;
  /** A streamed call (StreamCompletion, REST `stream: true`). */
  readonly stream: boolean;
  /** The request's steering bytes on the steering budget (reserved by `lens_shapes`). */
  readonly steeringLease: SteeringLease;
  /** Prompts and n (`prompt_count`). */
  shape: RequestShape;
  /** The caller's key; undefined with keys off (`key`). */
  key: KeyInfo | undefined;
  /** The model served (`model`). */
  model: ServedModel<Inference> | undefined;
  /** One Inference request per choice (`lens_shapes`, proto/API.md §6). */
  fanOut: boolean;
  /** Inference requests the call holds at once, counted in the key's share (`lens_shapes`). */
  upstreamRequests: number;
  /** The decoded steering vectors (`lens_shapes`). */
  steering: Uint8Array[];
  /** Each prompt's tokens: exact, or `bounds` (`prompt_length`, or counted earlier for a refusal). */
  lengths: number[] | undefined;
  /** Each prompt's bound of its tokens when they were not counted exactly (never with a fan-out). */
  bounds: number[] | undefined;
  /** max_tokens as resolved (`prompt_length`), lowered near the Budget's end (`hold`). */
  maxTokens: number;
  /** The request's place among its key's requests in flight (`key_caps`). */
  ticket: AdmissionTicket;
  /** The request's entries in its key's rate-limit windows (`rate_limits`); undefined: not limited. */
  rate: RateReservation | undefined;
  /** The Hold on the key's Budget (`hold`); undefined with keys off. */
  hold: Hold | undefined;
}

/** What the steps use of the service. */
export interface CheckEnv {
  readonly models: ModelRegistry<Inference>;
  readonly ledger: Ledger | undefined;
  readonly admission: Admission;
  /** The rate-limit windows (src/ratelimit); undefined: no rate limits. */
  readonly rateLimits: RateLimitStore | undefined;
  /** Parts of a lens fan-out that run at once (proto/API.md §6). */
  readonly fanOutConcurrency: number;
  /** The special tokens the model's tokenizer adds to a text prompt (cached per model). */
  readonly specialTokens: (
    client: Inference,
    servedModelName: string,
    signal: AbortSignal,
  ) => Promise<number>;
  /** Models whose prompts came back longer than their bound: counted exactly from then on. */
  readonly boundBroken: WeakSet<ServedModel<Inference>>;
}

/** One named step of {@link checkOrder}. */
export interface CheckStep {
  readonly name: string;
  readonly run: (draft: Draft, env: CheckEnv) => void | Promise<void>;
}

/** The model the `model` step resolved. */
function servedModel(draft: Draft): ServedModel<Inference> {
  if (draft.model === undefined) throw new Error("unreachable: a step ran before the `model` step");
  return draft.model;
}

const sum = (counts: readonly number[]): number => counts.reduce((a, b) => a + b, 0);

/** Each prompt's tokens as Inference counts them (`/tokenize`), with the caller's signal. */
function countPrompts(draft: Draft): Promise<number[]> {
  const model = servedModel(draft);
  return countPromptTokens(model.client, model.servedModelName, draft.request, draft.ctx.signal);
}

/** §3: a prompt list no size cap allows, as the JSON parsers refuse it, before the key. */
function promptCount(draft: Draft): void {
  draft.shape = requestShape(draft.request);
  checkPromptCount(draft.shape);
}

/** §9: the caller's key (401). */
async function key(draft: Draft, env: CheckEnv): Promise<void> {
  if (env.ledger === undefined) return;
  draft.key = await env.ledger.authenticate(draft.ctx.authorization);
  if (draft.ctx.record !== undefined) draft.ctx.record.keyName = draft.key.name ?? draft.key.id;
}

/** §4: the ranges and cross-field rules of the proto (protovalidate). */
function ranges(draft: Draft): void {
  validateRequest(draft.request);
}

/** §4: `stream_options` only with a stream, `prompt_logprobs` only without. */
function streamOnlyFields(draft: Draft): void {
  checkStreamOnlyFields(draft.request, draft.stream);
}

/** §3: several prompts or n > 1 need max_tokens. */
function maxTokensGiven(draft: Draft): void {
  checkMaxTokensGiven(draft.request, draft.shape);
}

/** §6: a fan-out's seed + k stays an int64. */
function fanOutSeed(draft: Draft): void {
  checkFanOutSeed(draft.request, draft.shape);
}

/** §2: the model (404). */
function model(draft: Draft, env: CheckEnv): void {
  draft.model = env.models.resolve(draft.request.model);
  if (draft.ctx.record !== undefined) draft.ctx.record.model = draft.model.id;
}

/** §9: the key may use the model (403). */
async function modelAllowed(draft: Draft, env: CheckEnv): Promise<void> {
  if (draft.key === undefined || env.ledger === undefined) return;
  const model = servedModel(draft);
  await env.ledger.checkModel(draft.key, model.id, model.aliases);
}

/** §6: capture layers and steering vectors (shapes, values; 429/413 for the steering bytes). */
function lensShapes(draft: Draft, env: CheckEnv): void {
  const { request, shape } = draft;
  draft.fanOut = isLensFanOut(request, shape);
  // A fan-out holds up to its concurrency of Inference requests: counted in the key's share.
  draft.upstreamRequests = draft.fanOut ? Math.min(shape.prompts * shape.n, env.fanOutConcurrency) : 1;
  draft.steering = checkLensShapes(request, servedModel(draft), draft.steeringLease);
}

/** §3: the size cap, prompts × n × max_tokens ≤ 32,000. */
function sizeCap(draft: Draft): void {
  checkGeneratedTokensCap(draft.request, draft.shape);
}

/**
 * §6: the capture cap is a size cap, checked before deadline_infeasible: when even a one-token
 * prompt would break it, the prompt is counted here (the message names its tokens) and the cap
 * checked; otherwise the exact check follows the count (`capture_cap`).
 */
async function captureCapUncounted(draft: Draft): Promise<void> {
  const { request, shape } = draft;
  const model = servedModel(draft);
  if (request.maxTokens === undefined) return;
  const layers = captureLayers(request, model);
  if (
    layers * shape.prompts * shape.n * (1 + request.maxTokens) <=
    captureLayerTokenLimit(model.hiddenSize)
  ) {
    return;
  }
  draft.lengths = await countPrompts(draft);
  checkCaptureCap(request, model, {
    ...shape,
    promptTokens: sum(draft.lengths),
    maxTokens: request.maxTokens,
  });
}

/** §3: a non-streamed answer that cannot come within the API's wait (deadline_infeasible). */
function deadlineFeasible(draft: Draft): void {
  checkDeadlineFeasible(draft.request, draft.stream);
}

/** §3: a max_tokens no prompt leaves room for is refused (400), counted for the message's numbers. */
async function maxTokensRoom(draft: Draft): Promise<void> {
  const { request } = draft;
  const model = servedModel(draft);
  if (draft.lengths !== undefined || request.maxTokens === undefined || request.maxTokens < model.maxModelLen)
    return;
  draft.lengths = await countPrompts(draft);
  checkContextLength(model.maxModelLen, draft.lengths, request.maxTokens);
}

/**
 * §9: the key's caps on requests in flight (requests, streams, the model's share), or 429 — after
 * every refusal a retry cannot pass, so that a 429's "retry" is not followed by a 400. Keys off:
 * no caps (one trusted caller on loopback). A cluster worker asks its primary.
 */
async function keyCaps(draft: Draft, env: CheckEnv): Promise<void> {
  if (draft.key === undefined) return;
  const model = servedModel(draft);
  const ticket = env.admission.admit(draft.key.id, {
    stream: draft.stream,
    modelId: model.id,
    modelCapacity: model.upstreamCapacity,
    upstreamRequests: draft.upstreamRequests,
  });
  draft.ticket = ticket instanceof Promise ? await ticket : ticket;
}

/**
 * Each prompt's bound of its tokens (UTF-8 bytes + the special tokens added) when it decides the
 * length check without Inference: the model's tokenizer is byte-level, the prompts are text,
 * max_tokens is given and every bound + max_tokens fits max_model_len. Undefined when the prompts
 * must be counted exactly: token ids (their length is exact), the default max_tokens (it is
 * max_model_len − the prompt's tokens), a capture (its cap and replay), prompt_logprobs (served
 * by Inference's non-streamed answer: a caller who goes away is charged the whole Hold), a
 * prompt near max_model_len (the refusal names the exact count), a fan-out (each part is charged
 * its prompt's exact count).
 */
async function promptBounds(draft: Draft, env: CheckEnv): Promise<number[] | undefined> {
  const { request } = draft;
  const model = servedModel(draft);
  const p = request.prompt.case;
  if (draft.fanOut || (p !== "text" && p !== "texts")) return undefined;
  const maxTokens = request.maxTokens;
  if (model.byteLevelTokenizer !== true || env.boundBroken.has(model) || maxTokens === undefined)
    return undefined;
  if (request.outputResidualStream !== undefined || request.promptLogprobs !== undefined) return undefined;
  let specials = 0;
  if (request.addSpecialTokens ?? true) {
    try {
      specials = await env.specialTokens(model.client, model.servedModelName, draft.ctx.signal);
    } catch {
      return undefined; // counted exactly, which says why Inference cannot answer, as before
    }
  }
  const bounds = boundPromptTokens(request, specials);
  for (const b of bounds) if (b + maxTokens > model.maxModelLen) return undefined;
  return bounds;
}

/** §3: each prompt's tokens + max_tokens ≤ max_model_len; max_tokens resolved (its default). */
async function promptLength(draft: Draft, env: CheckEnv): Promise<void> {
  const model = servedModel(draft);
  if (draft.lengths === undefined) {
    draft.bounds = await promptBounds(draft, env);
    draft.lengths = draft.bounds ?? (await countPrompts(draft));
  }
  draft.maxTokens = resolveMaxTokens(draft.request, model.maxModelLen, draft.lengths, draft.stream);
  checkContextLength(model.maxModelLen, draft.lengths, draft.maxTokens);
}

/** §3: min_tokens ≤ max_tokens as resolved. */
function minTokens(draft: Draft): void {
  checkMinTokens(draft.request, draft.maxTokens);
}

/** §6: the capture cap, exact, over the whole request. */
function captureCap(draft: Draft): void {
  const promptTokens = sum(draft.lengths ?? []);
  checkCaptureCap(draft.request, servedModel(draft), {
    ...draft.shape,
    promptTokens,
    maxTokens: draft.maxTokens,
  });
}

/** §9: the key's rate limits, for the key and for the model (rate-limits.ts). */
async function rateLimits(draft: Draft, env: CheckEnv): Promise<void> {
  if (env.rateLimits === undefined || draft.key?.rateLimits === undefined) return;
  const tokens = sum(draft.lengths ?? []) + draft.shape.prompts * draft.shape.n * draft.maxTokens;
  draft.rate = await reserveRate(env.rateLimits, draft.key, servedModel(draft).id, tokens, draft.ctx);
}

/**
 * §9: the Hold on the key's Budget for prompt + max_tokens (402 when it cannot hold one token);
 * near the Budget's end max_tokens is lowered to what it holds (§3, the clamped header). A bound
 * of the prompt that does not fit the Budget whole is counted exactly first: the clamp or refusal
 * is the exact count's.
 */
async function hold(draft: Draft, env: CheckEnv): Promise<void> {
  const { key } = draft;
  const { ledger } = env;
  if (ledger === undefined || key === undefined) return;
  const { shape, fanOut } = draft;
  const capture = draft.request.outputResidualStream !== undefined;
  // A fan-out is prompts × n requests of one prompt and n = 1 each: each reads its prompt.
  const demand = {
    prompts: fanOut ? shape.prompts * shape.n : shape.prompts,
    n: fanOut ? 1 : shape.n,
    maxTokens: draft.maxTokens,
    captureReplay: capture && draft.stream,
  };
  const promptDemand = (lengths: readonly number[]) => (fanOut ? shape.n : 1) * sum(lengths);
  let placed = await ledger.placeHold(key, {
    ...demand,
    promptTokens: promptDemand(draft.lengths ?? []),
    promptTokensBound: draft.bounds !== undefined,
  });
  if ("countNeeded" in placed) {
    draft.bounds = undefined;
    draft.lengths = await countPrompts(draft);
    placed = await ledger.placeHold(key, { ...demand, promptTokens: promptDemand(draft.lengths) });
    if ("countNeeded" in placed) throw new Error("unreachable: an exact demand asked for a count");
  }
  draft.hold = { id: placed.holdId, tokens: placed.heldTokens, keyId: key.id };
  if (placed.clamped) {
    draft.maxTokens = placed.maxTokens;
    draft.ctx.setResponseHeader(clampedHeader, String(draft.maxTokens));
    if (draft.ctx.record !== undefined) draft.ctx.record.clamped = true;
  }
}

/**
 * The order of checks, proto/API.md §3: key; ranges and cross-field rules; model; the size caps;
 * deadline_infeasible; the key's caps on requests in flight; prompt length; then the Hold. A step
 * refuses by throwing its ApiError; none after it runs.
 */
export const checkOrder: readonly CheckStep[] = [
  { name: "prompt_count", run: promptCount },
  { name: "key", run: key },
  { name: "ranges", run: ranges },
  { name: "stream_only_fields", run: streamOnlyFields },
  { name: "max_tokens_given", run: maxTokensGiven },
  { name: "fan_out_seed", run: fanOutSeed },
  { name: "model", run: model },
  { name: "model_allowed", run: modelAllowed },
  { name: "lens_shapes", run: lensShapes },
  { name: "size_cap", run: sizeCap },
  { name: "capture_cap_uncounted", run: captureCapUncounted },
  { name: "deadline_feasible", run: deadlineFeasible },
  { name: "max_tokens_room", run: maxTokensRoom },
  { name: "key_caps", run: keyCaps },
  { name: "prompt_length", run: promptLength },
  { name: "min_tokens", run: minTokens },
  { name: "capture_cap", run: captureCap },
  { name: "rate_limits", run: rateLimits },
  { name: "hold", run: hold },
];

/** A draft before any step: nothing decided, no ticket, no Hold. */
export function newDraft(
  request: CreateCompletionRequest,
  ctx: CallContext,
  stream: boolean,
  steeringLease: SteeringLease,
  noTicket: AdmissionTicket,
): Draft {
  return {
    request,
    ctx,
    stream,
    steeringLease,
    shape: { prompts: 0, n: 1 },
    key: undefined,
    model: undefined,
    fanOut: false,
    upstreamRequests: 1,
    steering: [],
    lengths: undefined,
    bounds: undefined,
    maxTokens: 0,
    ticket: noTicket,
    rate: undefined,
    hold: undefined,
  };
}

/**
 * Runs `steps` ({@link checkOrder}, or a test's copy of it) on `draft`; throws the first refusal
 * (what was decided stays on `draft`).
 */
export async function runChecks(
  draft: Draft,
  env: CheckEnv,
  steps: readonly CheckStep[] = checkOrder,
): Promise<void> {
  for (const step of steps) {
    const pending = step.run(draft, env);
    if (pending !== undefined) await pending;
  }
}
