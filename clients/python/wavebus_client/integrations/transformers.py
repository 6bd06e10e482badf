"""wavebus on Hugging Face transformers' continuous batching (transformers 5.x), on every rank:

    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    wb = attach(manager)      # before manager.start(); the rank's agent comes from `wavebus launch`
    manager.start()
    ...
    manager.stop(block=True); wb.close()

attach() wraps the manager's own step (docs/transformers.md): each generation step is one wave.
Before the forward: wave_head(N) with step N-1's telemetry (TP0 only), the forward offered for an
input snapshot / the flight recorder and, on every rank, its inputs' digest (rank_divergence);
after it: end_of_wave(N) (a due KV dump is copied there), and the sampled token column's digest. The
telemetry goes through the client's tensor path (Client.tensor_batch): each request holds a stable
row (transformers_rows.py), a step passes the sampled token and log-prob columns straight from the
engine's output tensor, and arrivals, block-table changes, finishes and frees are sparse events.
The paged KV cache is moved into POSIX shared memory before the first step and registered as one
K and one V region per layer (block_stride: transformers interleaves every layer's pages in one
block), so the agent reads it without the engine's help.
With every wavebus feature off each call is a memory load; nothing else is added to the step.
"""
import logging
import os
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

from ..client import Client
from ..errors import AgentUnavailableError, ConfigError
from .. import mailbox as mb
from ..region import Region, validate
from ..ring import MAX_ROWS
from ..shm import _create, _view
from ..telemetry import LogitsFiniteGate
from . import transformers_cache
from .transformers_cache import kv_regions, layer_name
from .transformers_rows import RequestRows

log = logging.getLogger("wavebus_client")
_NO_ROWS = np.zeros(0, dtype=np.int64)


def attach(manager, *, client: Optional[Client] = None, weights: bool = True, tag: Optional[str] = None,
           on_copy: Optional[Callable[[int, Any], None]] = None) -> "TransformersWavebus":
    """Connect a ContinuousBatchingManager (not yet started) to this rank's wavebus agent.
    ``weights``: send a checksum per local weight shard (fingerprints). ``on_copy(wave, processor)``
    runs right after an end_of_wave that copied a KV dump (a test keeps the pool as it was then)."""
    return TransformersWavebus(manager, client=client, weights=weights, tag=tag, on_copy=on_copy)


