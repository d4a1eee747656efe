// A refusal carried in connect-es's error (src/surfaces/rpc/carried-refusal.ts) reads back as the same
// ApiError once connect-es has written it, and is told apart from a final envelope.
import { Code } from "@connectrpc/connect";
import { errorFromJson, errorToJson } from "@connectrpc/connect/protocol-connect";
import { describe, expect, it } from "vitest";
import { ApiError } from "../../../src/core/errors/index.js";
import { carriedRefusal, carryRefusal, hasFinalEnvelope } from "../../../src/surfaces/rpc/carried-refusal.js";
import { toConnectError } from "../../../src/surfaces/rpc/index.js";

/** `err` as a caller of Connect reads it back. */
const roundTrip = (err: ReturnType<typeof carryRefusal>) =>
  errorFromJson(errorToJson(err, {}), undefined, err);

describe("carried refusals", () => {
  it("read back with code, message and param, and are not final", () => {
    const api = new ApiError("invalid_request", "Invalid type for 'max_tokens': expected a number.", {
      param: "max_tokens",
    });
    const back = roundTrip(carryRefusal(api));
    expect(back.code).toBe(Code.InvalidArgument);
    expect(hasFinalEnvelope(back)).toBe(false);
    const read = carriedRefusal(back);
    expect(read).toBeInstanceOf(ApiError);
    expect([read?.code, read?.message, read?.param, read?.type]).toEqual([
      api.code,
      api.message,
      "max_tokens",
      "invalid_request_error",
    ]);
  });

  it("a param left out stays null", () => {
    expect(carriedRefusal(roundTrip(carryRefusal(new ApiError("invalid_request", "No."))))?.param).toBeNull();
  });

  it("an envelope that names its request is final, not carried", () => {
    const final = roundTrip(
      toConnectError(new ApiError("invalid_request", "No."), "req_0123456789abcdef0123456789abcdef"),
    );
    expect(hasFinalEnvelope(final)).toBe(true);
    expect(carriedRefusal(final)).toBeUndefined();
  });
});
