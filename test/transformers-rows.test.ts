// The transformers integration's rows (clients/python/wavebus_client/integrations/transformers_rows.py):
// transformers' requests on the tensor path's stable rows, against a real PagedAttentionCache of a
// small random Llama (the allocator's own block tables, grown by its own allocation) and a real
// TensorBatch, in the suite's torch 2.x venv. What the head would carry is read from the batch's
// own columns (fill) and events. Also slot_batch: a row arrived and freed while sending paused
// sends no binding later.
import * as path from 'path';
import { spawnSync } from 'child_process';
import { ROOT, cleanup, tmpDir } from './helpers';
import { torch2 } from './torch2';

afterAll(cleanup);
jest.setTimeout(120000);

const DRIVER = `
import json, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM, GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.requests import RequestState
from wavebus_client import wavebus_pb2 as pb
from wavebus_client.tensor_head import TensorBatch
from wavebus_client.integrations.transformers_rows import RequestRows

torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)
model = LlamaForCausalLM(cfg)
model.config._attn_implementation = "paged|sdpa"
cb = ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=64, page_size=4, use_async_batching=False, allow_block_sharing=False)
manager = model.init_continuous_batching(generation_config=GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0),
                                         continuous_batching_config=cb)
cache = manager._create_batch_processor().cache
alloc = next(iter(cache.cache_allocators.values()))
batch = TensorBatch(None, 3)  # three rows: the third request waits for one
rows = RequestRows(batch, alloc)
states = {}

def grow(rid, n):  # the allocator's own path: n more tokens for rid
    st = states.setdefault(rid, RequestState(request_id=rid, initial_tokens=[5, 6, 7]))
    assert cache.can_store_request_tokens(st, n)
    st.position_offset += n

def head():  # what the next wave_head carries new (not the round-robin re-sends), then the head went
    # Each new binding and table is kept as its wire bytes (head_bytes.py): decoded here.
    new = pb.TelemetryColumns.FromString(batch.new_bytes())
    binds = sorted([b.slot, b.req_id, b.prompt_len, list(b.prompt_token_ids)] for b in new.bind)
    tables = sorted([t.slot, list(t.block_ids)] for t in new.blocks)
    ev = batch.event_columns()
    batch.sparse_bytes()  # what the head takes: the new ones go out with it
    batch.sent()
    rows.head_sent()
    return {"bind": binds, "blocks": tables, "events": sorted(zip(*ev)) if ev[0] else []}

out = {}
grow("a", 3); grow("b", 5)
rows.sync(states)
out["arrive"] = head()
rows.sync(states)
out["quiet"] = head()
grow("a", 2)  # a crosses a page: its table only
rows.sync(states)
out["grew"] = head()["blocks"]
out["rows_of"] = rows.rows_of({"b": 0, "zz": 1, "a": 2}).tolist()
# c and d come; only one row is left
grow("c", 1); grow("d", 1)
rows.sync(states)
out["exhausted"] = [rows.stats["rows_exhausted"], rows.live]
head()
# a finishes in wave 5, its blocks go back after end_of_wave(5); it comes back (offload-like) at once
rows.finish("a")
cache.free_blocks("a"); rows.released("a", 5)
grow("a", 1)
rows.sync(states)  # a's free has not gone with a head: no new row yet
rows.issue_frees(5)  # same wave: not yet
out["wave5"] = [head(), rows.live]
rows.issue_frees(6)
rows.sync(states)
out["wave6"] = [head(), rows.live]
rows.sync(states)  # its row came back with that head: the waiting request takes it
out["wave7"] = head()
# slot_batch: arrived and freed while sending paused: the binding never goes
b2 = TensorBatch(None, 4)
b2.arrive(2, "x", prompt_len=1)
b2.free(2)
b2.reset()
out["paused"] = [len(b2.new_bytes()), b2.live]
print(json.dumps(out))
`;

test('requests take stable rows at their first blocks, tables go when they change, freed rows come back after the head that freed them', () => {
  const { python } = torch2();
  const tmp = tmpDir('wavebus-hf-rows-');
  const r = spawnSync(python, ['-c', DRIVER], {
    encoding: 'utf8', timeout: 110000, cwd: tmp,
    env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python'), PYTHONDONTWRITEBYTECODE: '1', OMP_NUM_THREADS: '1' },
  });
  if (r.status !== 0) throw new Error(`python exited ${r.status ?? r.signal}\n${r.stderr}`);
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
  // a and b take rows 0 and 1 with their prompts; their tables (page size 4: a 1 block, b 2) go too.
  expect(out.arrive.bind).toEqual([[0, 'a', 3, [5, 6, 7]], [1, 'b', 3, [5, 6, 7]]]);
  expect(out.arrive.blocks.map((b: [number, number[]]) => [b[0], b[1].length])).toEqual([[0, 1], [1, 2]]);
  // Nothing changed: no binding, no table.
  expect(out.quiet).toEqual({ bind: [], blocks: [], events: [] });
  // a's fifth token needs a second block: only a's table goes.
  expect(out.grew.map((b: [number, number[]]) => [b[0], b[1].length])).toEqual([[0, 2]]);
  expect(out.rows_of).toEqual([1, -1, 0]);
  // c takes the last row; d finds none (counted) and waits.
  expect(out.exhausted).toEqual([1, 3]);
  // Wave 5: a finished (event); its give-back is not yet a free, and it takes no new row.
  expect(out.wave5).toEqual([{ bind: [], blocks: [], events: [[0, 1]] }, 2]);
  // Wave 6: a's row is freed by this head; d is still waiting (no row free before the head went).
  expect(out.wave6).toEqual([{ bind: [], blocks: [], events: [[0, 2]] }, 2]);
  // Then the freed row is taken again: d or a (both wait; one gets it, the other stays counted).
  expect(out.wave7.bind).toHaveLength(1);
  expect(out.wave7.bind[0][0]).toBe(0);
  expect(['a', 'd']).toContain(out.wave7.bind[0][1]);
  expect(out.paused).toEqual([0, 0]);
});
