"""pending_dump(req_id): is a dump of this request armed for a wave still to end on this rank?

Vectors are published ahead (docs/architecture.md, "Waves"): with a lookahead of L a dump detected in
wave N-1 is copied at the end of wave N+L, so a request can finish in between. An engine asks before
giving a finished request's blocks back (after end_of_wave(W), before the next forward) and, while
true, keeps them. The waves that matter are the decided ones not yet ended: W+1 up to the mailbox
floor (L waves with the chain on time); a later wave's dumps are decided at a head still to come.
Every rank has the same vectors, so every rank gives the same answer: a few memory loads (no system
call) when none has dump_due; with dump_due a wave's req ids are asked of the agent once; W+1's
vector not there yet is asked of the agent too, which waits for it within its bound.
"""
import time
from typing import Callable, Dict, List, Optional, Set

from . import mailbox as mb
from . import wavebus_pb2 as pb


def due_dumps_asker(sock, avail, bound_s: Callable[[], float], hello: Callable[[float], bool], stats: dict) -> Callable[[int], Optional[List[str]]]:
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
        if reply is None or not reply.ok:
            return None
        return list(reply.due_req_ids)
    return ask


class PendingDumps:
    def __init__(self, mailbox_of: Callable[[], "mb.Mailbox"], ask: Callable[[int], Optional[List[str]]]):
        self._mailbox_of = mailbox_of
        self._ask = ask
        self.last_ended = -1
        self._due: Dict[int, Set[str]] = {}

    def ended(self, wave: int) -> None:
        """end_of_wave(wave) ran: its dumps are copied (or failed); older answers are dropped."""
        self.last_ended = wave
        for w in [w for w in self._due if w <= wave]:
            del self._due[w]

    def check(self, req_id: str) -> bool:
        nxt = self.last_ended + 1
        box = self._mailbox_of()
        # The decided waves: below the floor, never more than the ring holds (a stale floor).
        decided_to = min(box.floor - 1, nxt + mb.SLOTS - 1)
        for w in range(nxt, max(nxt, decided_to) + 1):
            v = box.read_wave(w)
            if v is not None and not v.dump_due:
                continue
            ids = self._due.get(w)
            if ids is None:
                got = self._ask(w)
                if got is None:
                    return True  # unknown: keep the blocks one more step (asked again next time)
                ids = self._due[w] = set(got)
            if req_id in ids:
                return True
        return False
