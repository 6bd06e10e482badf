"""pending_dump(req_id): is a dump of this request armed for a wave still to end on this rank?

Vectors are published ahead (docs/architecture.md, "Waves"): with a lookahead of L a dump detected in
wave N-1 is copied at the end of wave N+L, so a request can finish in between. An engine asks before
giving a finished request's blocks back (after end_of_wave(W), before the next forward) and, while
true, keeps them. The waves that matter are the decided ones not yet ended: W+1 up to the mailbox
floor (L waves with the chain on time); a later wave's dumps are decided at a head still to come.
Every rank has the same vectors, so every rank gives the same answer: a few memory loads (no system
call) when none has dump_due; with dump_due a wave's req ids are asked of the agent once; W+1's
vector not there yet is asked of the agent too, which waits for it within its bound.

An unanswered question costs one bound once (VectorStall): its answer (everything pending) is kept
for that wave, so the wave's finished requests are kept until it ends and nobody asks again; after
it, while no new vector arrives, a wave without a vector is not asked about but given up
(forfeited_to: its dumps are never copied on this rank, end_of_wave skips them), so no block is kept
on account of an unanswered question beyond the end of the wave it was about.
"""
import time
from typing import Callable, Dict, List, Optional, Set

from . import mailbox as mb
from . import wavebus_pb2 as pb


class VectorStall:
    """The wave vectors stopped coming (a dead or lost coordinator, a stalled chain): the engine pays
    one bound for it, once, and then nothing until the mailbox moves again. Set when a wait for a
    vector ran out, a due_dumps question went unanswered, or the agent said its coordinator is lost;
    over as soon as the agent publishes anything new (the mailbox's floor or epoch changed)."""

    def __init__(self, mailbox_of: Callable[[], "mb.Mailbox"]):
        self._mailbox_of = mailbox_of
        self.stalls = 0
        self._on = False
        self._key = (-1, -1)

    def _now(self):
        box = self._mailbox_of()
        return (box.floor, box.epoch)

    def begin(self) -> None:
        if self.active():
            return
        self._on = True
        self.stalls += 1
        self._key = self._now()

    def active(self) -> bool:
        if self._on and self._now() != self._key:
            self._on = False
        return self._on


def due_dumps_asker(sock, avail, bound_s: Callable[[], float], hello: Callable[[float], bool], stats: dict,
                    stall: VectorStall) -> Callable[[int], Optional[List[str]]]:
    """The asker PendingDumps uses: ClientRequest.due_dumps after a hello, within the call bound;
    None when the agent did not answer (every request then counts as pending)."""
    def ask(wave: int) -> Optional[List[str]]:
        if avail.still_unavailable():
            return None
        deadline = time.monotonic() + bound_s()
        stats["due_dumps_asked"] += 1
        if not hello(deadline):
            return None
        reply = sock.request(pb.ClientRequest(due_dumps=pb.DueDumps(wave=wave)), deadline)
        if reply is not None and reply.coordinator_lost:
            stats["coordinator_lost"] += 1
            stall.begin()
        if reply is None or not reply.ok:
            return None
        return list(reply.due_req_ids)
    return ask


_Q_FLOOR, _Q_EPOCH = mb._Q_FLOOR, mb._Q_EPOCH

# The agent could not say which requests are due: every request counts as pending until that wave ends.
ALL = None


class PendingDumps:
    def __init__(self, mailbox_of: Callable[[], "mb.Mailbox"], ask: Callable[[int], Optional[List[str]]], stall: VectorStall):
        self._mailbox_of = mailbox_of
        self._ask = ask
        self._stall = stall
        self.last_ended = -1
        # the last wave given up without asking (vectors stalled): its dumps are never copied here
        self.forfeited_to = -1
        self._due: Dict[int, Optional[Set[str]]] = {}
        # (floor, last ended wave, mailbox, epoch) of a range of decided waves (they follow from the
        # floor and the last ended wave) whose vectors were all there with no dump due: the step's
        # other finished requests are answered without reading them again (a published vector does
        # not change within its epoch; the floor moving changes the range).
        self._clear = None

    @property
    def asked(self) -> bool:
        """Whether answers are kept (end_of_wave calls ended() only then: the usual step asked nothing)."""
        return bool(self._due)

    def ended(self, wave: int) -> None:
        """end_of_wave(wave) ran: its dumps are copied (or failed); older answers are dropped."""
        self.last_ended = wave
        if not self._due:  # the usual case: nothing was asked
            return
        for w in [w for w in self._due if w <= wave]:
            del self._due[w]

    def check(self, req_id: str, box: Optional["mb.Mailbox"] = None) -> bool:
        if box is None:
            box = self._mailbox_of()
        q = box._q  # the mailbox's words (None once closed: the properties say 0)
        clear = self._clear
        # The step's other finished requests: the same waves (the same floor and last ended wave),
        # read already, nothing due (two loads).
        if clear is not None and q is not None and clear[0] == q[_Q_FLOOR] and clear[1] == self.last_ended and clear[2] is box and clear[3] == q[_Q_EPOCH]:
            return False
        nxt = self.last_ended + 1
        floor = q[_Q_FLOOR] if q is not None else box.floor
        # The decided waves: below the floor, never more than the ring holds (a stale floor).
        decided_to = min(floor - 1, nxt + mb.SLOTS - 1)
        key = (floor, self.last_ended, box, box.epoch)
        if q is not None and box.no_dump_due(nxt, max(nxt, decided_to)):
            # The step's first finished request, the usual wave: every decided vector there, none
            # with dump_due (what the loop below finds, without building a vector per wave).
            self._clear = key
            return False
        clear = True
        for w in range(nxt, max(nxt, decided_to) + 1):
            v = box.read_wave(w)
            if v is not None and not v.dump_due:
                continue
            clear = False
            if w not in self._due:
                if v is None and self._stall.active():
                    # No vector and none coming: not asked (a bound each), given up on this rank.
                    self.forfeited_to = max(self.forfeited_to, w)
                    continue
                got = self._ask(w)
                # Kept until the wave ends, an unknown answer too: asked again, it would cost every
                # finished request a bound.
                self._due[w] = ALL if got is None else set(got)
                if got is None:
                    self._stall.begin()
            ids = self._due[w]
            if ids is ALL or req_id in ids:
                return True
        if clear:
            self._clear = key
        return False
