"""A transformers continuous-batching server, one process per rank, with wavebus attached.

    wavebus launch --tp 2 -- torchrun --nproc-per-node 2 serve.py --model DIR --out OUT

The model is loaded with tp_plan="auto" when WORLD_SIZE > 1 (DTensor over gloo on CPU); requests
are served by transformers' own ContinuousBatchingManager (paged cache, FIFO scheduler). The lines
that concern wavebus are marked "wavebus:". Test switches: --nan STEP:REQ puts a NaN into request
REQ's rows of the final norm's output at step STEP (a forward hook, on every rank); --save-copies keeps,
at every wave whose end_of_wave copied a KV dump, each request's pages as the engine reads them;
--sample SEED samples (multinomial) with transformers' TP-shared seed instead of greedy.

Test doubles for faulty hardware (rank_divergence's tests set them; nothing else should):
WAVEBUS_TEST_DOUBLE_DIVERGE=WAVE:REQ:RANK pushes request REQ's logits row on rank RANK at wave WAVE
to another argmax (a rank that decides apart); WAVEBUS_TEST_DOUBLE_SEED_APART=1 reseeds each rank's
sampler with its own seed before the first forward (a sampler seeded apart). `wavebus verdict`'s
tests (faults.py): --shard-patch FILE loads a wrong value into one TP shard; --flip-output WAVE:RANK
flips the top mantissa bit of the first logit of wave WAVE on RANK, in this process only (before
--save-logits keeps it: the engine's output is the flipped one).
"""
import argparse
import contextlib
import json
import math
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import wavebus_client  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:  # running from a checkout
    sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))

from transformers import AutoModelForCausalLM, GenerationConfig  # noqa: E402
from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: E402

from wavebus_client.integrations.transformers import attach  # noqa: E402  (wavebus:)

sys.path.insert(0, HERE)
import faults  # noqa: E402  (test doubles)


@contextlib.contextmanager
def whole(path: str, mode: str = "w"):
    """The file at ``path`` written whole (into a temporary file, renamed once written): whoever waits
    for it to exist reads all of it, and a rank killed mid-write (kill -9 tests) leaves none, never a
    truncated one that replay.py would load. (examples/torch-engine/engine.py has the same: each
    example stands alone.)"""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, mode) as f:
        yield f
    os.replace(tmp, path)


def parse_nan(spec):
    try:
        step, req = spec.split(":")
        return int(step), req
    except ValueError:
        raise SystemExit(f"serve: --nan must be STEP:REQ, got {spec!r}") from None


def parse_diverge(spec):
    try:
        wave, req, rank = spec.split(":")
        return int(wave), req, int(rank)
    except ValueError:
        raise SystemExit(f"serve: WAVEBUS_TEST_DOUBLE_DIVERGE must be WAVE:REQ:RANK, got {spec!r}") from None


