"""A torchrun-style worker for test/torchrun.test.ts: holds a bf16 KV pool in shared memory
through the wavebus Python client, steps like an engine, and saves its pool for comparison."""
import os
import sys
import time

import torch

from wavebus_client import AgentUnavailableError, Client, RequestStep, StepTelemetry
from wavebus_client.shm import kv_pool_shm

rank = int(os.environ["RANK"])
# Steps until out_dir/stop appears (the test says when it has what it needs), at most max_steps.
out_dir, max_steps, block_ids = sys.argv[1], int(sys.argv[2]), [int(b) for b in sys.argv[3].split(",")]
layers = [f"model.layers.{i}.self_attn" for i in range(2)]
tensors, regions = kv_pool_shm(f"wavebus-torchrun-{os.getpid()}", layers, num_blocks=16, block_size=4,
                               num_kv_heads=2, head_dim=8, dtype=torch.bfloat16)
g = torch.Generator().manual_seed(1000 + rank)
for layer in layers:
    for t in tensors[layer]:
        t.copy_(torch.randn(t.shape, generator=g).to(torch.bfloat16))
torch.save({f"{l}.{kv}": tensors[l][i].clone() for l in layers for i, kv in enumerate("kv")}, os.path.join(out_dir, f"pool_rank{rank}.pt"))

c = Client.connect()
try:
    c.register_all(regions)
except AgentUnavailableError as e:
    # A busy host can hold the agent past hello_timeout_ms: the regions are kept and sent once it
    # answers (docs/python-client.md), as a real engine must not die of a slow debugging sidecar.
    print(f"rank {rank}: {e}; stepping on", file=sys.stderr, flush=True)
timeouts = 0
step = 0
while step < max_steps and not os.path.exists(os.path.join(out_dir, "stop")):
    step += 1
    tel = StepTelemetry(requests=[RequestStep(req_id="req-py-1-0a1b2c3d", new_token_ids=[100 + step], block_ids=block_ids,
                                              prompt_len=8, num_output_tokens=step)])
    c.wave_head(step, tel)
    time.sleep(0.02)  # the forward
    if c.end_of_wave(step).timed_out:
        timeouts += 1
c.close()
print(f"rank {rank} done, end_of_wave timeouts {timeouts}", flush=True)
