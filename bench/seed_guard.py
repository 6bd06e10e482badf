"""The seed's per-step path, for `wavebus bench overhead`'s same-run baseline.

N engine ranks (forked processes, one TP group on loopback) step as the simulated engine of the
wavebus modes does: a busy --compute-us (host work), an idle --forward-ms (the forward on the
accelerator), then a lockstep barrier (the stand-in for the forward's all-reduce, as the sim's
src/sim/tp-barrier.ts). Mode "absent" stops there. Mode "seed" adds what vLLM Ascend's Runtime
Guard does every step: TP0 broadcasts [wave_idx, config_due, dump_due] (a 3-int tensor) over a
torch.distributed gloo group of the TP ranks, then broadcast_object_list of the due lane (None
unless something is due), and TP0 runs the detectors in Python after sampling: token_repeat
(the recent tokens of every running request) and logits_finite (torch.isfinite on the logits;
on the accelerator in the seed, here on the CPU on a [rows, vocab] float32 tensor).

Prints one JSON line: mean steps/s over ranks, the same over the last four fifths, the ranks'
own CPU µs per step, and the collectives each rank actually completed.

usage: seed_guard.py MODE RANKS PORT STEPS FORWARD_MS COMPUTE_US ROWS VOCAB
"""
import json
import os
import sys
import time

RECENT = 32  # tokens kept per request for token_repeat
PERIODS = (1, 2, 3, 4)
REPEATS = 4  # a tail of REPEATS x period tokens with that period is a repetition


def spin(us):
    end = time.perf_counter_ns() + us * 1000
    while time.perf_counter_ns() < end:
        pass


def token_repeat(recent):
    """The rows whose last tokens repeat a short period REPEATS times (the seed's detector)."""
    hits = []
    for row, toks in enumerate(recent):
        for p in PERIODS:
            n = p * REPEATS
            if len(toks) >= n and all(toks[-i] == toks[-i - p] for i in range(1, n - p + 1)):
                hits.append(row)
                break
    return hits


def worker(mode, rank, world, port, steps, forward_ms, compute_us, rows, vocab, barrier, out):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    seed = mode == "seed"
    if seed:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    due = torch.zeros(3, dtype=torch.int64)
    logits = torch.randn(rows, vocab, dtype=torch.float32)
    recent = [[] for _ in range(rows)]
    broadcasts = objects = detector_runs = repeats = nonfinite = 0
    barrier.wait()
    steady_from = max(1, steps // 5)
    t0 = steady_at = time.perf_counter()
    cpu0 = time.process_time()
    for step in range(1, steps + 1):
        if step == steady_from + 1:
            steady_at = time.perf_counter()
        if seed:
            if rank == 0:
                due[0], due[1], due[2] = step, 0, 1 if repeats else 0
            dist.broadcast(due, src=0)
            broadcasts += 1
            lane = [{"dump": "token_repeat"} if rank == 0 and repeats else None]
            dist.broadcast_object_list(lane, src=0)
            objects += 1
            repeats = 0
        spin(compute_us)
        time.sleep(forward_ms / 1000.0)
        barrier.wait()
        # Sampling: one new token per running request (the engine keeps them, guard or not).
        for r in range(rows):
            toks = recent[r]
            toks.append((step * 7919 + r * 104729) % 32000)
            if len(toks) > RECENT:
                del toks[0]
        if seed and rank == 0:
            repeats = len(token_repeat(recent))
            if not bool(torch.isfinite(logits).all().item()):
                nonfinite += 1
            detector_runs += 1
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    out.put({
        "rank": rank,
        "steps": steps,
        "steps_per_s": steps / wall,
        "steady_steps_per_s": (steps - steady_from) / max(1e-9, time.perf_counter() - steady_at) if steps > steady_from else steps / wall,
        "cpu_us_per_step": cpu * 1e6 / steps,
        "broadcasts": broadcasts,
        "broadcast_objects": objects,
        "detector_runs": detector_runs,
        "nonfinite_steps": nonfinite,
    })
    if seed:
        dist.destroy_process_group()


def main():
    import torch.multiprocessing as mp

    mode = sys.argv[1]
    if mode not in ("absent", "seed"):
        raise SystemExit(f"seed_guard.py: MODE must be absent or seed, got {mode!r}")
    world, port, steps, forward_ms, compute_us, rows, vocab = (int(x) for x in sys.argv[2:9])
    # fork: children share the parent's imported torch (importing it N more times dominates otherwise)
    ctx = mp.get_context("fork")
    out = ctx.SimpleQueue()
    barrier = ctx.Barrier(world)
    args = (world, port, steps, forward_ms, compute_us, rows, vocab, barrier, out)
    procs = [ctx.Process(target=worker, args=(mode, r) + args) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        print(json.dumps({"error": f"seed_guard workers exited with {bad}"}))
        raise SystemExit(1)
    ranks = sorted((out.get() for _ in range(world)), key=lambda r: r["rank"])
    mean = lambda k: sum(r[k] for r in ranks) / len(ranks)
    print(json.dumps({
        "mode": mode,
        "ranks": world,
        "steps_per_s": mean("steps_per_s"),
        "steady_steps_per_s": mean("steady_steps_per_s"),
        "cpu_us_per_step": mean("cpu_us_per_step"),
        "broadcasts": [r["broadcasts"] for r in ranks],
        "broadcast_objects": [r["broadcast_objects"] for r in ranks],
        "detector_runs": [r["detector_runs"] for r in ranks],
    }))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
