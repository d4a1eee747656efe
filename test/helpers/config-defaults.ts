// The configuration's defaults as the gateway resolves them (src/config/env-schema.ts, through
// loadConfig with an empty environment): what test call sites pass where the code below the
// configuration takes resolved settings. Derived from the schema, never restated.
import { type Config, loadConfig } from "../../src/config/index.js";
import type { AdmissionLimits } from "../../src/service/index.js";

/** Every setting at its default (no ACS_MODELS: the embedded engine's; no ACS_DB: keys off). */
export const configDefaults: Config = loadConfig({});

/** The steering budget's bounds at their defaults (createSteeringBudget's options). */
export const steeringDefaults = {
  requestBytes: configDefaults.steeringRequestBytes,
  processBytes: configDefaults.steeringProcessBytes,
} as const;

/** The per-key caps at their defaults (createAdmission's limits). */
export const admissionDefaults: AdmissionLimits = {
  maxRequestsPerKey: configDefaults.maxRequestsPerKey,
  maxStreamsPerKey: configDefaults.maxStreamsPerKey,
  maxUpstreamSharePerKey: configDefaults.maxUpstreamSharePerKey,
};

/** An SSE writer's settings at their defaults (createSseWriter's options, onStall aside). */
export const sseDefaults = {
  keepaliveIntervalMs: configDefaults.keepaliveIntervalMs,
  stallMs: configDefaults.streamStallMs,
} as const;
