export { buildServer, type ServerDeps } from "../surfaces/http/build-server.js";
export { endTransport } from "../surfaces/http/end-transport.js";
export {
  createLifecycle,
  type DrainOptions,
  drainAndClose,
  type Lifecycle,
  type LifecycleOptions,
  type LifecyclePhase,
  shutdownError,
} from "../surfaces/http/lifecycle.js";
export { createMetrics, type GatewayMetrics } from "../surfaces/http/metrics.js";
export {
  createOnePortServer,
  defaultOnePortTimeouts,
  h2SessionLimits,
  type OnePortServer,
  type OnePortTimeouts,
} from "../surfaces/http/one-port-server.js";
export { type App, type AppConfig, type AppOptions, buildApp } from "./build-app.js";
