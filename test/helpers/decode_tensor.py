#!/usr/bin/python3
"""Independent decoder of vllm-lens tensor dicts (numpy + zstandard, as vllm-lens decodes them).

Reads JSON on stdin: one tensor dict ({"data", "dtype", "original_dtype", "shape",
"compression"}), a list of them, or a completion response (its activations.residual_stream).
Writes, for each dict, {"shape": [...], "float32": base64 of the values widened to float32,
little-endian, C order} (a list for a list). Base64 keeps NaN, ±Inf and -0 bit-exact. Tests use it
(pythonDecoder in decode-tensor.ts) to check the gateway's and the engine's tensors against a
decoder that shares no code with them, when ACS_TEST_PYTHON_DECODER=1 says that it can run.

Run with Debian's /usr/bin/python3 (python3-numpy, python3-zstandard; .ci/run installs them).
Exit status 3 when numpy or zstandard is missing.
"""

import base64
import json
import sys

try:
    import numpy as np
    import zstandard
except ImportError as err:  # pragma: no cover - depends on the machine
    print(f"missing Python module: {err.name}", file=sys.stderr)
    sys.exit(3)


def decode(d):
    raw = base64.b64decode(d["data"], validate=True)
    if d.get("compression") == "zstd":
        raw = zstandard.ZstdDecompressor().decompress(raw)
    elif d.get("compression") is not None:
        raise ValueError("unknown compression %r" % d.get("compression"))
    arr = np.frombuffer(raw, dtype=np.dtype(d["dtype"]).newbyteorder("<")).reshape(d["shape"])
    if d.get("original_dtype") == "torch.bfloat16":
        values = (arr.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        values = arr.astype(np.float32)
    values = np.ascontiguousarray(values, dtype="<f4")
    return {"shape": list(values.shape), "float32": base64.b64encode(values.tobytes()).decode("ascii")}


def main():
    doc = json.load(sys.stdin)
    if isinstance(doc, list):
        json.dump([decode(d) for d in doc], sys.stdout)
    elif "activations" in doc:
        json.dump(decode(doc["activations"]["residual_stream"]), sys.stdout)
    else:
        json.dump(decode(doc), sys.stdout)


if __name__ == "__main__":
    main()
