"""pending_dump(req_id): is a dump of this request armed for a wave whose end_of_wave has not run on
this rank yet? Vectors are published a wave ahead (docs/architecture.md, "Waves"), so a request can
finish between its detection and its copy; an engine that asks before freeing a request's blocks
keeps them one step longer and the copy reads the request's own KV, not reused blocks.

With no dump_due in the ring's vectors after the last ended wave the answer costs a few memory
loads (no system call); for a wave with dump_due the req ids are asked of the agent once.
"""
from typing import Callable, Dict, List, Optional, Set

from . import mailbox as mb

# The agent could not say which requests are due: every request counts as pending (kept a step).
_ALL = None


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

    def _due_waves(self) -> List[int]:
        m = self._mailbox_of()
        top = m.floor - 1  # the newest decided wave
        out = []
        for w in range(max(self.last_ended + 1, top - mb.SLOTS + 1, 0), top + 1):
            v = m.read_wave(w)
            if v is not None and v.dump_due and not v.implied:
                out.append(w)
        return out

    def check(self, req_id: str) -> bool:
        for w in self._due_waves():
            ids = self._due.get(w)
            if ids is None:
                got = self._ask(w)
                if got is None:
                    return True  # unknown: keep the blocks one more step (asked again next time)
                ids = self._due[w] = set(got)
            if req_id in ids:
                return True
        return False
