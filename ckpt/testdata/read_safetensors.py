"""Reads a safetensors file with nothing but json and numpy (no meshrun code)
and prints every tensor as JSON: {name: {"dtype", "shape", "values"}}.

It checks the file as the format defines it and exits 1, saying why, when it
is not: each tensor's bytes are its shape's element count times its dtype's
size, and the tensors' data_offsets tile the data section exactly, in order,
with nothing before, between or after them."""
import json
import struct
import sys

import numpy as np

# safetensors' dtype names: numpy dtype and bytes per element.
DTYPES = {"F32": (np.dtype("<f4"), 4), "F64": (np.dtype("<f8"), 8), "BF16": (np.dtype("<u2"), 2)}


def fail(msg):
    print("read_safetensors.py: %s: %s" % (sys.argv[1], msg), file=sys.stderr)
    sys.exit(1)


with open(sys.argv[1], "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
    data = f.read()

out = {}
spans = []
for name, e in header.items():
    if name == "__metadata__":
        continue
    if set(e) != {"dtype", "shape", "data_offsets"}:
        fail("tensor %r has fields %s" % (name, sorted(e)))
    if e["dtype"] not in DTYPES:
        fail("tensor %r: dtype %r" % (name, e["dtype"]))
    shape = e["shape"]
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        fail("tensor %r: shape %r" % (name, shape))
    begin, end = e["data_offsets"]
    dt, size = DTYPES[e["dtype"]]
    if end - begin != int(np.prod(shape, dtype=np.int64)) * size:
        fail("tensor %r: %d bytes for %s %s" % (name, end - begin, e["dtype"], shape))
    spans.append((begin, end, name))
    raw = data[begin:end]
    arr = np.frombuffer(raw, dtype=dt)
    if e["dtype"] == "BF16":
        # bfloat16 is the upper half of a float32.
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    arr = arr.reshape(shape)
    out[name] = {"dtype": e["dtype"], "shape": list(arr.shape), "values": arr.astype(np.float64).ravel().tolist()}

at = 0
for begin, end, name in sorted(spans):
    if begin != at:
        fail("tensor %r starts at %d, the previous data ends at %d" % (name, begin, at))
    at = end
if at != len(data):
    fail("the tensors end at %d of %d bytes of data" % (at, len(data)))
print(json.dumps({"tensors": out, "metadata": header.get("__metadata__", {})}))
