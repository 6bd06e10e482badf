"""Named error classes, mirroring src/errors.ts. Each carries a stable ``code``.

The codes are the shared list in error_codes.py (generated from proto/errors.json; docs/errors.md
explains each)."""

import re

from .error_codes import CODES, ERRNO_PATTERN

_ERRNO = re.compile(ERRNO_PATTERN)


def is_error_code(code: str) -> bool:
    """True for a listed code or a system-call failure (ERR_ + errno name)."""
    return code in CODES or bool(_ERRNO.match(code))


class WavebusError(Exception):
    """Base class; ``code`` is stable so callers can branch on it."""

    default_code = "ERR_WAVEBUS"

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code or self.default_code


class ConfigError(WavebusError, ValueError):
    """Bad argument, environment variable or file content. The message names it."""

    default_code = "ERR_CONFIG"


class ProtocolError(WavebusError):
    """A reply or mailbox that could not be accepted (decoding, magic, version, size)."""

    default_code = "ERR_PROTOCOL"


class AgentUnavailableError(WavebusError):
    """The rank's agent did not answer within the bound (hello, register)."""

    default_code = "ERR_AGENT_UNAVAILABLE"


class AgentError(WavebusError):
    """The agent answered a request with ok=false."""

    default_code = "ERR_AGENT"


class CaptureError(WavebusError):
    """A snapshot capture failed: the caller must abort the forward (fail loud)."""

    default_code = "ERR_CAPTURE"


class CudaUnavailableError(WavebusError):
    """A CUDA region was asked for in a process without CUDA."""

    default_code = "ERR_CUDA_UNAVAILABLE"


class ReplayError(WavebusError):
    """A snapshot call dir that does not match its meta.json (the message names the file)."""

    default_code = "ERR_REPLAY"
