"""A tensor-parallel serving engine for the model in model.py, instrumented for wavebus.

One process per rank, started by `wavebus launch` (through torchrun_env.py, or any launcher that
sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). All ranks form one TP group over
gloo. Requests arrive over the first steps, are batched continuously and decoded greedily (with
--spec-tokens K, speculatively: spec.py); the text is written to OUT/outputs.json by rank 0. See docs/torch-engine.md.
"""
import argparse
import contextlib
import json
import os
import time
import sys
from typing import List

# torch 2.x's pip wheels compute matmuls in MKL, which picks its kernel by the operands' memory
# alignment: without conditional numerical reproducibility, replay.py's logits can differ from the
# engine's in the last bits (seen at 9- and 1-row forwards). Set before torch loads MKL; the engine
# and replay.py both set it, so their bits agree. (Debian's torch 1.13 uses OpenBLAS: no effect.)
os.environ.setdefault("MKL_CBWR", "COMPATIBLE")

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import wavebus_client  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:  # running from a checkout
    sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))

sys.path.insert(0, HERE)
import device_fault  # noqa: E402
from model import VOCAB, Comm, ModelConfig, forward, full_weights, patch_shard, shard  # noqa: E402
from scheduler import Request, Scheduler  # noqa: E402
from spec import Drafter, verify  # noqa: E402
from wavebus_hooks import WavebusHooks  # noqa: E402

PROMPTS = ["The quick brown fox ", "Hello, wavebus! ", "Tensor parallel ", "Paged attention reads ",
           "Once upon a time ", "KV blocks: ", "Greedy decoding of ", "wave after wave "]


