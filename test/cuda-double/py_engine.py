"""A Python engine whose KV pool lives in the CUDA runtime test double (allocated there through
ctypes, exported with cudaIpcGetMemHandle) and registered as `cuda` regions with the Python client.

    python3 py_engine.py <libcudart_double.so> <out_dir> <req_id> <block,ids>

Writes each layer's pool bytes to out_dir/<region>.bin, steps waves 1..3 (a manual dump is armed
for the request), prints one JSON line."""
import json
import os
import sys

from device import DoubleDevice
from wavebus_client import Client, RequestStep, StepTelemetry
from wavebus_client.region import Region

lib, out_dir, req_id, blocks = sys.argv[1], sys.argv[2], sys.argv[3], [int(b) for b in sys.argv[4].split(",")]
dev = DoubleDevice(lib)
shape = [8, 4, 2, 8]  # num_blocks, block_size, num_kv_heads, head_dim (bf16)
nbytes = 8 * 4 * 2 * 8 * 2
regions, ptrs = [], []
for layer in ("layers.0", "layers.1"):
    for kv in ("k", "v"):
        data = os.urandom(nbytes)
        with open(os.path.join(out_dir, f"{layer}.{kv}.bin"), "wb") as f:
            f.write(data)
        ptr = dev.upload(data)
        ptrs.append(ptr)
        regions.append(Region(name=f"{layer}.{kv}", kind="cuda", cuda_ipc_handle=dev.ipc_handle(ptr), nbytes=nbytes,
                              dtype="bfloat16", shape=shape, role="kv_pool", layer=layer, kv=kv))
c = Client.connect()
c.register_all(regions)
for w in range(1, 4):
    c.wave_head(w, StepTelemetry(requests=[RequestStep(req_id=req_id, new_token_ids=[1], block_ids=blocks, prompt_len=8, num_output_tokens=1)]))
    c.end_of_wave(w)
c.close()
for p in ptrs:
    dev.free(p)
print(json.dumps({"regions": [r.name for r in regions]}))
