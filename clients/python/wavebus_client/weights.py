"""register_weights(name -> tensor): the agent adds a crc32c per weight shard to this rank's
fingerprint (docs/fingerprints.md), reading the bytes itself through the native copy path, off
the step. A CUDA tensor is read through its IPC handle; a host tensor is copied once into a shm
segment that is unlinked as soon as the agent has mapped it (the agent's mapping outlives the name)."""
import os
import time
from typing import Mapping

from . import dtypes
from . import wavebus_pb2 as pb
from .errors import AgentError, AgentUnavailableError, ConfigError
from .region import Region, validate

_seq = [0]


def _host_copy(name: str, tensor) -> Region:
    from .shm import _create, _view

    t = tensor.detach().contiguous()
    dt = dtypes.from_torch(t.dtype)
    nbytes = t.numel() * t.element_size()
    _seq[0] += 1
    shm = _create(f"wavebus-w{os.getpid()}-{_seq[0]}", nbytes, "register_weights()")
    if nbytes:
        _view(shm, 0, list(t.shape), dt).copy_(t)
    return validate(Region(name=name, kind="shm", shm_name="/" + shm.name, offset=0, nbytes=nbytes, dtype=dt,
                           shape=list(t.shape), role="weight", owner=shm), "register_weights()")


def weight_region(name: str, tensor) -> Region:
    import torch

    if not isinstance(name, str) or not name:
        raise ConfigError(f"register_weights(): a weight name must be a non-empty string, got {name!r}")
    if not isinstance(tensor, torch.Tensor):
        raise ConfigError(f"register_weights(): weight {name!r} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_cuda:
        from .cuda import cuda_region

        return cuda_region(tensor.detach().contiguous(), name, role="weight")
    return _host_copy(name, tensor)


def send_weights(client, weights: Mapping[str, object]) -> int:
    """What Client.register_weights does; how many shards the agent took (0 when everything is off)."""
    if not hasattr(weights, "items"):
        raise ConfigError(f"register_weights(): expected a mapping name -> tensor, got {type(weights).__name__}")
    if not client.enabled:
        return 0
    client._ensure_hello("register_weights()")
    from .shm import release

    sent = 0
    items = list(weights.items())
    for i, (name, tensor) in enumerate(items):
        r = weight_region(name, tensor)
        msg = r.to_proto()
        # The last shard: the agent sends the fingerprint once, before answering it.
        msg.last_weight = i == len(items) - 1
        try:
            reply = client._sock.request(pb.ClientRequest(register=msg), time.monotonic() + client.capture_timeout_ms / 1000)
        finally:
            if r.kind == "shm":
                release(r)  # the agent mapped it while answering; the copy goes with its last mapping
        if reply is None:
            why = f"register_weights(): the wavebus agent did not answer within {client.capture_timeout_ms} ms (weight {name!r})"
            client._avail.mark_unavailable(why)
            raise AgentUnavailableError(why)
        if not reply.ok:
            raise AgentError(f"register_weights(): the agent refused weight {name!r}: {reply.error}", reply.error_code or "ERR_AGENT")
        sent += 1
    return sent
