"""How a serving engine plugs into wavebus: every call this engine makes, in the order a model
runner makes them. Read top to bottom as an integration guide; docs/vllm.md maps each call onto
vLLM's worker and model runner.

1. startup: put the KV pool and the persistent input buffers in POSIX shared memory and register
   them (the rank's agent reads them there for KV dumps and input snapshots);
2. each step: wave_head (the previous step's telemetry) -> fill the input buffers ->
   before_forward (offer the forward for an input snapshot) -> forward -> check_logits (before
   sampling) -> sample -> end_of_wave (apply config, do a due KV dump; bounded);
3. shutdown: close.
With every wavebus feature off each call returns at once (a memory load, no message).
"""
from dataclasses import replace
from typing import Dict, List, Optional

import torch

import numpy as np

from wavebus_client import Client, LogitsFiniteGate
from wavebus_client.shm import kv_pool_shm, shm_tensor

# The persistent input buffers (vLLM's model runner keeps the same ones: input_ids, positions,
# slot_mapping, block_table, seq_lens, query_start_loc, and logits_indices, the rows sampled, which
# a speculative step needs), all int64, sized for the largest step.
ENGINE_VERSION = "torch-engine 1.0"  # sent in the rank's fingerprint (docs/fingerprints.md)

INPUTS = ("input_ids", "positions", "slot_mapping", "block_table", "seq_lens", "query_start_loc", "logits_indices")


