"""Replay a captured forward through transformers' own model; compare with the engine's logits.

    torchrun --standalone --nproc-per-node 2 replay.py --model DIR --snapshots CACHE/snapshots/HASH --call 0,1 --engine-out OUT

Every rank loads the model as serve.py does (tp_plan="auto" when WORLD_SIZE > 1), builds a paged
cache of the same geometry through transformers' own manager, puts the captured cache bytes into it,
and runs the model on the captured inputs (wavebus_client.integrations.transformers.SNAPSHOT_INPUTS,
in that order, then the cache). Prints one JSON line per rank: bitwise equality and the largest
|difference| with the logits serve.py --save-logits kept for that wave; exits 1 unless bit-exact.

Started without torchrun (no WORLD_SIZE) for a TP>1 replay, it runs itself under torch's own
torchrun (`python -m torch.distributed.run --standalone`) with that many ranks: one command
replays a TP group (what `wavebus verdict` calls).

--tp 1 replays a TP=N capture in one process (bisect's reference): the ranks' caches are joined
along the KV heads (a colwise k_proj/v_proj gives rank r heads r*H/N..(r+1)*H/N-1; transformers'
cache rows are [kv_heads, head_dim] at the same row positions whatever the TP size).
--probe DIR records every module (wavebus_client.probe, splits from the model's tp_plan) into
DIR/rank<g>/call<N>; --fault makes a wrong forward on purpose (docs/bisect.md).
For `wavebus verdict` (docs/verdict.md): --save-logits DIR writes DIR/call<N>/replay_rank<g>.npy
(and engine_rank<g>.npy with --engine-out) and DIR/fingerprint.json; --device T=D names the device
index TP rank T stands for (the CPU here: the fingerprint only); --shard-patch FILE loads the same
wrong shard as serve.py --shard-patch (faults.py).
"""
import argparse
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import wavebus_client  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
sys.path.insert(0, HERE)

from transformers import AutoModelForCausalLM, GenerationConfig  # noqa: E402
from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: E402

