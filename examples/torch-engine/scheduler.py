"""Continuous batching over a paged KV pool: requests arrive, are prefilled whole, decode one
token a step (or, with a drafter, verify k draft tokens and keep the accepted ones: spec.py),
finish and free their blocks. Every rank runs the same scheduler on the same
(all-gathered) logits, so the ranks agree without a broadcast."""
from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class Request:
    req_id: str
    prompt: List[int]
    max_tokens: int
    arrival_step: int = 1
    output: List[int] = field(default_factory=list)
    blocks: List[int] = field(default_factory=list)
    finished: bool = False
    computed: int = 0  # tokens whose K/V are in the cache
    draft_computed: int = 0  # the same in the draft model's cache (spec.py)

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.output)


class BlockAllocator:
    def __init__(self, num_blocks: int):
        # Block 0 is kept free of requests (as vLLM keeps a null block), so a zero in a padded
        # block table never points at live data.
        self.free = list(range(1, num_blocks))

    def take(self) -> Optional[int]:
        return self.free.pop(0) if self.free else None

    def give_back(self, blocks: List[int]) -> None:
        self.free.extend(blocks)
        self.free.sort()


@dataclass
class Batch:
    reqs: List[Request]
    is_prompt: bool          # some row is a prefill
    input_ids: List[int]
    positions: List[int]
    slots: List[int]
    query_start_loc: List[int]
    seq_lens: List[int]
    block_table: List[List[int]]
    logits_indices: List[int]  # the rows whose logits are sampled: a prefill's last, every row of a verified draft
    drafts: List[List[int]]    # per request, the draft tokens this step verifies (empty: a plain row)


class Scheduler:
    def __init__(self, requests: List[Request], num_blocks: int, block_size: int, max_running: int = 8):
        self.waiting = sorted(requests, key=lambda r: r.arrival_step)
        self.running: List[Request] = []
        # Finished, blocks not given back yet: a dump of them is pending (client.pending_dump).
        self.holding: List[Request] = []
        self.done: List[Request] = []
        self.alloc = BlockAllocator(num_blocks)
        self.block_size = block_size
        self.max_running = max_running

    def idle(self) -> bool:
        return not self.waiting and not self.running and not self.holding

    def _grow(self, r: Request, upto: int) -> bool:
        while len(r.blocks) * self.block_size < upto:
            b = self.alloc.take()
            if b is None:
                return False
            r.blocks.append(b)
        return True

    def schedule(self, step: int, drafter=None, k: int = 0) -> Optional[Batch]:
        """Decode every running request (one new slot each; with a drafter, 1 + k_r slots: the last
        token and k_r draft tokens, k_r = k but never past max_tokens), then admit arrived requests
        whose prompt fits. None when nothing runs this step."""
        rows: List[tuple] = []
        lens = {r.req_id: min(k, r.max_tokens - len(r.output) - 1) if drafter else 0 for r in self.running}
        for r in self.running:
            if not self._grow(r, r.seq_len + lens[r.req_id]):
                raise RuntimeError(f"KV pool exhausted while decoding {r.req_id} (no preemption in this engine)")
        drafts = drafter.propose([(r, lens[r.req_id]) for r in self.running]) if drafter else {}
        for r in list(self.running):
            d = drafts.get(r.req_id, [])
            rows.append((r, [r.output[-1]] + d, list(range(r.seq_len - 1, r.seq_len + len(d))), d))
        while self.waiting and self.waiting[0].arrival_step <= step and len(self.running) < self.max_running:
            r = self.waiting[0]
            need = -(-len(r.prompt) // self.block_size)
            if need > len(self.alloc.free):
                break
            self.waiting.pop(0)
            self._grow(r, len(r.prompt))
            self.running.append(r)
            rows.append((r, list(r.prompt), list(range(len(r.prompt))), []))
        if not rows:
            return None
        b = Batch([], False, [], [], [], [0], [], [], [], [])
        width = max(len(r.blocks) for r, _, _, _ in rows)
        for r, ids, pos, d in rows:
            b.reqs.append(r)
            b.drafts.append(d)
            b.logits_indices += list(range(len(b.input_ids) + len(ids) - 1 - len(d), len(b.input_ids) + len(ids)))
            b.is_prompt = b.is_prompt or r.computed == 0
            b.input_ids += ids
            b.positions += pos
            b.slots += [r.blocks[p // self.block_size] * self.block_size + p % self.block_size for p in pos]
            b.query_start_loc.append(len(b.input_ids))
            b.seq_lens.append(pos[-1] + 1)
            b.block_table.append(r.blocks + [0] * (width - len(r.blocks)))
        return b

    def commit(self, batch: Batch, tokens: List[List[int]]) -> List[Request]:
        """Append each sequence's new tokens (one, or the accepted drafts and the bonus token);
        returns the requests that finished (still holding their blocks: retire() them, then free
        them with release() once no dump of them is pending). Rejected drafts roll back: `computed` stops
        after the last accepted one, and their slots are overwritten by the next step."""
        finished = []
        for r, new in zip(batch.reqs, tokens):
            r.computed = r.seq_len + len(new) - 1
            r.draft_computed = min(r.draft_computed, r.computed)
            r.output += new
            if len(r.output) >= r.max_tokens:
                r.finished = True
                finished.append(r)
        return finished

    def retire(self, finished: List[Request]) -> None:
        """Finished requests stop running but keep their blocks until release() (a dump may be pending)."""
        for r in finished:
            self.running.remove(r)
            self.holding.append(r)

    def release(self, rs: List[Request]) -> None:
        for r in rs:
            self.holding.remove(r)
            self.alloc.give_back(r.blocks)
            self.done.append(r)
