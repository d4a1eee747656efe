#!/usr/bin/python3
"""Independent decoder of a vllm-lens tensor dict (numpy + zstandard, Debian packages).

Reads JSON from stdin: either a tensor dict or a completion response with
activations.residual_stream. Prints JSON {"shape": [...], "values": [...float32 in C order]}.
Run with /usr/bin/python3 (Debian's python3-numpy and python3-zstandard).
"""
import base64
import json
import sys

import numpy as np
import zstandard


def decode(t):
    raw = base64.b64decode(t["data"], validate=True)
    if t.get("compression") == "zstd":
        raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=1 << 30)
    elif t.get("compression") not in (None,):
        raise ValueError("unknown compression %r" % t.get("compression"))
    dtype = t["dtype"]
    if dtype == "int16" and "bfloat16" in str(t.get("original_dtype")):
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        arr = bits.view(np.float32)
    elif dtype == "float32":
        arr = np.frombuffer(raw, dtype="<f4")
    elif dtype == "float16":
        arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    else:
        arr = np.frombuffer(raw, dtype="<i2").astype(np.float32)
    return arr.reshape(t["shape"])


def main():
    doc = json.load(sys.stdin)
    t = doc["activations"]["residual_stream"] if "activations" in doc else doc
    arr = decode(t)
    json.dump({"shape": list(arr.shape), "values": [float(x) for x in arr.ravel()]}, sys.stdout)


if __name__ == "__main__":
    main()
