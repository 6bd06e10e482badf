"""Torch tensors in POSIX shared memory, which the rank's agent maps to read them.

``tensor, region = shm_tensor("wavebus-in0-rank0", [8, 128], torch.int64)`` then
``client.register(region)``. The segment stays alive as long as this process does (the Region
holds the SharedMemory); ``release(region)`` or process exit unlinks it.

Under ``wavebus launch`` the name gets the job's ``WAVEBUS_SHM_PREFIX`` in front, so that the
launcher removes the segment even when this process is killed (SIGKILL runs no atexit).
"""
import _posixshmem
import atexit
import os
import re
from multiprocessing import resource_tracker, shared_memory
from typing import Dict, List, Optional, Sequence, Tuple

from . import dtypes
from .errors import ConfigError
from .region import Region, check_shape, validate

_LIVE: Dict[str, shared_memory.SharedMemory] = {}
_ALIGN = 256  # offsets of KV layers inside one pool segment
_SHM_PREFIX = re.compile(r"^wavebus-[0-9a-f]{12}-$")  # what `wavebus launch` sets (src/launch/run-dir.ts)


def _job_prefix() -> str:
    p = os.environ.get("WAVEBUS_SHM_PREFIX", "")
    return p if _SHM_PREFIX.match(p) else ""


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _create(name: str, nbytes: int, where: str) -> shared_memory.SharedMemory:
    if not isinstance(name, str) or not name.strip("/") or "/" in name.lstrip("/"):
        raise ConfigError(f"{where}: shm name must be a non-empty name without '/', got {name!r}")
    bare = name.lstrip("/")
    prefix = _job_prefix()
    if prefix and not bare.startswith(prefix):
        bare = prefix + bare
    try:
        shm = shared_memory.SharedMemory(name=bare, create=True, size=max(nbytes, 1))
    except FileExistsError:
        raise ConfigError(f"{where}: shared memory /{bare} already exists (a previous run left it? remove /dev/shm/{bare})", "ERR_SHM_EXISTS") from None
    # Python 3.11's resource tracker would unlink the segment when this process's tracker exits,
    # possibly while the agent still reads it; this module unlinks it itself (release / atexit).
    try:
        resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001 (no public API)
    except Exception:
        pass
    _LIVE[shm.name] = shm
    return shm


def _view(shm: shared_memory.SharedMemory, offset: int, shape: List[int], dtype_name: str):
    import torch

    tdt = dtypes.torch_dtype_or_raise(dtype_name, "dtype")
    n = _numel(shape)
    if n == 0:
        return torch.empty(shape, dtype=tdt)
    return torch.frombuffer(shm.buf, dtype=tdt, count=n, offset=offset).view(shape)


def shm_tensor(name: str, shape: Sequence[int], dtype, *, region_name: Optional[str] = None, role: str = "input",
               layer: str = "", kv: str = "", token_ids: Optional[bool] = None) -> Tuple["object", Region]:
    """A zero-filled tensor in a new shm segment ``/<name>``, and the Region that describes it."""
    where = "shm_tensor()"
    dims = check_shape(shape, where)
    dt = dtypes.parse_dtype(dtype, f"{where}: dtype")
    nbytes = _numel(dims) * dtypes.itemsize(dt)
    shm = _create(name, nbytes, where)
    t = _view(shm, 0, dims, dt)
    region = Region(name=region_name or name.lstrip("/"), kind="shm", shm_name="/" + shm.name, offset=0, nbytes=nbytes,
                    dtype=dt, shape=dims, role=role, layer=layer, kv=kv, token_ids=token_ids, base_ptr=t.data_ptr() if nbytes else None, owner=shm)
    try:
        validate(region, where)
    except ConfigError:
        release(region)
        raise
    return t, region


def kv_pool_shm(name: str, layers: Sequence[str], num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                dtype) -> Tuple[Dict[str, Tuple["object", "object"]], List[Region]]:
    """A paged KV pool in one shm segment: per layer a K and a V tensor of shape
    [num_blocks, block_size, num_kv_heads, head_dim], and one kv_pool Region each ("<layer>.k", "<layer>.v")."""
    where = "kv_pool_shm()"
    if not layers or not all(isinstance(l, str) and l for l in layers):
        raise ConfigError(f"{where}: layers must be a non-empty list of layer names, got {layers!r}")
    if len(set(layers)) != len(layers):
        raise ConfigError(f"{where}: layers has duplicate names")
    dims = check_shape([num_blocks, block_size, num_kv_heads, head_dim], where)
    dt = dtypes.parse_dtype(dtype, f"{where}: dtype")
    per = _numel(dims) * dtypes.itemsize(dt)
    stride = (per + _ALIGN - 1) // _ALIGN * _ALIGN
    shm = _create(name, stride * 2 * len(layers), where)
    tensors: Dict[str, Tuple[object, object]] = {}
    regions: List[Region] = []
    for i, layer in enumerate(layers):
        pair = []
        for j, kv in enumerate(("k", "v")):
            off = stride * (2 * i + j)
            t = _view(shm, off, dims, dt)
            pair.append(t)
            regions.append(validate(Region(name=f"{layer}.{kv}", kind="shm", shm_name="/" + shm.name, offset=off, nbytes=per,
                                           dtype=dt, shape=dims, role="kv_pool", layer=layer, kv=kv,
                                           base_ptr=t.data_ptr() if per else None, owner=shm), where))
        tensors[layer] = (pair[0], pair[1])
    return tensors, regions


def _unlink(shm: shared_memory.SharedMemory) -> None:
    # Not shm.unlink(): that would unregister from the resource tracker a second time.
    try:
        _posixshmem.shm_unlink(shm._name)  # noqa: SLF001
    except FileNotFoundError:
        pass


def release(region: Region) -> None:
    """Unlink the region's segment (the mapping stays valid until the tensors are gone)."""
    shm = _LIVE.pop(region.shm_name.lstrip("/"), None)
    if shm is not None:
        _unlink(shm)


@atexit.register
def _unlink_all() -> None:
    for name in list(_LIVE):
        _unlink(_LIVE.pop(name))
