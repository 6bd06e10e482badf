"""A small decoder-only transformer with a paged KV cache, sharded for tensor parallelism.

Everything a rank needs is in `RankWeights` (its shard) and `forward()`; the collectives come in
through a `Comm` (torch.distributed with gloo in the engine, an in-process stand-in in replay.py),
so the same code runs on-line and off-line. Layout follows vLLM: per layer a K and a V cache of
[num_blocks, block_size, num_kv_heads_per_rank, head_dim]; a token's slot is block * block_size + offset.
"""
from dataclasses import dataclass
from typing import Dict, FrozenSet, List

import torch

import device_fault

VOCAB = 256  # byte-level: token id = byte value


@dataclass(frozen=True)
class ModelConfig:
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 4
    head_dim: int = 16
    mlp: int = 128
    rope_theta: float = 10000.0
    eps: float = 1e-6
    seed: int = 1234
    lm_head_std: float = 1.0  # logit std ~ lm_head_std * sqrt(hidden): a confident (peaked) model

    def layer_names(self) -> List[str]:
        return [f"model.layers.{i}.self_attn" for i in range(self.layers)]


def full_weights(cfg: ModelConfig) -> Dict[str, torch.Tensor]:
    """The unsharded weights, drawn from cfg.seed (nothing is downloaded). Same on every rank."""
    g = torch.Generator().manual_seed(cfg.seed)
    H, D = cfg.hidden, cfg.head_dim

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float32) * std

    w = {"embed": randn(VOCAB, H)}
    for i in range(cfg.layers):
        p = f"layers.{i}."
        w[p + "attn_norm"] = 1.0 + randn(H, std=0.1)
        w[p + "q"] = randn(cfg.heads * D, H, std=H ** -0.5)
        w[p + "k"] = randn(cfg.kv_heads * D, H, std=H ** -0.5)
        w[p + "v"] = randn(cfg.kv_heads * D, H, std=H ** -0.5)
        w[p + "o"] = randn(H, cfg.heads * D, std=(cfg.heads * D) ** -0.5)
        w[p + "mlp_norm"] = 1.0 + randn(H, std=0.1)
        w[p + "gate"] = randn(cfg.mlp, H, std=H ** -0.5)
        w[p + "up"] = randn(cfg.mlp, H, std=H ** -0.5)
        w[p + "down"] = randn(H, cfg.mlp, std=cfg.mlp ** -0.5)
    w["final_norm"] = 1.0 + randn(H, std=0.1)
    w["lm_head"] = randn(VOCAB, H, std=cfg.lm_head_std)
    # A prior for readable text: bytes outside printable ASCII get small logits, so a healthy
    # model writes printable (if meaningless) text and corruption shows as control bytes.
    printable = torch.zeros(VOCAB, 1)
    printable[32:127] = 1.0
    w["lm_head"] *= 0.05 + 0.95 * printable
    return w


def shard(cfg: ModelConfig, w: Dict[str, torch.Tensor], tp_rank: int, tp_size: int) -> Dict[str, torch.Tensor]:
    """This rank's shard: q/k/v, gate/up and lm_head column-parallel (output rows split: heads,
    MLP columns, vocabulary), o and down row-parallel (input columns split), the rest replicated."""
    for what, n in (("heads", cfg.heads), ("kv_heads", cfg.kv_heads), ("mlp", cfg.mlp), ("vocab", VOCAB)):
        if n % tp_size:
            raise ValueError(f"tp_size {tp_size} does not divide {what} ({n})")
    D = cfg.head_dim

    def rows(t, n):  # n units of len(t)/n rows each; this rank's share
        per = t.shape[0] // tp_size
        return t[tp_rank * per:(tp_rank + 1) * per].contiguous()

    def cols(t):
        per = t.shape[1] // tp_size
        return t[:, tp_rank * per:(tp_rank + 1) * per].contiguous()

    s = {}
    for k, t in w.items():
        name = k.split(".")[-1]
        if name in ("q", "k", "v", "gate", "up") or k == "lm_head":
            s[k] = rows(t, tp_size)
        elif name in ("o", "down"):
            s[k] = cols(t)
        else:
            s[k] = t.clone()
    return s


def patch_shard(w: Dict[str, torch.Tensor], path: str, tp_rank: int, tp_size: int) -> None:
    """--shard-patch FILE: a wrong value in one TP shard's checkpoint (a resharding bug stands in for
    it: the model's full weights, TP=1, stay right). FILE is JSON [{"tp_size", "tp_rank", "weight",
    "index", "add"}]: `add` is added to element `index` (flat) of that shard of `weight`."""
    import json
    with open(path) as f:
        items = json.load(f)
    for i, it in enumerate(items if isinstance(items, list) else [None]):
        try:
            n, r, key, at, add = int(it["tp_size"]), int(it["tp_rank"]), str(it["weight"]), int(it["index"]), float(it["add"])
        except (TypeError, KeyError, ValueError) as e:
            raise SystemExit(f"--shard-patch {path}: item {i}: expected {{tp_size, tp_rank, weight, index, add}}: {e}")
        if key not in w or not 0 <= at < w[key].numel():
            raise SystemExit(f"--shard-patch {path}: item {i}: no weight {key!r} with element {at}")
        if (n, r) == (tp_size, tp_rank):
            w[key].view(-1)[at] += add


