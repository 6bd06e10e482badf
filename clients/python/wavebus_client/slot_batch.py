"""The engine's persistent batch as wavebus sees it (the tensor hot path, docs/python-client.md).

Each running request keeps a stable row (vLLM's InputBatch row, a continuous-batching slot) from
``arrive`` to ``free``; wavebus uses the row as the telemetry's slot. Arrivals, block-table
changes, finishes and frees are sparse events, paid once each; a step passes only columns
(``TensorBatch.wave_head``). The events wait here until the next wave head carries them. Each
binding and block table is encoded to its wire bytes once, when reported (head_bytes.py): a head
joins the bytes it carries, re-sends included, and builds no protobuf object.

Two stores keep them, with the same behaviour: SlotEvents here (dictionaries), and with the native
path NativeSlotEvents (_native.Slots, in C: arrays by row, so the per-step calls touch a few lines
of memory). arrive() and blocks() check and encode in Python here (with the protobuf
library's encoding) and in C there (_native_arrive.h), with the same checks in the same order and
the same bytes. The round of re-sends goes through the live rows by row in both.
"""
from itertools import compress, product, repeat, starmap
from operator import and_, itemgetter
from typing import Dict, List, Optional, Tuple

from .errors import ConfigError
from .head_bytes import TAGS, bind_bytes, blocks_bytes, head_bytes

FLAG_FINISHED = 1
FLAG_FREED = 2
# Live bindings and block tables re-sent per head, round-robin: a lost head heals within
# live / RESEND_PER_STEP steps, at a cost that does not grow with the batch.
RESEND_PER_STEP = 4
# The per-step work below runs in C over the few rows it touches (map, compress), so its Python
# bytecodes do not grow with the events of a step (docs/python-client.md, "What a step costs").
_FREED_BITS, _POP, _NO_DEFAULT = repeat(FLAG_FREED), dict.pop, (None,)
_BYTES_OF = itemgetter(1)  # a table's (block ids, bytes) -> its bytes


def _row(row, max_rows: int, where: str) -> int:
    if type(row) is int and 0 <= row < max_rows:
        return row  # the usual call: a Python int in range
    if hasattr(row, "item"):
        row = row.item()
    if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < max_rows:
        raise ConfigError(f"{where}: row must be an integer in 0..{max_rows - 1}, got {row!r}")
    return row


def _as_list(x) -> list:
    """A column's items as a new list: x.tolist() (numpy, torch) or list(x)."""
    if type(x) is not list and hasattr(x, "tolist"):
        x = x.tolist()
    return list(x)


def _rows_list(rows, where: str) -> list:
    """finish_rows / free_rows's rows as a list (the caller's own list as it is); a str, or what is
    not a sequence, is a ConfigError naming the call (as _native_slots.h's slots_flag_rows)."""
    if type(rows) is list:
        return rows
    if type(rows) is str:
        raise ConfigError(f"{where}: rows must be a sequence of rows, got the str {rows!r}")
    try:
        return _as_list(rows)
    except TypeError:
        raise ConfigError(f"{where}: rows must be a sequence of rows (list, tuple, numpy array, tensor), got {type(rows).__name__}") from None