class TransformersWavebus:
    def __init__(self, manager, *, client=None, weights=True, tag=None, on_copy=None):
        import transformers

        if getattr(manager, "is_running", lambda: False)():
            raise ConfigError("attach(): the manager is already running; attach before manager.start()")
        if getattr(getattr(manager, "continuous_batching_config", None), "use_async_batching", False):
            raise ConfigError("attach(): use_async_batching=True is not mapped (two IO pairs); set it to False (docs/transformers.md)")
        self.manager, self.on_copy = manager, on_copy
        self.model = manager.model
        helper = manager.distributed_helper
        self.tp_rank, self.tp_size = helper.tp_local_rank, helper.tp_size
        self.global_rank = helper.global_rank
        self.tag = tag or f"hf{os.getpid()}"
        self.client = client or Client.connect(engine_version=f"transformers {transformers.__version__}")
        self.features = self.client.hello()
        self.gate = LogitsFiniteGate(item_sync=bool(self.features and self.features.item_sync))
        if weights:
            self.client.register_weights(local_weights(self.model))
        self.wave = 0
        self._bus = False
        self.stats = {"snapshot_errors": 0}
        self.processor = None
        self._on_cuda = False
        self.kv: List[Region] = []
        self._staging: Dict[str, torch.Tensor] = {}
        self.tensor_batch = None                     # the client's TensorBatch, made with the cache
        self.rows: Optional[RequestRows] = None
        self._columns: Optional[tuple] = None        # (rows, token ids, log-probs) of the last step, sent with the next head
        self._non_finite: list = []
        self._holding: Dict[str, bool] = {}          # finished, blocks kept for a dump decided ahead (-> no_cache)
        self._finishing: Optional[str] = None        # the request finish_request is finishing now
        self._hooks = [self.model.register_forward_hook(self._check_logits)]
        create = manager._create_batch_processor

        def create_and_attach():
            p = create()
            if self.processor is not p:
                self._attach_processor(p)
            return p

        manager._create_batch_processor = create_and_attach

    # -- startup: the cache into shared memory, the telemetry's rows, the per-step wrappers
    def _attach_processor(self, p) -> None:
        self.processor = p
        self.kv = share_cache(p.cache, self.tag)
        self._on_cuda = p.cache.cache_tensor.device.type == "cuda"
        self.client.register_all(self.kv)
        # The tensor path: a row per request holding blocks (at most one per block) plus the rows
        # freed in a step, which come back after the next head; the hello asks the agent for a ring.
        alloc = next(iter(p.cache.cache_allocators.values()))
        max_rows = min(MAX_ROWS, alloc.num_blocks + p.cache.max_batch_tokens)
        self.tensor_batch = self.client.tensor_batch(max_rows, vocab=int(getattr(self.model.config, "vocab_size", 0) or 0))
        try:
            self.client.hello()  # now, so that the agent makes the ring before the first step
        except AgentUnavailableError as e:  # the first head says hello again within its bound
            log.warning("wavebus: %s", e)
        self.rows = RequestRows(self.tensor_batch, alloc)
        step, update, finish = p._generation_step, p.update_batch, p.scheduler.finish_request
        p._generation_step = lambda model: self._step(step, model)
        p.update_batch = lambda: self._update(update)
        p.scheduler.finish_request = lambda request_id: self._finish(finish, request_id)
        # Every give-back goes through the cache: a finish, and an offload when the cache is full.
        self._free_cache = p.cache.free_blocks
        p.cache.free_blocks = lambda request_id, no_cache=False: self._free(request_id, no_cache)

    # -- one step = one wave
    def _step(self, step, model) -> None:
        self.wave += 1
        io = self.processor.inputs_and_outputs
        # Telemetry only while the bus is on and this rank heads its replica; with everything off a
        # step walks no request and builds nothing.
        af = self.client.agent_features
        self._bus = bool(self.client.features & mb.FEATURE_BUS) and af is not None and bool(af.tp0)
        self.send_head(self.wave)
        if self._bus:
            # Requests scheduled for this step that got blocks take rows now, after the head: their
            # bindings and tables go with the next head, beside this step's tokens.
            self.rows.sync(self.processor.scheduler.active_requests)
        if self.client.features & mb.FEATURE_RANK_DIGEST:
            # rank_divergence: every TP rank digests the forward's inputs (a ring write, no message).
            kw = io.get_model_kwargs(use_padding=self.processor.model_runner.pad_inputs)
            # The row starts (cu_seq_lens_q) let an inputs mismatch name its first row and request.
            self.client.decided_inputs(self.wave, kw["input_ids"], kw["position_ids"], kw.get("cu_seq_lens_q"))
        if self.client.wants_forward():
            try:
                self._offer_forward(io)
            except Exception as e:  # noqa: BLE001  a failed capture is reported, never the end of serving
                self.stats["snapshot_errors"] += 1
                self.client.last_error = f"before_forward (wave {self.wave}): {e}"
                log.warning("wavebus: %s", self.client.last_error)
        step(model)
        if self._on_cuda and self.client.features & mb.FEATURE_BUS:
            # The agent copies a due dump from its own process and stream: the forward's cache writes
            # must be done (the step waits for its sampled tokens right after anyway).
            torch.cuda.current_stream(self.processor.cache.cache_tensor.device).synchronize()
        res = self.client.end_of_wave(self.wave)
        if res.dumps_written and self.on_copy is not None:
            self.on_copy(self.wave, self.processor)
        self._release_held()

    def send_head(self, wave: int) -> None:
        """The one place telemetry leaves the engine: the last step's columns through the tensor path."""
        cols, self._columns = self._columns, None
        nf, self._non_finite = self._non_finite, []
        if cols is None:
            self.tensor_batch.wave_head(wave, _NO_ROWS)
        else:
            rows, ids, lps = cols
            self.tensor_batch.wave_head(wave, rows, ids, logprobs=lps, non_finite=nf or None)
        self.rows.head_sent()

    def _update(self, update) -> None:
        io = self.processor.inputs_and_outputs
        digest = bool(self.client.features & mb.FEATURE_RANK_DIGEST)
        if self._bus or digest:
            # The step's sampled tokens: output_ids[0, :n] (log-probs bit-cast in row 1), one per
            # request that sampled, in the order of req_id_to_new_token_position (batch order).
            # Copied now: the next step's batch preparation zeroes output_ids before our head.
            sampled = io.req_id_to_new_token_position
            n = len(sampled)
            tokens = io.output_ids[0, :n]
            if digest:
                self.client.decided(self.wave, tokens)
            if self._bus:
                ids = tokens.numpy().copy()
                lps = io.output_ids[1, :n].view(torch.float32).numpy().copy() if io.return_logprobs else None
                rows = self.rows.rows_of(sampled)
                if n and rows.min() < 0:  # requests without a row (none left): their tokens are left out
                    keep = rows >= 0
                    rows, ids, lps = rows[keep], ids[keep], (lps[keep] if lps is not None else None)
                self._columns = (rows, ids, lps)
                self._non_finite = self.gate.collect()
        update()  # finishes (-> _finish) and gives blocks back (-> _free)
        # Blocks given back after end_of_wave(W) count as freed in wave W+1 (the coordinator's copy-window rule).
        self.rows.issue_frees(self.wave)

    def _finish(self, finish, request_id: str) -> None:
        """The scheduler finishes a request (and gives its blocks back through _free)."""
        self.rows.finish(request_id)
        self._finishing = request_id
        try:
            finish(request_id)
        finally:
            self._finishing = None

    def _free(self, request_id: str, no_cache: bool = False) -> None:
        """Blocks going back. A finished request whose dump is decided for a wave still to end on
        this rank (pending_dump) keeps them until that wave ended. Any other give-back (an offload
        under cache pressure, which must not wait) is reported freed, so a dump copied after it is
        marked incomplete (freed_before_copy) rather than trusted."""
        finishing = self._finishing == request_id
        if finishing and self.block_ids(request_id) and self.client.pending_dump(request_id):
            self._holding[request_id] = no_cache
            return
        self._free_cache(request_id, no_cache)
        self.rows.released(request_id, self.wave)

    def _release_held(self) -> None:
        for rid in [r for r in self._holding if not self.client.pending_dump(r)]:
            no_cache = self._holding.pop(rid)
            self._free_cache(rid, no_cache)
            self.rows.released(rid, self.wave)

    def block_ids(self, request_id: str) -> List[int]:
        """The request's block table (the full-attention allocator's: the pages the KV regions index)."""
        alloc = next(iter(self.processor.cache.cache_allocators.values()))
        return list(alloc.block_table.get(request_id, []))

    def batch(self) -> List[tuple]:
        """The running step: (req_id, first row, rows, samples a token) per request, in row order
        (built on demand: a test's fault hook, a snapshot's row_request)."""
        out, row = [], 0
        for fs in self.processor.inputs_and_outputs.requests_in_batch:
            out.append((fs.state.request_id, row, fs.query_length, fs.has_new_token))
            row += fs.query_length
        return out

    # -- logits_finite: the real logits, one row per request that samples
    def _check_logits(self, module, args, output) -> None:
        if not (self.client.features & mb.FEATURE_DETECTORS) or not self._bus or self.processor is None:
            return
        logits = getattr(output, "logits", None)
        if logits is None:
            return
        sampled = self.processor.inputs_and_outputs.req_id_to_new_token_position
        if sampled and logits.shape[1] == len(sampled):  # the model kept only the sampled rows (logits_to_keep)
            self.gate.check(logits[0], list(sampled))

    # -- input snapshots / flight recorder: the forward's real inputs, copied into shm staging
    def _offer_forward(self, io) -> None:
        kwargs = io.get_model_kwargs(use_padding=self.processor.model_runner.pad_inputs)
        batch = self.batch()
        rows, positions = [], kwargs["position_ids"][0].tolist()
        for i, (_rid, _first, n, _has) in enumerate(batch):
            rows += [i] * n
        rows += [-1] * (len(positions) - len(rows))
        ctx = {"compilation_hash": f"transformers-{type(self.model).__name__}-tp{self.tp_size}", "global_step": self.wave,
               "is_prompt": any(s.state.status.name.startswith("PREFILLING") for s in io.requests_in_batch),
               "req_ids": [b[0] for b in batch], "positions": positions, "row_request": rows}
        try:
            inputs = [self._stage(name, t) for name, t in flatten_inputs(kwargs)]
        except Exception as e:  # noqa: BLE001  whatever it was, the captures waiting on this forward must hear it
            # Not staged: the forward is offered without inputs and the cause, so a capture that
            # would take it fails loudly on the agent and in `wavebus capture` instead of expiring.
            self.client.before_forward(ctx, [], staging_error=f"{type(e).__name__}: {e}")
            raise
        inputs.append(("kv_cache", 0, "uint8", [self.processor.cache.cache_tensor.numel()]))
        self.client.before_forward(ctx, inputs)

    def _stage(self, name: str, t: torch.Tensor) -> tuple:
        buf = self._staging.get(name)
        if buf is None or buf.dtype != t.dtype:
            # Sized to the engine's own buffer behind the tensor (every step's slice of it fits), not
            # to this step's slice: attention_mask's [.., :q, :k] grows with the context, and a
            # staging region is registered once.
            cap = max(t.untyped_storage().nbytes() // t.element_size(), t.numel(), 1)
            shm = _create(f"{self.tag}-in-{name}", cap * t.element_size(), "attach()")
            buf = _view(shm, 0, [cap], _dtype_name(t.dtype))
            region = validate(Region(name=name, kind="shm", shm_name="/" + shm.name, nbytes=cap * t.element_size(),
                                     dtype=_dtype_name(t.dtype), shape=[cap], role="input", base_ptr=buf.data_ptr(), owner=shm,
                                     token_ids=True if name == "input_ids" else None))
            self.client.register(region)
            self._staging[name] = buf
        if t.numel() > buf.numel():
            raise ConfigError(f"attach(): input {name!r} has {t.numel()} elements, more than its staging region's {buf.numel()} "
                              "(the engine's buffer behind it grew after the region was registered)")
        buf[: t.numel()].view(t.shape).copy_(t)
        # By region and offset: an empty tensor (no cache read in a prefill) has no address to look up.
        return (name, 0, _dtype_name(t.dtype), list(t.shape))

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self.client.close()


def _dtype_name(dt) -> str:
    from .. import dtypes

    return dtypes.from_torch(dt)


# What a snapshot holds, in this order (replay.py reads it back by position): the tensors of the
# forward's kwargs that the paged attention reads, then the whole cache as it was before the forward.
# read_index / write_index are one-element lists (one attention type); attention_mask is absent with
# a flash kernel, so a snapshot has len(SNAPSHOT_INPUTS) + 1 inputs with it and one fewer without.
SNAPSHOT_INPUTS = ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "logits_indices", "read_index",
                   "write_index", "attention_mask")


