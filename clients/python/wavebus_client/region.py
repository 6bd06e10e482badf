"""Region: one block of engine memory the agent may read (a KV pool layer, an input buffer)."""
from dataclasses import dataclass, field
from typing import Any, List, Optional

from . import dtypes
from . import wavebus_pb2 as pb
from .errors import ConfigError

KINDS = {"shm": pb.REGION_SHM, "cuda": pb.REGION_CUDA}
ROLES = {"kv_pool": pb.ROLE_KV_POOL, "input": pb.ROLE_INPUT, "weight": pb.ROLE_WEIGHT}
# token_ids: None leaves it to the name ("input_ids"); True / False say it (docs/recorder.md).
TOKEN_IDS = {None: pb.TOKEN_IDS_BY_NAME, True: pb.TOKEN_IDS_YES, False: pb.TOKEN_IDS_NO}
CUDA_IPC_HANDLE_SIZE = 64


@dataclass
class Region:
    """Fields of wavebus.Region. ``kind`` is 'shm' | 'cuda', ``role`` is 'kv_pool' | 'input'.

    ``token_ids`` (input regions): whether it holds token ids, which the flight recorder's bundles
    keep only as report.save_sensitive_info allows; None: the agent goes by the name "input_ids".
    ``base_ptr`` (not sent) is the address of the region's first byte in this process, so that
    before_forward can turn a tensor into (region, offset); ``owner`` keeps its memory alive.
    """

    name: str
    kind: str = "shm"
    shm_name: str = ""
    offset: int = 0
    nbytes: int = 0
    cuda_ipc_handle: bytes = b""
    device: int = 0
    dtype: str = "uint8"
    shape: List[int] = field(default_factory=list)
    role: str = "input"
    layer: str = ""
    kv: str = ""
    token_ids: Optional[bool] = None
    # kv_pool: bytes from one block's start to the next's; 0: back to back. An interleaved pool
    # (transformers' paged cache) registers each layer's K or V at its offset with the block stride.
    block_stride: int = 0
    base_ptr: Optional[int] = field(default=None, repr=False, compare=False)
    owner: Any = field(default=None, repr=False, compare=False)

    def to_proto(self) -> "pb.Region":
        r = validate(self)
        return pb.Region(
            name=r.name, kind=KINDS[r.kind], shm_name=r.shm_name, offset=r.offset, nbytes=r.nbytes,
            cuda_ipc_handle=r.cuda_ipc_handle, device=r.device, dtype=r.dtype, shape=r.shape,
            role=ROLES[r.role], layer=r.layer, kv=r.kv, token_ids=TOKEN_IDS[r.token_ids],
            block_stride=r.block_stride,
        )


def _nat(v, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{where} must be an integer, got {v!r}")
    if v < 0:
        raise ConfigError(f"{where} must be >= 0, got {v}")
    return v


def check_shape(shape, where: str) -> List[int]:
    try:
        dims = list(shape)
    except TypeError:
        raise ConfigError(f"{where}: shape must be a list of integers, got {shape!r}") from None
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int):
            raise ConfigError(f"{where}: shape {dims} has a non-integer dimension {d!r}")
        if d < 0:
            raise ConfigError(f"{where}: shape {dims} has a negative dimension")
    return dims


def from_any(region, where: str = "register()") -> Region:
    """Accept a Region or a dict with its field names (unknown keys are errors)."""
    if isinstance(region, Region):
        return region
    if isinstance(region, dict):
        known = set(Region.__dataclass_fields__)
        unknown = sorted(set(region) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown region field(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
        if "name" not in region:
            raise ConfigError(f"{where}: region has no name")
        return Region(**region)
    raise ConfigError(f"{where}: region must be a Region or a dict, got {type(region).__name__}")


def validate(r: Region, where: str = "register()") -> Region:
    """Check every field; errors name the function, the region and the field."""
    if not isinstance(r.name, str) or not r.name:
        raise ConfigError(f"{where}: region name must be a non-empty string, got {r.name!r}")
    w = f"{where}: region {r.name!r}"
    if r.kind not in KINDS:
        raise ConfigError(f"{w}: kind must be one of {', '.join(KINDS)}, got {r.kind!r}")
    if r.role not in ROLES:
        raise ConfigError(f"{w}: role must be one of {', '.join(ROLES)}, got {r.role!r}")
    if r.token_ids is not None and not isinstance(r.token_ids, bool):
        raise ConfigError(f"{w}: token_ids must be True, False or None, got {r.token_ids!r}")
    if r.token_ids is not None and r.role != "input":
        raise ConfigError(f"{w}: token_ids is only for input regions")
    r.dtype = dtypes.parse_dtype(r.dtype, f"{w}: dtype")
    r.shape = check_shape(r.shape, w)
    _nat(r.offset, f"{w}: offset")
    _nat(r.nbytes, f"{w}: nbytes")
    _nat(r.device, f"{w}: device")
    _nat(r.block_stride, f"{w}: block_stride")
    numel = 1
    for d in r.shape:
        numel *= d
    need = numel * dtypes.itemsize(r.dtype)
    if r.block_stride:
        if r.role != "kv_pool" or len(r.shape) != 4:
            raise ConfigError(f"{w}: block_stride is only for kv_pool regions")
        block = need // r.shape[0] if r.shape[0] else 0
        if r.block_stride < block:
            raise ConfigError(f"{w}: block_stride {r.block_stride} is below one block ({block} bytes)")
        need = (r.shape[0] - 1) * r.block_stride + block if r.shape[0] else 0
    if r.nbytes != need:
        raise ConfigError(f"{w}: nbytes {r.nbytes} does not match shape {r.shape} of {r.dtype} ({need} bytes)")
    if r.kind == "shm":
        if not isinstance(r.shm_name, str) or not r.shm_name.strip("/"):
            raise ConfigError(f"{w}: shm_name is required for an shm region")
        if "/" in r.shm_name.lstrip("/"):
            raise ConfigError(f"{w}: shm_name {r.shm_name!r} must not contain '/' after the leading one")
        if r.cuda_ipc_handle:
            raise ConfigError(f"{w}: cuda_ipc_handle is only for kind 'cuda'")
    else:
        if not isinstance(r.cuda_ipc_handle, (bytes, bytearray)) or len(r.cuda_ipc_handle) != CUDA_IPC_HANDLE_SIZE:
            n = len(r.cuda_ipc_handle) if isinstance(r.cuda_ipc_handle, (bytes, bytearray)) else r.cuda_ipc_handle
            raise ConfigError(f"{w}: cuda_ipc_handle must be {CUDA_IPC_HANDLE_SIZE} bytes, got {n!r}")
        r.cuda_ipc_handle = bytes(r.cuda_ipc_handle)
    if r.role == "kv_pool":
        if len(r.shape) != 4:
            raise ConfigError(f"{w}: a kv_pool region has shape [num_blocks, block_size, num_kv_heads, head_dim], got {r.shape}")
        if r.kv not in ("k", "v"):
            raise ConfigError(f"{w}: kv must be 'k' or 'v' for a kv_pool region, got {r.kv!r}")
        if not isinstance(r.layer, str) or not r.layer:
            raise ConfigError(f"{w}: layer is required for a kv_pool region")
    elif r.kv:
        raise ConfigError(f"{w}: kv is only for kv_pool regions, got {r.kv!r}")
    return r
