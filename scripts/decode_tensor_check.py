#!/usr/bin/python3
"""Independent decoder of vllm-lens tensor dicts (numpy + zstandard, as vllm-lens decodes them).

Reads a JSON list of tensor dicts ({"data", "dtype", "original_dtype", "shape", "compression"})
on stdin and writes a JSON list on stdout: for each dict, {"shape": [...], "float32": base64 of
the values widened to float32, little-endian, C order}. Used by test/lens to check the gateway's
encoder against a decoder it shares no code with.

Exit status 3 when numpy or zstandard is missing (the test then skips with that message).
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
    arr = np.frombuffer(raw, dtype=np.dtype(d["dtype"]).newbyteorder("<")).reshape(d["shape"])
    original = d.get("original_dtype")
    if original == "torch.bfloat16":
        values = (arr.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        values = arr.astype(np.float32)
    values = np.ascontiguousarray(values, dtype="<f4")
    return {"shape": list(values.shape), "float32": base64.b64encode(values.tobytes()).decode("ascii")}


def main():
    dicts = json.load(sys.stdin)
    json.dump([decode(d) for d in dicts], sys.stdout)


if __name__ == "__main__":
    main()
