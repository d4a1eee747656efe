export { toConnectError } from "./error-conversion.js";
export { createHealthRoutes } from "./health-routes.js";
export { createConnectRoutes, requestIdKey } from "./routes.js";