@contextlib.contextmanager
def whole(path: str, mode: str = "w"):
    """The file at ``path`` written whole: into a temporary file, renamed once written. A rank killed
    mid-write (the recorder's kill -9 tests) leaves the earlier file or none, never a truncated one
    that replay.py or a test waiting for the file would read."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, mode) as f:
        yield f
    os.replace(tmp, path)


def env_int(name: str) -> int:
    v = os.environ.get(name)
    if v is None or not v.strip().lstrip("-").isdigit():
        raise SystemExit(f"engine: environment variable {name} must be an integer (torchrun / wavebus launch sets it), got {v!r}")
    return int(v)


def parse_fault(spec: str):
    """'none' | 'nan:STEP:REQ' (a NaN in the embedding row request REQ feeds at forward STEP) |
    'garble:STEP' (the LM head overwritten with small garbage from forward STEP on) |
    'draft:STEP' (noise on the draft model's LM head from forward STEP on; needs --spec-tokens) |
    'diverge:STEP:REQ:RANK' (on RANK only, request REQ's logits row at forward STEP pushed so its
    argmax is another token: a rank that samples apart) |
    'drop:STEP:REQ:RANK' (on RANK only, the scheduler leaves request REQ out of forward STEP, its
    tokens padded (id 0, position 0) so the collectives keep their shape: inputs that differ) |
    'nodigest:STEP:COUNT:RANK' (a test double for a rank whose client lost its decision ring: on RANK
    only, forwards STEP..STEP+COUNT-1 write no rank_divergence digest; the rank is "unknown" there)."""
    parts = spec.split(":")
    try:
        if parts == ["none"]:
            return None
        if parts[0] == "nan" and len(parts) == 3:
            return ("nan", int(parts[1]), int(parts[2]))
        if parts[0] in ("garble", "draft") and len(parts) == 2:
            return (parts[0], int(parts[1]))
        if parts[0] in ("diverge", "drop", "nodigest") and len(parts) == 4:
            return (parts[0], int(parts[1]), int(parts[2]), int(parts[3]))
    except ValueError:
        pass
    raise SystemExit(f"engine: --fault must be none, nan:STEP:REQ, garble:STEP, draft:STEP, diverge:STEP:REQ:RANK, drop:STEP:REQ:RANK or nodigest:STEP:COUNT:RANK, got {spec!r}")


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="directory for outputs.json and the engine's own copies (logits, pools)")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--arrive-every", type=int, default=2, help="request i arrives at step 1 + i * this")
    ap.add_argument("--num-blocks", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--spec-tokens", type=int, default=0, help="speculative decoding: draft tokens per step (0: off)")
    ap.add_argument("--draft-noise", type=float, default=2.0, help="std of the noise a draft:STEP fault adds to the draft's LM head")
    ap.add_argument("--fault", action="append", default=[], help="none | nan:STEP:REQ | garble:STEP | draft:STEP (repeatable)")
    ap.add_argument("--save-every-forward", action="store_true", help="save every forward's logits (replay.py compares a flight recorder flush with them)")
    ap.add_argument("--step-sleep-ms", type=int, default=0, help="sleep this long after each forward (a test kills the engine mid-run)")
    ap.add_argument("--raise-at", help="STEP:RANK: raise an uncaught RuntimeError inside forward STEP on RANK (after its inputs are staged)")
    ap.add_argument("--result-dir", help="write <dir>/rank<g>.json (forwards, waves, endOfWaveTimeouts, captures, snapshotsSkipped) at the end")
    ap.add_argument("--dp", type=int, default=1, help="data-parallel replicas: the world splits into DP groups of world/dp TP ranks")
    ap.add_argument("--flip-byte", action="append", default=[], help="RANK:WEIGHT:BYTE: flip one byte of that weight shard on that rank at load (a fingerprint test)")
    ap.add_argument("--env-on-rank", action="append", default=[], help="RANK:NAME=VALUE: set an environment variable on that rank only, before meeting the agent")
    ap.add_argument("--shard-patch", help="JSON file: a wrong value in one TP shard's checkpoint (model.patch_shard; docs/verdict.md)")
    ap.add_argument("--flip-output", action="append", default=[], help="STEP:RANK: flip the top mantissa bit of logits[0, 0] of forward STEP on RANK, in this process only (a one-off fault)")
    ap.add_argument("--linger", type=int, default=3, help="idle waves after the last request (a dump armed late still runs)")
    args = ap.parse_args(argv)
    faults = [f for f in (parse_fault(x) for x in args.fault) if f is not None]
    if args.spec_tokens < 0:
        raise SystemExit(f"engine: --spec-tokens must be >= 0, got {args.spec_tokens}")
    if args.spec_tokens == 0 and any(f[0] == "draft" for f in faults):
        raise SystemExit("engine: --fault draft:STEP needs --spec-tokens > 0 (there is no draft model otherwise)")
    rank, world = env_int("RANK"), env_int("WORLD_SIZE")
    device_fault.set_device(env_int("LOCAL_RANK"))  # the faulty-device test double keys on the device index
    flips = set()
    for spec in args.flip_output:
        st, _, rk = spec.partition(":")
        if not st.isdigit() or not rk.isdigit():
            raise SystemExit(f"engine: --flip-output must be STEP:RANK, got {spec!r}")
        flips.add((int(st), int(rk)))
    if args.dp < 1 or world % args.dp:
        raise SystemExit(f"engine: --dp must divide WORLD_SIZE ({world}), got {args.dp}")
    tp, tp_rank = world // args.dp, rank % (world // args.dp)
    for spec in args.env_on_rank:
        r, _, kv = spec.partition(":")
        name, eq, value = kv.partition("=")
        if not r.isdigit() or not name or not eq:
            raise SystemExit(f"engine: --env-on-rank must be RANK:NAME=VALUE, got {spec!r}")
        if int(r) == rank:
            os.environ[name] = value
    torch.set_num_threads(1)  # one thread: the same reduction order on-line and in replay.py
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"pid_rank{rank}"), "w") as f:  # a test kills this process by it
        f.write(str(os.getpid()))
    raise_at = tuple(int(x) for x in args.raise_at.split(":")) if args.raise_at else None
    if world > 1:
        import torch.distributed as dist
        addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), env_int("MASTER_PORT")
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)
    group = None
    if world > 1 and args.dp > 1:
        # Every rank makes every replica's TP group (torch.distributed's rule), then keeps its own.
        groups = [dist.new_group(list(range(d * tp, (d + 1) * tp))) for d in range(args.dp)]
        group = groups[rank // tp]
    cfg = ModelConfig(seed=args.seed)
    w = shard(cfg, full_weights(cfg), tp_rank, tp)
    flip_bytes(w, args.flip_byte, rank)
    if args.shard_patch:
        patch_shard(w, args.shard_patch, tp_rank, tp)
    comm = Comm(tp, group)
    kv_heads = cfg.kv_heads // tp
    max_tokens = (max(len(p) for p in PROMPTS) + 1 + args.spec_tokens) * args.requests
    max_blocks = -(-(max(len(p) for p in PROMPTS) + args.max_tokens + args.spec_tokens) // args.block_size)
    hooks = WavebusHooks(tag=f"wbtorch-{os.getpid()}", layers=cfg.layer_names(), num_blocks=args.num_blocks,
                         block_size=args.block_size, kv_heads=kv_heads, head_dim=cfg.head_dim, max_tokens=max_tokens,
                         max_seqs=args.requests, max_blocks_per_seq=max_blocks, num_spec_tokens=args.spec_tokens,
                         weights=w)
    if world > 1:
        # Every rank has loaded and met its agent (weight checksums sent) before any serves: what a
        # real engine's startup collective gives, and what makes every report's fingerprint_diff whole.
        dist.barrier()
    drafter = Drafter(cfg, w, comm, args.num_blocks, args.block_size, kv_heads) if args.spec_tokens else None
    reqs = [Request(f"req-{i}", list(PROMPTS[i % len(PROMPTS)].encode()), args.max_tokens, 1 + i * args.arrive_every)
            for i in range(args.requests)]
    sched = Scheduler(reqs, args.num_blocks, args.block_size, max_running=args.requests)
    graph = f"torch-engine-tp{tp}"
    wave, step, idle, tel, timeouts, freed = 0, 0, 0, None, 0, []
    spec_log = {r.req_id: [] for r in reqs}  # [forward, draft_len, accepted] per verified draft, as sent
    while idle < args.linger:
        wave += 1
        hooks.wave_head(wave, tel)
        tel = None
        for f in faults:
            if f[0] == "draft" and f[1] == step + 1 and not drafter.perturbed:  # before this forward's drafts
                drafter.perturb(rank, args.draft_noise)
        batch = sched.schedule(wave, drafter, args.spec_tokens)
        if batch is not None:
            step += 1
            views = hooks.stage_inputs(batch)
            restores = [plant(f, step, batch, w, reqs, cfg, rank, views) for f in faults]
            # rank_divergence: a digest of this forward's inputs (a ring write; nothing when off).
            silent = any(f[0] == "nodigest" and f[1] <= step < f[1] + f[2] and f[3] == rank for f in faults)
            if not silent:
                hooks.client.decided_inputs(wave, views["input_ids"], views["positions"], views["query_start_loc"])
            captured, call_dir = hooks.before_forward(step, batch, views, graph)
            if raise_at == (step, rank):
                raise RuntimeError(f"engine: --raise-at {step}:{rank}: an error inside forward {step}")
            logits = forward(cfg, w, comm, hooks.kv, views["input_ids"], views["positions"], views["slot_mapping"],
                             views["block_table"], views["seq_lens"], views["query_start_loc"], args.block_size,
                             views["logits_indices"])
            if (step, rank) in flips:  # a bit flipped in this forward's output, nowhere else (no replay can reproduce it)
                logits.view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 22)
            for restore in restores:
                if restore is not None:
                    restore()
            if captured or args.save_every_forward:  # the engine's own result of the forward, for replay.py to compare with
                with whole(os.path.join(args.out, f"forward_rank{rank}_step{step}.pt"), "wb") as f:
                    torch.save({"logits": logits.clone(), "call_dir": call_dir, "step": step}, f)
            if args.step_sleep_ms:
                time.sleep(args.step_sleep_ms / 1000)
            hooks.check_logits(logits, batch)
            for f in faults:
                if f is not None and f[0] == "diverge" and f[1] == step and f[3] == rank:
                    row = batch.reqs.index(reqs[f[2]])
                    top = int(logits[row].argmax())
                    logits[row, (top + 1) % logits.shape[1]] = logits[row, top] + 1.0
            logp = torch.log_softmax(logits, dim=-1)
            argmax_t = logits.argmax(dim=-1)
            # rank_divergence: a digest of the token column this rank decided, in the telemetry's row order.
            if not silent:
                hooks.client.decided(wave, argmax_t)
            argmax = argmax_t.tolist()
            tokens, lps, row = [], [], 0
            for r, d in zip(batch.reqs, batch.drafts):  # greedy: a plain row keeps its argmax, a draft the verified prefix + bonus
                new = verify(argmax[row:row + len(d) + 1], d)
                tokens.append(new)
                lps.append([logp[row + j, t].item() for j, t in enumerate(new)])
                row += len(d) + 1
                if d:
                    spec_log[r.req_id].append([step, len(d), len(new)])
            finished = sched.commit(batch, tokens)
            sched.retire(finished)
            tel = hooks.telemetry(batch, tokens, lps, finished, freed)
        elif freed:
            tel = hooks.freed_telemetry(freed)
        res = hooks.end_of_wave(wave)
        timeouts += int(res.timed_out)
        if res.dumps_written:  # the agent copied KV blocks at this point: keep the pool as it was
            with whole(os.path.join(args.out, f"pool_rank{rank}_wave{wave}.pt"), "wb") as f:
                torch.save({f"{l}.{kv}": hooks.kv[l][j].clone() for l in cfg.layer_names() for j, kv in enumerate("kv")}, f)
        # Finished requests give their blocks back now, except one with a dump due at the end of a
        # wave already decided (armed lookahead waves ahead): kept a step, then asked again. The next
        # telemetry says freed.
        kept = hooks.pending_dumps([r.req_id for r in sched.holding])  # one call for all; () when none
        freed = [r for r in sched.holding if r.req_id not in kept] if kept else list(sched.holding)
        sched.release(freed)
        idle = idle + 1 if sched.idle() else 0
    # Captures taken, and forwards a capture would have taken that were skipped because the agent did
    # not answer before_forward within its bound (the client's warning says so too): a skipped
    # forward is never captured later, so a run that needed the capture can tell a miss from a bug.
    capture_counts = {"captures": hooks.client.stats["captures"], "snapshotsSkipped": hooks.client.stats["snapshots_skipped"]}
    hooks.close()
    if rank == 0:
        out = {r.req_id: {"prompt": bytes(r.prompt).decode("latin-1"), "text": bytes(r.output).decode("latin-1"),
                          "tokens": r.output, "spec": spec_log[r.req_id]} for r in sched.done}
        spec = {"spec_tokens": args.spec_tokens, "draft_forwards": drafter.forwards if drafter else 0}
        with whole(os.path.join(args.out, "outputs.json")) as f:
            json.dump({"tp": tp, "dp": args.dp, "steps": step, "waves": wave, "spec": spec, "requests": out}, f, indent=1)
        for r in sched.done:
            print(f"{r.req_id}: {bytes(r.prompt).decode('latin-1')!r} -> {bytes(r.output).decode('latin-1')!r}", flush=True)
    if args.result_dir:
        os.makedirs(args.result_dir, exist_ok=True)
        with whole(os.path.join(args.result_dir, f"rank{rank}.json")) as f:
            json.dump({"rank": rank, "forwards": step, "waves": wave, "endOfWaveTimeouts": timeouts, **capture_counts}, f)
    print(f"rank {rank} done: {step} forwards, {wave} waves, end_of_wave timeouts {timeouts}, "
          f"captures {capture_counts['captures']}, snapshots skipped {capture_counts['snapshotsSkipped']}", flush=True)
    if world > 1:
        import torch.distributed as dist
        dist.destroy_process_group()
    return 0


def flip_bytes(w, specs, rank):
    """--flip-byte RANK:WEIGHT:BYTE: one byte of one weight shard inverted on one rank (a silent corruption)."""
    for spec in specs:
        parts = spec.split(":")
        if len(parts) != 3 or not parts[0].isdigit() or parts[1] not in w or not parts[2].isdigit():
            raise SystemExit(f"engine: --flip-byte must be RANK:WEIGHT:BYTE with a weight of {sorted(w)}, got {spec!r}")
        if int(parts[0]) == rank:
            raw = w[parts[1]].view(-1).view(torch.uint8)
            raw[int(parts[2])] ^= 0xFF


def plant(fault, step, batch, w, reqs, cfg, rank, views):
    """Faults by real means; returns how to undo a transient one after the forward."""
    if fault is None or fault[0] in ("draft", "diverge", "nodigest") or step != fault[1]:  # draft: on the drafter; diverge: on the logits
        return None
    if fault[0] == "drop":
        if fault[3] == rank:  # this rank's scheduler left the request out: its tokens are padding here
            i = batch.reqs.index(reqs[fault[2]])
            lo, hi = batch.query_start_loc[i], batch.query_start_loc[i + 1]
            views["input_ids"][lo:hi] = 0
            views["positions"][lo:hi] = 0
        return None
    if fault[0] == "garble":  # a corrupted LM head: its slice on every rank overwritten with small garbage
        g = torch.Generator().manual_seed(99 + rank)
        w["lm_head"].copy_(torch.randn(w["lm_head"].shape, generator=g) * 1e-3)
        return None
    target = reqs[fault[2]]
    if target not in batch.reqs:
        raise SystemExit(f"engine: --fault nan:{fault[1]}:{fault[2]}: {target.req_id} is not in forward {step}")
    i = batch.reqs.index(target)
    tok = batch.input_ids[batch.query_start_loc[i]]
    row = w["embed"][tok].clone()
    w["embed"][tok] = float("nan")  # one weight row: NaN flows through attention into this request's KV and logits

    def restore():
        w["embed"][tok] = row
    return restore


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
