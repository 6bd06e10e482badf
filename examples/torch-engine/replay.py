"""Replay a captured forward off-line, in one process, and compare it with what the engine computed.

    python3 replay.py --snapshots CACHE_ROOT/snapshots/torch-engine-tp2 --call 3 --engine-out OUT

For each rank g, `load_call_dir(<snapshots>/rank<g>/call<N>)` gives the forward's positional inputs
(input_ids, positions, slot_mapping, block_table, seq_lens, query_start_loc, logits_indices, then
the K and V cache of every layer as the step read them); the rank's weight shard is rebuilt from the seed. The
ranks' forwards run side by side in threads; their all-reduce and all-gather are done in this
process, summing in rank order (for 2 ranks a + b, which is what gloo's sum gives: float addition
commutes). Prints one JSON line per rank: bitwise equality and the largest |difference| with the
logits the engine saved (OUT/forward_rank<g>_step<S>.pt, S = meta.json global_step). Exit 0 only if every rank is bit-exact.
"""
import argparse
import json
import os
import sys
import threading

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import wavebus_client  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
sys.path.insert(0, HERE)
from model import Comm, ModelConfig, forward, full_weights, shard  # noqa: E402
from wavebus_client.replay import load_call_dir  # noqa: E402


class ThreadComm(Comm):
    """The collectives among tp_size threads of this process (the off-line stand-in for gloo)."""

    def __init__(self, tp_size: int, rank: int, shared: dict, barrier: threading.Barrier):
        super().__init__(tp_size)
        self.rank, self.shared, self.barrier = rank, shared, barrier

    def _exchange(self, t):
        self.shared[self.rank] = t.clone()
        self.barrier.wait()
        parts = [self.shared[r] for r in range(self.tp_size)]
        self.barrier.wait()
        return parts

    def all_reduce(self, t):
        parts = self._exchange(t)
        acc = parts[0]
        for p in parts[1:]:
            acc = acc + p
        t.copy_(acc)
        return t

    def all_gather_last(self, t):
        return torch.cat(self._exchange(t), dim=-1)


def replay(snapshots: str, call: int, tp: int, seed: int, block_size: int):
    cfg = ModelConfig(seed=seed)
    full = full_weights(cfg)
    shared, barrier, results, errors = {}, threading.Barrier(tp), {}, []

    def run(rank):
        try:
            meta, t = load_call_dir(os.path.join(snapshots, f"rank{rank}", f"call{call}"))
            ids, pos, slots, table, seq_lens, qsl, rows = t[:7]
            kv = {layer: (t[7 + 2 * i].clone(), t[8 + 2 * i].clone()) for i, layer in enumerate(cfg.layer_names())}
            w = shard(cfg, full, rank, tp)
            results[rank] = (meta, forward(cfg, w, ThreadComm(tp, rank, shared, barrier), kv, ids, pos, slots, table,
                                           seq_lens, qsl, block_size, rows))
        except BaseException as e:  # noqa: BLE001 (reported below; the barrier is broken for the others)
            errors.append(f"rank {rank}: {type(e).__name__}: {e}")
            barrier.abort()

    torch.set_num_threads(1)  # as the engine: one thread, one reduction order
    threads = [threading.Thread(target=run, args=(r,)) for r in range(tp)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise SystemExit("replay failed: " + "; ".join(errors))
    return results


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--snapshots", required=True, help="<cache_root>/snapshots/<compilation_hash>")
    ap.add_argument("--call", type=int, required=True)
    ap.add_argument("--engine-out", required=True)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--block-size", type=int, default=4)
    a = ap.parse_args(argv)
    ok = True
    for rank, (meta, logits) in sorted(replay(a.snapshots, a.call, a.tp, a.seed, a.block_size).items()):
        want = torch.load(os.path.join(a.engine_out, f"forward_rank{rank}_step{meta['global_step']}.pt"))["logits"]
        same = logits.shape == want.shape and torch.equal(logits.view(torch.int32), want.view(torch.int32))
        diff = (logits - want).abs().max().item() if logits.shape == want.shape else None
        ok = ok and same
        print(json.dumps({"rank": rank, "global_step": meta["global_step"], "call_index": meta["call_index"],
                          "shape": list(logits.shape), "bitwise_equal": same, "max_abs_diff": diff}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
