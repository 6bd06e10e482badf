"""The engine client's per-step calls (wave_head, end_of_wave, pending_dump) and their bound.

A mixin of Client (client.py), which holds the connection, the hello and the state these read.
They read the agent's shared-memory mailbox and ask the agent only when this rank has work in the
wave, never waiting beyond the bound.
"""
import logging
import time
from typing import NamedTuple, Optional

from . import mailbox as mb
from . import wavebus_pb2 as pb
from .errors import ConfigError
from .features import DEFAULT_END_OF_WAVE_TIMEOUT_MS
from .wave_head import _MAX_U64, check_wave

log = logging.getLogger("wavebus_client")
# The per-step calls' constants as module globals (one load each, no attribute lookup).
_BUS, _SENDS, _Q_FEATURES = mb.FEATURE_BUS, mb.FEATURE_BUS | mb.FEATURE_HEADS, mb._Q_FEATURES
_Q_FLOOR, _Q_EPOCH, _SLOT_AT, _SLOT_MASK, _U32 = mb._Q_FLOOR, mb._Q_EPOCH, mb._SLOT_AT, mb.SLOTS - 1, mb._U32
# A nothing-due vector made in C (WaveVector's own constructor is Python code).
_tuple_new, _WaveVector = tuple.__new__, mb.WaveVector


class EndOfWaveResult(NamedTuple):
    """end_of_wave()'s answer. A named tuple: the usual step's is made in C (tuple.__new__), with no
    Python frame, right after the forward when every line of Python runs with cold caches."""
    wave: int
    sent: bool = False          # the agent was asked (something due, or the wave had not arrived)
    timed_out: bool = False     # the wave vector / the agent's answer did not come within the bound
    dumps_written: int = 0
    vector: Optional[mb.WaveVector] = None
    error: str = ""


