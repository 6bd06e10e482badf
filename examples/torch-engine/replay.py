"""Replay a captured forward off-line, in one process, and compare it with what the engine computed.

    python3 replay.py --snapshots CACHE_ROOT/snapshots/torch-engine-tp2 --call 3 --engine-out OUT

For each rank g, `load_call_dir(<snapshots>/rank<g>/call<N>)` gives the forward's positional inputs
(input_ids, positions, slot_mapping, block_table, seq_lens, query_start_loc, logits_indices, then
the K and V cache of every layer as the step read them); the rank's weight shard is rebuilt from the seed. The
ranks' forwards run side by side in threads; their all-reduce and all-gather are done in this
process, summing in rank order (for 2 ranks a + b, which is what gloo's sum gives: float addition
commutes). Prints one JSON line per rank; with --engine-out, bitwise equality and the largest |difference| with
the logits the engine saved (OUT/forward_rank<g>_step<S>.pt, S = meta.json global_step), and exit 0 only if every rank is bit-exact.

--tp may differ from the TP size of the capture (the number of rank<g> dirs holding call<N>): the
ranks' KV caches are joined along the head dim and re-split, so a TP=2 capture replays at TP=1
(the reference for `wavebus bisect`; its logits are not compared with the engine's: no --engine-out).
--probe DIR runs the module tree of modules.py (the same bits) with wavebus_client.probe on and
writes DIR/rank<g>/call<N> per rank. --fault makes a wrong forward on purpose (docs/bisect.md).
For `wavebus verdict` (docs/verdict.md): --call takes a list (N,M,...: one process replays them all),
--save-logits DIR writes DIR/call<N>/replay_rank<g>.npy and, with --engine-out, engine_rank<g>.npy
(g: the global rank that recorded the forward) and DIR/fingerprint.json (the host and each TP
rank's device: wavebus_client.fingerprint.device_fingerprint), --device T=D runs TP rank T's thread as device index
D (the faulty-device test double keys on it), --shard-patch FILE loads the same wrong shard as the engine.
"""
import argparse
import json
import os
import sys
import threading

# torch 2.x's pip wheels compute matmuls in MKL, which picks its kernel by the operands' memory
# alignment: without conditional numerical reproducibility, replay.py's logits can differ from the
# engine's in the last bits (seen at 9- and 1-row forwards). Set before torch loads MKL; the engine
# and replay.py both set it, so their bits agree. (Debian's torch 1.13 uses OpenBLAS: no effect.)
os.environ.setdefault("MKL_CBWR", "COMPATIBLE")

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import wavebus_client  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
sys.path.insert(0, HERE)
import device_fault  # noqa: E402
from model import Comm, ModelConfig, forward, full_weights, patch_shard, shard  # noqa: E402
from wavebus_client.probe import Probe, parse_layers  # noqa: E402
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


class DropComm(Comm):
    """A broken all-reduce (fault drop:MODULE:RANK): every rank sums all contributions but RANK's."""

    def __init__(self, base: ThreadComm, drop: int):
        super().__init__(base.tp_size)
        self.base, self.drop = base, drop

    def all_reduce(self, t):
        parts = self.base._exchange(t)
        acc = None
        for r, p in enumerate(parts):
            if r != self.drop:
                acc = p if acc is None else acc + p
        t.copy_(acc)
        return t


def parse_fault(spec: str, tp: int):
    """weight:RANK:KEY (noise on that rank's shard of weight KEY, e.g. layers.1.up) |
    drop:MODULE:RANK (MODULE's all-reduce loses RANK's part) | nan:MODULE:RANK (a NaN written into
    MODULE's output on RANK)."""
    parts = spec.split(":")
    if len(parts) == 3 and parts[0] in ("weight", "drop", "nan"):
        rank = parts[1] if parts[0] == "weight" else parts[2]
        if rank.isdigit() and int(rank) < tp:
            return (parts[0], int(rank), parts[2] if parts[0] == "weight" else parts[1])
    raise SystemExit(f"replay: --fault must be weight:RANK:KEY, drop:MODULE:RANK or nan:MODULE:RANK with RANK < --tp {tp}, got {spec!r}")


def poison(module, args, out) -> None:
    """A forward hook that writes a NaN into the output's first element, in place (returns None: keeps the output)."""
    out.view(-1)[0] = float("nan")