class SlotEvents:
    """Bindings (row -> request), block tables and finish/free flags, with what the next head sends."""

    def __init__(self, max_rows: int):
        self.max_rows = max_rows
        self._live: Dict[int, Tuple[str, int]] = {}  # row -> (req_id, prompt_len)
        self._bind_b: Dict[int, bytes] = {}  # row -> its binding's bytes for re-sends
        self._tables: Dict[int, Tuple[List[int], bytes]] = {}  # row -> (block ids, their bytes)
        self._new_bind: Dict[int, bytes] = {}
        self._new_blocks: Dict[int, bytes] = {}
        self._flags: Dict[int, int] = {}
        self._resend_all = False
        self._cycle: List[int] = []  # the live rows of this round of re-sends (by row), and how far it got
        self._cycle_at = 0

    @property
    def live(self) -> int:
        return len(self._live)

    def arrive(self, row, req_id: str, prompt_len: int = 0, prompt_token_ids=None) -> None:
        """Request ``req_id`` now holds ``row`` (until ``free(row)``)."""
        row = _row(row, self.max_rows, "arrive()")
        if not isinstance(req_id, str) or not req_id:
            raise ConfigError(f"arrive(): req_id must be a non-empty string, got {req_id!r}")
        try:
            req_id.encode()
        except UnicodeEncodeError as e:  # a lone surrogate: no wire form
            raise ConfigError(f"arrive(): req_id must be valid UTF-8 ({e})") from None
        if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or not 0 <= prompt_len <= 0xFFFFFFFF:
            raise ConfigError(f"arrive(): prompt_len must be an integer in 0..2^32-1, got {prompt_len!r}")
        held = self.holder(row)
        if held is not None:
            raise ConfigError(f"arrive(): row {row} still holds request {held!r}; free(row) it first")
        if self.row_flags(row) & FLAG_FREED:
            # Its free and this arrival would reach the coordinator in one head, the free last.
            raise ConfigError(f"arrive(): row {row} was freed since the last wave_head; bind it after the next wave_head")
        ids: List[int] = []
        if prompt_token_ids is not None:
            ids = _as_list(prompt_token_ids)
            if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= 0xFFFFFFFF for t in ids):
                raise ConfigError("arrive(): prompt_token_ids must be integers in 0..2^32-1")
        first = bind_bytes(row, req_id, prompt_len, ids)
        self._live[row] = (req_id, prompt_len)
        # The first head carries the prompt's ids; re-sends go without them.
        self._bind_b[row] = bind_bytes(row, req_id, prompt_len) if ids else first
        self._tables.pop(row, None)
        self._new_bind[row] = first

    def blocks(self, row, block_ids) -> None:
        """``row``'s whole block table, when it changed (sent with the next head)."""
        row = _row(row, self.max_rows, "blocks()")
        if self.holder(row) is None:
            raise ConfigError(f"blocks(): row {row} holds no request (arrive() first)")
        table = _as_list(block_ids)
        if not all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 0xFFFFFFFF for b in table):
            raise ConfigError(f"blocks(): block ids of row {row} must be integers in 0..2^32-1")
        if self.table_ids(row) != table:
            b = blocks_bytes(row, table)
            self._tables[row] = (table, b)
            self._new_blocks[row] = b

    def holder(self, row) -> Optional[str]:
        """``row``'s request id, or None."""
        held = self._live.get(row)
        return held[0] if held is not None else None

    def row_flags(self, row) -> int:
        """``row``'s finish/free flags since the last head."""
        return self._flags.get(row, 0)

    def table_ids(self, row) -> Optional[List[int]]:
        """``row``'s block ids, or None."""
        held = self._tables.get(row)
        return held[0] if held is not None else None

    def finish(self, row) -> None:
        """``row``'s request finished in the step the next head reports."""
        if type(row) is not int or row not in self._live:  # a live row is an int in range
            row = self._held(row, "finish()")
        if row in self._flags:
            self._flags[row] |= FLAG_FINISHED
        else:
            self._flags[row] = FLAG_FINISHED

    def free(self, row) -> None:
        """``row``'s blocks were given back (ask ``pending_dump`` first): its binding ends with the next head."""
        if type(row) is not int or row not in self._live:
            row = self._held(row, "free()")
        if row in self._flags:
            self._flags[row] |= FLAG_FREED
        else:
            self._flags[row] = FLAG_FREED

    def finish_rows(self, rows) -> None:
        """``finish(row)`` for each of ``rows`` (a list, tuple, numpy array or tensor), in order: the
        step's finished requests in one call. A refused row raises as ``finish`` does, the rows
        before it flagged."""
        self._flag_rows(rows, "finish_rows()", FLAG_FINISHED)

    def free_rows(self, rows) -> None:
        """``free(row)`` for each of ``rows``, in order (as ``finish_rows``)."""
        self._flag_rows(rows, "free_rows()", FLAG_FREED)

    def _flag_rows(self, rows, where: str, bit: int) -> None:
        live, flags = self._live, self._flags
        for row in _rows_list(rows, where):
            if type(row) is not int or row not in live:
                row = self._held(row, where)
            flags[row] = flags.get(row, 0) | bit

    def _held(self, row, where: str) -> int:
        row = _row(row, self.max_rows, where)
        if row not in self._live:
            raise ConfigError(f"{where}: row {row} holds no request")
        return row

    def reset(self) -> None:
        """Sending paused (bus off, agent gone, not the head rank): the events are dropped, frees
        take effect, and the next head re-sends every binding."""
        self.sent()
        self._resend_all = True

    def resend_all(self) -> None:
        """The next head carries every live binding and table (a new coordinator, a lost head)."""
        self._resend_all = True

    def pending_events(self) -> int:
        return len(self._flags)

    def event_columns(self):
        """(rows, flags) of this step's finish/free events, as lists (few)."""
        return list(self._flags.keys()), list(self._flags.values())

    def new_bytes(self) -> bytes:
        """The bytes of the bindings and tables new since the last head (not the re-sends), left pending."""
        return b"".join(self._new_bind.values()) + b"".join(self._new_blocks.values())

    def head(self, wave: int, tele_wave: int, non_finite: bytes = b"") -> bytes:
        """The head's bytes with what it carries of this batch (head_bytes.py): takes the pending
        bindings and tables as sparse_bytes() does."""
        return head_bytes(wave, tele_wave, self.sparse_bytes(), non_finite)

    def sparse_bytes(self) -> bytes:
        """TelemetryColumns' wire bytes of the pending bindings and tables (new ones, a few
        re-sends, or all after resend_all()): bindings first, then tables, as the library orders them."""
        new_bind, new_blocks = self._new_bind, self._new_blocks
        at = self._cycle_at
        rows = self._cycle[at:at + RESEND_PER_STEP]
        if self._resend_all or len(rows) < RESEND_PER_STEP:
            return self._sparse_slow()
        # The usual step: a full slice of the round, every row of it still live (a freed row has no
        # bytes: None) and none of them new this step.
        out = list(map(self._bind_b.get, rows))
        if None in out or not (new_bind.keys() | new_blocks.keys()).isdisjoint(rows):
            return self._sparse_slow()
        self._cycle_at = at + RESEND_PER_STEP
        out += new_bind.values()
        out += map(_BYTES_OF, filter(None, map(self._tables.get, rows)))
        out += new_blocks.values()
        self._new_bind, self._new_blocks = {}, {}
        return b"".join(out)

    def _sparse_slow(self) -> bytes:
        """sparse_bytes() row by row: after resend_all(), at the end of a round, or when a re-sent
        row was freed, bound anew or given a new table since the round began."""
        new_bind, tables = self._new_bind, self._new_blocks
        binds: List[bytes] = []
        blocks: List[bytes] = []
        if self._resend_all:
            self._resend_all = False
            bind_b = self._bind_b
            binds = [bind_b[row] for row in sorted(self._live) if row not in new_bind]
            tables = {row: self._tables[row][1] for row in sorted(self._tables)}
        else:
            live, bind_b, held = self._live, self._bind_b, self._tables
            for row in self._resend_rows():
                if row in live and row not in new_bind:
                    binds.append(bind_b[row])
                    t = held.get(row)
                    if t is not None and row not in tables:
                        blocks.append(t[1])
        if new_bind:
            binds.extend(new_bind.values())
        if tables:
            blocks.extend(tables.values())
        self._new_bind, self._new_blocks = {}, {}
        return b"".join(binds) + b"".join(blocks) if blocks else b"".join(binds)

    def sent(self) -> None:
        """The head went out: frees take effect (the row is free for a later arrive)."""
        flags = self._flags
        if not flags:
            return
        self._flags = {}
        # Frees take effect: the freed rows (compress: those whose flags have FLAG_FREED) leave
        # every map, the unsent ones too (sending paused, reset(): a binding of a row already freed
        # must not go later). In C, whatever the count.
        list(starmap(_POP, product((self._live, self._bind_b, self._tables, self._new_bind, self._new_blocks),
                                   compress(flags, map(and_, flags.values(), _FREED_BITS)), _NO_DEFAULT)))

    def _resend_rows(self) -> List[int]:
        """The next RESEND_PER_STEP rows of the round; a new round (the rows live now) when it ends."""
        at = self._cycle_at
        out = self._cycle[at:at + RESEND_PER_STEP]
        at += len(out)
        if len(out) < RESEND_PER_STEP:
            self._cycle = sorted(self._live)  # once per round through the live rows, by row (as in C)
            need = RESEND_PER_STEP - len(out)
            more = self._cycle[:need]
            out += more
            at = len(more)
            if at < need:  # fewer live rows than a step re-sends: the next step starts a round again
                at = 0
        self._cycle_at = at
        return out


