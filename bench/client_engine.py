"""`wavebus bench client`'s engine: one Python engine loop at N running requests, timing in its own
thread the calls it makes every step. Modes:
  tensor  - TensorBatch.wave_head (the ring) + before_forward + end_of_wave + pending_dumps(finished);
            WAVEBUS_PY_NATIVE=0 in its environment makes it bench client's tensor_py (the numpy ring writes)
  dict    - the same with Client.wave_head and the dict telemetry (the convenience path)
  off     - the tensor loop against a mailbox with every feature off (nothing is sent)
  none    - the same loop without wavebus (the engine's own arrays only)
  floor   - the same loop with each of the engine's wavebus calls (finish_rows, free_rows, arrive,
            blocks, the four per-step calls) made to a C function that does nothing ("".format): what the calls
            alone cost a step after the forward, whatever a client does in them
  seed    - the seed's path: its Python detectors in the engine (token_repeat, spec_acceptance per
            request, logits_finite's isfinite on [N, 1024] float32 logits), ported from the seed's
            description (token_repeat: window 32, threshold 64, min 32; spec_acceptance: window 10)
The forward (not timed) is 3 ms: FORWARD "sleep" (the default) sleeps it, "spin" busy-waits it, as an
engine thread in cudaStreamSynchronize does by default (its caches stay warmer than after a sleep).
Prints one JSON line: per-step p50/p99 µs of the step's calls in all, and per call; "events" is the
step's sparse calls: the finished requests' finish_rows() and free_rows(), and the arrivals (arrive() and
blocks() of the requests taking the rows freed at the step before; ~N/200 a step, as many as
finish), the other four exclude them.
usage: client_engine.py MODE N STEPS RUN_DIR [FORWARD]
"""
import json
import sys
import time
from collections import deque

import numpy as np

from engine_requests import BenchRequests

mode, n, steps, run_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
forward = sys.argv[5] if len(sys.argv) > 5 else "sleep"
if forward not in ("sleep", "spin"):
    sys.exit(f"client_engine.py: FORWARD must be sleep or spin, got {forward!r}")
WARM = 30
rng = np.random.default_rng(1)
FORWARD_S = 0.003  # a 3 ms forward, as bench overhead


class SeedTokenRepeat:
    __slots__ = ("content", "scores", "seen", "over")

    def __init__(self):
        self.content, self.scores, self.seen, self.over = deque(maxlen=32), deque(maxlen=32), 0, 0

    def step(self, t):
        score = self.content.count(t)
        self.content.append(t)
        self.seen += 1
        self.scores.append(score)
        if self.seen >= 32 and sum(self.scores) > 64:
            self.over += 1
            return self.over >= 1
        self.over = 0
        return False


class SeedSpec:
    __slots__ = ("win",)

    def __init__(self):
        self.win = deque(maxlen=10)

    def step(self, draft, accepted):
        if draft == 0:
            return False
        self.win.append((max(0, accepted - 1), draft))
        if len(self.win) < 10:
            return False
        acc = sum(a for a, _ in self.win)
        rate, length = acc / sum(d for _, d in self.win), acc / len(self.win)
        return (rate < 0.3 and length < 1.4) or (rate > 0.96 and length > 2.8)


