"""rank_divergence's engine side (docs/runtime-guard.md): per wave, a digest of the forward's inputs
(token ids, positions; at before_forward) and of the token column the rank decided (row order),
written into the decision ring, a file the agent created and reads without a message. The layout is
proto/layouts.json's "decision" (through shm_layout.py; the agent reads it with src/agent/decision-ring.ts).

Cost per call: one copy of the column into the ring as int32 (any integer dtype, so ranks that hold
int64 and int32 columns still agree) and one zlib CRC-32 over it; no message, no system call. The
input digest is taken the same way: over the ids and positions as int32 (over the ring's copies
when the inputs are kept).
Columns are numpy arrays or CPU torch tensors (a device tensor is copied to the host first: the
engine that samples on the device already brings its tokens back to append them).
"""
import mmap
import os
import struct
import zlib

import numpy as np

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
# The slot's fields in the order _write unpacks them: seq, wave, token_crc, rows, input_crc, input_tokens, flags, input_rows.
_SLOT_AT, _SLOT = _packed("slot", ("seq", "wave", "token_crc", "rows", "input_crc", "input_tokens", "flags", "input_rows"))
_BODY_AT, _BODY = _packed("slot", ("wave", "token_crc", "rows", "input_crc", "input_tokens", "flags", "input_rows"))
if COLUMNS < SLOT_HEADERS + SLOTS * SLOT_BYTES:
    raise WavebusError(f"proto/layouts.json: layouts.decision.constants.columns: {COLUMNS} lies inside the {SLOTS} slot structs", "ERR_LAYOUT")


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
    """CRC-32 of the token ids as int32 little-endian, then the positions as int32 (the ring's form,
    as the token digest: ranks holding int64 and int32 columns agree, and half the bytes of int64)."""
    crc = zlib.crc32(as_array(token_ids).astype("<i4", copy=False))
    if positions is not None:
        crc = zlib.crc32(as_array(positions).astype("<i4", copy=False), crc)
    return crc


class DecisionRing:
    """The client's side of one decision ring (opened from the path the agent's hello gave)."""

    def __init__(self, path: str):
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
        # One int32 view per slot's column, made once: a write is np.copyto into it.
        whole = np.frombuffer(self._mm, dtype="<i4", count=SLOTS * max_rows, offset=COLUMNS)
        self._columns = [whole[i * max_rows:(i + 1) * max_rows] for i in range(SLOTS)]
        # The input columns (ids, positions, row starts) per slot, kept for the agent to name the
        # first row whose inputs differ after an inputs mismatch (it reads them only then).
        ins = np.frombuffer(self._mm, dtype="<i4", count=SLOTS * per_slot, offset=COLUMNS + SLOTS * 4 * max_rows)
        self._inputs = [(ins[i * per_slot:i * per_slot + max_in], ins[i * per_slot + max_in:i * per_slot + 2 * max_in],
                         ins[i * per_slot + 2 * max_in:(i + 1) * per_slot]) for i in range(SLOTS)]

    def _begin(self, wave: int):
        """Seq made odd (a reader leaves the slot out; still odd after a writer that died
        mid-write) before anything of the slot, its column included, changes."""
        off = SLOT_HEADERS + (wave % SLOTS) * SLOT_BYTES
        head = _SLOT.unpack_from(self._mm, off + _SLOT_AT)
        _SEQ.pack_into(self._mm, off + _SEQ_AT, head[0] | 1)
        return off, head

    def _write(self, wave: int, begun, tokens, inputs) -> None:
        """The fields written, seq even again (whole). ``tokens`` / ``inputs``: (crc, count, flags)
        or None to keep what the slot holds for this wave."""
        mm = self._mm
        off, (seq, old_wave, tcrc, rows, icrc, itok, flags, irows) = begun
        seq |= 1
        if old_wave != wave:
            tcrc = rows = icrc = itok = flags = irows = 0
        if tokens is not None:
            tcrc, rows, f = tokens
            flags = (flags & (FLAG_INPUTS | FLAG_INPUT_COLUMNS)) | f
        if inputs is not None:
            icrc, itok, f, irows = inputs
            flags = (flags & ~(FLAG_INPUTS | FLAG_INPUT_COLUMNS)) | f
        _BODY.pack_into(mm, off + _BODY_AT, wave, tcrc, rows, icrc, itok, flags, irows)
        _SEQ.pack_into(mm, off + _SEQ_AT, seq + 1)

    def inputs(self, wave: int, token_ids, positions=None, row_starts=None) -> int:
        """The forward of ``wave`` takes these inputs (before_forward). Returns the digest.
        ``row_starts``: where each row's tokens start in ``token_ids``, then their end (the engine's
        query_start_loc / cu_seq_lens_q, rows + 1 values): given, the inputs are kept in the slot (three
        copies, no digest per row: the agent makes that only after a mismatch) so an inputs-only
        divergence names its first row."""
        ids = as_array(token_ids)
        pos = as_array(positions) if positions is not None else None
        begun = self._begin(wave)
        flags, irows, crc = FLAG_INPUTS, 0, None
        if row_starts is not None:
            starts = as_array(row_starts)
            n, r = ids.size, starts.size - 1
            if 0 <= r <= self.max_rows and n <= self.max_input_tokens and (pos is None or pos.size == n):
                c_ids, c_pos, c_starts = self._inputs[wave % SLOTS]
                c_ids[:n] = ids  # as int32, like the token column
                # The digest over the int32 copies just made: input_digest's definition, no second cast.
                crc = zlib.crc32(c_ids[:n])
                if pos is None:
                    c_pos[:n] = 0
                else:
                    c_pos[:n] = pos
                    crc = zlib.crc32(c_pos[:n], crc)
                c_starts[:r + 1] = starts
                flags, irows = FLAG_INPUTS | FLAG_INPUT_COLUMNS, r
        if crc is None:
            crc = input_digest(ids, pos)
        self._write(wave, begun, None, (crc, ids.size & 0xFFFFFFFF, flags, irows))
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
            flags = FLAG_TOKENS | FLAG_COLUMN
        else:  # too long for the slot: the digest alone (the incident then names no row)
            crc = zlib.crc32(a.astype("<i4", copy=False))
            flags = FLAG_TOKENS
        self._write(wave, begun, (crc, n & 0xFFFFFFFF, flags), None)
        return crc

    def close(self) -> None:
        self._columns = []
        self._inputs = []
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
                self._decision = DecisionRing(self._decision_path)
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
