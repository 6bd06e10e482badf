"""The telemetry ring's writer: per step, one copy per column into a slot of a file the agent
created and reads when the wave head naming the slot's seq arrives. No per-element Python, no
protobuf, no system call. The layout is proto/layouts.json's "telemetry" (through shm_layout.py;
the agent's reader is src/agent/telemetry-ring.ts).

Seqlock: the slot's seq word goes odd, the columns and counts are stored, then seq goes even
(2k for write k). The agent reads seq before and after it copies the slot out and drops a slot
whose seq changed or is not the one its head named (a torn write, counted as garbage). Stores
from one thread are seen in order on x86-64 and, through the GIL's barriers, on arm64.
"""
import mmap
import os
import struct
from itertools import repeat
from operator import setitem
from typing import Dict, Optional, Sequence

from . import native
from .errors import ConfigError
from .shm_layout import layout

_L = layout("telemetry")
HEADER = {f.name: f.at for f in _L.struct("header").fields.values()}
SLOT = {f.name: f.at for f in _L.struct("slot").fields.values()}
HEADER_BYTES = _L.struct("header").nbytes
MAGIC = struct.pack("<II", _L.constant("magic"), _L.constant("magic_hi"))  # b"WBTRING1"
VERSION = _L.constant("version")
COLUMNS = [c.name for c in _L.columns]
BIT = {name: 1 << i for i, name in enumerate(COLUMNS)}  # the slot's present word
# The numpy columns write() takes, in this order (those present); the per-row ones hold ``rows``
# values, the others ``tokens``. The events come as lists, the head's sparse part as bytes.
ARRAY_ORDER = ("row", "token_count", "token_ids", "token_logprobs", "draft_len", "accepted")
_PER_TOKEN = ("token_ids", "token_logprobs")
_ELLIPSES = repeat(Ellipsis)
MAX_ROWS = 1 << 20  # the coordinator's slot limit (src/client/telemetry.ts MAX_SLOTS)
_SEQ_AT, _WAVE_AT = SLOT["seq"], SLOT["wave"]
_WRITTEN_Q, _CONSUMED_Q = HEADER["written"] // 8, HEADER["consumed"] // 8
# wave, rows, tokens, events, present, extra_len: one store when the layout keeps them together (it does)
_COUNTS = struct.Struct("<QIIIII")
_COUNTS_TOGETHER = [SLOT[f] - SLOT["wave"] for f in ("rows", "tokens", "events", "present", "extra_len")] == [8, 12, 16, 20, 24]
# The events are a few Python ints: the rows packed with a struct made once per count, the flags
# (1..3) stored as bytes. A layout with other event dtypes fails here, at import.
_EV_ROW_CODE = {"<u4": "I", "<u2": "H", "<i4": "i"}[{c.name: c.dtype for c in _L.columns}["event_row"]]
assert {c.name: c.dtype for c in _L.columns}["event_flags"] == "<u1", "event_flags is one byte a flag"
_EV_BITS = BIT["event_row"] | BIT["event_flags"]
_EXTRA_BIT = BIT["extra"]
def column_offsets(max_rows: int, max_tokens: int, max_events: int, max_extra: int):
    """(offset in the slot, capacity, numpy dtype) per column, and the slot's bytes: as the agent computes them."""
    places, nbytes = _L.place_columns({"max_rows": max_rows, "max_tokens": max_tokens, "max_events": max_events, "max_extra": max_extra})
    return {name: (at, n, col.dtype) for name, (at, n, col) in places.items()}, nbytes


