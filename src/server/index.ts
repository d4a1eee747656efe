export { buildServer, type ServerDeps } from "./build-server.js";
export { createMetrics, type GatewayMetrics } from "./metrics.js";
export { createOnePortServer, type OnePortServer } from "./one-port-server.js";
