/**
 * Why tensor bytes or a tensor's description were refused, in words that complete a sentence
 * about the field (e.g. "shape [2, 4096] holds 8192 numbers … but data decodes to 100 bytes").
 * Callers turn it into an ApiError: 400 `invalid_request` for a request, 502 `upstream_error`
 * for Inference's output. `field` names the key at fault when the caller may append it to the
 * param (`.data`, `.dtype`, `.shape`, …).
 */
export class TensorRefusal extends Error {
  override readonly name = "TensorRefusal";
  readonly field: string | undefined;
  /** True for a value of the wrong JSON type (`Invalid type for …`), false for a wrong value. */
  readonly isTypeError: boolean;

  constructor(message: string, options: { field?: string; isTypeError?: boolean } = {}) {
    super(message);
    this.field = options.field;
    this.isTypeError = options.isTypeError ?? false;
  }
}
