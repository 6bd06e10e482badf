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
telemetry is the step's real sampled tokens and log-probs, the allocator's block tables and the
requests finished and freed. The paged KV cache is moved into POSIX shared memory before the first
step and registered as one K and one V region per layer (block_stride: transformers interleaves
every layer's pages in one block), so the agent reads it without the engine's help.
With every wavebus feature off each call is a memory load; nothing else is added to the step.
"""
import logging
import os
from typing import Any, Callable, Dict, List, Optional

import torch

from ..client import Client
from ..errors import ConfigError
from .. import mailbox as mb
from ..region import Region, validate
from ..shm import _create, _view
from ..telemetry import LogitsFiniteGate, RequestStep, StepTelemetry
from .transformers_cache import kv_regions, layer_name

log = logging.getLogger("wavebus_client")


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
        self.kv: List[Region] = []
        self._staging: Dict[str, torch.Tensor] = {}
        self._telemetry: Optional[StepTelemetry] = None   # of the last step, sent with the next head
        self._freed: List[tuple] = []                      # (wave ended before the free, its freed row)
        self._holding: Dict[str, bool] = {}                # finished, blocks kept for a dump decided ahead (-> no_cache)
        self._finishing: Optional[str] = None               # the request finish_request is finishing now
        self._sent_prompt = set()
        self._batch: List[tuple] = []                      # (req_id, first row, rows) of the running step
        self._batch_blocks: Dict[str, List[int]] = {}
        self._finished_states: Dict[str, Any] = {}          # finished in this step (gone from the scheduler)
        self._hooks = [self.model.register_forward_hook(self._check_logits)]
        create = manager._create_batch_processor

        def create_and_attach():
            p = create()
            if self.processor is not p:
                self._attach_processor(p)
            return p

        manager._create_batch_processor = create_and_attach

    # -- startup: the cache into shared memory, the per-step wrappers
    def _attach_processor(self, p) -> None:
        self.processor = p
        self.kv = share_cache(p.cache, self.tag)
        self.client.register_all(self.kv)
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
        self._batch, row = [], 0
        # The step's rows by request: only while some feature is on (with everything off a step
        # walks no request: at 256 running requests the walk alone was ~0.1 ms a step).
        self._bus = bool(self.client.features & mb.FEATURE_BUS)
        if self.client.features:
            for fs in io.requests_in_batch:
                self._batch.append((fs.state.request_id, row, fs.query_length, fs.has_new_token))
                row += fs.query_length
        # Block tables as they are now: a request finished in this step gives its blocks back in
        # update_batch. Only while the bus is on: with everything off a step builds no telemetry.
        self._batch_blocks = {rid: self.block_ids(rid) for rid, *_ in self._batch} if self._bus else {}
        self.send_head(self.wave, self._telemetry)
        self._telemetry = None
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
        res = self.client.end_of_wave(self.wave)
        if res.dumps_written and self.on_copy is not None:
            self.on_copy(self.wave, self.processor)
        self._release_held()

    def send_head(self, wave: int, telemetry: Optional[StepTelemetry]) -> None:
        """The one place telemetry leaves the engine (the dict API today; the tensor path later)."""
        self.client.wave_head(wave, telemetry)

    def _update(self, update) -> None:
        digest = bool(self.client.features & mb.FEATURE_RANK_DIGEST)
        if not self._bus and not digest:  # everything off: nothing is read from the step's outputs
            update()
            self._telemetry, self._finished_states = None, {}
            self._freed = [(after, row) for after, row in self._freed if after >= self.wave]
            return
        _, tokens, logprobs = self.processor.inputs_and_outputs.prepare_batch_update()
        update()
        if digest:
            # rank_divergence: the token column this rank sampled, in the telemetry's row order (the
            # requests of the batch that sampled, in batch order), from the engine's own tensor.
            sampled = sum(1 for b in self._batch if b[3])
            self.client.decided(self.wave, tokens[:sampled])
        if not self._bus:
            self._telemetry, self._finished_states = None, {}
            self._freed = [(after, row) for after, row in self._freed if after >= self.wave]
            return
        reqs, k = [], 0
        active = self.processor.scheduler.active_requests
        for rid, _row, _n, has_token in self._batch:
            state = active.get(rid) or self._finished_states.pop(rid, None)
            if state is None:
                continue
            new, lps = [], []
            if has_token:
                new = [int(tokens[k])]
                lps = [float(logprobs[k])] if logprobs is not None else []
                k += 1
            first = rid not in self._sent_prompt
            self._sent_prompt.add(rid)
            prompt = list(state.initial_tokens) if hasattr(state, "initial_tokens") else []
            reqs.append(RequestStep(req_id=rid, new_token_ids=new, new_token_logprobs=lps, block_ids=self._batch_blocks.get(rid, []),
                                    finished=state.status.name == "FINISHED", prompt_len=len(prompt),
                                    num_output_tokens=len(state.generated_tokens), prompt_token_ids=prompt if first else []))
        # Blocks given back after end_of_wave(W) count as freed in wave W+1 (the coordinator's copy-window rule).
        freed = [row for after, row in self._freed if after < self.wave]
        self._freed = [(after, row) for after, row in self._freed if after >= self.wave]
        self._telemetry = StepTelemetry(requests=reqs + freed, non_finite=self.gate.collect())
        self._finished_states = {}

    def _finish(self, finish, request_id: str) -> None:
        """The scheduler finishes a request (and gives its blocks back through _free)."""
        state = self.processor.scheduler.active_requests.get(request_id)
        if state is not None:
            self._finished_states[request_id] = state
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
        blocks = self.block_ids(request_id)
        finishing = self._finishing == request_id
        if blocks and finishing and self.client.pending_dump(request_id):
            self._holding[request_id] = no_cache
            return
        self._free_cache(request_id, no_cache)
        if finishing:
            self._sent_prompt.discard(request_id)
        if blocks:
            self._freed.append((self.wave, RequestStep(req_id=request_id, block_ids=blocks, finished=finishing, freed=True)))

    def _release_held(self) -> None:
        for rid in [r for r in self._holding if not self.client.pending_dump(r)]:
            no_cache = self._holding.pop(rid)
            blocks = self.block_ids(rid)
            self._free_cache(rid, no_cache)
            self._sent_prompt.discard(rid)
            self._freed.append((self.wave, RequestStep(req_id=rid, block_ids=blocks, finished=True, freed=True)))

    def block_ids(self, request_id: str) -> List[int]:
        """The request's block table (the full-attention allocator's: the pages the KV regions index)."""
        alloc = next(iter(self.processor.cache.cache_allocators.values()))
        return list(alloc.block_table.get(request_id, []))

    def batch(self) -> List[tuple]:
        """The running step: (req_id, first row, rows, samples a token) per request, in row order."""
        return list(self._batch)

    # -- logits_finite: the real logits, one row per request that samples
    def _check_logits(self, module, args, output) -> None:
        if not (self.client.features & mb.FEATURE_DETECTORS) or self.tp_rank != 0 or not self._batch:
            return
        logits = getattr(output, "logits", None)
        if logits is None:
            return
        rows = [rid for rid, _r, _n, has in self._batch if has]
        if logits.shape[1] == len(rows):  # the model kept only the sampled rows (logits_to_keep)
            self.gate.check(logits[0], rows)

    # -- input snapshots / flight recorder: the forward's real inputs, copied into shm staging
    def _offer_forward(self, io) -> None:
        kwargs = io.get_model_kwargs(use_padding=self.processor.model_runner.pad_inputs)
        named = flatten_inputs(kwargs)
        inputs = [self._stage(name, t) for name, t in named]
        inputs.append(("kv_cache", 0, "uint8", [self.processor.cache.cache_tensor.numel()]))
        rows, positions = [], kwargs["position_ids"][0].tolist()
        for i, (_rid, _first, n, _has) in enumerate(self._batch):
            rows += [i] * n
        rows += [-1] * (len(positions) - len(rows))
        ctx = {"compilation_hash": f"transformers-{type(self.model).__name__}-tp{self.tp_size}", "global_step": self.wave,
               "is_prompt": any(s.state.status.name.startswith("PREFILLING") for s in io.requests_in_batch),
               "req_ids": [b[0] for b in self._batch], "positions": positions, "row_request": rows}
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
    """Move the paged cache's one flat tensor into a new POSIX shm segment (same bytes, same layout)
    and let every allocator rebuild its views on it; the KV regions describing it."""
    old = cache.cache_tensor
    if old.device.type != "cpu":
        raise ConfigError("attach(): the cache is on the GPU; its CUDA IPC export is not built yet (docs/transformers.md)")
    nbytes = old.numel() * old.element_size()
    shm = _create(f"{tag}-kv", nbytes, "attach()")
    new = _view(shm, 0, [old.numel()], "uint8")
    new.copy_(old.view(torch.uint8))
    cache.cache_tensor = new
    non_trash = cache.num_sectors * cache.bytes_per_sector
    for alloc in cache.cache_allocators.values():
        alloc.register_cache_tensor(cache.bytes_per_sector, non_trash, new, cache.pool)
    alias = Region(name="kv_cache", kind="shm", shm_name="/" + shm.name, nbytes=nbytes, dtype="uint8", shape=[nbytes],
                   role="input", base_ptr=new.data_ptr(), owner=shm)
    return kv_regions(cache, shm, new.data_ptr()) + [validate(alias)]


__all__ = ["attach", "TransformersWavebus", "share_cache", "local_weights", "flatten_inputs", "layer_name", "SNAPSHOT_INPUTS"]
