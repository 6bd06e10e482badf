"""Write a snapshot call dir with numpy / torch only (independent of wavebus's writers).

Usage: write_bundle.py ROOT FORMAT...   (npy | pt | safetensors): writes ROOT/<format>/ for each
Prints {format: [[dtype, shape, bits-as-hex], ...]} for the test to compare with.
"""
import json
import os
import struct
import sys

import numpy as np
import torch

from wavebus_client.checksum import crc32c_file, format_checksum

ST = {"float32": "F32", "bfloat16": "BF16", "int64": "I64", "bool": "BOOL", "float16": "F16", "uint8": "U8"}


def tensors():
    return [
        ("float32", torch.tensor([[1.5, -2.0, float("inf")], [0.0, 3.25, -0.5]], dtype=torch.float32)),
        ("bfloat16", torch.tensor([1.0, -1.5, 3.0e38, 0.0078125], dtype=torch.bfloat16)),
        ("int64", torch.tensor([-1, 2**40, 7], dtype=torch.int64)),
        ("bool", torch.tensor([[True, False], [False, True]])),
        ("float16", torch.zeros((0, 3), dtype=torch.float16)),
        ("uint8", torch.tensor(200, dtype=torch.uint8)),  # 0-d
    ]


def bits(t):
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.contiguous().numpy().tobytes().hex()


def np_bits(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view("V2")
    return t.numpy()


def write_safetensors(path, t, dtype):
    raw = t.view(torch.int16).numpy().tobytes() if dtype == "bfloat16" else t.numpy().tobytes()
    header = {"tensor": {"dtype": ST[dtype], "shape": list(t.shape), "data_offsets": [0, len(raw)]}, "__metadata__": {"by": "test"}}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + raw)


def write(call_dir, fmt):
    os.makedirs(call_dir, exist_ok=True)
    inputs, files, expected = [], [], []
    for i, (dtype, t) in enumerate(tensors()):
        name = f"tensor{i}.{fmt}"
        path = os.path.join(call_dir, name)
        if fmt == "npy":
            np.save(path, np_bits(t))
        elif fmt == "pt":
            torch.save(t, path)
        else:
            write_safetensors(path, t, dtype)
        inputs.append({"index": i, "dtype": dtype, "shape": list(t.shape)})
        files.append({"name": name, "bytes": os.path.getsize(path), "checksum": format_checksum(crc32c_file(path))})
        expected.append([dtype, list(t.shape), bits(t)])
    meta = {"schema": 1, "hash": "h0", "format": fmt, "global_rank": 0, "tp_rank": 0, "call_index": 0,
            "selected_by": ["call_index"], "inputs": inputs, "files": files}
    with open(os.path.join(call_dir, "meta.json"), "w") as f:
        json.dump(meta, f, sort_keys=True, indent=2)
    return expected


def main():
    root = sys.argv[1]
    print(json.dumps({fmt: write(os.path.join(root, fmt), fmt) for fmt in sys.argv[2:]}))


if __name__ == "__main__":
    main()