class WavebusHooks:
    def __init__(self, *, tag: str, layers: List[str], num_blocks: int, block_size: int, kv_heads: int,
                 head_dim: int, max_tokens: int, max_seqs: int, max_blocks_per_seq: int, num_spec_tokens: int = 0,
                 client: Optional[Client] = None, weights: Optional[Dict[str, torch.Tensor]] = None):
        self.num_spec_tokens = num_spec_tokens
        # 1a. The paged KV pool, vLLM's layout: per layer K and V of [num_blocks, block_size, kv_heads, head_dim].
        self.kv, regions = kv_pool_shm(f"{tag}-kv", layers, num_blocks, block_size, kv_heads, head_dim, torch.float32)
        # 1b. The KV pool is also an input of the forward (the attention reads it): the same bytes
        # registered a second time as `input` regions, so a snapshot holds the cache the step read.
        self.kv_inputs = []
        for r in list(regions):
            alias = replace(r, name=f"kv_cache.{r.name}", role="input", layer="", kv="")
            regions.append(alias)
            self.kv_inputs.append((alias.name, 0, alias.dtype, alias.shape))  # offset within the region
        # 1c. Persistent input buffers.
        self.buf: Dict[str, torch.Tensor] = {}
        shapes = {"input_ids": [max_tokens], "positions": [max_tokens], "slot_mapping": [max_tokens],
                  "block_table": [max_seqs * max_blocks_per_seq], "seq_lens": [max_seqs], "query_start_loc": [max_seqs + 1],
                  "logits_indices": [max_tokens]}
        # input_ids holds token ids (said, though the name alone would tell the agent): the flight
        # recorder's bundles keep them only as report.save_sensitive_info allows (docs/recorder.md).
        for name in INPUTS:
            self.buf[name], r = shm_tensor(f"{tag}-{name}", shapes[name], torch.int64, region_name=name,
                                           token_ids=True if name == "input_ids" else None)
            regions.append(r)
        # 1d. Meet the rank's agent (WAVEBUS_RUN_DIR and LOCAL_RANK come from `wavebus launch`).
        self.client = client or Client.connect(engine_version=ENGINE_VERSION)
        self.client.register_all(regions)
        # 1e. The persistent batch as wavebus sees it (the tensor hot path, docs/python-client.md):
        # a row per running request, asked for before the hello so that the agent makes the ring.
        self.batch = self.client.tensor_batch(max_seqs)
        self._row: Dict[str, int] = {}
        self._free_rows = list(range(max_seqs - 1, -1, -1))
        self._rows_after_head: List[int] = []  # freed rows: taken again once the head carrying the free went
        feats = self.client.hello()
        # 1e. Optional: a checksum per weight shard in this rank's fingerprint (the agent reads them
        # once, now, off the step); an incident report names the shards that differ across replicas.
        if weights:
            self.client.register_weights(weights)
        self.gate = LogitsFiniteGate(item_sync=bool(feats and feats.item_sync))

    # -- 2a. fill the persistent buffers (views into shared memory) for this step
    def stage_inputs(self, batch) -> Dict[str, torch.Tensor]:
        n, s, li = len(batch.input_ids), len(batch.reqs), len(batch.logits_indices)
        width = len(batch.block_table[0])
        views = {
            "input_ids": self.buf["input_ids"][:n], "positions": self.buf["positions"][:n],
            "slot_mapping": self.buf["slot_mapping"][:n], "seq_lens": self.buf["seq_lens"][:s],
            "query_start_loc": self.buf["query_start_loc"][:s + 1],
            "block_table": self.buf["block_table"][:s * width].view(s, width),
            "logits_indices": self.buf["logits_indices"][:li],
        }
        for k, src in (("input_ids", batch.input_ids), ("positions", batch.positions), ("slot_mapping", batch.slots),
                       ("seq_lens", batch.seq_lens), ("query_start_loc", batch.query_start_loc), ("block_table", batch.block_table),
                       ("logits_indices", batch.logits_indices)):
            views[k].copy_(torch.tensor(src, dtype=torch.int64))
        return views

    # -- 2b. head of the wave: the previous step's telemetry (only TP0 of the last PP stage sends)
    def wave_head(self, wave: int, telemetry: Optional[dict]) -> None:
        t = telemetry or {"rows": []}
        self.batch.wave_head(wave, t["rows"], t.get("token_ids"), logprobs=t.get("logprobs"), token_counts=t.get("token_counts"),
                             draft_len=t.get("draft_len"), accepted=t.get("accepted"), non_finite=t.get("non_finite"))
        self._free_rows += self._rows_after_head
        self._rows_after_head = []

    # -- 2c. offer the forward for an input snapshot: the inputs in the order the forward takes them
    def before_forward(self, step: int, batch, views: Dict[str, torch.Tensor], graph: str):
        rows = []
        for i, r in enumerate(batch.reqs):
            rows += [i] * (batch.query_start_loc[i + 1] - batch.query_start_loc[i])
        ctx = {"compilation_hash": graph, "global_step": step, "is_prompt": batch.is_prompt,
               "req_ids": [r.req_id for r in batch.reqs], "positions": batch.positions, "row_request": rows,
               "num_speculative_tokens": self.num_spec_tokens}
        inputs = [views[k] for k in INPUTS] + self.kv_inputs
        return self.client.before_forward(ctx, inputs)  # raises CaptureError: abort the forward

    # -- 2d. before sampling: start the non-finite check of the real logits (one row per sequence,
    # 1 + draft length rows for a verified draft)
    def check_logits(self, logits: torch.Tensor, batch):
        return self.gate.check(logits, [r.req_id for r, d in zip(batch.reqs, batch.drafts) for _ in range(1 + len(d))])

    # -- 2e. after sampling: the step's telemetry, sent with the next wave's head. Spec counts:
    # draft_len = draft tokens verified, accepted = tokens the verification kept, the bonus token
    # included (accepted drafts + 1: the guard counts max(0, accepted - 1) as accepted drafts).
    # `freed`: the requests whose blocks went back after the previous wave's end_of_wave (reported in
    # this wave: blocks free before its end); they are not in the batch any more.
    def telemetry(self, batch, tokens: List[List[int]], logprobs: List[List[float]], finished, freed=()) -> dict:
        rows, counts, ids, lps = [], [], [], []
        for r, t, lp in zip(batch.reqs, tokens, logprobs):
            row = self._row.get(r.req_id)
            if row is None:  # a new request takes a row (sparse: once per request)
                row = self._row[r.req_id] = self._free_rows.pop()
                self.batch.arrive(row, r.req_id, prompt_len=len(r.prompt), prompt_token_ids=r.prompt)
            self.batch.blocks(row, r.blocks)  # sent only when it changed
            rows.append(row)
            counts.append(len(t))
            ids += t
            lps += lp
            if r in finished:
                self.batch.finish(row)
        self._free(freed)
        t = {"rows": np.array(rows, dtype=np.int64), "token_ids": np.array(ids, dtype=np.int64),
             "logprobs": np.array(lps, dtype=np.float32), "token_counts": np.array(counts, dtype=np.int64),
             "non_finite": self.gate.collect()}  # waits for check_logits' rows
        if self.num_spec_tokens:
            t["draft_len"] = np.array([len(d) for d in batch.drafts], dtype=np.int64)
            t["accepted"] = np.array([len(x) if d else 0 for d, x in zip(batch.drafts, tokens)], dtype=np.int64)
        return t

    def freed_telemetry(self, freed) -> dict:
        """A wave without a forward that gives kept blocks back: only their frees."""
        self._free(freed)
        return {"rows": np.zeros(0, dtype=np.int64)}

    def _free(self, rs) -> None:
        for r in rs:
            row = self._row.pop(r.req_id)
            self.batch.free(row)
            self._rows_after_head.append(row)

    # -- 2g. after end_of_wave, before giving a finished request's blocks back: a dump armed for it
    # for the next wave (decided a wave ahead) keeps them one more step. A memory load when nothing is due.
    def pending_dump(self, req_id: str) -> bool:
        return self.client.pending_dump(req_id)

    def pending_dumps(self, req_ids):
        """The step's finished requests in one call: those of ``req_ids`` to keep (usually none: ())."""
        return self.client.pending_dumps(req_ids)

    # -- 2f. end of the wave: bounded; a due KV dump is copied from the pool here
    def end_of_wave(self, wave: int):
        return self.client.end_of_wave(wave)

    # -- 3. shutdown
    def close(self) -> None:
        self.client.close()
