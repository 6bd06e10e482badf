"""Baselines for `wavebus bench dump`: numpy.save and torch.save of the same bytes (a bf16 KV
tensor) into the same directory, each followed by fsync, as the seeds' implementations write.
Prints one JSON line {"numpy_save_ms": [...], "torch_save_ms": [...]} (one figure per run)."""
import json
import os
import sys
import time

import numpy as np
import torch

size_mb, out_dir, runs = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
n = size_mb * 1024 * 1024 // 2
data = np.random.default_rng(1).integers(0, 2**16, n, dtype=np.uint16)
t = torch.from_numpy(data.view(np.int16)).view(torch.bfloat16).reshape(-1, 16, 8, 128)
res = {"numpy_save_ms": [], "torch_save_ms": []}
for i in range(runs):
    for key, path, save in (
        ("numpy_save_ms", os.path.join(out_dir, f"np-{i}.npy"), lambda p: np.save(p, data.view("V2"))),
        ("torch_save_ms", os.path.join(out_dir, f"torch-{i}.pt"), lambda p: torch.save({"k": t}, p)),
    ):
        t0 = time.perf_counter()
        save(path)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        res[key].append((time.perf_counter() - t0) * 1000)
        os.remove(path)
print(json.dumps(res))
