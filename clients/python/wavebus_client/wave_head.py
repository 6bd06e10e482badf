"""The per-step wave head: the request built from the engine's telemetry, and the request slots
(the columnizer) with when to re-send their bindings."""
from typing import Optional

from . import wavebus_pb2 as pb
from .errors import ConfigError
from .telemetry import TelemetryColumnizer, telemetry_proto

# Steps between re-sends of every request's binding and block table (a lost one heals by then).
RESEND_EVERY = 64
_MAX_U64 = (1 << 64) - 1


class WaveHeadBuilder:
    def __init__(self):
        self._columnizer: Optional[TelemetryColumnizer] = None  # request slots of the telemetry
        self._telemetry_epoch = -1
        self._since_resend = 0

    def reset(self) -> None:
        """Sending paused: requests freed meanwhile go unseen, so the slots start over."""
        self._columnizer = None

    def resend(self) -> None:
        """A head (with its bindings) may have been lost: every binding and block table goes again."""
        if self._columnizer is not None:
            self._columnizer.resend()

    def build(self, wave: int, telemetry, detectors: bool, epoch: int) -> "pb.WaveHeadRequest":
        """``epoch``: the coordinator's, from the mailbox (a new one knows no bindings)."""
        body = pb.WaveHeadRequest(wave=wave)
        if telemetry is None:
            return body
        tp = telemetry_proto(telemetry, wave - 1 if wave > 0 else 0)
        if self._columnizer is None:
            self._columnizer = TelemetryColumnizer()
        # A new coordinator (epoch) knows no bindings; a periodic re-send heals a lost message.
        self._since_resend += 1
        if epoch != self._telemetry_epoch or self._since_resend >= RESEND_EVERY:
            self._telemetry_epoch = epoch
            self._since_resend = 0
            self._columnizer.resend()
        # No detector reads tokens: send only what a manual dump needs (requests, blocks, finish).
        body.telemetry.wave = tp.wave
        body.telemetry.columns.CopyFrom(self._columnizer.columns(tp.requests, tokens=detectors))
        if detectors:
            body.telemetry.non_finite.extend(tp.non_finite)
        return body


def check_wave(wave, where: str) -> int:
    if isinstance(wave, bool) or not isinstance(wave, int) or not 0 <= wave <= _MAX_U64:
        raise ConfigError(f"{where}: wave must be a non-negative integer, got {wave!r}")
    return wave
