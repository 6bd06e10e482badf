"""rank_divergence's engine side (docs/runtime-guard.md): per wave, a digest of the forward's inputs
(token ids, positions; at before_forward) and of the token column the rank decided (row order),
written into the decision ring, a file the agent created and reads without a message. The layout is
proto/wavebus.proto's DecisionLayout (the agent reads it with src/agent/decision-ring.ts).

Cost per call: one copy of the column into the ring as int32 (any integer dtype, so ranks that hold
int64 and int32 columns still agree) and one zlib CRC-32 over it; no message, no system call.
Columns are numpy arrays or CPU torch tensors (a device tensor is copied to the host first: the
engine that samples on the device already brings its tokens back to append them).
"""
import mmap
import os
import struct
import zlib

import numpy as np

from . import wavebus_pb2 as pb
from .errors import AgentUnavailableError, ConfigError
from .mailbox import FEATURE_RANK_DIGEST

SLOTS = pb.DECISION_SLOTS
MAX_ROWS = pb.DECISION_MAX_ROWS
_SEQ = struct.Struct("<Q")
# A slot header as DecisionLayout has it: seq, wave, token_crc, rows, input_crc, input_tokens, flags.
_SLOT = struct.Struct("<QQIIIII")
_BODY = struct.Struct("<QIIIII")  # the same from wave on
assert _SLOT.size == pb.DECISION_SLOT_OFF_FLAGS + 4 and pb.DECISION_SLOT_OFF_WAVE == 8 and pb.DECISION_SLOT_OFF_TOKEN_CRC == 16
assert (pb.DECISION_SLOT_OFF_ROWS, pb.DECISION_SLOT_OFF_INPUT_CRC, pb.DECISION_SLOT_OFF_INPUT_TOKENS) == (20, 24, 28)


def as_array(column) -> np.ndarray:
    """A 1-D contiguous numpy view of ``column`` (numpy array, torch tensor, or a sequence)."""
    if isinstance(column, np.ndarray):
        a = column
    elif hasattr(column, "detach") and hasattr(column, "numpy"):  # a torch tensor
        try:
            a = column.numpy()  # a CPU tensor without grad: in place, the common case
        except (RuntimeError, TypeError):
            a = column.detach().cpu().numpy()
    else:
        a = np.asarray(column)
    if a.ndim != 1:
        a = a.reshape(-1)
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a


def token_digest(column) -> int:
    """The CRC-32 the ring holds for ``column``: of its values as int32 little-endian (tests, tools)."""
    a = as_array(column)
    return zlib.crc32(a.astype("<i4", copy=False)) if a.size else 0


def input_digest(token_ids, positions=None) -> int:
    """CRC-32 of the token ids' bytes, then the positions' bytes (as the engine holds them)."""
    crc = zlib.crc32(as_array(token_ids))
    if positions is not None:
        crc = zlib.crc32(as_array(positions), crc)
    return crc


