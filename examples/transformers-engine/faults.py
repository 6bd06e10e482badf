"""Test doubles for serve.py and replay.py (named as such: nothing else should use them).

- shard_patch(model, FILE, tp_rank, tp_size): a wrong value in one TP shard's checkpoint. FILE is
  JSON [{"tp_size", "tp_rank", "weight", "index", "add"}]: ``add`` goes into element ``index``
  (flat) of that rank's local shard of parameter ``weight`` (its HF name,
  ``model.layers.1.mlp.up_proj.weight``), on the ranks of a job of that TP size only: the full
  weights (TP=1, bisect's reference) stay right.
- flip_top_mantissa(t): the top mantissa bit of t's first element, in place (a one-off bit flip).
"""
import json

import torch


def local(p):
    """A parameter's local shard (a DTensor's to_local(), else the tensor)."""
    return p.to_local() if hasattr(p, "to_local") else p


def shard_patch(model, path: str, tp_rank: int, tp_size: int) -> int:
    """Apply FILE's items for this (tp_size, tp_rank); returns how many applied."""
    try:
        with open(path) as f:
            items = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"--shard-patch {path}: {e}")
    params = dict(model.named_parameters())
    done = 0
    for i, it in enumerate(items if isinstance(items, list) else [None]):
        try:
            n, r, key, at, add = int(it["tp_size"]), int(it["tp_rank"]), str(it["weight"]), int(it["index"]), float(it["add"])
        except (TypeError, KeyError, ValueError) as e:
            raise SystemExit(f"--shard-patch {path}: item {i}: expected {{tp_size, tp_rank, weight, index, add}}: {e}")
        if key not in params:
            raise SystemExit(f"--shard-patch {path}: item {i}: no parameter {key!r} (HF names: model.layers.1.mlp.up_proj.weight)")
        if (n, r) != (tp_size, tp_rank):
            continue
        shard = local(params[key])
        if not 0 <= at < shard.numel():
            raise SystemExit(f"--shard-patch {path}: item {i}: {key!r}'s shard on tp rank {r} has {shard.numel()} elements, not {at + 1}")
        with torch.no_grad():
            shard.view(-1)[at] += add
        done += 1
    return done


def flip_top_mantissa(t: torch.Tensor) -> None:
    """Flip bit 22 (float32's top mantissa bit) of t's first element, in place."""
    if t.dtype != torch.float32:
        raise SystemExit(f"flip: float32 only, got {t.dtype}")
    bits = t.view(-1)[:1].view(torch.int32)
    bits ^= 1 << 22
