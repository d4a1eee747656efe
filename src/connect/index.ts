export { toConnectError } from "./error-conversion.js";
export { createHealthRoutes } from "./health-routes.js";
export { writeProtocolError } from "./protocol-error.js";
export { createConnectRoutes, requestIdKey } from "./routes.js";
