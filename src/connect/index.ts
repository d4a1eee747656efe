export { toConnectError } from "./error-conversion.js";
export { createConnectRoutes } from "./routes.js";
