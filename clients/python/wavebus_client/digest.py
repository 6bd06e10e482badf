"""rank_divergence's engine side (docs/runtime-guard.md): per wave, a digest of the forward's inputs
(token ids, positions; at before_forward) and of the token column the rank decided (row order),
written into the decision ring, a file the agent created and reads without a message. The layout is
proto/layouts.json's "decision" (through shm_layout.py; the agent reads it with src/agent/decision-ring.ts).

Cost per call: one copy of the column into the ring as int32 (any integer dtype, so ranks that hold
int64 and int32 columns still agree) and one zlib CRC-32 over it; no message, no system call. The
input digest is taken the same way: over the ids and positions copied as int32 into the slot's
input columns (kept there, flagged, when the row starts are given).
Columns are numpy arrays or CPU torch tensors (a device tensor is copied to the host first: the
engine that samples on the device already brings its tokens back to append them).
"""
import mmap
import os
import struct
import zlib

import numpy as np

from . import native
from .errors import AgentUnavailableError, ConfigError, WavebusError
from .mailbox import FEATURE_RANK_DIGEST
from .shm_layout import layout

_L = layout("decision")
SLOTS = _L.constant("slots")
MAX_ROWS = _L.constant("max_rows")
MAX_INPUT_TOKENS = _L.constant("max_input_tokens")
MAGIC, VERSION, COLUMNS = _L.constant("magic"), _L.constant("version"), _L.constant("columns")
FLAG_TOKENS, FLAG_INPUTS, FLAG_COLUMN = _L.constant("flag_tokens"), _L.constant("flag_inputs"), _L.constant("flag_column")
FLAG_INPUT_COLUMNS = _L.constant("flag_input_columns")
SLOT_HEADERS, SLOT_BYTES = _L.struct("header").nbytes, _L.struct("slot").nbytes
_HEADER = [_L.struct("header")[f] for f in ("magic", "version", "slots", "max_rows", "max_input_tokens")]


def _packed(sname: str, names):
    """One struct.Struct for these fields of the layout's struct, read and written in one call: they
    must lie back to back in this order (the per-wave write is two packs, not one per field)."""
    fields = [_L.struct(sname)[n] for n in names]
    for a, b in zip(fields, fields[1:]):
        if a.at + a.nbytes != b.at:
            raise WavebusError(f"proto/layouts.json: layouts.decision.structs.{sname}: {b.name} does not follow {a.name}", "ERR_LAYOUT")
    return fields[0].at, struct.Struct("<" + "".join(f.st.format.lstrip("<") for f in fields))


_SEQ_AT, _SEQ = _packed("slot", ("seq",))
# The slot's fields in the order the ring keeps them per slot: seq, wave, token_crc, rows, input_crc, input_tokens, flags, input_rows.
_SLOT_AT, _SLOT = _packed("slot", ("seq", "wave", "token_crc", "rows", "input_crc", "input_tokens", "flags", "input_rows"))
_BODY_AT, _BODY = _packed("slot", ("wave", "token_crc", "rows", "input_crc", "input_tokens", "flags", "input_rows"))
if COLUMNS < SLOT_HEADERS + SLOTS * SLOT_BYTES:
    raise WavebusError(f"proto/layouts.json: layouts.decision.constants.columns: {COLUMNS} lies inside the {SLOTS} slot structs", "ERR_LAYOUT")


_I4 = np.dtype("<i4")


def as_array(column) -> np.ndarray:
    """A 1-D numpy view of ``column`` (numpy array, torch tensor, or a sequence), not necessarily
    contiguous (each use copies it into the ring, or checks)."""
    if type(column) is np.ndarray:
        a = column
    elif hasattr(column, "detach") and hasattr(column, "numpy"):  # a torch tensor
        # Tensor.numpy() per column: a view made once of the engine's buffer and sliced per step
        # measured slower after the forward (more torch calls to check it; docs/benchmarks.md).
        try:
            a = column.numpy()  # a CPU tensor without grad: in place, the common case
        except (RuntimeError, TypeError):
            a = column.detach().cpu().numpy()
    else:
        a = np.asarray(column)
    return a if a.ndim == 1 else a.reshape(-1)


