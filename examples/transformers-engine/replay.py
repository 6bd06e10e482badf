"""Replay a captured forward through transformers' own model; compare with the engine's logits.

    torchrun --standalone --nproc-per-node 2 replay.py --model DIR --snapshots CACHE/snapshots/HASH --call 0,1 --engine-out OUT

Every rank loads the model as serve.py does (tp_plan="auto" when WORLD_SIZE > 1), builds a paged
cache of the same geometry through transformers' own manager, puts the captured cache bytes into it,
and runs the model on the captured inputs (wavebus_client.integrations.transformers.SNAPSHOT_INPUTS,
in that order, then the cache). Prints one JSON line per rank: bitwise equality and the largest
|difference| with the logits serve.py --save-logits kept for that wave; exits 1 unless bit-exact.
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import wavebus_client  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))

from transformers import AutoModelForCausalLM, GenerationConfig  # noqa: E402
from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: E402

from wavebus_client.integrations.transformers import SNAPSHOT_INPUTS  # noqa: E402
from wavebus_client.replay import load_call_dir  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--snapshots", required=True, help="<cache_root>/snapshots/<compilation_hash>")
    ap.add_argument("--call", type=lambda v: [int(x) for x in v.split(",")], required=True, help="N[,N...]: the call dirs to replay")
    ap.add_argument("--engine-out", required=True, help="serve.py's --out (run with --save-logits)")
    ap.add_argument("--num-blocks", type=int, default=32, help="as serve.py was run")
    ap.add_argument("--page-size", type=int, default=16, help="as serve.py was run")
    args = ap.parse_args()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    tp = {"tp_plan": "auto"} if world > 1 else {}
    model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="paged|sdpa", dtype=torch.float32, **tp)
    gen = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(num_blocks=args.num_blocks, max_batch_tokens=256, page_size=args.page_size,
                                  use_async_batching=False, allow_block_sharing=False)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    cache = manager._create_batch_processor().cache  # never started: only its cache is used

    exact = True
    for call in args.call:
        exact = replay(args, rank, model, cache, call) and exact
    if torch.distributed.is_initialized():
        # tp_plan="auto" made the gloo group: both ranks leave it together. A rank that exits while
        # the other still holds its pairs can abort in teardown ("terminate called without an active
        # exception", SIGABRT; seen once in a suite run after every replay had printed its result).
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0 if exact else 1


def replay(args, rank: int, model, cache, call: int) -> bool:
    meta, tensors = load_call_dir(os.path.join(args.snapshots, f"rank{rank}", f"call{call}"))
    *inputs, kv = tensors
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
    with torch.no_grad():
        logits = model(**kwargs).logits
    want = torch.load(os.path.join(args.engine_out, f"logits_rank{rank}_wave{meta['global_step']}.pt"))
    same = logits.shape == want.shape and torch.equal(logits.view(torch.int32), want.view(torch.int32))
    diff = float((logits - want).abs().max()) if logits.shape == want.shape else float("inf")
    print(json.dumps({"rank": rank, "call": call, "wave": meta["global_step"], "req_ids": meta["req_ids"],
                      "bitwise_equal": bool(same), "max_abs_diff": diff}), flush=True)
    return bool(same)


if __name__ == "__main__":
    sys.exit(main())
