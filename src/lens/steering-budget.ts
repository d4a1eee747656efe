// How many bytes of decoded steering tensors the gateway holds at once. A zstd tensor of ~1.5 KB
// inflates to 32 MiB: without a bound, a few small requests can make the process hold gigabytes.
import { ApiError } from "../core/errors/index.js";

/** Seconds a caller refused for a busy process is told to wait (`Retry-After`). */
export const STEERING_RETRY_AFTER_SECONDS = 1;

/** Options of {@link createSteeringBudget}. Bytes, each an integer ≥ 1. */
export interface SteeringBudgetOptions {
  /** Most decoded steering bytes one request may hold (ACS_STEERING_REQUEST_BYTES). */
  readonly requestBytes: number;
  /** Most decoded steering bytes all requests in flight may hold together (ACS_STEERING_PROCESS_BYTES). */
  readonly processBytes: number;
}

/** The bytes one request holds against a {@link SteeringBudget}. */
export interface SteeringLease {
  /**
   * Takes `bytes` more for this request, before they are decoded. Throws ApiError: 413
   * `request_too_large` (param `apply_steering_vectors`) when the request's bytes exceed what one
   * request may hold (or the whole process budget): it can never be served; 429 `rate_limited`
   * (param null, retry after 1 s) when they would exceed what is left now: retry later.
   */
  reserve(bytes: number): void;
  /** Gives every byte of this lease back (idempotent); call when the request is done. */
  release(): void;
  /** Bytes held now. */
  readonly bytes: number;
}

/** A process-wide count of in-flight decoded steering bytes, with a per-request and a total bound. */
export interface SteeringBudget {
  readonly requestBytes: number;
  readonly processBytes: number;
  /** Bytes held by all requests now. */
  readonly inFlight: number;
  /** The most bytes ever held at once since the budget was made. */
  readonly peak: number;
  /** A lease for one request, holding nothing yet. */
  lease(): SteeringLease;
}

function checkBound(name: string, value: number): number {
  if (!Number.isSafeInteger(value) || value < 1)
    throw new RangeError(`${name} must be an integer ≥ 1, got ${value}`);
  return value;
}

/**
 * The budget of decoded steering bytes (proto/API.md §6's tensors, counted in their dtype: elements ×
 * 2 or 4 bytes, whatever their compression on the wire). A request reserves its total once its
 * shapes are checked and before any tensor is decoded, and keeps it until its answer is complete
 * (the bytes are sent to Inference, and again for a streamed capture's replay). Throws RangeError
 * for a bound that is not an integer ≥ 1.
 */
export function createSteeringBudget(options: SteeringBudgetOptions): SteeringBudget {
  const requestBytes = checkBound("requestBytes", options.requestBytes);
  const processBytes = checkBound("processBytes", options.processBytes);
  const counts: BudgetCounts = { requestBytes, processBytes, inFlight: 0, peak: 0 };

  return {
    requestBytes,
    processBytes,
    get inFlight() {
      return counts.inFlight;
    },
    get peak() {
      return counts.peak;
    },
    lease: () => new Lease(counts),
  };
}

/** A budget's bounds and what it holds now (shared by its leases). */
interface BudgetCounts {
  readonly requestBytes: number;
  readonly processBytes: number;
  inFlight: number;
  peak: number;
}

/** One request's lease: one object per request, its methods shared (every request takes one). */
class Lease implements SteeringLease {
  #held = 0;
  readonly #budget: BudgetCounts;

  constructor(budget: BudgetCounts) {
    this.#budget = budget;
  }

  get bytes(): number {
    return this.#held;
  }

  reserve(bytes: number): void {
    if (bytes <= 0) return;
    const budget = this.#budget;
    const total = this.#held + bytes;
    const bound = Math.min(budget.requestBytes, budget.processBytes);
    if (total > bound) {
      throw new ApiError(
        "request_too_large",
        `The steering vectors of this request decode to ${total} bytes, more than the ${bound} bytes one request may hold.`,
        { param: "apply_steering_vectors" },
      );
    }
    if (budget.inFlight + bytes > budget.processBytes) {
      throw new ApiError(
        "rate_limited",
        `The server is busy decoding the steering vectors of other requests (${budget.inFlight} of ${budget.processBytes} bytes in use); this request needs ${total}. Retry in ${STEERING_RETRY_AFTER_SECONDS} s.`,
        { retry: { retry: true, afterSeconds: STEERING_RETRY_AFTER_SECONDS } },
      );
    }
    this.#held = total;
    budget.inFlight += bytes;
    budget.peak = Math.max(budget.peak, budget.inFlight);
  }

  release(): void {
    this.#budget.inFlight -= this.#held;
    this.#held = 0;
  }
}