import faults  # noqa: E402
from wavebus_client.integrations.transformers import SNAPSHOT_INPUTS  # noqa: E402
from wavebus_client.integrations.transformers_probe import INCLUDE, tp_splits  # noqa: E402
from wavebus_client.probe import Probe, parse_layers  # noqa: E402
from wavebus_client.replay import load_call_dir  # noqa: E402


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--snapshots", required=True, help="<cache_root>/snapshots/<compilation_hash> (or a recorder flush's)")
    ap.add_argument("--call", required=True, help="N[,N...]: the call dirs to replay")
    ap.add_argument("--engine-out", help="serve.py's --out (run with --save-logits): compare the logits bit for bit")
    ap.add_argument("--num-blocks", type=int, default=32, help="as serve.py was run")
    ap.add_argument("--page-size", type=int, default=16, help="as serve.py was run")
    ap.add_argument("--tp", type=int, help="TP size to replay at (default: the capture's); 1 joins the ranks' caches")
    ap.add_argument("--probe", help="record every module's output into PROBE/rank<g>/call<N> (wavebus bisect)")
    ap.add_argument("--probe-layers", help="N or LO-HI: only these decoder layers (modules outside layers stay)")
    ap.add_argument("--probe-inputs", action="store_true", help="record module inputs too")
    ap.add_argument("--fault", action="append", default=[], help="weight:RANK:PARAM (noise on RANK's shard of PARAM) | nan:MODULE:RANK (with --probe)")
    ap.add_argument("--shard-patch", help="serve.py's --shard-patch file (a wrong value in one shard's checkpoint)")
    ap.add_argument("--save-logits", help="write DIR/call<N>/replay_rank<g>.npy (and engine_rank<g>.npy with --engine-out)")
    ap.add_argument("--device", action="append", default=[], help="T=D: TP rank T stands for device index D (fingerprint)")
    a = ap.parse_args(argv)
    if not os.path.isdir(a.snapshots):
        raise SystemExit(f"replay: --snapshots {a.snapshots}: not a directory")
    try:
        a.calls = [int(c) for c in a.call.split(",")]
        a.devices = {int(k): int(v) for k, v in (d.split("=") for d in a.device)}
    except ValueError:
        raise SystemExit(f"replay: --call must be N or N,M,... and --device T=D (integers), got --call {a.call!r} --device {a.device!r}")
    a.capture_tp = len(group_dirs(a.snapshots, a.calls[0]))
    if a.tp is None:
        a.tp = a.capture_tp
    if a.tp not in (1, a.capture_tp):
        raise SystemExit(f"replay: --tp {a.tp}: replays at the capture's TP size ({a.capture_tp}) or at 1")
    a.faults = [parse_fault(f, a.tp) for f in a.fault]
    if a.faults and not a.probe:
        raise SystemExit("replay: --fault needs --probe")
    return a


def parse_fault(spec: str, tp: int):
    parts = spec.split(":")
    if len(parts) == 3 and parts[0] in ("weight", "nan"):
        rank = parts[1] if parts[0] == "weight" else parts[2]
        if rank.isdigit() and int(rank) < tp:
            return parts[0], int(rank), parts[2] if parts[0] == "weight" else parts[1]
    raise SystemExit(f"replay: --fault must be weight:RANK:PARAM or nan:MODULE:RANK with RANK < --tp {tp}, got {spec!r}")


def group_dirs(snapshots: str, call: int):
    """The capture's rank<g>/call<N> dirs of one TP group, in tp_rank order."""
    found = []
    for d in sorted(os.listdir(snapshots)):
        p = os.path.join(snapshots, d, f"call{call}")
        if d.startswith("rank") and d[4:].isdigit() and os.path.isdir(p):
            with open(os.path.join(p, "meta.json")) as f:
                found.append((int(json.load(f).get("tp_rank", 0)), p))
    found.sort()
    if not found or [t for t, _ in found] != list(range(len(found))):
        raise SystemExit(f"replay: {snapshots}: need one TP group's rank<g>/call{call} (tp ranks 0..n-1), found tp ranks {[t for t, _ in found]}")
    return [p for _, p in found]


def main(argv) -> int:
    a = parse_args(argv)
    if a.save_logits and "WORLD_SIZE" not in os.environ:
        save_fingerprint(a.save_logits, [a.devices.get(t, t) for t in range(a.tp)])
    if a.tp > 1 and "WORLD_SIZE" not in os.environ:
        # One command per TP group: the ranks under torch's own torchrun (its exit is the worst rank's).
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(a.tp), os.path.abspath(__file__), *argv]
        return subprocess.run(cmd).returncode
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world != a.tp:
        raise SystemExit(f"replay: WORLD_SIZE {world}, but this replay is at TP {a.tp}")
    tp = {"tp_plan": "auto"} if world > 1 else {}
    model = AutoModelForCausalLM.from_pretrained(a.model, attn_implementation="paged|sdpa", dtype=torch.float32, **tp)
    if a.shard_patch:
        faults.shard_patch(model, a.shard_patch, rank, world)
    gen = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(num_blocks=a.num_blocks, max_batch_tokens=256, page_size=a.page_size,
                                  use_async_batching=False, allow_block_sharing=False)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    cache = manager._create_batch_processor().cache  # never started: only its cache is used
    probe = None
    if a.probe:
        plant(model, rank, a.faults)
        probe = Probe(model, global_rank=rank, tp_rank=rank, tp_size=world, split_for=tp_splits(model), include=INCLUDE,
                      layers=parse_layers(a.probe_layers), inputs=a.probe_inputs, label=f"transformers-tp{world}")
    exact = True
    for call in a.calls:
        exact = replay(a, rank, model, cache, call, probe) and exact
    if torch.distributed.is_initialized():
        # tp_plan="auto" made the gloo group: both ranks leave it together. A rank that exits while
        # the other still holds its pairs can abort in teardown ("terminate called without an active
        # exception", SIGABRT; seen once in a suite run after every replay had printed its result).
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0 if exact else 1


def plant(model, rank: int, specs) -> None:
    """--fault, in the replay only: noise (std 0.1) on this rank's shard of a parameter, or a NaN
    written into a module's output (a forward hook registered before the probe's: the probe sees it)."""
    params = dict(model.named_parameters())
    for kind, frank, what in specs:
        if rank != frank:
            continue
        if kind == "weight":
            if what not in params:
                raise SystemExit(f"replay: --fault weight: no parameter {what!r} (e.g. model.layers.1.mlp.up_proj.weight)")
            shard = faults.local(params[what])
            with torch.no_grad():
                shard.add_(torch.randn(shard.shape, generator=torch.Generator().manual_seed(7)) * 0.1)
        else:
            try:
                module = model.get_submodule(what)
            except AttributeError:
                raise SystemExit(f"replay: --fault nan: no module {what!r}") from None
            module.register_forward_hook(lambda _m, _a, out: out.view(-1).__setitem__(0, float("nan")))


