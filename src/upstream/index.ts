// Clients of the services behind the gateway. Today: Inference (vLLM + vllm-lens).
export * from "./vllm/index.js";