class StepCallsMixin:
    """Client's per-step calls; see docs/python-client.md."""

    def call_bound_ms(self) -> float:
        """The bound of a per-step call: call_timeout_ms, else the agent's end-of-wave bound."""
        if self.call_timeout_ms is not None:
            return self.call_timeout_ms
        return self.agent_features.end_of_wave_timeout_ms if self.agent_features else DEFAULT_END_OF_WAVE_TIMEOUT_MS

    def _bound_s(self) -> float:
        return (self.call_bound_ms() + self.end_of_wave_margin_ms) / 1000

    def wave_head(self, wave: int, telemetry=None) -> bool:
        """Mark the head of ``wave`` (with the telemetry of the previous wave). Only TP0 of the last
        PP stage sends, only while the bus is active; never waits for the answer. True if sent.
        The dict / dataclass form; ``tensor_batch()`` is the per-step path whose cost does not grow
        with the batch."""
        feats = self._head_gate(wave, self._head)
        if feats is None:
            return False
        body = self._head.build(wave, telemetry, bool(feats & mb.FEATURE_DETECTORS), self._mb.epoch)
        if not self._send_head(body):
            self._head.resend()  # its bindings may have been in this one
            return False
        return True

    def _head_ready(self, wave, feats: int) -> bool:
        """_head_gate's usual outcome, in loads only: a valid wave, sending on, the agent answering
        and known, this rank its replica's TP0, every region sent, no answer awaited (drain would
        read nothing). Sets the head's wave as _head_gate does; False hands the call to _head_gate."""
        af = self.agent_features
        if (type(wave) is int and 0 <= wave <= _MAX_U64 and feats & _SENDS and af is not None and af.tp0
                and not self._avail.unavailable and len(self._sent_regions) == len(self._regions) and not self._sock.awaiting):
            self._head_wave = wave
            return True
        return False

    def _head_gate(self, wave: int, builder):
        """The checks every wave head passes: the features when this rank sends now, else None
        (``builder.reset()`` when sending paused)."""
        check_wave(wave, "wave_head()")
        self._head_wave = wave
        feats = self._mb.features
        if not feats & (mb.FEATURE_BUS | mb.FEATURE_HEADS):  # also covers "everything off"
            builder.reset()  # requests freed meanwhile go unseen: start over when sending again
            return None
        if self._avail.still_unavailable():
            # Nothing queues up for an agent that is gone; the bindings go again once it is back.
            builder.reset()
            self.stats["wave_head_skipped"] += 1
            return None
        if self.agent_features is None and not self._hello(time.monotonic() + self._bound_s()):
            self._avail.mark_unavailable(f"wave_head({wave}): no answer to hello within {self.call_bound_ms()} ms")
            builder.reset()  # every head skipped lets its frees take effect: the engine rebinds rows at once
            self.stats["wave_head_skipped"] += 1
            return None
        if not self.agent_features.tp0:
            builder.reset()
            return None
        if len(self._sent_regions) != len(self._regions) and not self._flush_regions(time.monotonic() + self._bound_s(), step=True):
            builder.reset()
            self.stats["wave_head_skipped"] += 1
            return None
        self._sock.drain()
        return feats

    def _send_head(self, body: "pb.WaveHeadRequest") -> bool:
        # One-way: the engine never waits for the agent or the coordinator at the head of a wave.
        if not self._sock.send(pb.ClientRequest(wave_head=body), one_way=True):
            self.stats["wave_head_skipped"] += 1
            return False
        self.stats["wave_head_sent"] += 1
        return True

    def end_of_wave(self, wave: int) -> EndOfWaveResult:
        """End ``wave``. Returns at once when its vector is in the mailbox with nothing due; else asks
        the agent to do what is due, waiting at most the bound (then timed_out=True)."""
        if type(wave) is not int or not 0 <= wave <= _MAX_U64:
            check_wave(wave, "end_of_wave()")
        self._ended_wave = wave
        pending = self._pending
        pending.last_ended = wave
        if pending._due:  # the usual step asked nothing: nothing to drop
            pending.ended(wave)
        box = self._mb
        q = box._q  # the features word, read in place (None once closed: off)
        if q is None or not q[_Q_FEATURES] & _BUS:  # also covers "everything off"
            return _tuple_new(EndOfWaveResult, (wave, False, False, 0, None, ""))
        # The usual step, in word loads (_lookup's, inline): the wave's slot holds it, not being written,
        # unchanged across the loads, nothing due.
        at = _SLOT_AT[wave & _SLOT_MASK]
        s1 = q[at]
        if not s1 & 1 and s1 and q[at + 1] == wave and not q[at + 2] and not q[at + 3] & _U32 and q[at] == s1:
            self.stats["end_of_wave_fast"] += 1
            return _tuple_new(EndOfWaveResult, (wave, False, False, 0, _tuple_new(_WaveVector, (wave, False, False, False, False)), ""))
        v = box.read_wave(wave)
        if v is not None and not (v.config_due or v.dump_due or v.snapshot_due):
            self.stats["end_of_wave_fast"] += 1
            return EndOfWaveResult(wave, False, False, 0, v)
        # Vectors stalled (one bound was spent on it), or a wave pending_dump gave up: no wait, no copy.
        if (v.dump_due and wave <= self._pending.forfeited_to) if v is not None else self._stall.active():
            self.stats["end_of_wave_timeouts"] += 1
            self.stats["stalled_skips"] += 1
            self._sock.send(pb.ClientRequest(end_of_wave=pb.EndOfWave(wave=wave, missed=True)), one_way=True)
            return EndOfWaveResult(wave, timed_out=True, vector=v)
        if self._avail.still_unavailable():
            # Its mailbox is not updated any more: no waiting, the step goes on (counted). A frozen
            # agent still learns of the miss when it resumes (one-way; dropped if its queue is full).
            self.stats["end_of_wave_timeouts"] += 1
            self._sock.send(pb.ClientRequest(end_of_wave=pb.EndOfWave(wave=wave, missed=True)), one_way=True)
            return EndOfWaveResult(wave, timed_out=True, vector=v)
        if v is None and self.agent_features is not None and self._mb.can_wait and len(self._sent_regions) == len(self._regions):
            # Late vector, agent known: sleep on the mailbox (the agent's publish wakes us), no request.
            # A late vector may mean a dead agent (nobody updates the mailbox): ask it alongside.
            since = time.monotonic()
            if not self._sock.in_flight("ping"):
                self._ping()
            got = self._mb.wait_wave(wave, self.call_bound_ms() / 1000)
            if got == "timeout":
                self.stats["end_of_wave_timeouts"] += 1
                self.stats["end_of_wave_waited"] += 1
                self._stall.begin()
                self._sock.drain()
                if self._avail.last_answer < since:
                    self._sock.forget("ping")
                    self._avail.mark_unavailable(f"end_of_wave({wave}): no answer within {self.call_bound_ms()} ms")
                # One-way: the agent counts the miss and fails the wave's dumps if they arrive later.
                self._sock.send(pb.ClientRequest(end_of_wave=pb.EndOfWave(wave=wave, missed=True)), one_way=True)
                return EndOfWaveResult(wave, timed_out=True)
            if isinstance(got, mb.WaveVector):
                self.stats["end_of_wave_waited"] += 1
                # Late but within the bound: the agent counts it (one-way; /metrics per rank).
                self.stats["late_vectors"] += 1
                self._sock.send(pb.ClientRequest(end_of_wave=pb.EndOfWave(wave=wave, late=True)), one_way=True)
                v = got
                if not v.anything_due:
                    return EndOfWaveResult(wave, vector=v)
        deadline = time.monotonic() + self._bound_s()
        self.stats["end_of_wave_sent"] += 1
        reply = None
        if self._hello(deadline) and (len(self._sent_regions) == len(self._regions) or self._flush_regions(deadline, step=True)):
            reply = self._sock.request(pb.ClientRequest(end_of_wave=pb.EndOfWave(wave=wave)), deadline)
            if reply is not None and not reply.ok and reply.error_code == "ERR_NO_HELLO":
                # The agent restarted and does not know us: hello and regions again, retry within the bound.
                self._rejoin()
                if self._hello(deadline) and self._flush_regions(deadline, step=True):
                    reply = self._sock.request(pb.ClientRequest(end_of_wave=pb.EndOfWave(wave=wave)), deadline)
        if reply is None:
            self._avail.mark_unavailable(f"end_of_wave({wave}): no answer within {self.call_bound_ms()} ms")
        elif reply.coordinator_lost:
            self.stats["coordinator_lost"] += 1
        if reply is not None and reply.timed_out:
            self._stall.begin()  # the agent waited the bound for the vector (or knows none is coming)
        timed_out = reply is None or reply.timed_out
        if timed_out:
            self.stats["end_of_wave_timeouts"] += 1
        written, error = 0, ""
        if reply is not None:
            written = reply.dumps_written
            if not reply.ok:
                error = f"{reply.error_code} {reply.error}".strip()
                self.stats["end_of_wave_errors"] += 1
                self.last_error = f"end_of_wave: {error}"
                log.warning("wavebus end_of_wave(%d): %s", wave, error)
        return EndOfWaveResult(wave, True, timed_out, written, v if v is not None else self._mb.read_wave(wave), error)

    def pending_dump(self, req_id: str) -> bool:
        """True when a dump of ``req_id`` is armed for a wave whose end_of_wave has not run on this rank
        yet: keep the request's blocks one more step before freeing them. A few memory loads (no
        system call) when no vector in the mailbox has dump_due; else the due wave's req ids are asked
        of the agent once per wave (within the call bound; no answer counts as pending)."""
        q = self._mb._q  # the features word, read in place (None once closed: off)
        if q is None or not q[_Q_FEATURES] & _BUS:
            return False
        p = self._pending
        # The step's later finished requests: the step's answer, settled by its first (one compare).
        if p._key == (q, q[_Q_FLOOR], p.last_ended, q[_Q_EPOCH]):
            if p._dues is None:
                return False
            return p.settled(req_id)
        return p._settle(req_id, self._mb, q)

    def pending_dumps(self, req_ids) -> tuple:
        """The requests of ``req_ids`` (a sequence of str) that ``pending_dump`` says to keep, in
        their order: one call for the step's finished requests instead of one each. The usual step
        (nothing due) returns the empty tuple after settling the step with the first id."""
        if type(req_ids) is not list and type(req_ids) is not tuple:
            if type(req_ids) is str:  # one id where a sequence of them goes: its characters are no ids
                raise ConfigError(f"pending_dumps(): req_ids must be a sequence of request ids, got the str {req_ids!r}")
            try:
                req_ids = list(req_ids)  # a numpy array of str, a set, a generator
            except TypeError:
                raise ConfigError(f"pending_dumps(): req_ids must be a sequence of request ids, got {type(req_ids).__name__}") from None
        q = self._mb._q
        if q is None or not q[_Q_FEATURES] & _BUS or not req_ids:
            return ()
        pending, p = self.pending_dump, self._pending
        # The usual step: the first id settles it with nothing due (pending_dump's own key check).
        if not pending(req_ids[0]) and p._dues is None and p._key == (q, q[_Q_FLOOR], p.last_ended, q[_Q_EPOCH]):
            return ()
        return tuple(r for r in req_ids if pending(r))  # the first again: its answer is kept, not asked again
