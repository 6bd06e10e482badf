"""model.py's forward as a torch.nn.Module tree, so the probe (wavebus_client.probe) can hook it.

Same weights (the rank's shard dict, by reference: a corrupted shard shows here too), same
collectives (a Comm), the same torch operations in the same order as model.forward: the logits are
bit for bit the engine's (replay.py --probe --engine-out checks it). Names follow vLLM / HF Llama:
model.embed_tokens, model.layers.<i>.{input_layernorm, self_attn.{q_proj, k_proj, v_proj, attn,
o_proj}, post_attention_layernorm, mlp.{gate_proj, up_proj, down_proj}}, model.norm, lm_head, logits.

TP splits, declared once per module type (SPLITS, and probe_input_split for inputs):
ColumnParallelLinear's output is split on the last dim (heads, MLP columns, vocabulary), as is
PagedAttention's [tokens, heads_per_rank * head_dim] (its q, k, v inputs on dim 1, the heads);
RowParallelLinear all-reduces inside, so its output is replicated (its input is column split);
embedding, norms, decoder layers, self_attn, mlp and the all-gathered logits (whose input is the
LM head's vocabulary slice) are replicated.
"""
from typing import Dict, Optional

import torch

from model import Comm, ModelConfig, paged_attention, rms_norm, rotary
from wavebus_client.probe import COLUMN, REPLICATED, Split


class Embedding(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, ids):
        return self.weight[ids]


class RMSNorm(torch.nn.Module):
    def __init__(self, weight, eps):
        super().__init__()
        self.weight, self.eps = weight, eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class ColumnParallelLinear(torch.nn.Module):
    probe_input_split = REPLICATED

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, x):
        return x @ self.weight.t()


class RowParallelLinear(torch.nn.Module):
    """x @ W.t() over this rank's input columns, then the all-reduce (as vLLM's, reduce_results=True)."""
    probe_input_split = COLUMN

    def __init__(self, weight, comm: Comm):
        super().__init__()
        self.weight, self.comm = weight, comm

    def forward(self, x):
        return self.comm.all_reduce(x @ self.weight.t())


class PagedAttention(torch.nn.Module):
    """Writes this step's K/V through slot_mapping, attends over the paged cache; [T, heads * head_dim]."""
    probe_input_split = Split("column", 1)  # q, k, v: [T, heads_per_rank, head_dim]

    def __init__(self, layer: str, ctx: Dict, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.layer, self.ctx, self.heads, self.kv_heads, self.head_dim = layer, ctx, heads, kv_heads, head_dim

    def forward(self, q, k, v):
        c, D = self.ctx, self.head_dim
        k_cache, v_cache = c["kv"][self.layer]
        k_cache.view(-1, self.kv_heads, D)[c["slot_mapping"]] = k
        v_cache.view(-1, self.kv_heads, D)[c["slot_mapping"]] = v
        a = paged_attention(q, k_cache, v_cache, c["block_table"], c["seq_lens"], c["query_start_loc"], c["positions"],
                            c["block_size"])
        return a.reshape(-1, self.heads * D)


class Attention(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, w, comm: Comm, i: int, ctx: Dict):
        super().__init__()
        p, self.cfg, self.ctx = f"layers.{i}.", cfg, ctx
        self.hq, self.hkv = cfg.heads // comm.tp_size, cfg.kv_heads // comm.tp_size
        self.q_proj, self.k_proj, self.v_proj = (ColumnParallelLinear(w[p + n]) for n in "qkv")
        self.attn = PagedAttention(cfg.layer_names()[i], ctx, self.hq, self.hkv, cfg.head_dim)
        self.o_proj = RowParallelLinear(w[p + "o"], comm)

    def forward(self, h):
        D, pos, theta = self.cfg.head_dim, self.ctx["positions"], self.cfg.rope_theta
        q = rotary(self.q_proj(h).view(-1, self.hq, D), pos, theta)
        k = rotary(self.k_proj(h).view(-1, self.hkv, D), pos, theta)
        v = self.v_proj(h).view(-1, self.hkv, D)
        return self.o_proj(self.attn(q, k, v))


class MLP(torch.nn.Module):
    def __init__(self, w, comm: Comm, p: str):
        super().__init__()
        self.gate_proj, self.up_proj = ColumnParallelLinear(w[p + "gate"]), ColumnParallelLinear(w[p + "up"])
        self.down_proj = RowParallelLinear(w[p + "down"], comm)

    def forward(self, h):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


class DecoderLayer(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, w, comm: Comm, i: int, ctx: Dict):
        super().__init__()
        p = f"layers.{i}."
        self.input_layernorm = RMSNorm(w[p + "attn_norm"], cfg.eps)
        self.self_attn = Attention(cfg, w, comm, i, ctx)
        self.post_attention_layernorm = RMSNorm(w[p + "mlp_norm"], cfg.eps)
        self.mlp = MLP(w, comm, p)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, w, comm: Comm, ctx: Dict):
        super().__init__()
        self.embed_tokens = Embedding(w["embed"])
        self.layers = torch.nn.ModuleList(DecoderLayer(cfg, w, comm, i, ctx) for i in range(cfg.layers))
        self.norm = RMSNorm(w["final_norm"], cfg.eps)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return x


class LogitsGather(torch.nn.Module):
    probe_input_split = COLUMN  # the LM head's vocabulary slice
    def __init__(self, comm: Comm):
        super().__init__()
        self.comm = comm

    def forward(self, x):
        return self.comm.all_gather_last(x)


class CausalLM(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, w, comm: Comm):
        super().__init__()
        self.ctx: Dict = {}
        self.model = Decoder(cfg, w, comm, self.ctx)
        self.lm_head = ColumnParallelLinear(w["lm_head"])
        self.logits = LogitsGather(comm)

    def forward(self, kv, input_ids, positions, slot_mapping, block_table, seq_lens, query_start_loc, block_size: int,
                logits_indices: Optional[torch.Tensor] = None):
        """model.forward's arguments and result (full-vocabulary logits of the selected rows)."""
        self.ctx.clear()
        self.ctx.update(kv=kv, positions=positions, slot_mapping=slot_mapping, block_table=block_table,
                        seq_lens=seq_lens, query_start_loc=query_start_loc, block_size=block_size)
        x = self.model(input_ids)
        rows = query_start_loc[1:] - 1 if logits_indices is None else logits_indices
        return self.logits(self.lm_head(self.model.norm(x[rows])))


SPLITS = {ColumnParallelLinear: COLUMN, PagedAttention: COLUMN, RowParallelLinear: REPLICATED}
