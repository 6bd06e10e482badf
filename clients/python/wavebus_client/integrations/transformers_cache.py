"""transformers' paged KV cache as wavebus KV regions.

transformers (5.x, generation/continuous_batching) keeps the whole cache in ONE flat uint8 tensor.
For a group of full-attention layers, block b is one contiguous run of bytes_per_block bytes holding,
for every layer i of the group in turn, a K page then a V page of page_size tokens
([page_size, num_kv_heads, head_dim] each); block ids in the allocator's block_table index that tensor
directly (its first two sectors are trash sectors no request owns). So layer i's K is a KV pool of
[num_blocks, page_size, heads, head_dim] at offset 2*i pages, one block every bytes_per_block bytes:
a region with block_stride. Layers of other attention types (sliding windows) are not mapped yet.

The regions are cut from one Region describing the whole cache tensor (``whole``): a POSIX shm
segment on the CPU (share_cache moves the tensor there), or a CUDA IPC export of the cache's own
device allocation on a GPU (cuda_cache_region: nothing moves). Each K or V region is the same
memory at whole.offset + its page's offset, with the block stride.
"""
import dataclasses
from typing import List

from .. import dtypes
from ..errors import ConfigError
from ..region import Region, validate

FULL_ATTENTION = "full_attention"


def layer_name(index: int) -> str:
    """The HF module that owns layer `index`'s attention (its KV dump files carry this name)."""
    return f"model.layers.{index}.self_attn"


def cuda_cache_region(cache) -> Region:
    """The cache's flat CUDA tensor exported through CUDA IPC (wavebus_client.cuda.cuda_region):
    the agent opens the engine's own allocation, nothing is copied or moved."""
    from ..cuda import cuda_region

    return cuda_region(cache.cache_tensor, "kv_cache")


def kv_regions(cache, whole: Region) -> List[Region]:
    """One K and one V kv_pool region per full-attention layer, cut from ``whole`` (the cache tensor's Region)."""
    if set(cache.cache_allocators) != {FULL_ATTENTION}:
        raise ConfigError(f"attach(): only full-attention models are mapped so far; this cache has {sorted(cache.cache_allocators)} (docs/transformers.md)")
    alloc = cache.cache_allocators[FULL_ATTENTION]
    dt = dtypes.from_torch(alloc.cache_dtype)
    heads, head_dim, page = alloc.num_key_value_heads, alloc.head_dim, alloc.tokens_per_page
    page_bytes = page * heads * head_dim * alloc.cache_dtype.itemsize
    stride = alloc.bytes_per_block
    if stride != 2 * page_bytes * len(alloc.layer_indices):
        raise ConfigError(f"attach(): unexpected cache layout (bytes_per_block {stride}, page {page_bytes} bytes, {len(alloc.layer_indices)} layers)")
    total = cache.cache_tensor.numel() * cache.cache_tensor.element_size()
    if whole.nbytes != total:
        raise ConfigError(f"attach(): the cache region holds {whole.nbytes} bytes, the cache tensor {total}")
    num_blocks = total // stride
    regions = []
    for i, layer in enumerate(alloc.layer_indices):
        for j, kv in enumerate(("k", "v")):
            off = (2 * i + j) * page_bytes
            regions.append(validate(dataclasses.replace(
                whole, name=f"{layer_name(layer)}.{kv}", offset=whole.offset + off, nbytes=(num_blocks - 1) * stride + page_bytes,
                dtype=dt, shape=[num_blocks, page, heads, head_dim], role="kv_pool", layer=layer_name(layer), kv=kv,
                block_stride=stride, token_ids=None, base_ptr=None if whole.base_ptr is None else whole.base_ptr + off), "attach()"))
    return regions
