"""The forward a snapshot may capture: its identity (ForwardContext) and its input tensors."""
from dataclasses import dataclass, field, fields
from typing import Dict, List

from . import dtypes
from . import wavebus_pb2 as pb
from .errors import ConfigError
from .region import Region, check_shape

# The forward-context rule, the same as the agent's (src/snapshot/selector.ts checkForwardContext;
# proto/wavebus.proto states it): integers the agent reads exactly (JS safe integers).
MAX_CONTEXT_INT = (1 << 53) - 1
_U32 = 0xFFFFFFFF


@dataclass
class ForwardContext:
    compilation_hash: str
    global_step: int = 0
    is_prompt: bool = False
    req_ids: List[str] = field(default_factory=list)
    positions: List[int] = field(default_factory=list)      # per row; -1 marks padding
    row_request: List[int] = field(default_factory=list)    # per row: index into req_ids, -1 for padding
    num_speculative_tokens: int = 0
    warmup: bool = False


def _ints(v, where: str, lo: int, hi: int) -> List[int]:
    if hasattr(v, "tolist"):
        v = v.tolist()
    if not isinstance(v, (list, tuple)):
        raise ConfigError(f"{where} must be a list of integers, got {type(v).__name__}")
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
            raise ConfigError(f"{where}[{i}] must be an integer in {lo}..{hi}, got {x!r}")
    return list(v)


def context_proto(ctx, where: str = "before_forward(): context") -> "pb.ForwardContext":
    if isinstance(ctx, dict):
        names = {f.name for f in fields(ForwardContext)}
        unknown = sorted(set(ctx) - names)
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")
        if "compilation_hash" not in ctx:
            raise ConfigError(f"{where}: compilation_hash is required")
        ctx = ForwardContext(**ctx)
    if not isinstance(ctx, ForwardContext):
        raise ConfigError(f"{where} must be a ForwardContext or a dict, got {type(ctx).__name__}")
    if not isinstance(ctx.compilation_hash, str) or not ctx.compilation_hash:
        raise ConfigError(f"{where}.compilation_hash must be a non-empty string, got {ctx.compilation_hash!r}")
    if isinstance(ctx.global_step, bool) or not isinstance(ctx.global_step, int) or not 0 <= ctx.global_step <= MAX_CONTEXT_INT:
        raise ConfigError(f"{where}.global_step must be an integer in 0..{MAX_CONTEXT_INT}, got {ctx.global_step!r}")
    for b in ("is_prompt", "warmup"):
        if not isinstance(getattr(ctx, b), bool):
            raise ConfigError(f"{where}.{b} must be true or false, got {getattr(ctx, b)!r}")
    if not isinstance(ctx.req_ids, (list, tuple)) or not all(isinstance(r, str) for r in ctx.req_ids):
        raise ConfigError(f"{where}.req_ids must be a list of strings, got {ctx.req_ids!r}")
    positions = _ints(ctx.positions, f"{where}.positions", -1, MAX_CONTEXT_INT)
    # Empty row_request: upstream's layout, row r is request r (rows past req_ids are padding).
    rows = _ints(ctx.row_request, f"{where}.row_request", -1, len(ctx.req_ids) - 1)
    if rows and len(rows) != len(positions):
        raise ConfigError(f"{where}: positions has {len(positions)} rows but row_request has {len(rows)} "
                          f"(leave row_request empty for row r = request r)")
    nst = ctx.num_speculative_tokens
    if isinstance(nst, bool) or not isinstance(nst, int) or not 0 <= nst <= _U32:
        raise ConfigError(f"{where}.num_speculative_tokens must be an integer in 0..{_U32}, got {nst!r}")
    return pb.ForwardContext(
        compilation_hash=ctx.compilation_hash, global_step=ctx.global_step, is_prompt=ctx.is_prompt,
        req_ids=list(ctx.req_ids), positions=positions, row_request=rows,
        num_speculative_tokens=nst, warmup=ctx.warmup,
    )


def input_proto(item, regions: Dict[str, Region], where: str) -> "pb.TensorInput":
    """(region_name, offset, dtype, shape) or a torch tensor inside a registered input region."""
    if isinstance(item, (tuple, list)):
        if len(item) != 4:
            raise ConfigError(f"{where} must be (region_name, offset, dtype, shape), got {len(item)} items")
        name, offset, dtype, shape = item
        region = regions.get(name)
        if region is None:
            raise ConfigError(f"{where}: region {name!r} is not registered")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ConfigError(f"{where}: offset must be a non-negative integer, got {offset!r}")
        if not isinstance(dtype, str) and type(dtype).__name__ == "dtype" and type(dtype).__module__ == "torch":
            import torch

            dt, item_size = dtypes.wire_name(dtype), torch.empty((), dtype=dtype).element_size()
        else:
            dt = dtypes.parse_dtype(dtype, f"{where}: dtype")
            item_size = dtypes.itemsize(dt)
        dims = check_shape(shape, where)
    else:
        import torch

        if not isinstance(item, torch.Tensor):
            raise ConfigError(f"{where} must be a torch tensor or (region_name, offset, dtype, shape), got {type(item).__name__}")
        if not item.is_contiguous():
            raise ConfigError(f"{where}: tensor must be contiguous (the agent copies one byte range)")
        # Any torch dtype: the agent checks it only if this forward is selected (.pt takes any dtype).
        dt, item_size = dtypes.wire_name(item.dtype), item.element_size()
        dims = list(item.shape)
        ptr = item.data_ptr()
        nbytes = item.numel() * item.element_size()
        region = None
        for r in regions.values():
            if r.base_ptr is not None and r.base_ptr <= ptr and ptr + nbytes <= r.base_ptr + r.nbytes:
                region = r
                break
        if region is None:
            raise ConfigError(f"{where}: tensor at 0x{ptr:x} ({nbytes} bytes) does not lie in a registered region")
        name, offset = region.name, ptr - region.base_ptr
    if region.role != "input":
        raise ConfigError(f"{where}: region {name!r} has role {region.role!r}; inputs must be in 'input' regions")
    numel = 1
    for d in dims:
        numel *= d
    end = offset + numel * item_size
    if end > region.nbytes:
        raise ConfigError(f"{where}: bytes {offset}..{end} lie outside region {name!r} ({region.nbytes} bytes)")
    return pb.TensorInput(region=name, offset=offset, dtype=dt, shape=dims)
