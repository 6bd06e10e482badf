"""The tensor hot path of wave_head (docs/python-client.md, "The tensor hot path").

Per step the engine passes what it already holds as arrays (numpy, or CPU torch tensors): the rows
that sampled, their token ids and optionally log-probs, token counts and speculative counts. They
go into the telemetry ring with one copy per column; the head itself carries only the sparse
events (SlotEvents). Nothing here touches an element in Python: values are checked where the
agent reads them (src/agent/telemetry-ring.ts), and garbage is counted there per rank.
"""
import logging
from typing import Optional

from . import mailbox as mb
from . import wavebus_pb2 as pb
from .errors import ConfigError
from .ring import ARRAY_ORDER, BIT, ring_sizes
from .slot_batch import SlotEvents, native_slot_events
from .telemetry import _nonfinite_list, nonfinite_row_proto
from .wave_head import _MAX_U64

_INT_KINDS = "iu"
_SENDS = mb.FEATURE_BUS | mb.FEATURE_HEADS
_DETECTORS, _Q_FEATURES = mb.FEATURE_DETECTORS, mb._Q_FEATURES
_PENDING = float("inf")
_B_ROW, _B_COUNT, _B_IDS = BIT["row"], BIT["token_count"], BIT["token_ids"]
_B_IDS_LPS, _B_SPEC = _B_IDS | BIT["token_logprobs"], BIT["draft_len"] | BIT["accepted"]
_log = logging.getLogger("wavebus_client")
_ndarray = None  # numpy.ndarray once a TensorBatch exists (numpy is imported only by the tensor path)


def _host(x, name: str, kinds: str):
    """A 1-d numpy array over ``x`` (no copy for numpy and CPU tensors); checks rank and dtype kind only."""
    if type(x) is _ndarray and x.ndim == 1 and x.dtype.kind in kinds:
        return x  # the usual step: the engine's own numpy column, nothing to convert
    import numpy as np

    if hasattr(x, "detach") and hasattr(x, "numpy"):  # torch.Tensor
        x = x.detach()
        if x.device.type != "cpu":
            x = x.cpu()  # waits for the device: pass host tensors (sampled ids usually are)
        x = x.numpy()
    elif not isinstance(x, np.ndarray):
        x = np.asarray(x)  # a list: converted element by element (the small-engine convenience)
    if x.ndim != 1:
        raise ConfigError(f"wave_head(): {name} must be 1-d, got shape {list(x.shape)}")
    if x.dtype.kind not in kinds and not (x.size == 0):
        raise ConfigError(f"wave_head(): {name} must hold {'integers' if kinds == _INT_KINDS else 'floats'}, got {x.dtype}")
    return x


def _host2d(x, where: str):
    """A 2-d numpy integer array over ``x`` (no copy for numpy and CPU tensors)."""
    import numpy as np

    if hasattr(x, "detach") and hasattr(x, "numpy"):
        x = x.detach()
        if x.device.type != "cpu":
            raise ConfigError(f"{where} must be on the CPU (a view the client can read each step), got {x.device}")
        x = x.numpy()
    elif not isinstance(x, np.ndarray):
        raise ConfigError(f"{where} must be a numpy array or a CPU torch tensor, got {type(x).__name__}")
    if x.ndim != 2 or x.dtype.kind not in _INT_KINDS:
        raise ConfigError(f"{where} must be a 2-d integer array, got shape {list(x.shape)} {x.dtype}")
    return x


