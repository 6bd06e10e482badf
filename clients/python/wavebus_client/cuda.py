"""CUDA regions: a device tensor shared with the agent through a CUDA IPC handle."""

from typing import Optional

from . import dtypes
from .errors import ConfigError, CudaUnavailableError
from .region import CUDA_IPC_HANDLE_SIZE, Region, validate


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def cuda_region(tensor, name: str, *, role: str = "input", layer: str = "", kv: str = "", token_ids: Optional[bool] = None) -> Region:
    """Describe a contiguous CUDA tensor as a Region the agent opens with cudaIpcOpenMemHandle.

    The IPC handle names the caching allocator's whole block; ``offset`` is where the tensor's
    first byte lies in it (the storage's offset in the block plus the tensor's in the storage).
    """
    import torch

    where = "cuda_region()"
    if not torch.cuda.is_available():
        raise CudaUnavailableError(f"{where}: CUDA is not available in this process (torch {torch.__version__}); use shm_tensor() for host memory")
    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
        raise ConfigError(f"{where}: tensor must be a CUDA torch.Tensor, got {getattr(tensor, 'device', type(tensor).__name__)}")
    if not tensor.is_contiguous():
        raise ConfigError(f"{where}: tensor must be contiguous")
    storage = tensor.storage()
    # torch 1.13 .. 2.x: (device, handle, storage_size_bytes, storage_offset_bytes, ref_counter_handle,
    #                     ref_counter_offset, event_handle, event_sync_required)
    shared = storage._share_cuda_()  # noqa: SLF001 (torch's own multiprocessing uses it)
    device, handle, _size, storage_offset_bytes = shared[0], shared[1], shared[2], shared[3]
    if not isinstance(handle, (bytes, bytearray)) or len(handle) < CUDA_IPC_HANDLE_SIZE:
        raise CudaUnavailableError(f"{where}: torch returned an unexpected IPC handle ({type(handle).__name__}, {len(handle) if hasattr(handle, '__len__') else '?'} bytes)")
    offset = int(storage_offset_bytes) + tensor.storage_offset() * tensor.element_size()
    dt = dtypes.from_torch(tensor.dtype)
    return validate(Region(name=name, kind="cuda", cuda_ipc_handle=bytes(handle[:CUDA_IPC_HANDLE_SIZE]), offset=offset,
                           nbytes=tensor.numel() * tensor.element_size(), device=int(device), dtype=dt,
                           shape=list(tensor.shape), role=role, layer=layer, kv=kv, token_ids=token_ids, base_ptr=tensor.data_ptr(),
                           owner=tensor), where)


