export { toConnectError } from "./error-conversion.js";
export { createConnectRoutes, requestIdKey } from "./routes.js";