def load(a, rank: int, call: int, cache):
    """(meta, inputs, cache bytes) of this rank; at --tp 1 from a TP=N capture, the ranks' caches joined along the heads."""
    dirs = group_dirs(a.snapshots, call)
    if a.tp == len(dirs):
        meta, tensors = load_call_dir(dirs[rank])
        return meta, tensors[:-1], tensors[-1]
    loaded = [load_call_dir(d) for d in dirs]
    meta, first = loaded[0]
    for i, (_, t) in enumerate(loaded[1:], 1):
        if len(t) != len(first) or any(not torch.equal(x, y) for x, y in zip(t[:-1], first[:-1])):
            raise SystemExit(f"replay: {dirs[i]}: its inputs differ from {dirs[0]}'s (not one TP group's forward)")
    alloc = next(iter(cache.cache_allocators.values()))
    heads, dim, dt = alloc.num_key_value_heads, alloc.head_dim, cache.dtype
    if heads % len(dirs):
        raise SystemExit(f"replay: {heads} KV heads do not split over {len(dirs)} ranks")
    rows = [t[-1].view(dt).view(-1, heads // len(dirs), dim) for _, t in loaded]
    joined = torch.cat(rows, dim=1).reshape(-1).view(torch.uint8)
    return meta, first[:-1], joined


def replay(a, rank: int, model, cache, call: int, probe) -> bool:
    meta, inputs, kv = load(a, rank, call, cache)
    if kv.numel() != cache.cache_tensor.numel():
        raise SystemExit(f"replay: the captured cache holds {kv.numel()} bytes, this one {cache.cache_tensor.numel()}: run with serve.py's --num-blocks/--page-size")
    cache.cache_tensor.copy_(kv)  # in place: the allocators' views stay on it
    named = dict(zip(SNAPSHOT_INPUTS, inputs))
    seq_q = named["cu_seq_lens_q"].diff()
    seq_k = named["cu_seq_lens_k"].diff()
    kwargs = {
        "input_ids": named["input_ids"], "position_ids": named["position_ids"], "cu_seq_lens_q": named["cu_seq_lens_q"],
        "cu_seq_lens_k": named["cu_seq_lens_k"], "max_seqlen_q": int(seq_q.max()), "max_seqlen_k": int(seq_k.max()),
        "logits_indices": named["logits_indices"], "logits_to_keep": named["logits_indices"],
        "read_index": [named["read_index"]], "write_index": [named["write_index"]],
        "attention_mask": named.get("attention_mask"), "cache": cache, "use_cache": False,
    }
    if probe is not None:
        probe.begin()
        probe.attach()
    try:
        with torch.no_grad():
            logits = model(**kwargs).logits
    finally:
        if probe is not None:
            probe.detach()
    as_captured = a.tp == a.capture_tp  # else the TP=1 reference of a TP=N capture: no engine output to compare
    g = int(meta.get("global_rank", rank)) if as_captured else 0
    line = {"rank": rank, "global_rank": g, "call": call, "wave": meta["global_step"], "req_ids": meta["req_ids"]}
    if probe is not None:
        line["probe"] = probe.write(a.probe, call)
    exact, want = True, None
    if a.engine_out and as_captured:
        saved = os.path.join(a.engine_out, f"logits_rank{g}_wave{meta['global_step']}.pt")
        if a.save_logits and not os.path.exists(saved):
            line.update(engine_output=None, reason=f"no {saved}")
        else:
            want = torch.load(saved)
            same = logits.shape == want.shape and torch.equal(logits.view(torch.int32), want.view(torch.int32))
            diff = float((logits - want).abs().max()) if logits.shape == want.shape else float("inf")
            line.update(bitwise_equal=bool(same), max_abs_diff=diff)
            exact = bool(same)
    if a.save_logits:
        import numpy as np
        d = os.path.join(a.save_logits, f"call{call}")
        os.makedirs(d, mode=0o700, exist_ok=True)
        np.save(os.path.join(d, f"replay_rank{g}.npy"), logits[0].numpy())
        if want is not None:
            np.save(os.path.join(d, f"engine_rank{g}.npy"), want[0].numpy())
    print(json.dumps(line), flush=True)
    return exact


def save_fingerprint(out: str, devices) -> None:
    """DIR/fingerprint.json: the host and each TP rank's device as this process sees them (`wavebus
    verdict` names them in a device-local verdict)."""
    from wavebus_client.fingerprint import device_fingerprint
    os.makedirs(out, mode=0o700, exist_ok=True)
    doc = {"devices": [dict(device_fingerprint(d), tp_rank=t) for t, d in enumerate(devices)]}
    with open(os.path.join(out, "fingerprint.json"), "w") as f:
        json.dump(doc, f)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
