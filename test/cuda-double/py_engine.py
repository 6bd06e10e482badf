"""A Python engine whose KV pool lives in the CUDA runtime test double (allocated there through
ctypes, exported with cudaIpcGetMemHandle) and registered as `cuda` regions with the Python client.

    python3 py_engine.py <libcudart_double.so> <out_dir> <req_id> <block,ids> [snapshot]

Writes each layer's pool bytes to out_dir/<region>.bin, steps waves 1..3 (a manual dump is armed
for the request), prints one JSON line. With "snapshot" it also registers a 256-byte `cuda` input
region (its bytes in out_dir/input0.bin) and offers one forward whose input is the int32 [32]
at offset 64 in it: the line then holds the capture's {"captured", "call_dir"}."""
import json
import os
import sys

from device import DoubleDevice
from wavebus_client import Client, RequestStep, StepTelemetry
from wavebus_client.region import Region

lib, out_dir, req_id, blocks = sys.argv[1], sys.argv[2], sys.argv[3], [int(b) for b in sys.argv[4].split(",")]
snapshot = sys.argv[5:] == ["snapshot"]
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
if snapshot:
    data = os.urandom(256)
    with open(os.path.join(out_dir, "input0.bin"), "wb") as f:
        f.write(data)
    ptr = dev.upload(data)
    ptrs.append(ptr)
    regions.append(Region(name="input0", kind="cuda", cuda_ipc_handle=dev.ipc_handle(ptr), nbytes=256, dtype="int32",
                          shape=[64], role="input"))
c = Client.connect()
c.register_all(regions)
for w in range(1, 4):
    c.wave_head(w, StepTelemetry(requests=[RequestStep(req_id=req_id, new_token_ids=[1], block_ids=blocks, prompt_len=8, num_output_tokens=1)]))
    c.end_of_wave(w)
out = {"regions": [r.name for r in regions]}
if snapshot:
    ctx = {"compilation_hash": "graph-py-cuda", "global_step": 1, "is_prompt": True, "req_ids": [req_id], "positions": [0]}
    captured, call_dir = c.before_forward(ctx, [("input0", 64, "int32", [32])])
    out.update(captured=captured, call_dir=call_dir)
c.close()
for p in ptrs:
    dev.free(p)
print(json.dumps(out))
