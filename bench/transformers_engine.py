"""The engine side of `wavebus bench transformers`: transformers 5.x continuous batching under
torchrun (TP over gloo on CPU), REQUESTS requests running at once, one process per rank.

    torchrun --nproc-per-node 2 transformers_engine.py MODE --model DIR --out OUT [...]

MODE
  absent  no wavebus_client at all (never imported);
  off     attach() from wavebus_client.integrations.transformers (the bench runs it under
          `wavebus launch` with every feature off);
  on      the same, the bench's runtime config turning the detectors on;
  seed    no wavebus: the seed's per-step path in the engine's step instead, ported to Python as
          the seed's Runtime Guard does it: before the forward TP0 broadcasts the due vector
          [wave, config_due, dump_due] over the TP group (gloo) and then the due lane
          (broadcast_object_list); a forward hook on TP0 checks every logits row with
          torch.isfinite; after sampling TP0 runs token_repeat on every request's new token
          (window 32: the token's occurrences among the previous 32, summed over the last 32
          scores, over when more than 64 after 32 content tokens; one alert per request).

Each rank writes OUT/rank<r>.json: steps/s over a window of steps in which every request decodes
(after --warmup-steps), the rank's CPU µs per step in it, and the µs per step spent in the layer
around the engine's step (wavebus' attach wrappers, or the seed's work): the engine's own
_generation_step and update_batch are timed inside that layer and outside it, the difference is
the layer's, plus the time in its logits hook.
"""
import argparse
import json
import os
import sys
import time
from collections import deque

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("absent", "off", "on", "seed")


class Timers:
    """Per step: when it started (outside every layer) and µs inside/outside the instrumentation."""

    def __init__(self):
        self.starts, self.layer_us, self.cpu, self.rows = [], [], [], []
        self.inner = 0.0  # the engine's own step + update time of the current step (s)
        self.hook = 0.0   # time in the layer's logits hook of the current step (s)
        self.send = 0.0   # time in attach's send_head of the current step (s), part of the layer's
        self.send_us, self.hook_us = [], []

    def add(self, field: str):
        """An accumulator into one of inner / hook / send (seconds)."""
        return lambda s: setattr(self, field, getattr(self, field) + s)


def timed(fn, add):
    """``fn`` wrapped: the wall time of each call goes to ``add(seconds)``. The one timing wrapper
    of this file (the engine's methods, the whole step, attach's send_head and logits check)."""
    def wrapper(*a, **k):
        s = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            add(time.perf_counter() - s)

    return wrapper


def time_inner(p, t: Timers) -> None:
    """Time the engine's own methods (installed before any layer wraps them)."""
    p._generation_step, p.update_batch = timed(p._generation_step, t.add("inner")), timed(p.update_batch, t.add("inner"))


def time_outer(p, t: Timers) -> None:
    """Time the whole step with its layers (installed after them): layer = outer - inner + hook."""
    state = {"outer": 0.0}
    outer = lambda s: state.__setitem__("outer", state["outer"] + s)  # noqa: E731
    step = timed(p._generation_step, outer)

    def outer_step(model):
        if t.starts:  # close the previous step: its update ran after its step
            t.layer_us.append((state["outer"] - t.inner + t.hook) * 1e6)
            t.send_us.append(t.send * 1e6)
            t.hook_us.append(t.hook * 1e6)
        state["outer"], t.inner, t.hook, t.send = 0.0, 0.0, 0.0, 0.0
        t.starts.append(time.perf_counter())
        t.cpu.append(time.process_time())
        t.rows.append(len(p.inputs_and_outputs.requests_in_batch))
        step(model)

    p._generation_step, p.update_batch = outer_step, timed(p.update_batch, outer)


class TokenRepeat:
    """The seed's token_repeat, per request (window 32, threshold 64, min_tokens 32, one alert)."""

    def __init__(self, window=32, threshold=64, min_tokens=32, consecutive_hits=1):
        self.window, self.threshold, self.min_tokens, self.hits_needed = window, threshold, min_tokens, consecutive_hits
        self.recent, self.scores = deque(maxlen=window), deque(maxlen=window)
        self.seen = self.consecutive = 0
        self.alerted = False

    def push(self, token: int):
        if self.alerted:
            return None
        score = self.recent.count(token)
        self.recent.append(token)
        self.scores.append(score)
        self.seen += 1
        repeat_sum = sum(self.scores)
        over = self.seen >= self.min_tokens and repeat_sum > self.threshold
        self.consecutive = self.consecutive + 1 if over else 0
        if self.consecutive >= self.hits_needed:
            self.alerted = True
            return {"repeat_sum": repeat_sum, "threshold": self.threshold, "window": self.window, "content_tokens_seen": self.seen,
                    "last_score": score, "consecutive_hits": self.consecutive, "recent_token_ids": list(self.recent)}
        return None


