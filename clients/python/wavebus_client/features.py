"""The agent's hello answer: which features are on, and the end-of-wave bound."""
import json
from dataclasses import dataclass

from .errors import ProtocolError

DEFAULT_END_OF_WAVE_TIMEOUT_MS = 50


@dataclass
class Features:
    """The agent's hello answer (features_json)."""

    tp0: bool = False
    bus: bool = False
    detectors: dict = None
    item_sync: bool = False
    snapshots: bool = False
    end_of_wave_timeout_ms: int = DEFAULT_END_OF_WAVE_TIMEOUT_MS

    @classmethod
    def parse(cls, text: str) -> "Features":
        if not text:
            return cls(detectors={})
        try:
            raw = json.loads(text)
        except ValueError as e:
            raise ProtocolError(f"hello reply: features_json is not valid JSON ({e})") from None
        if not isinstance(raw, dict):
            raise ProtocolError("hello reply: features_json must be a JSON object")
        f = cls(detectors={})
        for key in ("tp0", "bus", "item_sync", "snapshots"):
            if key in raw:
                if not isinstance(raw[key], bool):
                    raise ProtocolError(f"hello reply: features_json.{key} must be a boolean, got {raw[key]!r}")
                setattr(f, key, raw[key])
        if "detectors" in raw:
            if not isinstance(raw["detectors"], dict):
                raise ProtocolError("hello reply: features_json.detectors must be an object")
            f.detectors = raw["detectors"]
        if "end_of_wave_timeout_ms" in raw:
            t = raw["end_of_wave_timeout_ms"]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
                raise ProtocolError(f"hello reply: features_json.end_of_wave_timeout_ms must be a non-negative number, got {t!r}")
            f.end_of_wave_timeout_ms = t
        return f