def main():
    c = batch = None
    torch = None
    if mode in ("tensor", "dict", "off"):
        from wavebus_client import Client
        c = Client.connect(env={"WAVEBUS_RUN_DIR": run_dir, "LOCAL_RANK": "0"})
        if mode != "dict":
            batch = c.tensor_batch(max(n, 1), vocab=32000)
        if mode != "off":  # the agent turns the bus on once its coordinator's config is in force
            from wavebus_client.mailbox import FEATURE_BUS
            t_end = time.monotonic() + 20
            while not c.features & FEATURE_BUS and time.monotonic() < t_end:
                time.sleep(0.01)
            c.hello()  # at once (the ring is made then), not lazily within the first head's bound
    if mode == "floor":
        class Floor:  # a Python class, as the client's batch and Client are; each method a no-op in C
            finish_rows = free_rows = arrive = blocks = wave_head = before_forward = end_of_wave = pending_dump = pending_dumps = "".format

        c = batch = Floor()
    if mode == "seed":
        import torch
        logits = torch.zeros(n, 1024)
        tr = [SeedTokenRepeat() for _ in range(n)]
        sp = [SeedSpec() for _ in range(n)]
    reqs = BenchRequests(n, rng)
    rows, req = reqs.rows, reqs.req
    if batch is not None:
        reqs.bind_all(batch)
    ctx = {"compilation_hash": "bench", "global_step": 0, "req_ids": [], "positions": []}
    totals, per = [], {"wave_head": [], "before_forward": [], "end_of_wave": [], "pending_dump": [], "events": []}
    pc = time.perf_counter_ns
    for wave in range(1, steps + WARM + 1):
        toks = rng.integers(0, 32000, n).astype(np.int32)  # the engine's sampled ids (not timed)
        lps = np.full(n, -1.0, dtype=np.float32)
        done = reqs.finishing()
        t0 = pc()
        te = t0
        if mode in ("tensor", "off", "floor"):
            batch.finish_rows(done)  # the step's finished rows in one call
            te = pc()
            batch.wave_head(wave, rows, toks, lps)
        elif mode == "dict":
            doneset = set(done)
            tl = toks.tolist()
            c.wave_head(wave, {"requests": [{"req_id": req[r], "new_token_ids": [tl[r]], "new_token_logprobs": [-1.0], "block_ids": reqs.table(r),
                                             "finished": r in doneset, "freed": r in doneset} for r in range(n)]})
        elif mode == "seed":
            tl = toks.tolist()
            for r in range(n):
                tr[r].step(tl[r])
                sp[r].step(3, 2)
            bool(torch.isfinite(logits).all())
        t1 = pc()
        if c is not None:
            ctx["global_step"] = wave
            c.before_forward(ctx, [])
        t2 = pc()
        # The forward on the device (not timed), between before_forward and end_of_wave as in an engine
        # (examples/torch-engine/engine.py): the vector of the next wave, decided by this head, arrives meanwhile.
        if forward == "spin":
            until = pc() + int(FORWARD_S * 1e9)
            while pc() < until:
                pass
        else:
            time.sleep(FORWARD_S)
        t2f = pc()
        if c is not None:
            c.end_of_wave(wave)
        t3 = pc()
        # The step's finished requests asked in one call (the bench arms no dump: every one is freed).
        if c is not None:
            c.pending_dumps([req[r] for r in done])
        tp = pc()
        if batch is not None:
            batch.free_rows(done)
        t4f = pc()
        reqs.renew(done)  # the engine's own bookkeeping (not timed): the next requests' ids
        t4 = pc()
        # The engine reuses the rows: new requests arrive where the last step's finished ones were.
        reqs.arrive_after_head(batch, done)
        t5 = pc()
        if wave > WARM:
            totals.append((t5 - t0 - (t2f - t2) - (t4 - t4f)) / 1e3)
            for k, a, b in (("wave_head", te, t1), ("before_forward", t1, t2), ("end_of_wave", t2f, t3), ("pending_dump", t3, tp)):
                per[k].append((b - a) / 1e3)
            per["events"].append((te - t0 + t4f - tp + t5 - t4) / 1e3)
    q = lambda a, p: float(np.percentile(np.array(a), p)) if a else 0.0  # noqa: E731
    out = {"mode": mode, "requests": n, "steps": steps, "forward": forward, "p50_us": q(totals, 50), "p99_us": q(totals, 99),
           "calls": {k: {"p50_us": q(v, 50), "p99_us": q(v, 99)} for k, v in per.items()}}
    if mode == "off":
        # The same four calls in a tight loop (best of 3 x 20 000 steps, one finished request per
        # step, no events): what the off path itself costs with warm caches. The per-step figures
        # above also hold what a 3 ms sleep costs the next few µs of any code (cold caches).
        best = float("inf")
        for _ in range(3):
            t0 = pc()
            for w in range(1, 20001):
                batch.wave_head(w, rows, toks, lps)
                c.before_forward(ctx, [])
                c.end_of_wave(w)
                c.pending_dump(req[0])
            best = min(best, (pc() - t0) / 20000 / 1e3)
        out["off_loop_us"] = best
    if c is not None and mode != "floor":
        out["wave_heads_sent"] = c.stats["wave_head_sent"]
        if batch is not None:
            out["ring_heads"] = batch.stats["ring_heads"]
            out["inline_heads"] = batch.stats["inline_heads"]
            # Which path wrote the ring's slots (the client's native C call or its numpy path;
            # WAVEBUS_PY_NATIVE picks): "native", "numpy", or "mixed" when both ran.
            nat, npy = c.stats.get("ring_native_writes", 0), c.stats.get("ring_numpy_writes", 0)
            if nat or npy:
                out["ring_path"] = "mixed" if nat and npy else "native" if nat else "numpy"
            out["slots"] = "native" if batch.native_slots else "python"  # the rows' and events' store (slot_batch.py)
        c.close()
    print(json.dumps(out))


main()
