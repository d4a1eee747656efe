// JSON text in pieces, with the base64 of large byte arrays written piece by piece (a leaf: the
// lens module builds vllm_xargs with it, the vLLM client streams request bodies from it).
export {
  type Base64Source,
  base64Chunks,
  base64Length,
  isJsonText,
  type JsonText,
  type JsonTextPart,
  jsonStringOf,
  jsonText,
  jsonTextByteLength,
  jsonTextChunks,
  jsonTextToString,
} from "./json-text.js";