def _crc_i4(a: np.ndarray, crc: int = 0) -> int:
    """CRC-32 of ``a``'s values as int32 little-endian (no copy when they already are)."""
    if a.dtype is not _I4 or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a, dtype=_I4)  # an unsafe cast for int64: token ids fit
    return zlib.crc32(a, crc)


def token_digest(column) -> int:
    """The CRC-32 the ring holds for ``column``: of its values as int32 little-endian (tests, tools)."""
    a = as_array(column)
    return _crc_i4(a.astype(_I4, copy=False)) if a.size else 0


def input_digest(token_ids, positions=None) -> int:
    """CRC-32 of the token ids as int32 little-endian, then the positions as int32 (the ring's form,
    as the token digest: ranks holding int64 and int32 columns agree, and half the bytes of int64)."""
    crc = _crc_i4(as_array(token_ids).astype(_I4, copy=False))
    if positions is not None:
        crc = _crc_i4(as_array(positions).astype(_I4, copy=False), crc)
    return crc


class DecisionRing:
    """The client's side of one decision ring (opened from the path the agent's hello gave).

    The only writer of its ring (one per rank): each slot's fields are kept here too, so a write is
    three stores into the mapping (seq odd; the fields; seq even) and reads nothing back."""

    def __init__(self, path: str, stats=None):
        nat = native.load()  # before the file is opened: a bad WAVEBUS_PY_NATIVE leaves nothing open
        where = f"decision ring {path}"
        # No link followed: the path came from the agent's socket; the file is the agent's, 0600.
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            size = os.fstat(fd).st_size
            if size < COLUMNS:
                raise ConfigError(f"{where}: {size} bytes, shorter than its header ({COLUMNS})")
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        magic, version, slots, max_rows, max_in = (f.read(self._mm) for f in _HEADER)
        if magic != MAGIC or version != VERSION or slots != SLOTS:
            self._mm.close()
            raise ConfigError(f"{where}: not a version {VERSION} ring of {SLOTS} slots (magic {magic:#x}, version {version}, slots {slots})")
        per_slot = 2 * max_in + max_rows + 1  # int32s of one slot's input columns
        if max_rows < 1 or COLUMNS + SLOTS * 4 * (max_rows + per_slot) > size:
            self._mm.close()
            raise ConfigError(f"{where}: columns of {max_rows} rows and {max_in} input tokens do not fit its {size} bytes")
        self.path, self.max_rows, self.max_input_tokens = path, max_rows, max_in
        # One int32 view per slot's column, made once: a write is a copy into it.
        whole = np.frombuffer(self._mm, dtype=_I4, count=SLOTS * max_rows, offset=COLUMNS)
        self._columns = [whole[i * max_rows:(i + 1) * max_rows] for i in range(SLOTS)]
        # The input columns (ids, positions, row starts) per slot, kept for the agent to name the
        # first row whose inputs differ after an inputs mismatch (it reads them only then).
        ins = np.frombuffer(self._mm, dtype=_I4, count=SLOTS * per_slot, offset=COLUMNS + SLOTS * 4 * max_rows)
        self._inputs = [(ins[i * per_slot:i * per_slot + max_in], ins[i * per_slot + max_in:i * per_slot + 2 * max_in],
                         ins[i * per_slot + 2 * max_in:(i + 1) * per_slot]) for i in range(SLOTS)]
        # The native path (native.py): each call's copies and CRC in one C call, given each slot's
        # column offsets (in the file) and the slot's bounds; counted per path in ``stats``.
        self._native = nat
        col_at, in_at = COLUMNS, COLUMNS + SLOTS * 4 * max_rows
        self._ncol = [(col_at + 4 * max_rows * i, col_at + 4 * max_rows * (i + 1)) for i in range(SLOTS)]
        self._nin = [(in_at + 4 * per_slot * i, in_at + 4 * per_slot * (i + 1), in_at + 4 * (per_slot * i + max_in), in_at + 4 * (per_slot * i + 2 * max_in))
                     for i in range(SLOTS)]
        self.stats = stats if stats is not None else {}
        self.stats.setdefault("digest_native_writes", 0)
        self.stats.setdefault("digest_numpy_writes", 0)
        # Per slot: [its struct's offset, seq, wave, token_crc, rows, input_crc, input_tokens, flags, input_rows].
        self._slots = []
        for i in range(SLOTS):
            off = SLOT_HEADERS + i * SLOT_BYTES
            self._slots.append([off, *_SLOT.unpack_from(self._mm, off + _SLOT_AT)])

    def _begin(self, wave: int):
        """Seq made odd (a reader leaves the slot out; still odd after a writer that died mid-write)
        before anything of the slot, its columns included, changes. Returns the slot's state."""
        s = self._slots[wave % SLOTS]
        s[1] |= 1
        _SEQ.pack_into(self._mm, s[0] + _SEQ_AT, s[1])
        return s

    def _end(self, s, wave: int, tokens, inputs) -> None:
        """The fields of slot ``s`` written, then seq even again (whole). ``tokens`` / ``inputs``:
        (crc, count, flags) / (crc, count, flags, rows), or None to keep what the slot holds for this
        wave (the inputs and the token column of one wave share its slot)."""
        if s[2] != wave:
            s[2:] = (wave, 0, 0, 0, 0, 0, 0)
        if tokens is not None:
            s[3], s[4], f = tokens
            s[7] = (s[7] & (FLAG_INPUTS | FLAG_INPUT_COLUMNS)) | f
        if inputs is not None:
            s[5], s[6], f, s[8] = inputs
            s[7] = (s[7] & ~(FLAG_INPUTS | FLAG_INPUT_COLUMNS)) | f
        off, seq, _, tcrc, rows, icrc, itok, flags, irows = s
        _BODY.pack_into(self._mm, off + _BODY_AT, wave, tcrc, rows, icrc, itok, flags, irows)
        s[1] = seq + 1
        _SEQ.pack_into(self._mm, off + _SEQ_AT, seq + 1)

    def inputs(self, wave: int, token_ids, positions=None, row_starts=None) -> int:
        """The forward of ``wave`` takes these inputs (before_forward). Returns the digest.
        ``row_starts``: where each row's tokens start in ``token_ids``, then their end (the engine's
        query_start_loc / cu_seq_lens_q, rows + 1 values): given, the inputs are kept in the slot (three
        copies, no digest per row: the agent makes that only after a mismatch) so an inputs-only
        divergence names its first row."""
        ids = as_array(token_ids)
        pos = None if positions is None else as_array(positions)
        n = ids.size
        s = self._begin(wave)
        c_ids, c_pos, c_starts = self._inputs[wave % SLOTS]
        flags, irows = FLAG_INPUTS, 0
        crc = None
        nat = self._native
        if nat is not None and n <= self.max_input_tokens and (pos is None or pos.size == n):
            lo, hi, pos_at, starts_at = self._nin[wave % SLOTS]
            mi = self.max_input_tokens
            if row_starts is None:
                crc = (nat.copy_i32_crc(self._mm, lo, hi, 0, 1, lo, mi, ids) if pos is None else
                       nat.copy_i32_crc(self._mm, lo, hi, 0, 2, lo, mi, ids, pos_at, mi, pos))
            elif pos is not None:
                starts = as_array(row_starts)
                r = starts.size - 1
                if 0 <= r <= self.max_rows:
                    crc = nat.copy_i32_crc(self._mm, lo, hi, 0, 2, lo, mi, ids, pos_at, mi, pos, starts_at, self.max_rows + 1, starts)
                    flags, irows = FLAG_INPUTS | FLAG_INPUT_COLUMNS, r
        if crc is not None:
            self.stats["digest_native_writes"] += 1
        elif n <= self.max_input_tokens and (pos is None or pos.size == n):
            flags, irows = FLAG_INPUTS, 0
            self.stats["digest_numpy_writes"] += 1
            # As int32 into the slot's input columns (like the token column), the digest over them:
            # input_digest's definition, one cast. Without row starts they are scratch (no flag).
            c = c_ids[:n]
            c[...] = ids
            crc = zlib.crc32(c)
            if pos is not None:
                c = c_pos[:n]
                c[...] = pos
                crc = zlib.crc32(c, crc)
            if row_starts is not None:
                starts = as_array(row_starts)
                r = starts.size - 1
                if 0 <= r <= self.max_rows:
                    if pos is None:
                        c_pos[:n] = 0
                    c_starts[:r + 1] = starts
                    flags, irows = FLAG_INPUTS | FLAG_INPUT_COLUMNS, r
        else:
            crc = input_digest(ids, pos)
            self.stats["digest_numpy_writes"] += 1
        self._end(s, wave, None, (crc, n & 0xFFFFFFFF, flags, irows))
        return crc

    def decided(self, wave: int, token_ids) -> int:
        """The rank decided ``token_ids`` (one per row, row order) in ``wave``. Returns the digest."""
        a = as_array(token_ids)
        n = a.size
        s = self._begin(wave)
        crc = None
        if n <= self.max_rows:
            if self._native is not None:
                lo, hi = self._ncol[wave % SLOTS]
                crc = self._native.copy_i32_crc(self._mm, lo, hi, 0, 1, lo, self.max_rows, a)
            if crc is not None:  # copied as int32 and digested in C (int32 or int64, C-contiguous)
                self.stats["digest_native_writes"] += 1
            else:
                col = self._columns[wave % SLOTS][:n]
                col[...] = a  # as int32, whatever the integer dtype (unsafe cast: token ids fit)
                crc = zlib.crc32(col)
                self.stats["digest_numpy_writes"] += 1
            flags = FLAG_TOKENS | FLAG_COLUMN
        else:  # too long for the slot: the digest alone (the incident then names no row)
            crc = _crc_i4(a)
            flags = FLAG_TOKENS
            self.stats["digest_numpy_writes"] += 1
        self._end(s, wave, (crc, n & 0xFFFFFFFF, flags), None)
        return crc

    def close(self) -> None:
        self._columns = []
        self._inputs = []
        self._native = None
        try:
            self._mm.close()
        except BufferError:  # a caller still holds a view; the mapping goes with the process
            pass


