"""Baseline for `wavebus bench bus`: what the seeds' collective costs on this machine.

Spawns N processes in a torch.distributed gloo group on loopback and times, on rank 0,
broadcast of a 3-int tensor [wave, config_due, dump_due] followed by a barrier (so the
time covers every rank having it). Prints one JSON line: {"gloo_p50_us": .., "gloo_p99_us": ..}.

usage: gloo_bcast.py N PORT [ITERS]
"""
import json
import os
import sys
import time


def worker(rank, world, port, iters, out):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    t = torch.zeros(3, dtype=torch.int64)
    times = []
    for i in range(iters + 20):
        if rank == 0:
            t[0], t[1], t[2] = i, i % 2, 0
        start = time.perf_counter_ns()
        dist.broadcast(t, src=0)
        dist.barrier()
        if i >= 20:
            times.append((time.perf_counter_ns() - start) / 1000.0)
    if rank == 0:
        times.sort()
        out.put({"gloo_p50_us": times[len(times) // 2], "gloo_p99_us": times[min(len(times) - 1, int(len(times) * 0.99))], "gloo_iters": iters})
    dist.destroy_process_group()


def main():
    import torch.multiprocessing as mp

    world = int(sys.argv[1])
    port = int(sys.argv[2])
    iters = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    # fork: children share the parent's imported torch (importing it 8 more times dominates otherwise)
    ctx = mp.get_context("fork")
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, world, port, iters, out)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        print(json.dumps({"error": f"gloo workers exited with {bad}"}))
        sys.exit(1)
    print(json.dumps(out.get()))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
