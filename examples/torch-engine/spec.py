"""Speculative decoding: a layer-skipping draft model proposes k tokens, the target verifies them
in one forward, greedy acceptance.

The draft is the target itself with the last layer's attention skipped (self-speculative decoding,
as in "Draft & Verify"): it shares every weight tensor with the target's shard, runs the same TP
collectives, and needs a KV cache only for the layers that keep attention (its own pool, same
block ids as the target's). Along the target's greedy text it agrees with the target's argmax
about three times in four, so a healthy run accepts most drafts and a broken draft shows.

KV bookkeeping (per request): `computed` counts tokens whose target K/V are valid, `draft_computed`
the same in the draft's pool. Verification writes K/V for the last token and every draft token;
the slots of rejected drafts are stale and are simply overwritten by the next step, whose writes
start at `computed` (attention never reads past a query's own position). The draft catches up
from `draft_computed` at its first forward of a step (the whole prompt the first time, then one
token, or two when every draft was accepted).
"""
from typing import Dict, List, Tuple

import torch

from model import Comm, ModelConfig, forward


def verify(target_tokens: List[int], draft: List[int]) -> List[int]:
    """Greedy acceptance: the longest prefix of the draft that equals the target's argmax at each
    position, then the target's own next token (the bonus). target_tokens has len(draft) + 1
    entries (the argmax of every verified row)."""
    a = 0
    while a < len(draft) and target_tokens[a] == draft[a]:
        a += 1
    return draft[:a] + [target_tokens[a]]


class Drafter:
    def __init__(self, cfg: ModelConfig, w: Dict[str, torch.Tensor], comm: Comm, num_blocks: int, block_size: int,
                 kv_heads: int):
        self.cfg, self.comm, self.block_size = cfg, comm, block_size
        self.skip = frozenset({cfg.layers - 1})
        self.w = dict(w)  # the same tensors as the target's shard (a perturbation replaces one here only)
        shape = (num_blocks, block_size, kv_heads, cfg.head_dim)
        self.kv = {layer: (torch.zeros(shape), torch.zeros(shape))
                   for i, layer in enumerate(cfg.layer_names()) if i not in self.skip}
        self.forwards, self.perturbed = 0, False

    def propose(self, reqs: List[Tuple[object, int]]) -> Dict[str, List[int]]:
        """k_r draft tokens for each (request, k_r): k_r forwards of the draft, batched across requests.
        The requests' blocks must already cover seq_len + k_r slots."""
        out: Dict[str, List[int]] = {r.req_id: [] for r, _ in reqs}
        live, j = [(r, n) for r, n in reqs if n > 0], 0
        while live:
            ids, pos, slots, qsl, seq_lens, table = [], [], [], [0], [], []
            width = max(len(r.blocks) for r, _ in live)
            for r, _ in live:
                if j == 0:  # catch up: every token whose draft K/V is missing, the last one included
                    toks, p0 = (r.prompt + r.output)[r.draft_computed:], r.draft_computed
                else:
                    toks, p0 = [out[r.req_id][-1]], r.seq_len - 1 + j
                ids += toks
                pos += list(range(p0, p0 + len(toks)))
                slots += [r.blocks[p // self.block_size] * self.block_size + p % self.block_size for p in pos[-len(toks):]]
                qsl.append(len(ids))
                seq_lens.append(pos[-1] + 1)
                table.append(r.blocks + [0] * (width - len(r.blocks)))
            t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
            logits = forward(self.cfg, self.w, self.comm, self.kv, t(ids), t(pos), t(slots), t(table), t(seq_lens), t(qsl),
                             self.block_size, skip_attn=self.skip)
            self.forwards += 1
            for (r, _), tok in zip(live, logits.argmax(dim=-1).tolist()):
                out[r.req_id].append(tok)
            j += 1
            live = [(r, n) for r, n in live if n > j]
        for r, n in reqs:
            if n > 0:  # K/V written for every input but the last draft token
                r.draft_computed = r.seq_len + n - 1
        return out

    def perturb(self, rank: int, std: float) -> None:
        """The fault: noise on this rank's slice of the draft's LM head (a new tensor: the target's
        is untouched). The draft's argmax then rarely matches the target's: acceptance collapses."""
        g = torch.Generator().manual_seed(4242 + rank)
        head = self.w["lm_head"]
        self.w["lm_head"] = head + torch.randn(head.shape, generator=g) * std
        self.perturbed = True
