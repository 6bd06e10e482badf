"""`bench rank-digest`'s engine (bench/rank-digest.ts): the Python client's rank digests per step.

argv: ring path, warm steps per chunk, cold steps, sleep ms, then the row counts. Columns as
examples/torch-engine holds them: int64 CPU torch buffers made once, sliced anew each step (input ids,
positions, query_start_loc; the sampled tokens). Per row count:
- warm: decided(), inputs() and inputs() with the row starts each in a tight loop (best and median
  of 5 chunks, µs per call; the views made beforehand, a new tensor object each call);
- step: decided() and inputs() with the row starts as examples/torch-engine calls them, each step after
  a sleep of the forward's length (bench client's engine does the same) and after the engine's own
  work (its argmax; staging the next inputs), timed with perf_counter_ns around each call: the p50
  and p90 of their sum in µs; what the engine pays once its caches went cold in the forward;
- floor: three zlib.crc32 over int32 columns of the rows (ids, positions, tokens), warm: what the
  digests' definition costs whatever the code around it;
- step floor: the same step with two calls that do the least any client taking these tensors in
  Python must (their data pointers read: step_floor_ptr; the columns also copied into a ring as int32
  and a slot struct stored, no digest: step_floor_copy), p50 µs: what no digest design goes below.
"""
import json
import struct
import sys
import time
import zlib

import numpy as np
import torch

from wavebus_client.digest import DecisionRing

path, warm_n, cold_n, sleep_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
sizes = [int(x) for x in sys.argv[5:]]
ring = DecisionRing(path)
cap = max(sizes) + 1
g = torch.Generator().manual_seed(1)
buf = {"ids": torch.randint(0, 150000, (cap,), generator=g), "pos": torch.arange(cap) + 1000,
       "qsl": torch.arange(cap), "tok": torch.randint(0, 150000, (cap,), generator=g)}
ns = time.perf_counter_ns
wave = 0


def chunks(f):
    global wave
    for _ in range(200):
        f(wave)
        wave += 1
    out = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(warm_n):
            f(wave)
            wave += 1
        out.append((time.perf_counter() - t0) / warm_n * 1e6)
    out.sort()
    return {"best": out[0], "median": out[2]}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] / 1000


result = {}
for rows in sizes:
    ids, pos, qsl, tok = buf["ids"], buf["pos"], buf["qsl"], buf["tok"]
    # 64 sets of the step's views, each a tensor object of its own (as each step's are), made
    # outside the timed loop: the slicing is the engine's cost, not the digests'.
    v = [(ids[:rows], pos[:rows], qsl[:rows + 1], tok[:rows]) for _ in range(64)]
    r = {
        "decided": chunks(lambda w: ring.decided(w, v[w & 63][3])),
        "inputs": chunks(lambda w: ring.inputs(w, v[w & 63][0], v[w & 63][1])),
        "inputs_rows": chunks(lambda w: ring.inputs(w, *v[w & 63][:3])),
    }
    steps, ins, dec = [], [], []
    logits = torch.randn(rows, 64, generator=g)
    src = torch.randint(0, 150000, (rows,), generator=g)
    for i in range(cold_n + 20):
        # A step in examples/torch-engine's order: the forward (a sleep), the engine samples, then
        # decided(); the next step's inputs staged into its buffers, then decided_inputs(). The
        # engine's own work (untimed) runs first after the sleep, as in a real step.
        time.sleep(sleep_ms / 1000)
        sampled = logits.argmax(dim=-1)  # a fresh tensor, as the engine's argmax_t
        t0 = ns()
        ring.decided(wave, sampled)
        t1 = ns()
        ids[:rows].copy_(src)
        a, b, c = ids[:rows], pos[:rows], qsl[:rows + 1]  # the engine's views of the next step
        t2 = ns()
        ring.inputs(wave + 1, a, b, c)
        t3 = ns()
        wave += 2
        if i >= 20:
            steps.append(t1 - t0 + t3 - t2)
            dec.append(t1 - t0)
            ins.append(t3 - t2)
    r["step_p50"], r["step_p90"] = pct(steps, 0.5), pct(steps, 0.9)
    # The floor of any client taking these tensors in Python, in the same step order: two calls that
    # only read the tensors' data pointers, and two that also copy them into a ring as int32 and
    # store two slot structs (what the columns need so the agent can name a row), no digest.
    ptrs, copies = [], []
    scratch = np.zeros(3 * cap + 1, dtype="<i4")
    d_tok, d_ids, d_pos, d_qsl = scratch[:rows], scratch[cap:cap + rows], scratch[2 * cap:2 * cap + rows], scratch[3 * cap - rows - 1:3 * cap]
    head = bytearray(64)
    st = struct.Struct("<QQIIIIII")

    def take_ptr(w, t):
        return t.data_ptr()

    def take_ptrs(w, x, y, z):
        return x.data_ptr() + y.data_ptr() + z.data_ptr()

    def take_col(w, t):
        d_tok[...] = t.numpy()
        st.pack_into(head, 0, w, 0, 0, 0, 0, 0, 0, 0)

    def take_cols(w, x, y, z):
        d_ids[...] = x.numpy()
        d_pos[...] = y.numpy()
        d_qsl[...] = z.numpy()
        st.pack_into(head, 0, w, 0, 0, 0, 0, 0, 0, 0)

    for floor_of, one, three in ((ptrs, take_ptr, take_ptrs), (copies, take_col, take_cols)):
        for i in range(cold_n + 20):
            time.sleep(sleep_ms / 1000)
            sampled = logits.argmax(dim=-1)
            t0 = ns()
            one(wave, sampled)
            t1 = ns()
            ids[:rows].copy_(src)
            a, b, c = ids[:rows], pos[:rows], qsl[:rows + 1]
            t2 = ns()
            three(wave + 1, a, b, c)
            t3 = ns()
            if i >= 20:
                floor_of.append(t1 - t0 + t3 - t2)
    r["step_floor_ptr_p50"], r["step_floor_copy_p50"] = pct(ptrs, 0.5), pct(copies, 0.5)
    r["step_inputs_p50"], r["step_decided_p50"] = pct(ins, 0.5), pct(dec, 0.5)
    cols = [np.ascontiguousarray(x[:rows].numpy(), dtype="<i4") for x in (ids, pos, tok)]
    t0 = time.perf_counter()
    for _ in range(warm_n):
        for col in cols:
            zlib.crc32(col)
    r["crc_floor"] = (time.perf_counter() - t0) / warm_n * 1e6
    result[str(rows)] = r
# Which path ran the digests' copies and CRCs (WAVEBUS_PY_NATIVE picks): "native", "numpy" or "mixed".
nat, npy = ring.stats["digest_native_writes"], ring.stats["digest_numpy_writes"]
print(json.dumps({"python": result, "waves": wave, "path": "mixed" if nat and npy else "native" if nat else "numpy"}))
