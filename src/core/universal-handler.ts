// connect-es's router keeps a handler's description on the handler function itself (its service,
// method, path, content types, protocols, methods): a wrapper must carry them over.
import type { UniversalHandler, UniversalHandlerFn } from "@connectrpc/connect/protocol";

/** `fn` as a handler with `handler`'s description: a wrapper of `handler` the router can serve. */
export function asHandlerOf(handler: UniversalHandler, fn: UniversalHandlerFn): UniversalHandler {
  return Object.assign(fn, {
    service: handler.service,
    method: handler.method,
    requestPath: handler.requestPath,
    supportedContentType: handler.supportedContentType,
    protocolNames: handler.protocolNames,
    allowedMethods: handler.allowedMethods,
  });
}
