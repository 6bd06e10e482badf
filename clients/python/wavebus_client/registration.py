"""Regions the agent may read (register, register_all) and their sending: a mixin of Client, apart
from client.py so that the per-step calls stay in one file of readable size."""
import logging
import time
from typing import Iterable

from . import wavebus_pb2 as pb
from .errors import AgentError, AgentUnavailableError, ConfigError
from .region import Region, from_any, validate

log = logging.getLogger("wavebus_client")


class RegionsMixin:
    """Client's regions: ``_regions`` (kept) and ``_sent_regions`` (the agent has them)."""

    def register(self, region) -> bool:
        """Tell the agent about a block of memory it may read. Sent once per region name.
        Returns True when it was sent (False: everything off, or already registered)."""
        r = validate(from_any(region))
        prev = self._regions.get(r.name)
        if prev is not None and prev != r:
            raise ConfigError(f"register(): region {r.name!r} is already registered with different fields")
        if r.name in self._sent_regions:
            return False
        self._regions[r.name] = r
        if not self.enabled:
            return False  # kept, and sent once something turns on
        self._ensure_hello("register()")  # the region stays kept: it is sent once the agent answers
        if not self._send_region(r, time.monotonic() + self.hello_timeout_ms / 1000):
            why = f"register(): the wavebus agent did not answer within {self.hello_timeout_ms} ms (region {r.name!r})"
            self._avail.mark_unavailable(why)
            raise AgentUnavailableError(why)
        return True

    def _send_region(self, r: Region, deadline: float) -> bool:
        reply = self._sock.request(pb.ClientRequest(register=r.to_proto()), deadline)
        if reply is None:
            return False
        if not reply.ok:
            self._regions.pop(r.name, None)  # never accepted: not a region of this client
            raise AgentError(f"register(): the agent refused region {r.name!r}: {reply.error}", reply.error_code or "ERR_AGENT")
        self._sent_regions[r.name] = r
        return True

    def _flush_regions(self, deadline: float, step: bool = False) -> bool:
        """Send regions registered while everything was off (once the agent turned something on).
        In a step (``step``) a refusal is logged and counted instead of raised."""
        for name, r in list(self._regions.items()):
            if name in self._sent_regions:
                continue
            try:
                if not self._send_region(r, deadline):
                    return False
            except AgentError as e:
                if not step:
                    raise
                self.stats["register_errors"] += 1
                self.last_error = str(e)
                log.warning("%s", e)
        return True

    def register_weights(self, weights) -> int:
        """A checksum per weight shard in this rank's fingerprint (name -> torch tensor), computed by
        the agent off the step (weights.py). Returns how many the agent took (0: everything off)."""
        from .weights import send_weights

        return send_weights(self, weights)

    def register_all(self, regions: Iterable) -> int:
        """register() each region; how many were sent. An agent that does not answer does not cut
        the list short: every region is kept (sent once the agent answers), then the first
        AgentUnavailableError is raised."""
        sent, unavailable = 0, None
        for r in regions:
            try:
                sent += bool(self.register(r))
            except AgentUnavailableError as e:
                unavailable = unavailable or e
        if unavailable is not None:
            raise unavailable
        return sent