"""`wavebus bench overhead --engine python`'s engine: a Python TP group at N running requests.

Each rank steps as a serving engine does (examples/torch-engine/engine.py's order): the head of the
wave with the previous step's sampled tokens as columns (TensorBatch.wave_head), before_forward
(not selected), a busy --compute-us (host work), an idle --forward-ms (the forward on the
accelerator), a gloo all_reduce of one number on the TP group (the forward's collective, in every
mode, absent included), end_of_wave, then one pending_dumps for the requests that finished and their
frees. About N / 200 requests finish per step and new ones take their rows (sparse events).

The script forks its --nproc ranks itself, as the simulated engine does (each gets RANK, LOCAL_RANK
and WORLD_SIZE, as torchrun gives them). Under `wavebus launch` each rank's client attaches to its
agent and the job's runtime config decides what is on; with --detached wavebus is absent (the
baseline). Each rank writes RESULT_DIR/rank<R>.json in the simulated engine's result
shape (src/sim/rank.ts), which bench/overhead.ts reads.

With --rank-digest each rank also writes rank_divergence's digests every step, as
examples/torch-engine does: decided_inputs (the head's token column as the forward's ids, the
rows' ages as positions, one token per row) at before_forward and decided after the forward's
collective. The bench samples no new column after the forward: decided takes the head's column,
the same size (N int32) and the same on every rank (one random stream), so every wave agrees.
Nothing is written while the job's config has the detector off.

usage: overhead_engine.py --running N --steps S --forward-ms F --compute-us C --port P --result-dir D
                          --nproc K [--detached] [--stop-file PATH] [--step-times] [--rank-digest]
"""
import argparse
import json
import os
import resource
import sys
import time

from engine_requests import BenchRequests


def spin(us):
    end = time.perf_counter_ns() + us * 1000
    while time.perf_counter_ns() < end:
        pass


def rank_main(a, rank, world):
    import numpy as np
    import torch
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=world)
    meet = torch.zeros(1)
    c = batch = None
    if not a.detached:
        from wavebus_client import Client

        c = Client.connect()
        batch = c.tensor_batch(a.running, vocab=32000)
    n = a.running
    rng = np.random.default_rng(1)  # the same stream on every rank: TP ranks sample the same tokens
    reqs = BenchRequests(n, rng)
    rows, req = reqs.rows, reqs.req
    lps = np.full(n, -1.0, dtype=np.float32)
    if batch is not None:
        reqs.bind_all(batch)
    ctx = {"compilation_hash": "bench", "global_step": 0}
    digest = a.rank_digest and c is not None
    starts = np.arange(n + 1, dtype=np.int32)  # a decode step: one input token per row
    digests = 0
    steady_from = max(1, a.steps // 5)
    client_ns = eow_ns = overrun_ns = 0
    eow = []
    ends = [] if a.step_times else None
    dist.barrier()
    t0 = steady_at = time.perf_counter()
    cpu0 = time.process_time()
    steps = 0
    for wave in range(1, a.steps + 1):
        if a.stop_file and rank == 0 and os.path.exists(a.stop_file):
            meet[0] = -1.0  # tell the other ranks at the collective
        if wave == steady_from + 1:
            steady_at = time.perf_counter()
        toks = rng.integers(0, 32000, n).astype(np.int32)
        done = reqs.finishing()
        s0 = time.perf_counter_ns()
        if batch is not None:
            batch.finish_rows(done)
            batch.wave_head(wave, rows, toks, lps)
            ctx["global_step"] = wave
            if digest:
                digests += c.decided_inputs(wave, toks, reqs.age, starts)
            c.before_forward(ctx, [])
        s1 = time.perf_counter_ns()
        spin(a.compute_us)
        f0 = time.perf_counter_ns()
        time.sleep(a.forward_ms / 1000.0)
        overrun_ns += max(0, time.perf_counter_ns() - f0 - a.forward_ms * 1_000_000)
        dist.all_reduce(meet, op=dist.ReduceOp.MIN)
        stop = meet[0] < 0
        if digest:  # timed as the client's, outside end_of_wave's own figures
            d0 = time.perf_counter_ns()
            c.decided(wave, toks)
            client_ns += time.perf_counter_ns() - d0
        s2 = time.perf_counter_ns()
        if c is not None:
            c.end_of_wave(wave)
        s3 = time.perf_counter_ns()
        if c is not None:
            c.pending_dumps([req[r] for r in done])  # every frees at once here: the bench arms no dump
            batch.free_rows(done)
        s4 = time.perf_counter_ns()
        client_ns += (s1 - s0) + (s4 - s2)
        eow_ns += s3 - s2
        eow.append((s3 - s2) / 1000)
        reqs.renew(done)
        # Rows freed at this step take their new requests after the next head (that carries the free).
        reqs.arrive_after_head(batch, done)
        steps = wave
        if ends is not None:
            ends.append(time.time() * 1000)
        if stop:
            break
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    eow.sort()
    st = c.stats if c is not None else {}
    out = {
        "rank": rank,
        "steps": steps,
        "running": n,
        "stepsPerSec": steps / wall,
        "steadyStepsPerSec": (steps - steady_from) / max(1e-9, time.perf_counter() - steady_at) if steps > steady_from else steps / wall,
        "endOfWaveTimeouts": st.get("end_of_wave_timeouts", 0),
        "vectorWaits": st.get("end_of_wave_waited", 0),
        "lateVectors": st.get("late_vectors", 0),
        "endOfWaveP99Us": eow[min(len(eow) - 1, int(0.99 * len(eow)))] if eow else 0,
        "slowEndOfWaves": sum(1 for x in eow if x > 250),
        "cpuUsPerStep": cpu * 1e6 / max(1, steps),
        "clientUsPerStep": client_ns / 1000 / max(1, steps),
        "endOfWaveUsPerStep": eow_ns / 1000 / max(1, steps),
        "forwardOverrunUsPerStep": overrun_ns / 1000 / max(1, steps),
        "maxRssKiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "waveHeadsSent": st.get("wave_head_sent", 0),
        "ringHeads": batch.stats["ring_heads"] if batch is not None else 0,
        "digestWaves": digests,  # waves whose input digest went into the decision ring
    }
    if ends is not None:
        out["stepEndsAt"] = ends
    with open(os.path.join(a.result_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    if c is not None:
        c.close()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--running", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--forward-ms", type=float, default=3)
    p.add_argument("--compute-us", type=int, default=200)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--result-dir", required=True)
    p.add_argument("--detached", action="store_true")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--stop-file", default="")
    p.add_argument("--step-times", action="store_true")
    p.add_argument("--rank-digest", action="store_true")
    a = p.parse_args()
    os.makedirs(a.result_dir, exist_ok=True)
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=rank_main, args=(a, r, a.nproc)) for r in range(a.nproc)]
    for q in procs:
        q.start()
    for q in procs:
        q.join()
    bad = [q.exitcode for q in procs if q.exitcode != 0]
    if bad:
        sys.exit(f"overhead_engine.py: ranks exited with {bad}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