class TensorBatch:
    """``Client.tensor_batch()``: the engine's rows, their sparse events, and the per-step head.
    The rows and events are kept by a slot store below it in the class order: SlotEvents, or its
    C twin when the native path is on (native.py; ``native_slots`` says which)."""

    native_slots = False

    def __new__(cls, *args, **kwargs):
        if cls is TensorBatch:  # the concrete class on the store the native path picks (native.py)
            from . import native

            cls = _batch_class(native.load())
        return super().__new__(cls)

    def __init__(self, client, max_rows: int, max_tokens: Optional[int] = None, max_events: Optional[int] = None, vocab: int = 0):
        global _ndarray
        import numpy as np

        _ndarray = np.ndarray
        rows, tokens, events, vocab = ring_sizes(max_rows, max_tokens, max_events, vocab)
        super().__init__(rows)
        self.max_tokens, self.max_events, self.vocab = tokens, events, vocab
        self._client = client
        self._epoch = -1
        # Order across the two ways a head travels: the agent relays whole heads from its poll of
        # the ring and message heads as it reads its socket (a timer may run before the socket is
        # read), so a whole head written while a message head is unread could overtake it. After a
        # message head, heads go as messages naming their slot until the agent took the last such
        # slot. _PENDING: a message went and no slot was named since; 0: nothing pending.
        self._fence, self._fence_ring = 0, None
        self.stats = {"ring_heads": 0, "inline_heads": 0, "block_rows_sent": 0, "bad_block_rows": 0}
        self._bt = None  # block_table(): the engine's table and counts, and what the last head saw of them

    def ring_request(self) -> dict:
        """The hello's fields asking the agent for a ring of this batch's sizes."""
        return dict(ring_rows=self.max_rows, ring_tokens=self.max_tokens, ring_events=self.max_events, ring_vocab=self.vocab)

    def wave_head(self, wave: int, rows, token_ids=None, logprobs=None, token_counts=None,
                  draft_len=None, accepted=None, non_finite=None) -> bool:
        """Mark the head of ``wave`` with the telemetry of wave - 1, in columns: ``rows[i]`` sampled
        ``token_ids`` (one each, or ``token_counts[i]`` each, row by row), with ``logprobs``
        (same length, optional), and ``draft_len``/``accepted`` per row (speculative, optional).
        Like ``Client.wave_head``: one-way, never waits; True if sent."""
        c = self._client
        box = c._mb
        q = box._q  # the features word, read in place (None once closed: off)
        feats = q[_Q_FEATURES] if q is not None else 0
        if not feats & _SENDS and type(wave) is int and 0 <= wave <= _MAX_U64:
            # Everything off: what _head_gate does then, without its calls (a bad wave gets its
            # error there). The store's reset(): frees take effect, the finishes go unseen, and the
            # next head that goes re-sends every binding. One memory load and one C call.
            c._head_wave = wave
            self.reset()
            return False
        if not c._head_ready(wave, feats):
            feats = c._head_gate(wave, self)
            if feats is None:
                return False
        # The engine's own numpy columns pass as they are (the usual step); anything else via _host.
        r = rows if type(rows) is _ndarray and rows.ndim == 1 and rows.dtype.kind in _INT_KINDS else _host(rows, "rows", _INT_KINDS)
        n = r.shape[0]
        arrays = [r]  # in ring.ARRAY_ORDER, named by present
        present = _B_ROW
        tokens = 0
        if feats & _DETECTORS and token_ids is not None:
            ids = token_ids
            if not (type(ids) is _ndarray and ids.ndim == 1 and ids.dtype.kind in _INT_KINDS):
                ids = _host(token_ids, "token_ids", _INT_KINDS)
            tokens = ids.shape[0]
            if token_counts is not None:
                arrays.append(self._per_row(token_counts, "token_counts", n, _INT_KINDS))
                present |= _B_COUNT
            elif tokens != n:
                raise ConfigError(f"wave_head(): {tokens} token_ids for {n} rows; pass token_counts when a row sampled more than one")
            arrays.append(ids)
            if logprobs is not None:
                lp = logprobs
                if not (type(lp) is _ndarray and lp.ndim == 1 and lp.dtype.kind == "f"):
                    lp = _host(logprobs, "logprobs", "f")
                if lp.shape[0] != tokens:
                    raise ConfigError(f"wave_head(): {lp.shape[0]} logprobs for {tokens} token_ids")
                arrays.append(lp)
                present |= _B_IDS_LPS
            else:
                present |= _B_IDS
        if draft_len is not None or accepted is not None:
            if draft_len is None or accepted is None:
                raise ConfigError("wave_head(): draft_len and accepted go together")
            arrays.append(self._per_row(draft_len, "draft_len", n, _INT_KINDS))
            arrays.append(self._per_row(accepted, "accepted", n, _INT_KINDS))
            present |= _B_SPEC
        if self._bt is not None:
            self._diff_block_table()
        ev_rows, ev_flags = self.event_columns()  # this step's finish/free events (few), as lists
        epoch = box.epoch
        if epoch != self._epoch:  # a new coordinator knows no bindings
            self._epoch = epoch
            self.resend_all()
        nf = b""
        if non_finite is not None and feats & _DETECTORS:
            rows_nf = _nonfinite_list(non_finite, "wave_head(): non_finite")
            nf = pb.StepTelemetry(non_finite=[nonfinite_row_proto(x, f"wave_head(): non_finite[{i}]") for i, x in enumerate(rows_nf)]).SerializeToString()
        # The head's sparse part, joined from the bytes each event was encoded to once (head_bytes.py).
        extra = self.head(wave, wave - 1 if wave > 0 else 0, nf)
        ring = c._ring
        if (self._fence == 0 and ring is self._fence_ring and ring is not None and ring.room(n, tokens, len(ev_rows))
                and len(extra) <= ring.max_extra):
            # The usual step, as below in one test: the whole head in the ring (no message, no
            # system call; the agent polls for it), no message head pending, the same ring as before.
            ring.write(wave, present, arrays, n, tokens, ev_rows, ev_flags, extra)
            self.stats["ring_heads"] += 1
            c.stats["wave_head_sent"] += 1
            if ev_rows:
                self.sent()
            return True
        if ring is None:
            ring = c._telemetry_ring()
        fence = self._fence
        if ring is not self._fence_ring:
            self._fence_ring = ring  # a fresh ring (a new hello): nothing of the old one is pending in it
            if fence != _PENDING:
                fence = self._fence = 0
        if 0 < fence < _PENDING and ring is not None and ring.consumed() >= fence:
            fence = self._fence = 0
        if ring is not None and ring.room(n, tokens, len(ev_rows)):
            if fence == 0 and len(extra) <= ring.max_extra:
                # The whole head in the ring: no message, no system call; the agent polls for it.
                ring.write(wave, present, arrays, n, tokens, ev_rows, ev_flags, extra)
                self.stats["ring_heads"] += 1
                c.stats["wave_head_sent"] += 1
                if ev_rows:
                    self.sent()
                return True
            # The sparse part is large, or a message head is pending: a message names the slot.
            body = pb.WaveHeadRequest.FromString(extra)
            body.ring_seq = self._fence = ring.write(wave, present, arrays, n, tokens, ev_rows, ev_flags)
            self.stats["ring_heads"] += 1
        else:
            from .tensor_inline import inline_columns

            cols = dict(zip([name for name in ARRAY_ORDER if present & BIT[name]], arrays))
            if ev_rows:
                cols["event_row"], cols["event_flags"] = ev_rows, ev_flags
            body = pb.WaveHeadRequest.FromString(extra)
            inline_columns(body.telemetry.columns, cols, n)
            self.stats["inline_heads"] += 1
            self._fence = _PENDING
        if not c._send_head(body):
            # Not sent (the queue to the agent is full): as when sending pauses, its events are
            # dropped, its frees take effect (the engine may bind those rows at once; an arrive()
            # must never fail on a head wavebus could not send) and the next head re-sends every binding.
            self.reset()
            return False
        self.sent()
        return True

    def block_table(self, table, num_blocks) -> None:
        """Register the engine's block-table tensor ``table`` ([rows, max_blocks], integers, updated
        in place by the engine, as vLLM's and transformers' are) and its per-row block counts
        ``num_blocks`` ([rows]), numpy or CPU torch, once. Each head that is sent compares them with
        what the previous head saw (numpy, two vectorized comparisons), and the live rows whose
        blocks changed, or that a request took since, go with it as block-table events: the engine
        calls ``blocks()`` no more. Nothing is read while the bus is off."""
        t = _host2d(table, "block_table(): table")
        n = _host(num_blocks, "num_blocks", _INT_KINDS)
        if t.shape[0] < self.max_rows or n.shape[0] < self.max_rows:
            raise ConfigError(f"block_table(): table has {t.shape[0]} rows and num_blocks {n.shape[0]}; the batch has {self.max_rows}")
        import numpy as np

        rows = self.max_rows
        self._bt = (t[:rows], n[:rows], np.full((rows, t.shape[1]), -1, dtype=np.int64), np.full(rows, -1, dtype=np.int64))
        # From now on an arrival also marks its row's table unseen. Until then arrive() is the
        # store's own call (one C call on the native path), with no Python frame in front.
        self.arrive = self._arrive_registered

    def _arrive_registered(self, row, req_id: str, prompt_len: int = 0, prompt_token_ids=None) -> None:
        type(self).arrive(self, row, req_id, prompt_len, prompt_token_ids)
        self._bt[3][int(row)] = -1  # its table goes with the next head, whatever the last head saw

    def _diff_block_table(self) -> None:
        import numpy as np

        t, n, seen_t, seen_n = self._bt
        counts = n.astype(np.int64)  # a copy: the engine may write on
        width = min(max(int(counts.max()) if counts.size else 0, 0), t.shape[1])
        changed = counts != seen_n
        if width:
            changed |= (t[:, :width] != seen_t[:, :width]).any(axis=1)
        seen_t[:, :width] = t[:, :width]
        seen_n[:] = counts
        for r in np.flatnonzero(changed).tolist():
            if self.holder(r) is None:
                continue
            k = int(counts[r])
            try:
                if not 0 <= k <= t.shape[1]:
                    raise ConfigError(f"num_blocks[{r}] = {k} is not in 0..{t.shape[1]}")
                self.blocks(r, t[r, :k])
                self.stats["block_rows_sent"] += 1
            except ConfigError:
                # Garbage in the engine's table costs that row's update, never the step.
                self.stats["bad_block_rows"] += 1

    @staticmethod
    def _per_row(x, name: str, n: int, kinds: str):
        a = _host(x, name, kinds)
        if a.shape[0] != n:
            raise ConfigError(f"wave_head(): {name} has {a.shape[0]} entries for {n} rows")
        return a


