"""Degraded mode: whether the agent answers. A call that gets no answer within its bound marks the
agent unavailable (warned once per loss); calls then skip it, sending at most one probe per
interval, until any answer arrives."""
import logging
import time
from typing import Callable, Dict

log = logging.getLogger("wavebus_client")


class Availability:
    def __init__(self, endpoint: str, stats: Dict[str, int], probe_interval_ms: int,
                 ping: Callable[[], None], drain: Callable[[], None], back: Callable[[], None]):
        self.endpoint = endpoint
        self._stats = stats
        self.probe_interval_ms = probe_interval_ms
        self._ping = ping
        self._drain = drain
        self._back = back
        # True while the agent is known not to answer: calls skip it until it answers again.
        self.unavailable = False
        self.last_answer = float("-inf")
        self._last_probe = float("-inf")
        self.last_error = ""

    def heard(self) -> None:
        """Any answer proves the agent alive. After a loss, hello and regions go again on the next call."""
        self.last_answer = time.monotonic()
        if not self.unavailable:
            return
        self.unavailable = False
        self._stats["agent_back"] += 1
        self._back()
        log.info("the wavebus agent at %s answers again; engine calls use it again", self.endpoint)

    def mark_unavailable(self, why: str) -> None:
        self._last_probe = time.monotonic()
        if self.unavailable:
            return
        self.unavailable = True
        self._stats["agent_lost"] += 1
        self.last_error = why
        log.warning("the wavebus agent at %s is not answering (%s); engine calls skip it until it answers again", self.endpoint, why)

    def still_unavailable(self) -> bool:
        """While unavailable: read what came (non-blocking), and at most one probe per interval."""
        if not self.unavailable:
            return False
        self._drain()
        if self.unavailable and time.monotonic() - self._last_probe >= self.probe_interval_ms / 1000:
            self._last_probe = time.monotonic()
            self._stats["probes"] += 1
            self._ping()
        if self.unavailable:
            self._stats["skipped_unavailable"] += 1
        return self.unavailable
