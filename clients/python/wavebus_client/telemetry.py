"""Step telemetry the detectors need (sent by TP0 of the last PP stage with wave_head)."""
import math
import sys
from dataclasses import dataclass, field, fields
from typing import List, Optional, Sequence

from . import wavebus_pb2 as pb
from .errors import ConfigError

NONFINITE_KINDS = ("nan", "pos_inf", "neg_inf", "non_finite")
_U32 = 0xFFFFFFFF


@dataclass
class RequestStep:
    req_id: str
    new_token_ids: List[int] = field(default_factory=list)
    new_token_logprobs: List[float] = field(default_factory=list)
    new_token_ranks: List[int] = field(default_factory=list)
    draft_len: int = 0
    accepted: int = 0
    block_ids: List[int] = field(default_factory=list)
    finished: bool = False
    freed: bool = False
    prompt_len: int = 0
    num_output_tokens: int = 0
    prompt_token_ids: List[int] = field(default_factory=list)  # optional, sent once per request


@dataclass
class NonFiniteRow:
    row: int
    req_id: str = ""
    kind: str = "non_finite"


@dataclass
class StepTelemetry:
    requests: List[RequestStep] = field(default_factory=list)
    non_finite: List[NonFiniteRow] = field(default_factory=list)


def _u32(v, where: str) -> int:
    if hasattr(v, "item") and not isinstance(v, (list, tuple)):
        v = v.item()  # a 0-d tensor / numpy scalar
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{where} must be an integer, got {v!r}")
    if not 0 <= v <= _U32:
        raise ConfigError(f"{where} must be in 0..{_U32}, got {v}")
    return v


def _u32_list(v, where: str) -> List[int]:
    if hasattr(v, "tolist"):
        v = v.tolist()
    if not isinstance(v, (list, tuple)):
        raise ConfigError(f"{where} must be a list of integers, got {type(v).__name__}")
    return [_u32(x, f"{where}[{i}]") for i, x in enumerate(v)]


def _float_list(v, where: str) -> List[float]:
    if hasattr(v, "tolist"):
        v = v.tolist()
    if not isinstance(v, (list, tuple)):
        raise ConfigError(f"{where} must be a list of numbers, got {type(v).__name__}")
    out = []
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ConfigError(f"{where}[{i}] must be a number, got {x!r}")
        out.append(float(x))
    return out


def _bool(v, where: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{where} must be true or false, got {v!r}")
    return v


def _from(cls, v, where: str):
    if isinstance(v, cls):
        return v
    if isinstance(v, dict):
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(v) - names)
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")
        try:
            return cls(**v)
        except TypeError as e:
            raise ConfigError(f"{where}: {e}") from None
    raise ConfigError(f"{where} must be a {cls.__name__} or a dict, got {type(v).__name__}")


def request_step_proto(v, where: str) -> "pb.RequestStep":
    s = _from(RequestStep, v, where)
    if not isinstance(s.req_id, str) or not s.req_id:
        raise ConfigError(f"{where}.req_id must be a non-empty string, got {s.req_id!r}")
    ids = _u32_list(s.new_token_ids, f"{where}.new_token_ids")
    lps = _float_list(s.new_token_logprobs, f"{where}.new_token_logprobs")
    ranks = _u32_list(s.new_token_ranks, f"{where}.new_token_ranks")
    if lps and len(lps) != len(ids):
        raise ConfigError(f"{where}.new_token_logprobs has {len(lps)} values for {len(ids)} new_token_ids")
    if ranks and len(ranks) != len(ids):
        raise ConfigError(f"{where}.new_token_ranks has {len(ranks)} values for {len(ids)} new_token_ids")
    return pb.RequestStep(
        req_id=s.req_id, new_token_ids=ids, new_token_logprobs=lps, new_token_ranks=ranks,
        draft_len=_u32(s.draft_len, f"{where}.draft_len"), accepted=_u32(s.accepted, f"{where}.accepted"),
        block_ids=_u32_list(s.block_ids, f"{where}.block_ids"),
        finished=_bool(s.finished, f"{where}.finished"), freed=_bool(s.freed, f"{where}.freed"),
        prompt_len=_u32(s.prompt_len, f"{where}.prompt_len"),
        num_output_tokens=_u32(s.num_output_tokens, f"{where}.num_output_tokens"),
        prompt_token_ids=_u32_list(s.prompt_token_ids, f"{where}.prompt_token_ids"),
    )


