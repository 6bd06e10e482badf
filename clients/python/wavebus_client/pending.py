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
        # The step's answer, settled by its first finished request: (the mailbox's words, floor, last
        # ended wave, epoch) of the decided waves (they follow from the floor and the last ended wave)
        # and, for those with dump_due, what was asked of each (_dues: None when none has dump_due).
        # The step's other finished requests compare the key and read _dues, without reading the
        # vectors again: a published vector does not change within its epoch, an answer is kept until
        # its wave ends, and the floor moving or a wave ending changes the key.
        self._key = None
        self._dues: Optional[tuple] = None
        # (the mailbox's words, epoch, lo, hi): waves lo..hi were read in their slots with no dump due.
        # The next step's decided waves are mostly the same: only the new ones are read.
        self._clear_to = (None, -1, 0, -1)

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
        if q is not None and self._key == (q, q[_Q_FLOOR], self.last_ended, q[_Q_EPOCH]):
            return self.settled(req_id)
        return self._settle(req_id, box, q)

    def settled(self, req_id: str) -> bool:
        """The answer of the settled step (the key matched): pending when a decided wave's answer is
        "everything" or names the request."""
        dues = self._dues
        if dues is None:
            return False
        for ids in dues:
            if ids is ALL or req_id in ids:
                return True
        return False

    def _settle(self, req_id: str, box: "mb.Mailbox", q) -> bool:
        """The step's first finished request (or the mailbox moved): read the decided waves' vectors,
        ask the agent about a wave with dump_due once, and keep the step's answer (_key, _dues)."""
        last_ended = self.last_ended
        nxt = last_ended + 1
        floor = q[_Q_FLOOR] if q is not None else box.floor  # first: a slot the floor covers was written before it
        # The decided waves: below the floor, never more than the ring holds (a stale floor).
        last = min(floor - 1, nxt + mb.SLOTS - 1)
        if last < nxt:
            last = nxt
        if q is not None:
            epoch = q[_Q_EPOCH]
            key = (q, floor, last_ended, epoch)
            c_q, c_epoch, c_lo, c_hi = self._clear_to
            first = c_hi + 1 if c_q is q and c_epoch == epoch and c_lo <= nxt <= c_hi + 1 else nxt
            if first > last or box.no_dump_due(first, last):
                # The usual step: every decided vector there, none with dump_due (what the loop below
                # finds, without building a vector per wave); the waves read clear on an earlier step
                # (same mailbox and epoch) are not read again.
                self._key, self._dues = key, None
                self._clear_to = (q, epoch, nxt, last if first == nxt or last > c_hi else c_hi)
                return False
        dues = []
        for w in range(nxt, last + 1):
            v = box.read_wave(w)
            if v is not None and not v.dump_due:
                continue
            if w not in self._due:
                if v is None and self._stall.active():
                    # No vector and none coming: not asked (a bound each), given up on this rank. The
                    # stall lasts while the floor and epoch stay (the key's), so settled skips it too.
                    self.forfeited_to = max(self.forfeited_to, w)
                    continue
                got = self._ask(w)
                # Kept until the wave ends, an unknown answer too: asked again, it would cost every
                # finished request a bound.
                self._due[w] = ALL if got is None else set(got)
                if got is None:
                    self._stall.begin()
            ids = self._due[w]
            dues.append(ids)
            if ids is ALL or req_id in ids:
                # Later waves are asked only when a request passes this one (as before); an answer of
                # "everything" passes none, and after the last wave there is none to ask: the step's
                # answer is settled all the same.
                if (ids is ALL or w == last) and q is not None:
                    self._key, self._dues = key, tuple(dues)
                return True
        if q is not None:
            self._key, self._dues = key, tuple(dues) or None
        return False
