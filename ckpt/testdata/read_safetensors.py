"""Reads a safetensors file with nothing but json and numpy (no meshrun code)
and prints every tensor as JSON: {name: {"dtype", "shape", "values"}}."""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8")}

with open(sys.argv[1], "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
    data = f.read()

out = {}
for name, e in header.items():
    if name == "__metadata__":
        continue
    begin, end = e["data_offsets"]
    raw = data[begin:end]
    if e["dtype"] == "BF16":
        # bfloat16 is the upper half of a float32.
        u16 = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        arr = u16.view(np.float32)
    else:
        arr = np.frombuffer(raw, dtype=DTYPES[e["dtype"]])
    arr = arr.reshape(e["shape"])
    out[name] = {"dtype": e["dtype"], "shape": list(arr.shape), "values": arr.astype(np.float64).ravel().tolist()}
print(json.dumps({"tensors": out, "metadata": header.get("__metadata__", {})}))