def flatten_inputs(kwargs) -> List[tuple]:
    """The forward's tensor inputs named in SNAPSHOT_INPUTS, in that order (absent ones left out),
    as the engine holds them: slices of its preallocated buffers, maybe strided (attention_mask)."""
    out = []
    for k in SNAPSHOT_INPUTS:
        v = kwargs.get(k)
        if isinstance(v, (list, tuple)):
            if len(v) != 1:
                raise ConfigError(f"attach(): {k} has {len(v)} attention groups; only one is mapped so far")
            v = v[0]
        if isinstance(v, torch.Tensor):
            out.append((k, v))
    return out


def local_weights(model) -> Dict[str, torch.Tensor]:
    """This rank's shard of every parameter (a DTensor's local part under tp_plan)."""
    out = {}
    for name, p in model.named_parameters():
        t = p.to_local() if hasattr(p, "to_local") else p
        out[name] = t.detach()
    return out


def share_cache(cache, tag: str) -> List[Region]:
    """The cache as regions the agent reads: the KV regions and the whole tensor (``kv_cache``, the
    input snapshots' cache). On the CPU the paged cache's one flat tensor is moved into a new POSIX
    shm segment (same bytes, same layout) and every allocator rebuilds its views on it; on a GPU the
    cache's own allocation is exported through CUDA IPC (nothing moves)."""
    old = cache.cache_tensor
    if old.device.type == "cuda":
        whole = transformers_cache.cuda_cache_region(cache)
        return kv_regions(cache, whole) + [whole]
    if old.device.type != "cpu":
        raise ConfigError(f"attach(): the cache is on {old.device.type}; only the CPU (shm) and CUDA (IPC) are mapped")
    nbytes = old.numel() * old.element_size()
    shm = _create(f"{tag}-kv", nbytes, "attach()")
    new = _view(shm, 0, [old.numel()], "uint8")
    new.copy_(old.view(torch.uint8))
    cache.cache_tensor = new
    non_trash = cache.num_sectors * cache.bytes_per_sector
    for alloc in cache.cache_allocators.values():
        alloc.register_cache_tensor(cache.bytes_per_sector, non_trash, new, cache.pool)
    whole = validate(Region(name="kv_cache", kind="shm", shm_name="/" + shm.name, nbytes=nbytes, dtype="uint8", shape=[nbytes],
                            role="input", base_ptr=new.data_ptr(), owner=shm))
    return kv_regions(cache, whole) + [whole]


__all__ = ["attach", "TransformersWavebus", "share_cache", "local_weights", "flatten_inputs", "layer_name", "SNAPSHOT_INPUTS"]