class PyTensorBatch(TensorBatch, SlotEvents):
    """TensorBatch on SlotEvents (no native path)."""


_batch_classes = {None: PyTensorBatch}


def _batch_class(mod):
    """The TensorBatch for a _native module (None: the Python store)."""
    cls = _batch_classes.get(mod)
    if cls is None:
        cls = _batch_classes[mod] = type("NativeTensorBatch", (TensorBatch, native_slot_events(mod)),
                                         {"__doc__": "TensorBatch on NativeSlotEvents (the native path).", "native_slots": True})
    return cls


class TensorHeadMixin:
    """Client's side of the tensor path: the batch, and the ring the agent's hello named."""

    def tensor_batch(self, max_rows: int, *, max_tokens=None, max_events=None, vocab: int = 0):
        """The tensor hot path (docs/python-client.md): a ``TensorBatch`` of ``max_rows`` stable
        rows whose ``wave_head`` takes columns. Asks the agent for a telemetry ring at hello."""
        batch = TensorBatch(self, max_rows, max_tokens, max_events, vocab)
        self._ring_request = batch.ring_request()
        if self.agent_features is not None:
            self._rejoin()  # hello again, asking for the ring
        return batch

    def _telemetry_ring(self):
        """The ring the agent's hello named, mapped once (None: no ring, inline columns)."""
        if self._ring is None and self._ring_path:
            from .ring import TelemetryRing

            try:
                self._ring = TelemetryRing(self._ring_path, self.stats)
            except (OSError, ConfigError) as e:
                _log.warning("wavebus: telemetry ring %s unusable, sending columns inline: %s", self._ring_path, e)
                self._ring_path = ""
        return self._ring