def seed_layer(p, model, rank: int, alerts: list, t: Timers) -> None:
    """The seed's per-step path, wrapped around the engine's step like attach() (see the module doc)."""
    import torch.distributed as dist

    due = torch.zeros(3, dtype=torch.int64)
    state = {"wave": 0, "dump_due": 0, "rows": []}
    detectors = {}
    step, update = p._generation_step, p.update_batch

    def seed_step(m):
        state["wave"] += 1
        io = p.inputs_and_outputs
        state["rows"] = [(fs.state.request_id, fs.has_new_token) for fs in io.requests_in_batch]
        if rank == 0:
            due[0], due[1], due[2] = state["wave"], 0, state["dump_due"]
        dist.broadcast(due, src=0)
        lane = [{"dump": "token_repeat"} if rank == 0 and state["dump_due"] else None]
        dist.broadcast_object_list(lane, src=0)
        state["dump_due"] = 0
        step(m)

    def logits_finite(_module, _args, output):
        if rank != 0:
            return
        a = time.perf_counter()
        logits = output.logits[0]
        finite = torch.isfinite(logits).all(dim=-1)
        if not bool(finite.all()):
            rows = [rid for rid, has in state["rows"] if has]
            for r in (~finite).nonzero().flatten().tolist():
                alerts.append({"type": "logits_finite", "req_id": rows[r] if r < len(rows) else None, "wave": state["wave"]})
        t.hook += time.perf_counter() - a

    def seed_update():
        _, tokens, _ = p.inputs_and_outputs.prepare_batch_update()
        update()
        if rank != 0:
            return
        k = 0
        for rid, has in state["rows"]:
            if not has:
                continue
            tok = int(tokens[k])
            k += 1
            det = detectors.get(rid)
            if det is None:
                det = detectors[rid] = TokenRepeat()
            hit = det.push(tok)
            if hit is not None:
                alerts.append({"type": "token_repeat", "req_id": rid, "wave": state["wave"], **hit})
                state["dump_due"] = 1

    model.register_forward_hook(logits_finite)
    p._generation_step, p.update_batch = seed_step, seed_update


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=MODES)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--warmup-steps", type=int, default=20, help="steps before the window (prefill and warm-up)")
    ap.add_argument("--measure-steps", type=int, default=60)
    ap.add_argument("--page-size", type=int, default=16)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(0)
    torch.set_num_threads(1)  # two ranks on a 2-core host; the same in every mode

    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    tp = {"tp_plan": "auto"} if world > 1 else {}
    model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="paged|sdpa", dtype=torch.float32, **tp)
    prompts = [[(7 * i + 3 * j + 1) % 250 + 1 for j in range(5 + i % 3)] for i in range(args.requests)]
    # Every request decodes to the end of the window and a little past it; the cache holds them all
    # at once (explicit sizing: transformers would size it from the host's RAM, per rank).
    max_tokens = args.warmup_steps + args.measure_steps + 4
    per_request = -(-(max(len(p) for p in prompts) + max_tokens + 1) // args.page_size)
    batch_tokens = max(512, args.requests)
    gen = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(num_blocks=args.requests * per_request + 16, max_batch_tokens=batch_tokens, page_size=args.page_size,
                                  return_logprobs=True, use_async_batching=False, allow_block_sharing=False)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)

    t = Timers()
    alerts = []
    create = manager._create_batch_processor

    def with_inner():
        p = create()
        if not getattr(p, "_bench_inner", False):
            p._bench_inner = True
            time_inner(p, t)
            if args.mode == "seed":
                seed_layer(p, model, rank, alerts, t)
        return p

    manager._create_batch_processor = with_inner
    wb = None
    if args.mode in ("off", "on"):
        try:
            import wavebus_client  # noqa: F401
        except ImportError:
            sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
        from wavebus_client.integrations.transformers import attach

        wb = attach(manager)
        wb.gate.check = timed(wb.gate.check, t.add("hook"))
        wb.send_head = timed(wb.send_head, t.add("send"))  # the wave head with the last step's columns
    attached = manager._create_batch_processor

    def with_outer():
        p = attached()
        if not getattr(p, "_bench_outer", False):
            p._bench_outer = True
            time_outer(p, t)
        return p

    manager._create_batch_processor = with_outer

    manager.start()
    ids = [f"req-{i}" for i in range(args.requests)]
    for rid, pr in zip(ids, prompts):
        manager.add_request(pr, request_id=rid, max_new_tokens=max_tokens)
    done = 0
    while done < len(ids):
        r = manager.get_result(timeout=300)
        if r is None:
            raise SystemExit(f"transformers_engine: rank {rank}: no result within 300 s ({done} of {len(ids)} done)")
        if r.is_finished():
            done += 1
    manager.stop(block=True)
    if wb is not None:
        wb.close()

    w0, w1 = args.warmup_steps, args.warmup_steps + args.measure_steps
    if len(t.starts) <= w1:
        raise SystemExit(f"transformers_engine: rank {rank}: only {len(t.starts)} steps, the window needs {w1 + 1} (more --warmup/--measure than tokens?)")
    wall = t.starts[w1] - t.starts[w0]
    res = {
        "mode": args.mode, "rank": rank, "world": world, "requests": args.requests, "steps": len(t.starts),
        "window": [w0, w1], "steps_per_s": args.measure_steps / wall,
        "rows_min": min(t.rows[w0:w1]), "rows_max": max(t.rows[w0:w1]),
        "cpu_us_per_step": (t.cpu[w1] - t.cpu[w0]) * 1e6 / args.measure_steps,
        "layer_us_per_step": sum(t.layer_us[w0:w1]) / args.measure_steps,
        "send_head_us_per_step": sum(t.send_us[w0:w1]) / args.measure_steps,
        "logits_hook_us_per_step": sum(t.hook_us[w0:w1]) / args.measure_steps,
        "seed_alerts": len(alerts), "waves": wb.wave if wb is not None else None,
        # the whole run's wave heads through the telemetry ring and inline (a ring slot the agent had not taken yet)
        "heads": {k: wb.tensor_batch.stats[k] for k in ("ring_heads", "inline_heads")} if wb is not None else None,
        "wavebus_imported": "wavebus_client" in sys.modules,
        "num_blocks": cb.num_blocks, "max_batch_tokens": batch_tokens,
    }
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
