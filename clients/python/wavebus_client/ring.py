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
from typing import Dict, Optional

from .errors import ConfigError
from .shm_layout import layout

_L = layout("telemetry")
HEADER = {f.name: f.at for f in _L.struct("header").fields.values()}
SLOT = {f.name: f.at for f in _L.struct("slot").fields.values()}
HEADER_BYTES = _L.struct("header").nbytes
MAGIC = struct.pack("<II", _L.constant("magic"), _L.constant("magic_hi"))  # b"WBTRING1"
VERSION = _L.constant("version")
COLUMNS = [c.name for c in _L.columns]
MAX_ROWS = 1 << 20  # the coordinator's slot limit (src/client/telemetry.ts MAX_SLOTS)
_U64 = struct.Struct("<Q")
_SEQ_AT = SLOT["seq"]
_WRITTEN_AT, _CONSUMED_Q = HEADER["written"], HEADER["consumed"] // 8
# wave, rows, tokens, events, present, extra_len: one store when the layout keeps them together (it does)
_COUNTS = struct.Struct("<QIIIII")
_COUNTS_TOGETHER = [SLOT[f] - SLOT["wave"] for f in ("rows", "tokens", "events", "present", "extra_len")] == [8, 12, 16, 20, 24]


_STRUCT_CODE = {"<u4": "I", "<u1": "B", "<u2": "H", "<i4": "i"}
_PACKERS: Dict[tuple, struct.Struct] = {}


def _packer(code: str, n: int) -> struct.Struct:
    """A little-endian struct of ``n`` values of ``code``, made once per count."""
    st = _PACKERS.get((code, n))
    if st is None:
        st = _PACKERS[(code, n)] = struct.Struct(f"<{n}{code}")
    return st


def column_offsets(max_rows: int, max_tokens: int, max_events: int, max_extra: int):
    """(offset in the slot, capacity, numpy dtype) per column, and the slot's bytes: as the agent computes them."""
    places, nbytes = _L.place_columns({"max_rows": max_rows, "max_tokens": max_tokens, "max_events": max_events, "max_extra": max_extra})
    return {name: (at, n, col.dtype) for name, (at, n, col) in places.items()}, nbytes


class TelemetryRing:
    """The client's side of one ring file (from the path the agent's hello gave)."""

    def __init__(self, path: str):
        import numpy as np

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
        # Per slot and column, the view cut to the last length written there, and that length: a
        # step of the same batch size assigns into it without making a new view.
        self._cut = [{} for _ in self._base]
        # The header as u64 words (written, consumed: one index each; both 8-aligned in the layout).
        self._hq = memoryview(mm)[:HEADER_BYTES].cast("Q") if HEADER["consumed"] % 8 == 0 and HEADER["written"] % 8 == 0 else None
        self._pack = struct.Struct("<QIII")  # wave, rows, tokens, events
        self._present_bit = {name: 1 << i for i, name in enumerate(COLUMNS)}
        self._extra_off = self._cols["extra"][0]
        # struct codes of the integer columns a list may fill (the events): offset in the slot, code.
        self._list_cols = {name: (off, _STRUCT_CODE[dt]) for name, (off, n, dt) in self._cols.items() if dt in _STRUCT_CODE}
        # A client that comes back to the ring goes on numbering after the last write.
        self._seq = struct.unpack_from("<Q", mm, HEADER["written"])[0] // 2

    def fits(self, rows: int, tokens: int, events: int) -> bool:
        return rows <= self.max_rows and tokens <= self.max_tokens and events <= self.max_events

    def fits_extra(self, nbytes: int) -> bool:
        return nbytes <= self.max_extra

    def consumed(self) -> int:
        """The seq of the last slot the agent took (the header's consumed word)."""
        hq = self._hq
        return hq[_CONSUMED_Q] if hq is not None else struct.unpack_from("<Q", self._mm, HEADER["consumed"])[0]

    def free(self) -> bool:
        """Whether the next write's slot was taken by the agent: never overwrite a head it has not
        read (the caller sends that head as a message instead; nothing is lost when the agent lags)."""
        k = self._seq + 1
        return k <= self.slots or self.consumed() >= 2 * (k - self.slots)

    def write(self, wave: int, columns: Dict[str, object], rows: int, tokens: int, events: int, extra: bytes = b"") -> int:
        """Copy one step's columns (numpy arrays, already of the right length) into the next slot;
        returns its seq. The caller checked fits(). With ``extra`` (the head's sparse part, at most
        max_extra bytes) the slot is the whole head: ``written`` says so and the agent takes it on
        its own; without, the head goes as a message naming the seq."""
        k = self._seq + 1
        i = (k - 1) % self.slots
        base = self._base[i]
        cut, mm, bits = self._cut[i], self._mm, self._present_bit
        _U64.pack_into(mm, base + _SEQ_AT, 2 * k - 1)  # seq odd: being written
        present = 0
        for name, arr in columns.items():
            if type(arr) is list:
                # The few finish/free events, as Python ints: packed straight into the slot (numpy
                # would first build an array of them). The client made them: rows and flags in range.
                at, code = self._list_cols[name]
                _packer(code, len(arr)).pack_into(mm, base + at, *arr)
            else:
                n = len(arr)
                held = cut.get(name)
                if held is None or held[0] != n:
                    held = cut[name] = (n, self._views[i][name][:n])
                held[1][...] = arr  # one copy (a cast where the engine's dtype differs)
            present |= bits[name]
        if extra:
            at = base + self._extra_off
            mm[at: at + len(extra)] = extra
            present |= bits["extra"]
        if _COUNTS_TOGETHER:
            _COUNTS.pack_into(mm, base + SLOT["wave"], wave, rows, tokens, events, present, len(extra))
        else:
            self._pack.pack_into(mm, base + SLOT["wave"], wave, rows, tokens, events)
            struct.pack_into("<II", mm, base + SLOT["present"], present, len(extra))
        _U64.pack_into(mm, base + _SEQ_AT, 2 * k)  # seq even: written
        if extra:
            _U64.pack_into(mm, _WRITTEN_AT, 2 * k)  # after the slot: the agent's poll takes it
        self._seq = k
        return 2 * k

    def close(self) -> None:
        self._views, self._cut = [], []
        hq, self._hq = getattr(self, "_hq", None), None
        if hq is not None:
            hq.release()  # an exported view would keep the mmap from closing
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