def nonfinite_row_proto(v, where: str) -> "pb.NonFiniteRow":
    r = _from(NonFiniteRow, v, where)
    if r.kind not in NONFINITE_KINDS:
        raise ConfigError(f"{where}.kind must be one of {', '.join(NONFINITE_KINDS)}, got {r.kind!r}")
    if r.req_id is None:
        r.req_id = ""
    if not isinstance(r.req_id, str):
        raise ConfigError(f"{where}.req_id must be a string, got {r.req_id!r}")
    return pb.NonFiniteRow(row=_u32(r.row, f"{where}.row"), req_id=r.req_id, kind=r.kind)


def telemetry_proto(t, wave: int, where: str = "wave_head(): telemetry") -> "pb.StepTelemetry":
    """StepTelemetry (dataclass or dict with 'requests' / 'non_finite') as the proto message."""
    if t is None:
        return pb.StepTelemetry(wave=wave)
    t = _from(StepTelemetry, t, where)
    if not isinstance(t.requests, (list, tuple)):
        raise ConfigError(f"{where}.requests must be a list, got {type(t.requests).__name__}")
    # after sampling: a started check is waited on here
    non_finite = _nonfinite_list(t.non_finite, where)
    return pb.StepTelemetry(
        wave=wave,
        requests=[request_step_proto(r, f"{where}.requests[{i}]") for i, r in enumerate(t.requests)],
        non_finite=[nonfinite_row_proto(r, f"{where}.non_finite[{i}]") for i, r in enumerate(non_finite)],
    )


DEFERRED_MAX = 256  # the seed's bounded deferred queue of logits_finite checks


