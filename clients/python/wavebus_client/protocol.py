"""The protocol version, read from the compiled proto (enum ProtocolVersion in proto/wavebus.proto,
one version for the whole wire protocol): the agent (TypeScript) reads the same enum. Never written
here by hand."""
from typing import Optional

from . import wavebus_pb2 as pb
from .errors import ProtocolError

CLIENT_PROTOCOL_VERSION: int = pb.PROTOCOL_VERSION_CURRENT


def _describe(v: int) -> str:
    return f"{v} (from before protocol versions)" if v == pb.PROTOCOL_VERSION_UNSPECIFIED else str(v)


def protocol_mismatch(self_side: str, peer: int, where: str) -> Optional[ProtocolError]:
    """None when ``peer`` speaks this build's version; else the refusal naming both versions and the
    side to upgrade (the older one). ``self_side`` is 'client' (checking the agent's hello reply)."""
    if peer == CLIENT_PROTOCOL_VERSION:
        return None
    other = "client" if self_side == "agent" else "agent"
    older = other if peer < CLIENT_PROTOCOL_VERSION else self_side
    fix = ("upgrade the engine client (wavebus / wavebus_client)" if older == "client"
           else "upgrade wavebus on this host (the agent)")
    return ProtocolError(
        f"{where}: client protocol mismatch: the {other} speaks version {_describe(peer)}, this {self_side} "
        f"speaks version {_describe(CLIENT_PROTOCOL_VERSION)}; {fix} so both speak the same version",
        "ERR_PROTOCOL_VERSION")