class Comm:
    """The two collectives a TP forward needs. tp_size 1: no-ops."""

    def __init__(self, tp_size: int = 1, group=None):
        self.tp_size, self.group = tp_size, group

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1:
            import torch.distributed as dist
            dist.all_reduce(t, group=self.group)
        return t

    def all_gather_last(self, t: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return t
        import torch.distributed as dist
        parts = [torch.empty_like(t) for _ in range(self.tp_size)]
        dist.all_gather(parts, t.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding (neox style: halves rotated) on [T, heads, head_dim]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = positions.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def paged_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, positions, block_size):
    """Each sequence's queries attend to its keys 0..position, gathered from its blocks."""
    heads, kv_heads = q.shape[1], k_cache.shape[2]
    rep = heads // kv_heads
    out = torch.empty_like(q)
    scale = q.shape[-1] ** -0.5
    for i in range(seq_lens.shape[0]):
        a, b = int(query_start_loc[i]), int(query_start_loc[i + 1])
        n = int(seq_lens[i])
        nb = (n + block_size - 1) // block_size
        blocks = block_table[i, :nb]
        k = k_cache[blocks].reshape(nb * block_size, kv_heads, -1)[:n].repeat_interleave(rep, dim=1)
        v = v_cache[blocks].reshape(nb * block_size, kv_heads, -1)[:n].repeat_interleave(rep, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[a:b], k) * scale
        causal = torch.arange(n)[None, :] > positions[a:b][:, None]  # key index > query position
        s = s.masked_fill(causal[None], float("-inf"))
        out[a:b] = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v)
    return out


def mlp(cfg: ModelConfig, w: Dict[str, torch.Tensor], comm: Comm, p: str, x: torch.Tensor) -> torch.Tensor:
    h = rms_norm(x, w[p + "mlp_norm"], cfg.eps)
    # device_fault: a test double of a faulty device (off unless its file exists; docs/verdict.md)
    m = torch.nn.functional.silu(h @ w[p + "gate"].t()) * device_fault.corrupt(int(p.split(".")[1]), h @ w[p + "up"].t())
    return comm.all_reduce(m @ w[p + "down"].t())


def forward(cfg: ModelConfig, w: Dict[str, torch.Tensor], comm: Comm, kv: Dict[str, tuple], input_ids, positions,
            slot_mapping, block_table, seq_lens, query_start_loc, block_size: int, logits_indices=None,
            skip_attn: FrozenSet[int] = frozenset()) -> torch.Tensor:
    """One step for a mixed batch (prefill chunks and decode rows, concatenated). Writes this
    step's K/V through slot_mapping and returns the full-vocabulary logits of the rows in
    logits_indices (default: each sequence's last row; a speculative step asks for every row of a
    verified draft), [rows, VOCAB], identical on every rank. Layers in skip_attn skip attention
    (and need no KV cache): the layer-skipping draft model of spec.py."""
    D = cfg.head_dim
    hq, hkv = cfg.heads // comm.tp_size, cfg.kv_heads // comm.tp_size
    x = w["embed"][input_ids]
    for i, layer in enumerate(cfg.layer_names()):
        p = f"layers.{i}."
        if i in skip_attn:
            x = x + mlp(cfg, w, comm, p, x)
            continue
        h = rms_norm(x, w[p + "attn_norm"], cfg.eps)
        q = rotary((h @ w[p + "q"].t()).view(-1, hq, D), positions, cfg.rope_theta)
        k = rotary((h @ w[p + "k"].t()).view(-1, hkv, D), positions, cfg.rope_theta)
        v = (h @ w[p + "v"].t()).view(-1, hkv, D)
        k_cache, v_cache = kv[layer]
        k_cache.view(-1, hkv, D)[slot_mapping] = k
        v_cache.view(-1, hkv, D)[slot_mapping] = v
        a = paged_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, positions, block_size)
        x = x + comm.all_reduce(a.reshape(-1, hq * D) @ w[p + "o"].t())
        x = x + mlp(cfg, w, comm, p, x)
    rows = query_start_loc[1:] - 1 if logits_indices is None else logits_indices
    h = rms_norm(x[rows], w["final_norm"], cfg.eps)
    return comm.all_gather_last(h @ w["lm_head"].t())