class DigestMixin:
    """``Client.decided`` and ``Client.decided_inputs``: with rank_divergence off (the mailbox's
    RANK_DIGEST bit clear) each returns at once; on, each is one ring write (no message)."""

    # Not _ring / _ring_path: those are the telemetry ring's (tensor_head.py), a file of its own.
    _decision = None
    _decision_path = ""

    def _decision_ring(self):
        if not self._mb.features & FEATURE_RANK_DIGEST:
            return None
        if self._decision is None:
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
                self._decision = DecisionRing(self._decision_path, self.stats)
            except (OSError, ConfigError) as e:
                self.stats["decision_ring_errors"] = self.stats.get("decision_ring_errors", 0) + 1
                self.last_error = f"decision ring: {e}"
                self._decision_path = ""  # not asked again until a new hello names one
                return None
        return self._decision

    def decided_inputs(self, wave: int, token_ids, positions=None, row_starts=None) -> bool:
        """At before_forward of ``wave``: digest of the forward's token ids (and positions); with
        ``row_starts`` (rows + 1 offsets into token_ids) the inputs are kept so that a mismatch names
        its first row. True if written."""
        ring = self._decision_ring()
        if ring is None:
            return False
        ring.inputs(wave, token_ids, positions, row_starts)
        return True

    def decided(self, wave: int, token_ids) -> bool:
        """After sampling in ``wave``: digest of the token column (one id per row, in the wave head
        telemetry's row order). True if written."""
        ring = self._decision_ring()
        if ring is None:
            return False
        ring.decided(wave, token_ids)
        return True

    def _forget_decision_ring(self, path: str) -> None:
        """A hello named ``path`` (empty: none): a new agent may have a new ring."""
        if self._decision is not None and path != self._decision.path:
            self._decision.close()
            self._decision = None
        self._decision_path = path
