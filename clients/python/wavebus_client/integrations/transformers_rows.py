"""transformers' requests on the tensor path's stable rows (docs/transformers.md, "Telemetry").

transformers' continuous batching names a request by its id and builds each step's batch as a new
list; the tensor path (``Client.tensor_batch``) wants a stable row per request. ``RequestRows``
gives each request a row from its first blocks until they go back, takes a freed row again only
after the head that carried its free, and sends block tables as sparse events when they change.
Per step it costs one comparison of the allocator's block tables with the ones last sent (a list
comprehension, ~15 µs at 256 requests) and one row lookup per sampled request (``map`` over the
step's id -> position dict, in C); every other event is paid once per request.
"""
import itertools
from typing import Dict, List, Tuple

import numpy as np


class RequestRows:
    def __init__(self, batch, allocator):
        self.batch = batch                  # the client's TensorBatch
        self._alloc = allocator             # the full-attention allocator: its block_table is read, never written
        self._row: Dict[str, int] = {}      # request id -> row, from its arrival to its free
        self._sent: Dict[str, List[int]] = {}  # request id -> its table as last sent
        self._free_rows = list(range(batch.max_rows - 1, -1, -1))
        self._freeing: List[Tuple[int, str, int]] = []   # (wave ended before the give-back, req id, row)
        self._after_head: List[Tuple[str, int]] = []     # freed by the next head: their rows then come back
        self._waiting = set()                            # ids whose free has not gone with a head yet
        self.stats = {"rows_exhausted": 0}

    @property
    def live(self) -> int:
        return len(self._row)

    def sync(self, prompts) -> None:
        """After a wave's head: requests that got blocks take a row (``arrive``, with their prompt
        from ``prompts``, the scheduler's active requests), changed tables go as ``blocks``. Compares
        whole tables, so a block replaced in place (prefix sharing) is seen too."""
        sent, now = self._sent.get, self._alloc.block_table
        for rid in [rid for rid, t in now.items() if t != sent(rid)]:
            if rid in self._waiting:  # given back and taken again before its free went: next time
                continue
            row = self._row.get(rid)
            if row is None:
                if not self._free_rows:
                    self.stats["rows_exhausted"] += 1  # its telemetry is left out until a row frees
                    continue
                state = prompts.get(rid)
                prompt = list(state.initial_tokens) if state is not None else []
                row = self._row[rid] = self._free_rows.pop()
                self.batch.arrive(row, rid, prompt_len=len(prompt), prompt_token_ids=prompt)
            table = list(now[rid])
            self._sent[rid] = table
            self.batch.blocks(row, table)

    def rows_of(self, req_ids) -> np.ndarray:
        """The rows of ``req_ids`` (any iterable of ids, e.g. the step's id -> position dict), -1 where none."""
        return np.fromiter(map(self._row.get, req_ids, itertools.repeat(-1)), dtype=np.int64, count=len(req_ids))

    def finish(self, req_id: str) -> None:
        row = self._row.get(req_id)
        if row is not None:
            self.batch.finish(row)

    def released(self, req_id: str, wave: int) -> None:
        """``req_id``'s blocks went back after end_of_wave(``wave``): its row ends with the free
        event of wave + 1 (``issue_frees``); until that head went, the id takes no new row."""
        self._sent.pop(req_id, None)
        row = self._row.pop(req_id, None)
        if row is not None:
            self._freeing.append((wave, req_id, row))
            self._waiting.add(req_id)

    def issue_frees(self, wave: int) -> None:
        """In wave ``wave``: the frees of blocks given back after an earlier wave's end, carried by the next head."""
        if not self._freeing:
            return
        keep = []
        for after, rid, row in self._freeing:
            if after < wave:
                self.batch.free(row)
                self._after_head.append((rid, row))
            else:
                keep.append((after, rid, row))
        self._freeing = keep

    def head_sent(self) -> None:
        """A wave_head call returned: the frees it carried (or dropped, sending paused) took effect."""
        for rid, row in self._after_head:
            self._free_rows.append(row)
            self._waiting.discard(rid)
        self._after_head = []