class DecisionRing:
    """The client's side of one decision ring (opened from the path the agent's hello gave)."""

    def __init__(self, path: str):
        where = f"decision ring {path}"
        # No link followed: the path came from the agent's socket; the file is the agent's, 0600.
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            size = os.fstat(fd).st_size
            if size < pb.DECISION_COLUMNS:
                raise ConfigError(f"{where}: {size} bytes, shorter than its header ({pb.DECISION_COLUMNS})")
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        magic, version, slots, max_rows = struct.unpack_from("<IIII", self._mm, 0)
        if magic != pb.DECISION_MAGIC or version != pb.DECISION_VERSION or slots != SLOTS:
            self._mm.close()
            raise ConfigError(f"{where}: not a version {pb.DECISION_VERSION} ring of {SLOTS} slots (magic {magic:#x}, version {version}, slots {slots})")
        if max_rows < 1 or pb.DECISION_COLUMNS + SLOTS * 4 * max_rows > size:
            self._mm.close()
            raise ConfigError(f"{where}: columns of {max_rows} rows do not fit its {size} bytes")
        self.path, self.max_rows = path, max_rows
        # One int32 view per slot's column, made once: a write is np.copyto into it.
        whole = np.frombuffer(self._mm, dtype="<i4", count=SLOTS * max_rows, offset=pb.DECISION_COLUMNS)
        self._columns = [whole[i * max_rows:(i + 1) * max_rows] for i in range(SLOTS)]

    def _begin(self, wave: int):
        """Seq made odd (a reader leaves the slot out; still odd after a writer that died
        mid-write) before anything of the slot, its column included, changes."""
        off = pb.DECISION_SLOT_HEADERS + (wave % SLOTS) * pb.DECISION_SLOT_BYTES
        head = _SLOT.unpack_from(self._mm, off)
        _SEQ.pack_into(self._mm, off, head[0] | 1)
        return off, head

    def _write(self, wave: int, begun, tokens, inputs) -> None:
        """The fields written, seq even again (whole). ``tokens`` / ``inputs``: (crc, count, flags)
        or None to keep what the slot holds for this wave."""
        mm = self._mm
        off, (seq, old_wave, tcrc, rows, icrc, itok, flags) = begun
        seq |= 1
        if old_wave != wave:
            tcrc = rows = icrc = itok = flags = 0
        if tokens is not None:
            tcrc, rows, f = tokens
            flags = (flags & pb.DECISION_FLAG_INPUTS) | f
        if inputs is not None:
            icrc, itok, f = inputs
            flags |= f
        _BODY.pack_into(mm, off + 8, wave, tcrc, rows, icrc, itok, flags)
        _SEQ.pack_into(mm, off, seq + 1)

    def inputs(self, wave: int, token_ids, positions=None) -> int:
        """The forward of ``wave`` takes these inputs (before_forward). Returns the digest."""
        ids = as_array(token_ids)
        crc = zlib.crc32(ids)
        if positions is not None:
            crc = zlib.crc32(as_array(positions), crc)
        self._write(wave, self._begin(wave), None, (crc, ids.size & 0xFFFFFFFF, pb.DECISION_FLAG_INPUTS))
        return crc

    def decided(self, wave: int, token_ids) -> int:
        """The rank decided ``token_ids`` (one per row, row order) in ``wave``. Returns the digest."""
        a = as_array(token_ids)
        n = a.size
        begun = self._begin(wave)
        if n <= self.max_rows:
            col = self._columns[wave % SLOTS][:n]
            col[...] = a  # as int32, whatever the integer dtype (unsafe cast: token ids fit)
            crc = zlib.crc32(col)
            flags = pb.DECISION_FLAG_TOKENS | pb.DECISION_FLAG_COLUMN
        else:  # too long for the slot: the digest alone (the incident then names no row)
            crc = zlib.crc32(a.astype("<i4", copy=False))
            flags = pb.DECISION_FLAG_TOKENS
        self._write(wave, begun, (crc, n & 0xFFFFFFFF, flags), None)
        return crc

    def close(self) -> None:
        self._columns = []
        try:
            self._mm.close()
        except BufferError:  # a caller still holds a view; the mapping goes with the process
            pass


class DigestMixin:
    """``Client.decided`` and ``Client.decided_inputs``: with rank_divergence off (the mailbox's
    RANK_DIGEST bit clear) each returns at once; on, each is one ring write (no message)."""

    # Named apart from the telemetry ring's _ring / _ring_path (tensor_head.py): one Client holds both.
    _decision_ring = None
    _decision_path = ""

    def _decision_ring_open(self):
        if not self._mb.features & FEATURE_RANK_DIGEST:
            return None
        if self._decision_ring is None:
            # The ring's path comes with the hello (said once, within the bound, then remembered); an
            # agent that does not answer is marked lost once and probed, never waited on per step.
            if self.agent_features is None:
                try:
                    self._ensure_hello("decided()")
                except AgentUnavailableError:
                    return None
            if not self._decision_path:
                return None
            try:
                self._decision_ring = DecisionRing(self._decision_path)
            except (OSError, ConfigError) as e:
                self.stats["decision_ring_errors"] = self.stats.get("decision_ring_errors", 0) + 1
                self.last_error = f"decision ring: {e}"
                self._decision_path = ""  # not asked again until a new hello names one
                return None
        return self._decision_ring

    def decided_inputs(self, wave: int, token_ids, positions=None) -> bool:
        """At before_forward of ``wave``: digest of the forward's token ids (and positions). True if written."""
        ring = self._decision_ring_open()
        if ring is None:
            return False
        ring.inputs(wave, token_ids, positions)
        return True

    def decided(self, wave: int, token_ids) -> bool:
        """After sampling in ``wave``: digest of the token column (one id per row, in the wave head
        telemetry's row order). True if written."""
        ring = self._decision_ring_open()
        if ring is None:
            return False
        ring.decided(wave, token_ids)
        return True

    def _forget_decision_ring(self, path: str) -> None:
        """A hello named ``path`` (empty: none): a new agent may have a new ring."""
        if self._decision_ring is not None and path != self._decision_ring.path:
            self._decision_ring.close()
            self._decision_ring = None
        self._decision_path = path
