"""The client's version and the wire protocol it speaks."""
import hashlib

__version__ = "0.1.0"  # the same as the wavebus package (package.json)


def protocol_version() -> str:
    """A fingerprint of proto/wavebus.proto as compiled into wavebus_pb2 (sha256 of its serialized
    descriptor, first 16 hex digits): two sides with the same value speak the same messages."""
    from . import wavebus_pb2

    return "sha256:" + hashlib.sha256(wavebus_pb2.DESCRIPTOR.serialized_pb).hexdigest()[:16]
