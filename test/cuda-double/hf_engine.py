"""transformers' paged KV cache exported as `cuda` regions, against the CUDA runtime TEST DOUBLE.

    <torch 2.x venv python> hf_engine.py <libcudart_double.so> <out_dir> <req_id> <block,ids>

Builds a real PagedAttentionCache (transformers' own manager, a small random Llama, 2 layers), fills
its flat cache tensor with random bytes, uploads those bytes into the double's device memory (this
torch has no CUDA: the double's allocation stands for the GPU cache tensor) and cuts the K and V
regions from that one CUDA IPC export with integrations.transformers_cache.kv_regions, the function
share_cache() uses on a GPU. Registers them, steps waves 1..3 with the request on the given blocks
(job.js arms a manual dump), and writes the pages transformers' own page views hold for those
blocks to out_dir/<layer>.<k|v>.bin. Prints one JSON line: the regions registered."""
import json
import os
import sys

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from device import DoubleDevice
from wavebus_client import Client, RequestStep, StepTelemetry
from wavebus_client.integrations.transformers_cache import kv_regions
from wavebus_client.region import Region

lib, out_dir, req_id, blocks = sys.argv[1], sys.argv[2], sys.argv[3], [int(b) for b in sys.argv[4].split(",")]
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)
model = LlamaForCausalLM(cfg)
model.config._attn_implementation = "paged|sdpa"
cb = ContinuousBatchingConfig(num_blocks=8, max_batch_tokens=32, page_size=4, use_async_batching=False, allow_block_sharing=False)
manager = model.init_continuous_batching(generation_config=GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0),
                                         continuous_batching_config=cb)
cache = manager._create_batch_processor().cache
cache.cache_tensor.copy_(torch.randint(0, 256, cache.cache_tensor.shape, dtype=torch.uint8))
data = cache.cache_tensor.numpy().tobytes()
dev = DoubleDevice(lib)
ptr = dev.upload(data)
whole = Region(name="kv_cache", kind="cuda", cuda_ipc_handle=dev.ipc_handle(ptr), nbytes=len(data), dtype="uint8",
               shape=[len(data)], role="input")
regions = kv_regions(cache, whole) + [whole]
alloc = next(iter(cache.cache_allocators.values()))
pages_per_block = alloc.block_physical_stride // alloc.tokens_per_page
rows = torch.tensor(blocks, dtype=torch.long) * pages_per_block
for idx in alloc.layer_indices:
    for kv, pages in zip(("k", "v"), alloc._kv_page_views[idx]):
        with open(os.path.join(out_dir, f"model.layers.{idx}.self_attn.{kv}.bin"), "wb") as f:
            f.write(pages[rows].contiguous().numpy().tobytes())
c = Client.connect()
c.register_all(regions)
for w in range(1, 4):
    c.wave_head(w, StepTelemetry(requests=[RequestStep(req_id=req_id, new_token_ids=[1], block_ids=blocks, prompt_len=8, num_output_tokens=1)]))
    c.end_of_wave(w)
print(json.dumps({"regions": [[r.name, r.kind, r.offset, r.block_stride] for r in regions], "layers": len(alloc.layer_indices)}), flush=True)
c.close()
dev.free(ptr)
