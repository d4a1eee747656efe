// The completions service over the in-memory Inference port (./memory-inference.ts) with a real
// Budget ledger (SQLite in a temporary directory), a real steering budget and real per-key
// admission — each wrapped to count what the service takes and gives back: Holds placed and
// settled (with the tokens charged), steering leases and admission tickets released.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import {
  type CreateCompletionRequest,
  CreateCompletionRequestSchema,
} from "../../gen/acs/v1/completions_pb.js";
import { type BudgetLedger, createBudgetLedger } from "../../src/budget/index.js";
import type { ModelConfig } from "../../src/config/index.js";
import { createSteeringBudget, type SteeringBudget } from "../../src/lens/index.js";
import type { CheckStep } from "../../src/service/completions/check-order.js";
import {
  type Admission,
  type CompletionsApi,
  createAdmission,
  createCompletionsService,
  createModelRegistry,
  type Ledger,
} from "../../src/service/index.js";
import { admissionDefaults, configDefaults, steeringDefaults } from "./config-defaults.js";
import { MemoryInference, type MemoryScript } from "./memory-inference.js";

/** What the wrapped collaborators saw. */
export interface Taken {
  /** Each Hold placed: its tokens, and the tokens of each settle of it (one entry when settled once). */
  readonly holds: Map<string, { tokens: number; settles: number[] }>;
  /** Each steering lease handed out: how many times it was released. */
  readonly leases: number[];
  /** Each admission ticket handed out: how many times it was released. */
  readonly tickets: number[];
}

/** A service over a fresh in-memory port, and what it took. */
export interface MemoryService {
  readonly api: CompletionsApi;
  readonly port: MemoryInference;
  readonly taken: Taken;
  readonly steering: SteeringBudget;
  readonly admission: Admission;
}

/** The one model: `m` (served as `served`), max_model_len 4096, 2 layers of hidden size 8. */
export const memoryModel = {
  id: "m",
  aliases: [],
  upstreams: [{ url: "http://127.0.0.1:1", weight: 1 }],
  servedModelName: "served",
  maxModelLen: 4096,
  hiddenSize: 8,
  numLayers: 2,
  ownedBy: "acs",
} as unknown as ModelConfig;

/** The ledger of a test file, in a temporary directory; `close()` removes it. */
export async function memoryLedger(): Promise<{ ledger: BudgetLedger; close(): Promise<void> }> {
  const dir = mkdtempSync(join(tmpdir(), "acs-memory-service-"));
  const ledger = await createBudgetLedger({ path: join(dir, "budget.db") });
  return {
    ledger,
    async close() {
      await ledger.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** `ledger`, counting the Holds it placed and each settle of them. */
function countingLedger(ledger: Ledger, taken: Taken): Ledger {
  return {
    authenticate: (a) => ledger.authenticate(a),
    checkModel: (key, model, aliases) => ledger.checkModel(key, model, aliases),
    async placeHold(key, demand) {
      const placed = await ledger.placeHold(key, demand);
      if ("holdId" in placed) taken.holds.set(placed.holdId, { tokens: placed.heldTokens, settles: [] });
      return placed;
    },
    renew: (id, used) => ledger.renew(id, used),
    settle(id, used) {
      taken.holds.get(id)?.settles.push(used);
      return ledger.settle(id, used);
    },
    standing: (id) => ledger.standing(id),
  };
}

/** `budget`, counting each lease's releases. */
function countingSteering(budget: SteeringBudget, taken: Taken): SteeringBudget {
  return {
    requestBytes: budget.requestBytes,
    processBytes: budget.processBytes,
    get inFlight() {
      return budget.inFlight;
    },
    get peak() {
      return budget.peak;
    },
    lease() {
      const lease = budget.lease();
      const i = taken.leases.push(0) - 1;
      return {
        reserve: (bytes: number) => lease.reserve(bytes),
        release() {
          taken.leases[i] = (taken.leases[i] ?? 0) + 1;
          lease.release();
        },
        get bytes() {
          return lease.bytes;
        },
      };
    },
  };
}

/** `admission`, counting each ticket's releases. */
function countingAdmission(admission: Admission, taken: Taken): Admission {
  return {
    limits: admission.limits,
    get activeKeys() {
      return admission.activeKeys;
    },
    async admit(keyId: string, demand: Parameters<Admission["admit"]>[1]) {
      const ticket = await admission.admit(keyId, demand);
      const i = taken.tickets.push(0) - 1;
      return {
        upstreamRequests: ticket.upstreamRequests,
        release() {
          taken.tickets[i] = (taken.tickets[i] ?? 0) + 1;
          ticket.release();
        },
      };
    },
    inFlight: (keyId: string) => admission.inFlight(keyId),
  };
}

/**
 * The service over a fresh {@link MemoryInference} running `script`, with keys on `ledger`
 * (undefined: keys off), a non-stream deadline of `nonStreamDeadlineMs` (60 s unless given), and
 * `checkOrder` when a test wraps a step; every other setting at the configuration's default
 * (./config-defaults.ts).
 */
export function memoryService(
  ledger: Ledger | undefined,
  script: MemoryScript = {},
  options: {
    checkOrder?: readonly CheckStep[];
    lensFanOutConcurrency?: number;
    nonStreamDeadlineMs?: number;
  } = {},
): MemoryService {
  const port = new MemoryInference(script);
  const taken: Taken = { holds: new Map(), leases: [], tickets: [] };
  const steering = createSteeringBudget(steeringDefaults);
  const admission = createAdmission(admissionDefaults);
  const api = createCompletionsService({
    models: createModelRegistry([memoryModel], () => port),
    ledger: ledger === undefined ? undefined : countingLedger(ledger, taken),
    nonStreamDeadlineMs: options.nonStreamDeadlineMs ?? 60_000,
    holdRenewIntervalMs: configDefaults.holdRenewMs,
    steeringBudget: countingSteering(steering, taken),
    admission: countingAdmission(admission, taken),
    ...(options.checkOrder === undefined ? {} : { checkOrder: options.checkOrder }),
    lensFanOutConcurrency: options.lensFanOutConcurrency ?? configDefaults.lensFanOutConcurrency,
  });
  return { api, port, taken, steering, admission };
}

/** A request to the memory model (`"m"`, prompt "Hi", max_tokens 4), with `init`'s fields over those. */
export const memoryRequest = (
  init: MessageInitShape<typeof CreateCompletionRequestSchema>,
): CreateCompletionRequest =>
  create(CreateCompletionRequestSchema, {
    model: "m",
    prompt: { case: "text", value: "Hi" },
    maxTokens: 4,
    ...init,
  });

/** A call context of `authorization`, aborted through the returned controller. */
export function memoryCtx(authorization: string | undefined) {
  const controller = new AbortController();
  const headers = new Map<string, string>();
  return {
    controller,
    headers,
    ctx: {
      requestId: "req_0123456789abcdef0123456789abcdef",
      signal: controller.signal,
      authorization,
      setResponseHeader: (name: string, value: string) => headers.set(name, value),
    },
  };
}
