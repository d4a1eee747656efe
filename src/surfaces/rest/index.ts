// What the layers above use of the REST surface (src/surfaces/http): its routes and its error
// answers. Tests import the modules themselves.
export {
  handleUnmatchedRoute,
  type RestRoutesOptions,
  restRoutes,
} from "./rest-routes.js";
export {
  apiErrorFrom,
  renderMethodNotAllowed,
  requestIdOf,
  requestTooLarge,
  sendError,
  unknownRoute,
} from "./send-error.js";
