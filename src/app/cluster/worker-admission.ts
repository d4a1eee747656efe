// A cluster worker's per-key caps (proto/API.md §9): each admit asks the primary for the request's
// place (src/app/cluster/admission-broker.ts counts every worker's) and each release gives it
// back; while the primary does not answer, the worker counts its requests alone.
import type { Logger } from "pino";
import {
  type Admission,
  type AdmissionDemand,
  type AdmissionLimits,
  type AdmissionTicket,
  createAdmission,
  type KeyInFlight,
  type LocalAdmission,
  rateLimited,
} from "../../service/admission.js";
import type { AdmitAnswer, ToPrimary } from "./ipc.js";

/**
 * How long a worker waits for the primary's answer to an admit before counting alone, ms. The
 * primary answers within a millisecond when it runs; this bounds what a stopped one costs a request.
 */
export const ADMIT_ANSWER_MS = 1000;

/** A request this worker holds a place for (its share of `inFlight`). */
interface HeldPlace {
  readonly keyId: string;
  readonly demand: AdmissionDemand;
  readonly upstreamRequests: number;
}

/** One worker's admission: its places, the admits waiting for the primary, and whether it is alone. */
interface WorkerAdmission {
  readonly limits: AdmissionLimits;
  readonly logger: Logger;
  readonly send: (m: ToPrimary) => void;
  readonly newId: () => number;
  /** This worker's own counts, for the requests counted alone. */
  readonly alone: LocalAdmission;
  readonly held: Set<HeldPlace>;
  /** The admits waiting for the primary's answer, by id. */
  readonly pending: Map<number, (m: AdmitAnswer) => void>;
  /** The primary missed an answer: requests are counted alone until it answers again. */
  quiet: boolean;
}

/**
 * The per-key caps counted across every worker (src/app/cluster/worker.ts
 * `ClusterWorker.admission`): admits through the primary; alone while it does not answer.
 * `answered` takes the primary's answers to this worker's admits.
 */
export function workerAdmission(
  limits: AdmissionLimits,
  logger: Logger,
  send: (m: ToPrimary) => void,
  newId: () => number,
): { admission: Admission; answered: (m: AdmitAnswer) => void } {
  const state: WorkerAdmission = {
    limits,
    logger,
    send,
    newId,
    alone: createAdmission(limits),
    held: new Set(),
    pending: new Map(),
    quiet: false,
  };
  const admission: Admission = {
    limits,
    get activeKeys() {
      return new Set([...state.held].map((p) => p.keyId)).size;
    },
    inFlight: (keyId) => inFlight(state, keyId),
    admit: (keyId, demand) => admit(state, keyId, demand),
  };
  return { admission, answered: (m) => answered(state, m) };
}

/** This worker's share of `keyId`'s requests in flight. */
function inFlight(state: WorkerAdmission, keyId: string): KeyInFlight {
  const byModel = new Map<string, number>();
  let requests = 0;
  let streams = 0;
  for (const p of state.held) {
    if (p.keyId !== keyId) continue;
    requests++;
    if (p.demand.stream) streams++;
    byModel.set(p.demand.modelId, (byModel.get(p.demand.modelId) ?? 0) + p.upstreamRequests);
  }
  return { requests, streams, byModel };
}

/** `ticket` held by this worker until released (once). */
function hold(
  state: WorkerAdmission,
  keyId: string,
  demand: AdmissionDemand,
  ticket: AdmissionTicket,
): AdmissionTicket {
  const place: HeldPlace = { keyId, demand, upstreamRequests: ticket.upstreamRequests };
  state.held.add(place);
  return {
    upstreamRequests: ticket.upstreamRequests,
    release() {
      if (!state.held.delete(place)) return;
      ticket.release();
    },
  };
}

/** Counted by this worker alone; a cap its own counts break refuses it (throws). */
function countAlone(state: WorkerAdmission, keyId: string, demand: AdmissionDemand): AdmissionTicket {
  return hold(state, keyId, demand, state.alone.admit(keyId, demand));
}

function goQuiet(state: WorkerAdmission, why: string): void {
  if (state.quiet) return;
  state.quiet = true;
  state.logger.warn({ why }, "the primary does not count the requests' places; this worker counts its own");
}

/** The primary's answer to an admit: the primary counts again; an answer not waited for goes back. */
function answered(state: WorkerAdmission, m: AdmitAnswer): void {
  if (state.quiet) {
    state.quiet = false;
    state.logger.info("the primary counts the requests' places again");
  }
  const answer = state.pending.get(m.id);
  if (answer !== undefined) answer(m);
  // Not waited for (counted alone meanwhile): the primary's place goes back at once.
  else if (m.ticket !== undefined) state.send({ acs: "release", ticket: m.ticket });
}

function admit(
  state: WorkerAdmission,
  keyId: string,
  demand: AdmissionDemand,
): AdmissionTicket | Promise<AdmissionTicket> {
  const id = state.newId();
  if (!process.connected) {
    goQuiet(state, "no channel to the primary");
    return countAlone(state, keyId, demand);
  }
  // `send` returning false only says its queue is long: the message still goes.
  state.send({ acs: "admit", id, keyId, demand });
  // Asked all the same (its answer says the primary is back), but not waited for.
  if (state.quiet) return countAlone(state, keyId, demand);
  return new Promise<AdmissionTicket>((resolve, reject) => {
    // Counted here alone; a cap this worker's own counts break refuses it.
    const resolveAlone = (): void => {
      try {
        resolve(countAlone(state, keyId, demand));
      } catch (err) {
        reject(err);
      }
    };
    const timer = setTimeout(() => {
      // After this turn's poll phase: an answer already in the pipe (this worker's event loop
      // was busy past the wait, as under a burst) is read first, and settles the admit.
      setImmediate(() => {
        if (!state.pending.delete(id)) return;
        goQuiet(state, `no answer in ${ADMIT_ANSWER_MS} ms`);
        resolveAlone();
      });
    }, ADMIT_ANSWER_MS);
    state.pending.set(id, (answer) => {
      clearTimeout(timer);
      state.pending.delete(id);
      if (answer.refused !== undefined) {
        reject(rateLimited(answer.refused));
      } else if (answer.ticket === undefined) {
        // The primary failed to count it (logged there): counted here alone.
        resolveAlone();
      } else {
        const ticket = answer.ticket;
        const counted: AdmissionTicket = {
          upstreamRequests: answer.upstreamRequests ?? 1,
          release: () => void state.send({ acs: "release", ticket }),
        };
        resolve(hold(state, keyId, demand, counted));
      }
    });
  });
}