def _check_logits(logits, row_req_ids, where: str):
    import torch

    if not isinstance(logits, torch.Tensor):
        raise ConfigError(f"{where}: logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ConfigError(f"{where}: logits must be 2-d [rows, vocab], got shape {list(logits.shape)}")
    rows = logits.shape[0]
    if row_req_ids is not None and len(row_req_ids) != rows:
        raise ConfigError(f"{where}: row_req_ids has {len(row_req_ids)} entries for {rows} logits rows")


class PendingNonFinite:
    """A started logits_finite check (seed: isfinite + gate, waited on after sampling).

    At construction the check is queued on the logits' device: per row, whether it holds a NaN, a
    +inf, a -inf ([rows, 3] bools, one pass each), copied to the host without blocking (pinned
    memory and an event on CUDA). It reads the logits as they are at the call: an in-place change
    queued later on the same stream (grammar masking writing -inf, say) is not what it reports.
    ``result()`` waits for the copy and names the bad rows; call it after sampling, so that the
    device work overlaps it. On CPU tensors the work is done at once: same API, same order.
    Reading it as a list (iterating, ``len``, ``==``) waits too.
    """

    __slots__ = ("_flags", "_event", "_req_ids", "_rows")

    def __init__(self, logits, row_req_ids: Optional[Sequence[Optional[str]]] = None):
        import torch

        _check_logits(logits, row_req_ids, "nonfinite_rows()")
        self._req_ids = None if row_req_ids is None else [r or "" for r in row_req_ids]  # as they are now
        self._rows: Optional[List[NonFiniteRow]] = None
        self._event = None
        self._flags = None
        if not logits.is_floating_point() or logits.numel() == 0:
            self._rows = []
            return
        flags = torch.stack((torch.isnan(logits).any(dim=1), torch.isposinf(logits).any(dim=1), torch.isneginf(logits).any(dim=1)), dim=1)
        if flags.is_cuda:
            host = torch.empty(flags.shape, dtype=torch.bool, pin_memory=True)
            host.copy_(flags, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
            self._flags = host
        else:
            self._flags = flags

    def ready(self) -> bool:
        """True when result() would not wait."""
        return self._rows is not None or self._event is None or self._event.query()

    def result(self) -> List[NonFiniteRow]:
        """The rows holding a non-finite value, with their kind (nan / pos_inf / neg_inf, or
        non_finite when a row mixes them). Waits for the device copy the first time."""
        if self._rows is None:
            if self._event is not None:
                self._event.synchronize()
            flags = self._flags
            bad = flags.any(dim=1).nonzero().flatten().tolist()
            out = []
            for i, (n, p, m) in zip(bad, flags[bad].tolist() if bad else []):
                kinds = [k for k, on in (("nan", n), ("pos_inf", p), ("neg_inf", m)) if on]
                kind = kinds[0] if len(kinds) == 1 else "non_finite"
                out.append(NonFiniteRow(row=i, req_id="" if self._req_ids is None else self._req_ids[i], kind=kind))
            self._rows = out
            self._flags = self._event = None
        return self._rows

    def __iter__(self):
        return iter(self.result())

    def __len__(self):
        return len(self.result())

    def __getitem__(self, i):
        return self.result()[i]

    def __eq__(self, other):
        return list(self.result()) == list(other)

    def __repr__(self):
        return f"PendingNonFinite({self._rows!r})" if self._rows is not None else "PendingNonFinite(<pending>)"


def nonfinite_rows(logits, row_req_ids: Optional[Sequence[Optional[str]]] = None, item_sync: bool = False):
    """Rows of ``logits`` ([rows, vocab]) holding any non-finite value, with their kind.

    kind is nan / pos_inf / neg_inf when a row holds only that kind of bad value, non_finite when
    it mixes them. ``row_req_ids[i]`` names row i's request (None or "" when unattributable).
    Call it before sampling. By default (the seed's ``logits_finite.item_sync: false``) it only
    starts the check and returns a ``PendingNonFinite`` that is waited on when read (after
    sampling: pass it as the telemetry's ``non_finite`` to ``wave_head``). With ``item_sync=True``
    it waits at once and returns the list.
    """
    if not isinstance(item_sync, bool):
        raise ConfigError(f"nonfinite_rows(): item_sync must be true or false, got {item_sync!r}")
    pending = PendingNonFinite(logits, row_req_ids)
    return pending.result() if item_sync else pending


class LogitsFiniteGate:
    """The client's logits_finite gate: ``check()`` before sampling, ``collect()`` after it.

    With item_sync false (the default) ``check()`` starts the check and returns None at once; the
    check waits in a deferred queue of at most ``max_deferred`` (256) entries, dropping the oldest
    (counted in ``dropped``) when the engine starts checks it never collects. ``collect()`` (after
    sampling; ``wave_head`` does it when the gate is the telemetry's ``non_finite``) waits for them
    in order and returns their rows. With item_sync true ``check()`` blocks and returns the rows
    now (they are collected too). ``item_sync`` may be changed between steps (the agent's hello
    answer carries the effective ``logits_finite.item_sync``).
    """

    def __init__(self, item_sync: bool = False, max_deferred: int = DEFERRED_MAX):
        if isinstance(max_deferred, bool) or not isinstance(max_deferred, int) or max_deferred < 1:
            raise ConfigError(f"LogitsFiniteGate(): max_deferred must be a positive integer, got {max_deferred!r}")
        self.item_sync = item_sync
        self.max_deferred = max_deferred
        self.dropped = 0
        from collections import deque

        self._queue = deque()

    @property
    def pending(self) -> int:
        return len(self._queue)

    def check(self, logits, row_req_ids: Optional[Sequence[Optional[str]]] = None) -> Optional[List[NonFiniteRow]]:
        if not isinstance(self.item_sync, bool):
            raise ConfigError(f"LogitsFiniteGate: item_sync must be true or false, got {self.item_sync!r}")
        p = PendingNonFinite(logits, row_req_ids)
        if len(self._queue) >= self.max_deferred:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(p)
        return p.result() if self.item_sync else None

    def collect(self) -> List[NonFiniteRow]:
        out: List[NonFiniteRow] = []
        while self._queue:
            out.extend(self._queue.popleft().result())
        return out


def _nonfinite_list(v, where: str):
    """The telemetry's non_finite: rows (or dicts), a PendingNonFinite, or a LogitsFiniteGate (collected now)."""
    if isinstance(v, LogitsFiniteGate):
        return v.collect()
    if isinstance(v, PendingNonFinite):
        return v.result()
    if not isinstance(v, (list, tuple)):
        raise ConfigError(f"{where}.non_finite must be a list, a PendingNonFinite or a LogitsFiniteGate, got {type(v).__name__}")
    out = []
    for x in v:
        out.extend(x.result() if isinstance(x, PendingNonFinite) else [x])
    return out


FLAG_FINISHED = 1
FLAG_FREED = 2


class TelemetryColumnizer:
    """Rows (validated ``pb.RequestStep``) to ``pb.TelemetryColumns``, as the TypeScript client does.

    A request keeps its slot from step to step until a step reports it freed; its id travels once
    (a binding) and its block table only when it changes. ``resend()`` sends every live binding and
    table again with the next step (a new coordinator knows none of them).
    """

    def __init__(self):
        self._slots = {}
        self._holder = {}
        self._free = []
        self._next = 0
        self._tables = {}
        self._sent_in = {}
        self._generation = 0

    def resend(self) -> None:
        self._generation += 1

    @property
    def live(self) -> int:
        return len(self._slots)

    def columns(self, requests, tokens: bool = True) -> "pb.TelemetryColumns":
        from array import array

        rows = [r for r in requests if r.req_id]
        n_tok = sum(len(r.new_token_ids) for r in rows) if tokens else 0
        any_lp = tokens and any(len(r.new_token_logprobs) for r in rows)
        any_rank = tokens and any(len(r.new_token_ranks) for r in rows)
        any_spec = any(r.draft_len for r in rows)
        any_count = any(r.num_output_tokens for r in rows)
        slot, flags = array("I"), array("B")
        counts, ids, lps, ranks = array("I"), array("I"), array("f"), array("I")
        draft, acc, outs = array("I"), array("I"), array("I")
        out = pb.TelemetryColumns(rows=len(rows))
        released = []
        for r in rows:
            s = self._slots.get(r.req_id)
            if s is None:
                s = self._free.pop() if self._free else self._next
                if s == self._next:
                    self._next += 1
                self._slots[r.req_id] = s
                self._holder[s] = r.req_id
                self._tables.pop(s, None)
                self._sent_in[s] = self._generation
                out.bind.add(slot=s, req_id=r.req_id, prompt_len=r.prompt_len, prompt_token_ids=r.prompt_token_ids)
            elif self._sent_in.get(s) != self._generation:
                # a re-send (resend()): the id again, not the prompt
                self._sent_in[s] = self._generation
                self._tables.pop(s, None)
                out.bind.add(slot=s, req_id=r.req_id, prompt_len=r.prompt_len)
            slot.append(s)
            if n_tok:
                k = len(r.new_token_ids)
                counts.append(k)
                ids.extend(r.new_token_ids)
                if any_lp:
                    lps.extend(r.new_token_logprobs if len(r.new_token_logprobs) else [math.nan] * k)
                if any_rank:
                    ranks.extend(r.new_token_ranks if len(r.new_token_ranks) else [0] * k)
            if any_spec:
                draft.append(r.draft_len)
                acc.append(r.accepted)
            if any_count:
                outs.append(r.num_output_tokens)
            flags.append((FLAG_FINISHED if r.finished else 0) | (FLAG_FREED if r.freed else 0))
            table = list(r.block_ids)
            if table and self._tables.get(s) != table:
                self._tables[s] = table
                out.blocks.add(slot=s, block_ids=table)
            if r.freed:
                released.append(s)
        for s in released:
            req = self._holder.pop(s, None)
            if req is None:
                continue
            del self._slots[req]
            self._tables.pop(s, None)
            self._free.append(s)
        le = sys.byteorder == "little"
        for name, arr in (("slot", slot), ("token_count", counts), ("token_ids", ids), ("token_logprobs", lps),
                          ("token_ranks", ranks), ("draft_len", draft), ("accepted", acc), ("flags", flags),
                          ("num_output_tokens", outs)):
            if not le:
                arr.byteswap()  # the wire is little-endian
            setattr(out, name, arr.tobytes())
        return out
