"""scripts/gpu-check.sh's engine: a bf16 KV pool and an input buffer on the GPU, exported with the
Python client's cuda_region(); steps waves 1..3 (the agent dumps the request), offers one forward
for capture, then checks the agent's files bit-exact against the GPU tensors, loads an fp8 .pt,
and sets the agent's copy time (dump.json "copy") against torch's own device-to-host copy of the
same number of bytes. Prints one JSON line:
{"checks": [["PASS"|"FAIL", "what: detail"], ...], "agent_copy": {"bytes", "seconds"} | null,
 "torch_d2h": {"bytes", "seconds"}, "regions", "blocks"}."""
import glob
import json
import os
import sys
import time

import torch

from wavebus_client import Client, RequestStep, StepTelemetry
from wavebus_client.cuda import cuda_region

req_id, dump_root, cache_root = sys.argv[1], os.environ["WAVEBUS_JOB_DUMP_ROOT"], os.environ["WAVEBUS_JOB_ROOT"]
checks = []


def check(what, ok, detail=""):
    checks.append(["PASS" if ok else "FAIL", f"{what}: {detail}" if detail else what])


dev = torch.device("cuda", torch.cuda.current_device())
g = torch.Generator(device=dev).manual_seed(1234)
layers = ["model.layers.0.self_attn", "model.layers.1.self_attn"]
shape = (1024, 16, 8, 128)  # num_blocks, block_size, num_kv_heads, head_dim: 32 MiB per bf16 pool
pools = {l: [torch.randn(shape, generator=g, device=dev).to(torch.bfloat16) for _ in "kv"] for l in layers}
inp = torch.randint(0, 1 << 30, (4096,), generator=g, device=dev, dtype=torch.int32)
regions = [cuda_region(t, f"{l}.{kv}", role="kv_pool", layer=l, kv=kv) for l in layers for kv, t in zip("kv", pools[l])]
regions.append(cuda_region(inp, "input_ids", role="input"))
torch.cuda.synchronize()
# 768 of the 1024 blocks in a scattered order: 96 MiB over 4 regions, enough to time the copy.
blocks = torch.randperm(1024, generator=torch.Generator().manual_seed(7))[:768].tolist()

c = Client.connect()
c.register_all(regions)
for w in range(1, 4):
    c.wave_head(w, StepTelemetry(requests=[RequestStep(req_id=req_id, new_token_ids=[1], block_ids=blocks, prompt_len=8, num_output_tokens=1)]))
    c.end_of_wave(w)
captured, call_dir = c.before_forward({"compilation_hash": "gpu-check", "global_step": 1, "is_prompt": True}, [inp])

# The dump, bit-exact with the GPU blocks it came from.
deadline = time.monotonic() + 30
files = []
while time.monotonic() < deadline and not files:
    files = glob.glob(os.path.join(dump_root, "manual_trigger", req_id, "*", "dp0_tp0_pp0_cp0", "dump.json"))
    time.sleep(0.1)
agent_copy = None
if not files:
    check("KV dump of a request from GPU memory", False, f"no dp0_tp0_pp0_cp0/dump.json under {dump_root} after 30 s")
else:
    rank_dir = os.path.dirname(files[0])
    with open(files[0]) as fh:
        agent_copy = json.load(fh).get("copy")
    bad = []
    for l in layers:
        d = torch.load(os.path.join(rank_dir, f"{l}.pt"), weights_only=True)
        for i, kv in enumerate("kv"):
            want = pools[l][i][blocks].cpu()
            if d[kv].dtype != want.dtype or not torch.equal(d[kv].view(torch.int16), want.view(torch.int16)):
                bad.append(f"{l}.{kv}")
    check("KV dump bit-exact with the GPU tensors", not bad, f"{len(layers) * 2} regions x {len(blocks)} blocks" if not bad else "differ: " + ", ".join(bad))

# The input snapshot, bit-exact.
if not captured:
    check("input snapshot from GPU memory", False, "before_forward did not capture")
else:
    got = glob.glob(os.path.join(call_dir, "**", "*.pt"), recursive=True) + glob.glob(os.path.join(call_dir, "**", "*.npy"), recursive=True)
    ok = False
    for f in got:
        try:
            t = torch.load(f, weights_only=True) if f.endswith(".pt") else torch.from_numpy(__import__("numpy").load(f))
        except Exception:  # noqa: BLE001 (report what was found)
            continue
        if isinstance(t, dict):
            t = next((v for v in t.values() if isinstance(v, torch.Tensor)), None)
        if isinstance(t, torch.Tensor) and torch.equal(t.cpu(), inp.cpu()):
            ok = True
    check("input snapshot bit-exact with the GPU tensor", ok, call_dir)

# fp8: a .pt written from a GPU fp8 tensor loads back exactly.
if not hasattr(torch, "float8_e4m3fn"):
    check("fp8 .pt load", False, f"torch {torch.__version__} has no float8_e4m3fn")
else:
    f8 = torch.randn(64, 128, generator=g, device=dev).to(torch.float8_e4m3fn)
    p = os.path.join(cache_root, "fp8.pt")
    torch.save({"t": f8.cpu()}, p)
    back = torch.load(p, weights_only=True)["t"]
    check("fp8 .pt load", back.dtype == torch.float8_e4m3fn and torch.equal(back.view(torch.uint8), f8.cpu().view(torch.uint8)), "float8_e4m3fn 64x128")

# torch's device-to-host copy (cudaMemcpyAsync D2H into pinned memory, then synchronize) of as many
# bytes as the agent's dump copied, contiguous: the ceiling the agent's gather is set against.
nbytes = agent_copy["bytes"] if agent_copy else len(layers) * 2 * len(blocks) * pools[layers[0]][0][0].numel() * 2
src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
torch.cuda.synchronize()
best = float("inf")
for _ in range(5):
    t0 = time.perf_counter()
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    best = min(best, time.perf_counter() - t0)
c.close()
print(json.dumps({"checks": checks, "agent_copy": agent_copy, "torch_d2h": {"bytes": nbytes, "seconds": best},
                  "regions": len(layers) * 2, "blocks": len(blocks)}))
