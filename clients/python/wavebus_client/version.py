"""The client's version and the wire protocol it speaks."""
import hashlib

from .protocol import CLIENT_PROTOCOL_VERSION

__version__ = "0.1.0"  # the same as the wavebus package (package.json)


def protocol_version() -> int:
    """The client <-> agent protocol version (ProtocolVersion.PROTOCOL_VERSION_CURRENT in
    proto/wavebus.proto), sent in every hello and checked against the agent's."""
    return CLIENT_PROTOCOL_VERSION


def proto_fingerprint() -> str:
    """sha256 of the compiled proto/wavebus.proto descriptor (first 16 hex digits): tells two builds
    of the messages apart even where the protocol version is the same."""
    from . import wavebus_pb2

    return "sha256:" + hashlib.sha256(wavebus_pb2.DESCRIPTOR.serialized_pb).hexdigest()[:16]
