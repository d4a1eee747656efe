// Clients of the services behind the gateway. Today: Inference (vLLM + vllm-lens), one client per
// server (vllm/), and the replicas of a model behind the same interface (pool/).

export * from "./pool/index.js";
export type {
  CompleteAnswer,
  CompleteCall,
  CompletionIds,
  Inference,
  InferenceCall,
  InferenceCompletion,
  InferenceRequest,
  ReplayAnswer,
  StreamCall,
  TokenCount,
} from "./port.js";
export * from "./vllm/index.js";
