"""The agent's hello answer (proto Features): which features are on, and the end-of-wave bound."""
from dataclasses import dataclass
from typing import Tuple

from . import wavebus_pb2 as pb
from .errors import ProtocolError

DEFAULT_END_OF_WAVE_TIMEOUT_MS = 50


@dataclass(frozen=True)
class Features:
    """The agent's hello answer (ClientReply.features)."""

    tp0: bool = False
    bus: bool = False
    detectors: Tuple[str, ...] = ()  # the enabled detectors, by config name
    item_sync: bool = False
    snapshots: bool = False
    end_of_wave_timeout_ms: int = DEFAULT_END_OF_WAVE_TIMEOUT_MS

    @classmethod
    def from_reply(cls, reply: "pb.ClientReply") -> "Features":
        """The features of a hello reply; an agent that sent none is a protocol error."""
        if not reply.HasField("features"):
            raise ProtocolError("hello reply: the agent sent no features (ClientReply.features)")
        f = reply.features
        return cls(tp0=f.tp0, bus=f.bus, detectors=tuple(f.detectors), item_sync=f.item_sync,
                   snapshots=f.snapshots, end_of_wave_timeout_ms=f.end_of_wave_timeout_ms)