def plant(model, w, comm, rank: int, faults) -> None:
    for kind, frank, what in faults:
        if kind == "weight" and rank == frank:
            if what not in w:
                raise SystemExit(f"replay: --fault weight: no weight {what!r} (e.g. layers.1.up)")
            w[what].add_(torch.randn(w[what].shape, generator=torch.Generator().manual_seed(7)) * 0.1)
        elif kind == "drop":
            model.get_submodule(what).comm = DropComm(comm, frank)  # every rank: an all-reduce is collective
        elif kind == "nan" and rank == frank:  # registered before the probe's hook: the probe sees the NaN
            model.get_submodule(what).register_forward_hook(poison)


def load_inputs(snapshots: str, call: int, tp: int, cfg: ModelConfig):
    """(metas, inputs, kv per rank of a TP=tp run) from a capture of any TP size."""
    ranks = sorted(int(d[4:]) for d in os.listdir(snapshots)
                   if d.startswith("rank") and d[4:].isdigit() and os.path.isdir(os.path.join(snapshots, d, f"call{call}")))
    # One TP group: consecutive global ranks (any DP replica's: replica * tp + tp rank), tp ranks 0..n-1.
    if not ranks or ranks != list(range(ranks[0], ranks[0] + len(ranks))):
        raise SystemExit(f"replay: {snapshots}: need one TP group's rank<g>/call{call} (consecutive global ranks), found ranks {ranks}")
    loaded = [load_call_dir(os.path.join(snapshots, f"rank{r}", f"call{call}")) for r in ranks]
    metas, first = [m for m, _ in loaded], loaded[0][1]
    for i, (m, t) in enumerate(loaded):
        if int(m.get("tp_rank", i)) != i:
            raise SystemExit(f"replay: rank{ranks[i]}/call{call}: tp_rank {m.get('tp_rank')}, expected {i} (not one TP group's forward)")
        if any(not torch.equal(a, b) for a, b in zip(t[:7], first[:7])):
            raise SystemExit(f"replay: rank{ranks[i]}/call{call}: its batch inputs differ from rank{ranks[0]}'s (not one TP group's forward)")
    per = cfg.kv_heads // tp
    kv = [{} for _ in range(tp)]
    for i, layer in enumerate(cfg.layer_names()):
        for j in (0, 1):
            full = torch.cat([t[7 + 2 * i + j] for _, t in loaded], dim=2)
            for r in range(tp):
                kv[r].setdefault(layer, [None, None])[j] = full[:, :, r * per:(r + 1) * per].contiguous()
    return metas, first[:7], kv


