"""Probe trees of a pipeline-parallel forward for test/bisect.test.ts: the torch engine's module
tree (examples/torch-engine/modules.py) at TP=1, run whole (OUT/pp1, the reference) and as two PP
stages (OUT/pp2: stage 0 = rank 0 runs the embedding and layer 0, stage 1 = rank 1 the rest),
the stage boundary tensor handed from one to the other as a send/recv would. The engine has no
PP; this is the layout a PP engine's probe writes (pp_rank, pp_size in meta.json).

    probe_pp.py OUT [--corrupt-boundary]   (noise on what stage 1 receives)
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = os.path.join(HERE, "..", "..", "examples", "torch-engine")
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
sys.path.insert(0, ENGINE)

import torch  # noqa: E402

from model import Comm, ModelConfig, full_weights, shard  # noqa: E402
from modules import SPLITS, CausalLM  # noqa: E402
from wavebus_client.probe import Probe  # noqa: E402

INCLUDE = ["model.*", "lm_head", "logits"]  # not the Decoder itself: stage-split, it never runs whole


def batch(cfg: ModelConfig):
    ids = torch.tensor(list(b"Hello, pipe"), dtype=torch.int64)
    n, bs = ids.shape[0], 4
    blocks = (n + bs - 1) // bs
    kv = {layer: (torch.zeros(8, bs, cfg.kv_heads, cfg.head_dim), torch.zeros(8, bs, cfg.kv_heads, cfg.head_dim))
          for layer in cfg.layer_names()}
    return dict(kv=kv, input_ids=ids, positions=torch.arange(n), slot_mapping=torch.arange(bs, bs + n),
                block_table=torch.arange(1, blocks + 1)[None, :], seq_lens=torch.tensor([n]),
                query_start_loc=torch.tensor([0, n]), block_size=bs)


def main(out: str, corrupt: bool) -> None:
    torch.set_num_threads(1)
    cfg = ModelConfig()
    w = shard(cfg, full_weights(cfg), 0, 1)
    model = CausalLM(cfg, w, Comm(1))
    b = batch(cfg)
    with Probe(model, splits=SPLITS, include=INCLUDE, inputs=True, label="pp1") as p:
        model(**b)
    p.write(os.path.join(out, "pp1"), 0)

    b = batch(cfg)  # a fresh cache: the run above wrote its K/V
    model.ctx.clear()
    model.ctx.update({k: v for k, v in b.items() if k not in ("input_ids",)})
    with Probe(model, global_rank=0, pp_rank=0, pp_size=2, splits=SPLITS, include=INCLUDE, inputs=True, label="pp2") as s0:
        sent = model.model.layers[0](model.model.embed_tokens(b["input_ids"]))
    s0.write(os.path.join(out, "pp2"), 0)
    received = sent.clone()
    if corrupt:  # a transfer that delivered the wrong bytes for one token
        received[3] += torch.randn(received.shape[1], generator=torch.Generator().manual_seed(5))
    with Probe(model, global_rank=1, pp_rank=1, pp_size=2, splits=SPLITS, include=INCLUDE, inputs=True, label="pp2") as s1:
        x = model.model.layers[1](received)
        rows = b["query_start_loc"][1:] - 1
        model.logits(model.lm_head(model.model.norm(x[rows])))
    s1.write(os.path.join(out, "pp2"), 0)


if __name__ == "__main__":
    main(sys.argv[1], "--corrupt-boundary" in sys.argv[2:])