def _held_row(s, row, where: str, need_live: int) -> int:
    """NativeSlotEvents' slow path for a row that is not a live int in range: the row, or the same
    ConfigError as SlotEvents raises."""
    row = _row(row, s.max_rows, where)
    if need_live and s.holder(row) is None:
        raise ConfigError(f"{where}: row {row} holds no request")
    return row


_native_classes = {}  # the _native module -> its NativeSlotEvents


def native_slot_events(mod):
    """SlotEvents with its state and per-step calls in C (``mod.Slots``, _native_slots.h): the
    same behaviour (test/python-native.test.ts compares them call by call), fewer lines of memory
    touched per step. A class, so that TensorBatch's methods sit on top of either store."""
    cls = _native_classes.get(mod)
    if cls is None:
        if mod.RESEND_PER_STEP != RESEND_PER_STEP:  # a module built from other sources
            raise ConfigError(f"wavebus_client._native re-sends {mod.RESEND_PER_STEP} rows a step, this package {RESEND_PER_STEP}: rebuild it (docs/python-client.md)")
        class NativeSlotEvents(mod.Slots):
            __doc__ = SlotEvents.__doc__ + " In C."

            def __init__(self, max_rows: int):
                mod.Slots.__init__(self, max_rows, TAGS, _held_row)

        cls = _native_classes[mod] = NativeSlotEvents
    return cls