def replay(snapshots: str, call: int, tp: int, seed: int, block_size: int, probe: dict = None, faults=(), devices=None, shard_patch=None):
    cfg = ModelConfig(seed=seed)
    if tp < 1 or cfg.kv_heads % tp:
        raise SystemExit(f"replay: --tp {tp} does not divide kv_heads ({cfg.kv_heads})")
    full = full_weights(cfg)
    metas, inputs, kvs = load_inputs(snapshots, call, tp, cfg)
    shared, barrier, results, errors = {}, threading.Barrier(tp), {}, []

    def run(rank):
        try:
            ids, pos, slots, table, seq_lens, qsl, rows = inputs
            kv = {layer: tuple(kvs[rank][layer]) for layer in cfg.layer_names()}
            device_fault.set_device((devices or {}).get(rank))
            w = shard(cfg, full, rank, tp)
            if shard_patch:
                patch_shard(w, shard_patch, rank, tp)
            comm = ThreadComm(tp, rank, shared, barrier)
            meta = metas[rank] if rank < len(metas) else metas[0]
            if probe is None:
                results[rank] = (meta, forward(cfg, w, comm, kv, ids, pos, slots, table, seq_lens, qsl, block_size, rows))
                return
            from modules import SPLITS, CausalLM
            model = CausalLM(cfg, w, comm)
            plant(model, w, comm, rank, faults)
            p = Probe(model, global_rank=rank, tp_rank=rank, tp_size=tp, splits=SPLITS, include=probe["include"],
                      layers=probe["layers"], inputs=probe["inputs"], fmt=probe["format"], label=f"torch-engine-tp{tp}")
            with p:
                logits = model(kv, ids, pos, slots, table, seq_lens, qsl, block_size, rows)
            p.write(probe["dir"], call)
            results[rank] = (meta, logits)
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
    ap.add_argument("--call", required=True, help="N, or N,M,... (each replayed in turn)")
    ap.add_argument("--engine-out", help="compare each rank's logits with the engine's (bit for bit)")
    ap.add_argument("--tp", type=int, help="TP size to replay at (default: the capture's)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--probe", help="record every module's output into PROBE/rank<g>/call<N> (wavebus bisect)")
    ap.add_argument("--probe-include", action="append", help="glob, or re:REGEX, of module names (repeatable; default all)")
    ap.add_argument("--probe-layers", help="N or LO-HI: only these decoder layers (modules outside layers stay)")
    ap.add_argument("--probe-inputs", action="store_true", help="record module inputs too")
    ap.add_argument("--probe-format", default="npy", choices=("npy", "pt"))
    ap.add_argument("--save-logits", help="write DIR/call<N>/replay_rank<g>.npy (and engine_rank<g>.npy with --engine-out)")
    ap.add_argument("--device", action="append", default=[], help="T=D: TP rank T's thread computes as device index D")
    ap.add_argument("--shard-patch", help="the engine's --shard-patch file (a wrong value in a shard's checkpoint)")
    ap.add_argument("--fault", action="append", default=[], help="weight:RANK:KEY | drop:MODULE:RANK | nan:MODULE:RANK (with --probe)")
    a = ap.parse_args(argv)
    if not os.path.isdir(a.snapshots):
        raise SystemExit(f"replay: --snapshots {a.snapshots}: not a directory")
    try:
        calls = [int(c) for c in a.call.split(",")]
        devices = {int(k): int(v) for k, v in (d.split("=") for d in a.device)}
    except ValueError:
        raise SystemExit(f"replay: --call must be N or N,M,... and --device T=D (integers), got --call {a.call!r} --device {a.device!r}")
    if a.tp is None:
        a.tp = sum(1 for d in os.listdir(a.snapshots) if os.path.isdir(os.path.join(a.snapshots, d, f"call{calls[0]}")))
    faults = [parse_fault(f, a.tp) for f in a.fault]
    if faults and not a.probe:
        raise SystemExit("replay: --fault needs --probe (faults are planted in the module tree)")
    probe = None if a.probe is None else {"dir": a.probe, "include": a.probe_include, "layers": parse_layers(a.probe_layers),
                                          "inputs": a.probe_inputs, "format": a.probe_format}
    if a.save_logits:
        save_fingerprint(a.save_logits, [devices.get(t, t) for t in range(a.tp)])
    ok = True
    for call in calls:
        ok = replay_one(a, call, probe, faults, devices) and ok
    return 0 if ok else 1


def save_fingerprint(out: str, devices) -> None:
    """DIR/fingerprint.json: the host and each TP rank's device as this process sees them (`wavebus
    verdict` names them in a device-local verdict)."""
    from wavebus_client.fingerprint import device_fingerprint
    os.makedirs(out, mode=0o700, exist_ok=True)
    doc = {"devices": [dict(device_fingerprint(d), tp_rank=t) for t, d in enumerate(devices)]}
    with open(os.path.join(out, "fingerprint.json"), "w") as f:
        json.dump(doc, f)


def replay_one(a, call: int, probe, faults, devices) -> bool:
    ok = True
    for rank, (meta, logits) in sorted(replay(a.snapshots, call, a.tp, a.seed, a.block_size, probe, faults, devices, a.shard_patch).items()):
        # The engine saved its logits under its global rank (= the TP rank with DP=1).
        g = meta.get("global_rank", rank)
        line = {"rank": rank, "global_rank": g, "global_step": meta["global_step"], "call_index": meta["call_index"], "shape": list(logits.shape)}
        want = None
        if a.engine_out:
            saved = os.path.join(a.engine_out, f"forward_rank{g}_step{meta['global_step']}.pt")
            if a.save_logits and not os.path.exists(saved):
                line.update(engine_output=None, reason=f"no {saved}")
            else:
                # weights_only: the file may come from another host (a verdict's replay request): never unpickle code.
                want = torch.load(saved, map_location="cpu", weights_only=True)["logits"]
                same = logits.shape == want.shape and torch.equal(logits.view(torch.int32), want.view(torch.int32))
                line.update(bitwise_equal=same, max_abs_diff=(logits - want).abs().max().item() if logits.shape == want.shape else None)
                ok = ok and same
        if a.save_logits:
            import numpy as np
            d = os.path.join(a.save_logits, f"call{call}")
            os.makedirs(d, mode=0o700, exist_ok=True)
            np.save(os.path.join(d, f"replay_rank{g}.npy"), logits.numpy())
            if want is not None:
                np.save(os.path.join(d, f"engine_rank{g}.npy"), want.numpy())
        if a.probe:
            line["probe"] = os.path.join(a.probe, f"rank{rank}", f"call{call}")
        print(json.dumps(line), flush=True)
    return ok


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