class TelemetryRing:
    """The client's side of one ring file (from the path the agent's hello gave)."""

    def __init__(self, path: str, stats: Optional[Dict[str, int]] = None):
        import numpy as np

        nat = native.load()  # before the file is opened: a bad WAVEBUS_PY_NATIVE leaves nothing open
        where = f"telemetry ring {path}"
        # No link followed: the path came from the agent's socket; the file is the agent's, 0600.
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_BYTES:
                raise ConfigError(f"{where}: {size} bytes, shorter than its header")
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        mm = self._mm
        u32 = lambda name: struct.unpack_from("<I", mm, HEADER[name])[0]  # noqa: E731
        if bytes(mm[0:8]) != MAGIC or u32("version") != VERSION:
            self.close()
            raise ConfigError(f"{where}: not a version {VERSION} telemetry ring")
        self.slots, self.max_rows, self.max_tokens, self.max_events = u32("slots"), u32("max_rows"), u32("max_tokens"), u32("max_events")
        self.max_extra = u32("max_extra")
        stride = struct.unpack_from("<Q", mm, HEADER["slot_bytes"])[0]
        self._cols, want = column_offsets(self.max_rows, self.max_tokens, self.max_events, self.max_extra)
        if self.slots < 1 or stride != want or HEADER_BYTES + self.slots * stride > size:
            self.close()
            raise ConfigError(f"{where}: {self.slots} slots of {stride} bytes do not fit its {size} bytes")
        struct.pack_into("<I", mm, HEADER["pid"], os.getpid())
        self.path, self.stride = path, stride
        self._base = [HEADER_BYTES + i * stride for i in range(self.slots)]
        # numpy views over every column of every slot, made once: a step only assigns into them.
        self._views = [{name: np.frombuffer(mm, dtype=dt, count=n, offset=b + off) for name, (off, n, dt) in self._cols.items()}
                       for b in self._base]
        # The file as u64 words: the header's written and consumed, each slot's seq (u64 fields,
        # 8-aligned in the layout, as are the header's and a slot's sizes: shm_layout.py checks it).
        self._q = memoryview(mm)[:size - size % 8].cast("Q")
        self._pack = struct.Struct("<QIII")  # wave, rows, tokens, events
        # Per slot: where it starts, its extra, its event rows and flags (absolute offsets).
        c = self._cols
        self._at = [((b + _SEQ_AT) // 8, b + _WAVE_AT, b + c["extra"][0], b + c["event_row"][0], b + c["event_flags"][0]) for b in self._base]
        # Per slot, the views of the last write's columns cut to its lengths, and what they were
        # cut for ((present, rows, tokens)): a step like the last assigns into them as they are.
        self._plan = [(None, ()) for _ in self._base]
        self._ev_pack: Dict[int, struct.Struct] = {}  # event count -> its rows' struct
        # A client that comes back to the ring goes on numbering after the last write.
        self._seq = struct.unpack_from("<Q", mm, HEADER["written"])[0] // 2
        # The native path (native.py): per slot, its offsets packed once for _native.ring_write.
        self._native, self._nplan = nat, []
        if nat is not None:
            try:
                self._nplan = [self._native_plan(b) for b in self._base]
            except (KeyError, AttributeError):  # a module built from other sources: the numpy path
                self._native, self._nplan = None, []
        # Which path wrote each slot (Client.stats when the client made the ring).
        self.stats = stats if stats is not None else {}
        self.stats.setdefault("ring_native_writes", 0)
        self.stats.setdefault("ring_numpy_writes", 0)

    def _native_plan(self, b: int) -> bytes:
        """Slot ``b``'s offsets for _native.ring_write, absolute in the file, from the layout, packed
        in the order the module names (RING_PLAN, then RING_PLAN_COLUMN per column in ARRAY_ORDER);
        the C side checks each against the slot."""
        c = self._cols
        ev_dt = c["event_row"][2]
        at = {"base": b, "stride": self.stride, "extra": b + c["extra"][0], "extra_cap": c["extra"][1],
              "event_row": b + c["event_row"][0], "event_row_cap": c["event_row"][1], "event_row_kind": ord(ev_dt[1]),
              "event_row_size": int(ev_dt[2:]), "event_flags": b + c["event_flags"][0], "event_flags_cap": c["event_flags"][1],
              "event_bits": _EV_BITS, "extra_bit": _EXTRA_BIT, "written": HEADER["written"], "columns": len(ARRAY_ORDER),
              **{f: b + SLOT[f] for f in ("seq", "wave", "rows", "tokens", "events", "present", "extra_len")}}
        plan = [at[name] for name in self._native.RING_PLAN]
        for name in ARRAY_ORDER:
            off, n, dt = c[name]
            col = {"bit": BIT[name], "at": b + off, "cap": n, "kind": ord(dt[1]), "size": int(dt[2:]), "per_token": int(name in _PER_TOKEN)}
            plan += [col[f] for f in self._native.RING_PLAN_COLUMN]
        return struct.pack(f"<{len(plan)}q", *plan)

    def room(self, rows: int, tokens: int, events: int) -> bool:
        """Whether a step of these sizes fits a slot and the next write's slot was taken by the
        agent: never overwrite a head it has not read (the caller sends that head as a message
        instead; nothing is lost when the agent lags)."""
        if rows <= self.max_rows and tokens <= self.max_tokens and events <= self.max_events:
            k = self._seq + 1
            return k <= self.slots or self._q[_CONSUMED_Q] >= 2 * (k - self.slots)
        return False

    def consumed(self) -> int:
        """The seq of the last slot the agent took (the header's consumed word)."""
        return self._q[_CONSUMED_Q]

    def write(self, wave: int, present: int, arrays: Sequence, rows: int, tokens: int, ev_rows: list, ev_flags: list, extra: bytes = b"") -> int:
        """Copy one step's columns into the next slot; returns its seq. ``arrays`` are the numpy
        columns named by ``present`` (BIT), in ARRAY_ORDER, each of ``rows`` or ``tokens`` values;
        ``ev_rows``/``ev_flags`` the finish/free events (Python ints, made by the client: in range).
        The caller checked room(). With ``extra`` (the head's sparse part, at most max_extra bytes)
        the slot is the whole head: ``written`` says so and the agent takes it on its own; without,
        the head goes as a message naming the seq."""
        i = self._seq % self.slots
        k = self._seq + 1
        if self._native is not None and self._native.ring_write(self._mm, self._nplan[i], 2 * k, wave, present, arrays, rows, tokens, ev_rows, ev_flags, extra):
            self._seq = k  # the whole write in C: columns C-contiguous with a dtype it casts as numpy does
            self.stats["ring_native_writes"] += 1
            return 2 * k
        seq_q, wave_at, extra_at, ev_row_at, ev_flags_at = self._at[i]
        mm, q = self._mm, self._q
        q[seq_q] = 2 * k - 1  # seq odd: being written
        plan = self._plan[i]
        if plan[0] != (present, rows, tokens):
            plan = self._plan[i] = ((present, rows, tokens), self._cut(i, present, rows, tokens))
        list(map(setitem, plan[1], _ELLIPSES, arrays))  # one copy a column (a cast where the engine's dtype differs)
        events = len(ev_rows)
        if events:
            try:
                pk = self._ev_pack[events]
            except KeyError:
                pk = self._ev_pack[events] = struct.Struct(f"<{events}{_EV_ROW_CODE}")
            pk.pack_into(mm, ev_row_at, *ev_rows)
            mm[ev_flags_at:ev_flags_at + events] = bytes(ev_flags)
            present |= _EV_BITS
        if extra:
            mm[extra_at:extra_at + len(extra)] = extra
            present |= _EXTRA_BIT
        if _COUNTS_TOGETHER:
            _COUNTS.pack_into(mm, wave_at, wave, rows, tokens, events, present, len(extra))
        else:
            self._pack.pack_into(mm, wave_at, wave, rows, tokens, events)
            struct.pack_into("<II", mm, wave_at - _WAVE_AT + SLOT["present"], present, len(extra))
        q[seq_q] = 2 * k  # seq even: written
        if extra:
            q[_WRITTEN_Q] = 2 * k  # after the slot: the agent's poll takes it
        self._seq = k
        self.stats["ring_numpy_writes"] += 1
        return 2 * k

    def _cut(self, i: int, present: int, rows: int, tokens: int) -> tuple:
        """Slot ``i``'s views of the columns in ``present``, in ARRAY_ORDER, cut to their lengths."""
        views = self._views[i]
        return tuple(views[name][:tokens if name in _PER_TOKEN else rows] for name in ARRAY_ORDER if present & BIT[name])

    def close(self) -> None:
        self._views, self._plan, self._native = [], [], None
        q, self._q = getattr(self, "_q", None), None
        if q is not None:
            q.release()  # an exported view would keep the mmap from closing
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # a view still held by the engine: the mapping goes with it


def ring_sizes(max_rows, max_tokens: Optional[int], max_events: Optional[int], vocab: int):
    """The hello's ring request, checked: (rows, tokens, events, vocab)."""
    for name, v in (("max_rows", max_rows), ("max_tokens", max_tokens), ("max_events", max_events), ("vocab", vocab)):
        if v is None and name in ("max_tokens", "max_events"):
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"Client.tensor_batch(): {name} must be a non-negative integer, got {v!r}")
    if not 1 <= max_rows <= MAX_ROWS:
        raise ConfigError(f"Client.tensor_batch(): max_rows must be in 1..{MAX_ROWS}, got {max_rows}")
    tokens = max_rows if max_tokens is None else max_tokens
    events = max(64, max_rows // 4) if max_events is None else max_events
    if tokens > 16 * MAX_ROWS or events > MAX_ROWS or vocab > 0xFFFFFFFF:
        raise ConfigError("Client.tensor_batch(): max_tokens, max_events or vocab is too large")
    return max_rows, tokens, events, vocab
