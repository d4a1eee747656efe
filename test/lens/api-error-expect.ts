// Test helper: run `fn`, expect an ApiError with this code/param, and return it for more checks.
import { expect } from "vitest";
import { ApiError } from "../../src/core/errors/index.js";

export function expectApiError(
  fn: () => unknown,
  expected: { code: string; param: string | null; status?: number; message?: string | RegExp },
): ApiError {
  let thrown: unknown;
  try {
    fn();
  } catch (err) {
    thrown = err;
  }
  expect(thrown, "expected an ApiError to be thrown").toBeInstanceOf(ApiError);
  const err = thrown as ApiError;
  expect({ code: err.code, param: err.param }).toEqual({ code: expected.code, param: expected.param });
  if (expected.status !== undefined) expect(err.status).toBe(expected.status);
  if (typeof expected.message === "string") expect(err.message).toBe(expected.message);
  else if (expected.message !== undefined) expect(err.message).toMatch(expected.message);
  return err;
}
