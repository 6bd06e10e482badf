"""before_forward (input snapshots) and the live-capture wave logic (which wave a forward belongs to,
whether a capture armed on the running job covers it): a mixin of Client, apart from client.py
because it is the one call that may wait a begun capture out, beyond the per-step bound."""
import logging
import time
from typing import Optional, Tuple

from . import mailbox as mb
from . import wavebus_pb2 as pb
from .errors import CaptureError, ConfigError
from .forward import context_proto, input_proto
from .recorder import Recorder, input_source, install_excepthook

log = logging.getLogger("wavebus_client")

# The features under which before_forward counts or records every forward (its full path runs).
_COUNTED = mb.FEATURE_SNAPSHOTS | mb.FEATURE_RECORDER
_Q_FEATURES, _BUS, _SLOT_AT, _SLOT_MASK, _U32 = mb._Q_FEATURES, mb.FEATURE_BUS, mb._SLOT_AT, mb.SLOTS - 1, mb._U32


class CaptureMixin:
    """Client's before_forward; ``_head_wave`` / ``_ended_wave`` are kept by wave_head / end_of_wave."""

    def before_forward(self, context, inputs, staging_error: str = "") -> Tuple[bool, str]:
        """Offer this forward for capture; returns (captured, call_dir). Sends only when snapshots
        are on. Raises CaptureError when a selected capture failed: abort the forward. An agent that
        does not answer within the call bound is not a failed capture: (False, "") with
        ``agent_unavailable`` set, and the forward goes on. ``staging_error``: the engine could not
        stage this forward's inputs (why; ``inputs`` empty): a forward a capture would take is
        offered without inputs, and the agent fails those captures with the cause (CaptureError
        here, the error in ``wavebus capture``) rather than letting them expire unseen."""
        q = self._mb._q  # the features word, read in place (None once closed: off)
        feats = q[_Q_FEATURES] if q is not None else 0
        if not feats:  # everything off (no capture can be in force either): one memory load
            return False, ""
        if not feats & _COUNTED and not self.async_scheduling and feats & _BUS:
            # The usual step in word loads (_live_capture_due's, its slot read inline): the forward's
            # wave (_forward_wave) in its slot, not being written, unchanged across the loads, no
            # snapshot_due. Anything else is _live_capture_due's to say.
            wave = self._ended_wave + 1
            if self._head_wave > wave:
                wave = self._head_wave
            at = _SLOT_AT[wave & _SLOT_MASK]
            s1 = q[at]
            if not s1 & 1 and s1 and q[at + 1] == wave and not q[at + 3] & _U32 and q[at] == s1:
                return False, ""
        if not feats & _COUNTED and not self._live_capture_due():
            # Neither snapshots nor the recorder: only a capture armed on the running job could
            # take this forward, and its wave's vector says none does (the usual step: a few loads).
            return False, ""
        snap, recording, call_index = self._forward_wanted(context)
        rec = self._recorder() if recording else None
        if not snap and rec is None:
            return False, ""
        ctx = context_proto(context)
        if not isinstance(inputs, (list, tuple)):
            raise ConfigError(f"before_forward(): inputs must be a list, got {type(inputs).__name__}")
        tins = [input_proto(x, self._regions, f"before_forward(): inputs[{i}]") for i, x in enumerate(inputs)]
        if rec is not None and not staging_error:
            # The flight recorder: one copy into the ring, no message (docs/recorder.md).
            rec.record(ctx, tins, [input_source(x, t, self._regions) for x, t in zip(inputs, tins)], self._forward_wave())
            self.stats["recorded"] = self.stats.get("recorded", 0) + 1
        if not snap:
            return False, ""
        if self._avail.still_unavailable():
            self.stats["snapshots_skipped"] += 1
            return False, ""
        # The mailbox says which request we wait on until we stop, whatever stops us: the agent keeps
        # only a copy made while the word still held it (the engine had not touched the inputs).
        self._capture_ticket += 1
        self._mb.set_capture_waiting(self._capture_ticket)
        try:
            return self._offer_capture(ctx, tins, self._capture_ticket, call_index, staging_error)
        finally:
            self._mb.set_capture_waiting(0)

    def _offer_capture(self, ctx, tins, ticket: int, call_index: Optional[int] = None, staging_error: str = "") -> Tuple[bool, str]:
        """The request and its answers (before_forward's result), while the mailbox holds ``ticket``."""
        bound_s = self._bound_s()
        deadline = time.monotonic() + bound_s
        # Wall clock for the agent (same host): it drops a capture it reaches after we stopped waiting.
        accept_by = int((time.time() + bound_s) * 1000) - self.end_of_wave_margin_ms
        plus1 = call_index + 1 if call_index is not None and call_index >= 0 else 0
        reply = self._capture_request(ctx, tins, deadline, accept_by, ticket, plus1, staging_error)
        if reply is not None and not reply.ok and reply.error_code == "ERR_NO_HELLO":
            self._rejoin()  # the agent restarted: introduce ourselves and our regions again, then retry
            reply = self._capture_request(ctx, tins, deadline, accept_by, ticket, plus1, staging_error)
        if reply is None:
            self._avail.mark_unavailable(f"before_forward(): no answer within {self.call_bound_ms()} ms")
            self.stats["snapshots_skipped"] += 1
            return False, ""
        if not reply.ok and reply.error_code == "ERR_CLIENT_GONE":
            # The agent reached the request past accept_by (the last margin of our wait, or later):
            # it copied nothing, as if it had not answered. A late agent is not a failed capture:
            # this forward is not captured, said and counted, and the forward goes on.
            self.stats["snapshots_skipped"] += 1
            log.warning("before_forward(): the agent reached this forward after the engine's deadline; not captured (%d skipped): %s",
                        self.stats["snapshots_skipped"], reply.error)
            return False, ""
        if reply.capturing:
            # Begun: the agent has capture_timeout_ms to finish. Not finishing is a failed capture.
            reply = self._sock.wait(reply.id, time.monotonic() + self.capture_timeout_ms / 1000)
            if reply is None:
                self._avail.mark_unavailable(f"before_forward(): a begun capture did not finish within {self.capture_timeout_ms} ms")
                raise CaptureError(f"before_forward(): the agent began the capture but did not finish it within {self.capture_timeout_ms} ms; abort this forward", "ERR_CAPTURE_TIMEOUT")
        if not reply.ok:
            raise CaptureError(f"before_forward(): capture failed: {reply.error}", reply.error_code or "ERR_CAPTURE")
        if reply.captured:
            self.stats["captures"] += 1
        return reply.captured, reply.call_dir

    def _recorder(self) -> Optional[Recorder]:
        """The ring the agent's hello named, mapped once (a hello if none was said yet). None while
        the agent does not answer: nothing is recorded then, the forward goes on."""
        if self._rec is not None:
            return self._rec
        if self._avail.still_unavailable() or not self._hello(time.monotonic() + self._bound_s()) or not self._recorder_path:
            return None
        self._rec = Recorder(self._recorder_path)
        install_excepthook(self._rec)
        return self._rec

    def _forward_wave(self) -> int:
        """The wave a forward now belongs to: the last wave_head's, or the one after the last ended."""
        return max(self._head_wave, self._ended_wave + 1)

    def wants_forward(self) -> bool:
        """Whether before_forward would do anything for the coming forward (snapshots, the flight
        recorder, or a capture armed on the running job covering its wave): an engine that must
        copy its inputs somewhere first (transformers' integration) asks this. The same rule as
        before_forward's (_forward_wanted). Memory loads only, unless a live capture is in force
        and its vector is late (then as before_forward waits)."""
        snap, recording, _ = self._forward_wanted()
        return snap or recording

    def _forward_wanted(self, context=None) -> Tuple[bool, bool, Optional[int]]:
        """The one rule for offering a forward: (a snapshot or a live capture takes it, the flight
        recorder takes it, its call index). With snapshots on, before_forward passes the context:
        the forward is counted (whether offered or not: the agent sees only what a rule could
        select) and offered when the rules of the agent's hello could select it. Without one
        (wants_forward, ahead of before_forward for the same forward) nothing is counted and a
        snapshot is wanted whenever snapshots are on."""
        feats = self._mb.features
        snap, call_index = False, None
        if feats & mb.FEATURE_SNAPSHOTS:
            if context is None:
                snap = True
            else:
                call_index = self._calls.count(context)
                pre = self._snap_pre
                snap = pre is None or pre.could_fire(context, call_index)
                if not snap:
                    self.stats["forwards_not_offered"] += 1
        return snap or self._live_capture_due(), bool(feats & mb.FEATURE_RECORDER), call_index

    def _live_capture_due(self) -> bool:
        """Snapshots off at startup: offer the forward only when its wave's vector says a capture
        armed on the running job covers it (docs/control.md). Never under async scheduling, and
        no vector is read with the bus off (as end_of_wave). A vector not there yet while a
        capture is in force here is waited for within the bound, as end_of_wave would."""
        if self.async_scheduling or not self._mb.features & mb.FEATURE_BUS:
            return False
        wave = self._forward_wave()
        v = self._mb.read_wave(wave)
        if v is None and self._mb.features & mb.FEATURE_LIVE_CAPTURES and self._mb.can_wait and not self._avail.still_unavailable():
            got = self._mb.wait_wave(wave, self.call_bound_ms() / 1000)
            v = got if isinstance(got, mb.WaveVector) else None
        return v is not None and v.snapshot_due

    def _capture_request(self, ctx, tins, deadline: float, accept_by: int, ticket: int, call_index_plus1: int = 0,
                         staging_error: str = "") -> Optional["pb.ClientReply"]:
        """Hello and regions if needed, then the before_forward request: its first answer by ``deadline``."""
        if not self._hello(deadline) or not self._flush_regions(deadline):
            return None
        req = pb.ClientRequest(before_forward=pb.BeforeForward(
            context=ctx, inputs=tins, accept_by_unix_ms=accept_by,
            finish_by_unix_ms=accept_by + self.capture_timeout_ms, wave=self._forward_wave(), wait_ticket=ticket,
            call_index_plus1=call_index_plus1, staging_error=staging_error))
        return self._sock.request(req, deadline)