"""wavebus engine client: talk to this rank's wavebus agent (see docs/python-client.md)."""
from .client import Client, EndOfWaveResult, Features
from .protocol import CLIENT_PROTOCOL_VERSION
from .version import __version__, proto_fingerprint, protocol_version
from .errors import (AgentError, AgentUnavailableError, CaptureError, ConfigError, CudaUnavailableError,
                     ProtocolError, ReplayError, WavebusError)
from .forward import ForwardContext
from .mailbox import Mailbox, MailboxWriter, WaveVector
from .region import Region
from .tensor_head import TensorBatch
from .telemetry import LogitsFiniteGate, NonFiniteRow, PendingNonFinite, RequestStep, StepTelemetry, nonfinite_rows

__all__ = [
    "Client", "TensorBatch", "EndOfWaveResult", "Features", "ForwardContext", "Mailbox", "MailboxWriter", "WaveVector",
    "Region", "RequestStep", "NonFiniteRow", "StepTelemetry", "nonfinite_rows", "PendingNonFinite", "LogitsFiniteGate",
    "WavebusError", "ConfigError", "ProtocolError", "AgentError", "AgentUnavailableError", "CaptureError",
    "CudaUnavailableError", "ReplayError", "CLIENT_PROTOCOL_VERSION", "protocol_version", "proto_fingerprint", "__version__",
]
