// The lens module: acs.v1.Tensor codec (base64, zstd, bf16/f16/f32), the REST tensor forms of
// proto/API.md §6, the capture and steering checks, the budget of decoded steering bytes, and the
// vllm_xargs of the lens fields.
// Signatures agreed between its users (REST decoder, service, upstream).
export { zstdCompress, zstdDecompressExact } from "./bounded-zstd.js";
export {
  captureLayers,
  captureLayerTokenLimit,
  checkCaptureCap,
  checkLensShapes,
  type LensModelFacts,
  type LensRequestCounts,
  MAX_CAPTURE_NUMBERS,
  MAX_STEERING_NUMBERS,
} from "./check-lens-request.js";
export {
  bf16FromNumber,
  f16FromNumber,
  numberFromBf16,
  numberFromF16,
} from "./float-bits.js";
export { lensVllmXargs } from "./lens-vllm-xargs.js";
export {
  createSteeringBudget,
  STEERING_RETRY_AFTER_SECONDS,
  type SteeringBudget,
  type SteeringBudgetOptions,
  type SteeringLease,
} from "./steering-budget.js";
export {
  decodeTensor,
  dtypeName,
  dtypeWidth,
  type EncodeTensorOptions,
  encodeTensor,
  float32ToRawBytes,
  MAX_TENSOR_ELEMENTS,
  rawBytesToFloat32,
  type TensorDtype,
  tensorElementCount,
  tensorRawBytes,
} from "./tensor-codec.js";
export {
  MAX_REQUEST_TENSOR_ELEMENTS,
  parseTensorJson,
  TENSOR_KEYS,
  tensorFromVllmLensJson,
  tensorToVllmLensJson,
  type VllmLensTensorJson,
} from "./tensor-json.js";
export { TensorRefusal } from "./tensor-refusal.js";
