export { type App, type AppConfig, type AppOptions, buildApp } from "./build-app.js";
export { buildServer, type ServerDeps } from "./build-server.js";
export { endTransport } from "./end-transport.js";
export {
  createLifecycle,
  type DrainOptions,
  drainAndClose,
  type Lifecycle,
  type LifecycleOptions,
  type LifecyclePhase,
  shutdownError,
} from "./lifecycle.js";
export { createMetrics, type GatewayMetrics } from "./metrics.js";
export {
  createOnePortServer,
  defaultOnePortTimeouts,
  h2SessionLimits,
  type OnePortServer,
  type OnePortTimeouts,
} from "./one-port-server.js";