def save_copy(out: str, rank: int, wave: int, wb) -> None:
    """Each live request's K and V pages at this wave, read through transformers' own page views."""
    cache = wb.processor.cache
    alloc = next(iter(cache.cache_allocators.values()))
    pages_per_block = alloc.block_physical_stride // alloc.tokens_per_page
    reqs = {}
    for rid, blocks in alloc.block_table.items():
        layers = {}
        for idx in alloc.layer_indices:
            k_pages, v_pages = alloc._kv_page_views[idx]
            rows = torch.tensor(blocks, dtype=torch.long) * pages_per_block
            layers[f"model.layers.{idx}.self_attn"] = {"k": k_pages[rows].clone(), "v": v_pages[rows].clone()}
        reqs[rid] = {"block_ids": list(blocks), "layers": layers}
    with whole(os.path.join(out, f"copy_rank{rank}_wave{wave}.pt"), "wb") as f:
        torch.save(reqs, f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, help="a directory written by make_model.py (or any causal LM)")
    ap.add_argument("--out", required=True, help="outputs.json (rank 0) and the test copies go here")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--num-blocks", type=int, default=32, help="cache size in blocks (docs/transformers.md, cache sizing)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--nan", help="STEP:REQ: a NaN in request REQ's rows of the last hidden state at step STEP")
    ap.add_argument("--garble", type=int, help="STEP: from step STEP on, this rank's LM head shard is small noise (a corrupted head)")
    ap.add_argument("--save-copies", action="store_true")
    ap.add_argument("--sample", type=int, metavar="SEED", help="sample (do_sample) with this seed, which transformers shares across the TP group")
    ap.add_argument("--save-logits", action="store_true", help="keep every step's logits (OUT/logits_rank<r>_wave<w>.pt; replay.py compares)")
    ap.add_argument("--step-sleep-ms", type=int, default=0, help="sleep this long in every forward (a live job for status/dump/capture)")
    ap.add_argument("--shard-patch", help="test double: JSON [{tp_size, tp_rank, weight, index, add}] (faults.py)")
    ap.add_argument("--flip-output", help="WAVE:RANK: test double, a one-off bit flip in that wave's first logit on RANK")
    ap.add_argument("--no-wavebus", action="store_true", help="serve without wavebus (a baseline)")
    ap.add_argument("--wavebus-tag", help="attach()'s tag (each rank adds -r<rank>): names the rank's shared-memory segments (default hf<pid>)")
    ap.add_argument("--result-dir", help="write <dir>/rank<g>.json (waves, endOfWaveTimeouts) at the end (wavebus demo reads it)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(0)

    tp = {"tp_plan": "auto"} if world > 1 else {}
    model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="paged|sdpa", dtype=torch.float32, **tp)
    if args.shard_patch:
        faults.shard_patch(model, args.shard_patch, rank, world)
    gen = GenerationConfig(max_new_tokens=args.max_tokens, do_sample=args.sample is not None, eos_token_id=-1, pad_token_id=0)
    # Cache sizing: transformers sizes the cache from free memory by default (max_memory_percent of
    # it); on CPU under TP=2 that is several GB per rank. num_blocks and max_batch_tokens fix it.
    cb = ContinuousBatchingConfig(num_blocks=args.num_blocks, max_batch_tokens=256, page_size=args.page_size,
                                  return_logprobs=True, use_async_batching=False, allow_block_sharing=False,
                                  **({"seed": args.sample} if args.sample is not None else {}))
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)

    wb = None
    if not args.no_wavebus:
        on_copy = (lambda wave, _p: save_copy(args.out, rank, wave, wb)) if args.save_copies else None
        tag = f"{args.wavebus_tag}-r{rank}" if args.wavebus_tag else None
        wb = attach(manager, on_copy=on_copy, tag=tag)  # wavebus: the one line (and wb.close() at the end)

    if args.nan:
        step, req = parse_nan(args.nan)

        def inject(_module, _args, output):
            if wb is not None and wb.wave == step:
                for rid, first, n, _has in wb.batch():
                    if rid == req:
                        output[0, first:first + n] = float("nan")
            return output

        # After the last attention: a NaN earlier (the embedding) reaches every request of a packed
        # paged|sdpa batch, whose masked attention still multiplies the NaN values by zero weights.
        model.model.norm.register_forward_hook(inject)

    if args.garble is not None:
        def garble(_module, _args):
            w = model.lm_head.weight
            if wb is not None and wb.wave == args.garble:
                local = w.to_local() if hasattr(w, "to_local") else w
                noise = torch.randn(local.shape, generator=torch.Generator().manual_seed(1000 + rank)) * 1e-3
                with torch.no_grad():
                    local.copy_(noise)

        model.register_forward_pre_hook(garble)

    diverge = os.environ.get("WAVEBUS_TEST_DOUBLE_DIVERGE")
    if diverge:
        d_wave, d_req, d_rank = parse_diverge(diverge)

        def push(_module, _args, output):
            # Test double: this rank's logits row of the request given another argmax at that wave.
            if wb is None or wb.wave != d_wave or rank != d_rank:
                return output
            logits = output.logits
            sampled = [(rid, first + n - 1) for rid, first, n, has in wb.batch() if has]
            rows = [k for k, (rid, _last) in enumerate(sampled) if rid == d_req]
            if not rows:
                raise SystemExit(f"serve: WAVEBUS_TEST_DOUBLE_DIVERGE: {d_req} samples nothing at wave {d_wave}")
            # The model kept only the sampled rows (logits_to_keep), or every token's (its last row).
            row = rows[0] if logits.shape[1] == len(sampled) else sampled[rows[0]][1]
            with torch.no_grad():
                top = int(logits[0, row].argmax())
                logits[0, row, (top + 1) % logits.shape[-1]] = logits[0, row, top] + 1000.0
            return output

        model.register_forward_hook(push)

    if os.environ.get("WAVEBUS_TEST_DOUBLE_SEED_APART") == "1":
        def reseed(_module, _args):
            # Test double: after transformers seeded the TP group alike, each rank reseeded apart.
            if wb is not None and wb.wave == 1:
                torch.manual_seed(1000 + rank)

        model.register_forward_pre_hook(reseed)

    if args.flip_output:
        try:
            f_wave, f_rank = (int(x) for x in args.flip_output.split(":"))
        except ValueError:
            raise SystemExit(f"serve: --flip-output must be WAVE:RANK, got {args.flip_output!r}") from None

        def flip(_module, _args, output):
            if wb is not None and wb.wave == f_wave and rank == f_rank:
                faults.flip_top_mantissa(output.logits)
            return output

        model.register_forward_hook(flip)  # before keep's: the saved logits are the flipped ones

    if args.save_logits:
        def keep(_module, _args, output):
            if wb is not None:
                with whole(os.path.join(args.out, f"logits_rank{rank}_wave{wb.wave}.pt"), "wb") as f:
                    torch.save(output.logits.detach().clone(), f)

        model.register_forward_hook(keep)

    if args.step_sleep_ms:
        model.register_forward_pre_hook(lambda *_: time.sleep(args.step_sleep_ms / 1000))

    with open(os.path.join(args.out, f"pid_rank{rank}"), "w") as f:
        f.write(str(os.getpid()))  # a test kills a rank by it
    manager.start()
    t0 = time.monotonic()
    prompts = [[(7 * i + 3 * j + 1) % 250 + 1 for j in range(5 + i % 3)] for i in range(args.requests)]
    ids = [f"req-{i}" for i in range(args.requests)]
    for rid, p in zip(ids, prompts):
        manager.add_request(p, request_id=rid, max_new_tokens=args.max_tokens)
    results = {}
    while len(results) < len(ids):
        r = manager.get_result(timeout=60)
        if r is None:
            raise SystemExit(f"serve: rank {rank}: no result within 60 s ({len(results)} of {len(ids)} done)")
        if r.is_finished():
            results[r.request_id] = r
    seconds = time.monotonic() - t0
    manager.stop(block=True)
    if rank == 0:
        out = {"requests": {rid: {"prompt": p, "tokens": list(results[rid].generated_tokens),
                                  "logprobs": [float(x) if math.isfinite(x) else None for x in (results[rid].logprobs or [])]} for rid, p in zip(ids, prompts)},
               "waves": wb.wave if wb else 0, "seconds": seconds,
               # the tensor path's heads (through the ring or inline) and rows it could not give
               "telemetry": {**wb.tensor_batch.stats, **wb.rows.stats, "live_rows": wb.rows.live} if wb else None}
        with whole(os.path.join(args.out, "outputs.json")) as f:
            json.dump(out, f)
    if args.result_dir:
        os.makedirs(args.result_dir, exist_ok=True)
        with whole(os.path.join(args.result_dir, f"rank{rank}.json")) as f:
            json.dump({"rank": rank, "waves": wb.wave if wb else 0,
                       "endOfWaveTimeouts": wb.client.stats.get("end_of_wave_timeouts", 0) if wb else 0}, f)
    if wb is not None:
        wb.close()
    print(f"rank {rank} done: {len(results)} requests, {wb.wave if wb else 0} waves, {seconds:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
