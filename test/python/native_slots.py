"""test/python-native.test.ts's Python side for _native.Slots (the tensor batch's rows and events in C,
slot_batch.py NativeSlotEvents): the same random calls to SlotEvents and to NativeSlotEvents, every
result, error text, event list and head compared; garbage to the C primitives; references released.
Prints one JSON line. usage: native_slots.py
"""
import gc
import json
import random
import sys
import tracemalloc

import numpy as np

from wavebus_client import _native
from wavebus_client import wavebus_pb2 as pb
from wavebus_client.errors import ConfigError
from wavebus_client.slot_batch import SlotEvents, native_slot_events

Native = native_slot_events(_native)
BAD_ROWS = [-1, 1.0, True, "0", 2**70, None, [0]]
# Garbage the engine could hand arrive() and blocks(), with the good values they stand in for.
BAD_REQ = [b"r", "", 3, None, "\ud800", "é-" * 70]  # the last is good: non-ASCII, over 127 bytes
BAD_PLEN = [True, -1, 2**32, 1.0, "5", 2**70, 2**32 - 1]  # the last is good
BAD_ROWS_ARGS = [5, None, "01", 2.5, object()]  # not a sequence of rows at all (a str is refused whole)
BAD_IDS = [[True], [-1], [2**32], [1.5], ["1"], [None], 7, np.array([3, 2**31], dtype=np.int64), np.array([-1]), (5, 6), range(3), np.uint32(7), [2**32 - 1, 0, 128]]


def call(obj, name, *args, keywords=False):
    """One call, its result or its refused call's error; keywords: arrive()'s optional arguments by name."""
    try:
        if keywords:
            row, req, plen, ids = args
            return ("ok", obj.arrive(row, req_id=req, prompt_len=plen, **({"prompt_token_ids": ids} if ids is not None else {})))
        return ("ok", getattr(obj, name)(*args))
    except (ConfigError, TypeError) as e:  # TypeError: an argument that is not a column at all (7)
        return (type(e).__name__, str(e))


def parity(out, seed=5, paused=0.0, key="heads_compared"):
    """Random arrivals (with and without prompt ids), tables, finishes, frees, resend_all and bad
    rows; after each step's calls both stores agree on everything, then on the head's bytes. With
    `paused`, that share of the steps sends no head and pauses instead (reset(): a rank that is not
    its replica's head rank, or the bus off): the new bindings and tables pile up across arrivals
    and frees, as in a long pause (the C store's lists then compact), and are compared as they stand."""
    random.seed(seed)
    heads = errors = 0
    for trial in range(40):
        m = random.choice([1, 3, 8, 64, 300])
        a, b = SlotEvents(m), Native(m)
        for step in range(150):
            for _ in range(random.randint(0, 10)):
                op, row = random.random(), random.randrange(m)
                if random.random() < 0.05:
                    row = random.choice(BAD_ROWS + [m, np.int64(row)])
                if op < 0.3:
                    req, plen = f"q{trial}-{step}-{row}", random.choice([0, 5, 300])
                    ids = [1, 2**32 - 1] if random.random() < 0.2 else None
                    if random.random() < 0.1:
                        req, plen, ids = random.choice([(random.choice(BAD_REQ), plen, ids), (req, random.choice(BAD_PLEN), ids), (req, plen, random.choice(BAD_IDS))])
                    args = ("arrive", row, req, plen, ids)
                elif op < 0.55:
                    ids = [random.randrange(2**32) for _ in range(random.randint(0, 6))] if random.random() < 0.7 else [1, 2]
                    args = ("blocks", row, random.choice(BAD_IDS) if random.random() < 0.1 else ids)
                elif op < 0.62:
                    args = ("finish", row)
                elif op < 0.74:
                    args = ("free", row)
                elif op < 0.85:
                    # The step's rows in one call, as a list, tuple or numpy array; now and then a bad
                    # row inside (the rows before it stay flagged) or a bad container.
                    rows = [random.randrange(m) for _ in range(random.randint(0, 4))]
                    if random.random() < 0.1:
                        rows.insert(random.randrange(len(rows) + 1), random.choice(BAD_ROWS + [m]))
                    kind = random.random()
                    rows = tuple(rows) if kind < 0.2 else np.array(rows, dtype=np.int64) if kind < 0.3 and all(type(r) is int and -2**62 < r < 2**62 for r in rows) else rows
                    if random.random() < 0.05:
                        rows = random.choice(BAD_ROWS_ARGS)
                    args = (random.choice(["finish_rows", "free_rows"]), rows)
                else:
                    args = ("resend_all",)
                kw = args[0] == "arrive" and random.random() < 0.5
                ra, rb = call(a, *args, keywords=kw), call(b, *args, keywords=kw)
                assert ra == rb, (trial, step, args, ra, rb)
                errors += ra[0] != "ok"
            assert a.event_columns() == b.event_columns(), (trial, step)
            assert a.new_bytes() == b.new_bytes(), (trial, step)
            assert (a.pending_events(), a.live) == (b.pending_events(), b.live), (trial, step)
            assert all(a.holder(r) == b.holder(r) and a.table_ids(r) == b.table_ids(r) and a.row_flags(r) == b.row_flags(r) for r in range(m))
            if random.random() < paused:
                a.reset()
                b.reset()
                assert a.new_bytes() == b.new_bytes(), (trial, step)
                heads += 1
                continue
            wave = random.choice([0, 1, 127, 128, 2**40 + step, 2**64 - 1])
            nf = pb.StepTelemetry(non_finite=[pb.NonFiniteRow(row=3)]).SerializeToString() if random.random() < 0.2 else b""
            if random.random() < 0.5:
                ha, hb = a.head(wave, wave - 1 if wave else 0, nf), b.head(wave, wave - 1 if wave else 0, nf)
                ref = pb.WaveHeadRequest.FromString(ha)  # the library reads it back
                assert ref.wave == wave and ref.telemetry.wave == (wave - 1 if wave else 0)
            else:
                ha, hb = a.sparse_bytes(), b.sparse_bytes()
            assert ha == hb, (trial, step)
            heads += 1
            if random.random() < 0.9:
                a.sent()
                b.sent()
    out[key] = heads
    out["errors_compared"] = out.get("errors_compared", 0) + errors


def garbage(out):
    """The C store given what no caller in the package passes: each a ConfigError or a TypeError, never a crash."""
    s = Native(4)
    tags = (b"",) * 12
    cases = {
        "init_zero_rows": lambda: _native.Slots.__init__(Native.__new__(Native), 0, tags, print),
        "init_huge_rows": lambda: _native.Slots.__init__(Native.__new__(Native), 2**40, tags, print),
        "init_four_tags": lambda: _native.Slots.__init__(Native.__new__(Native), 4, tags[:4], print),
        "init_tag_not_bytes": lambda: _native.Slots.__init__(Native.__new__(Native), 4, ("",) + tags[1:], print),
        "init_held_not_callable": lambda: _native.Slots.__init__(Native.__new__(Native), 4, tags, 3),
        "uninitialised_finish": lambda: _native.Slots.__new__(_native.Slots).finish(0),
        "uninitialised_arrive": lambda: _native.Slots.__new__(_native.Slots).arrive(0, "r"),
        "uninitialised_blocks": lambda: _native.Slots.__new__(_native.Slots).blocks(0, [1]),
        "uninitialised_head": lambda: _native.Slots.__new__(_native.Slots).head(1, 0, b""),
        "uninitialised_sparse": lambda: _native.Slots.__new__(_native.Slots).sparse_bytes(),
        "arrive_arity": lambda: s.arrive(1),
        "arrive_unknown_keyword": lambda: s.arrive(1, "r", prompt_length=3),
        "arrive_ids_not_iterable": lambda: s.arrive(1, "r", 0, object()),
        "blocks_arity": lambda: s.blocks(0),
        "blocks_tolist_raises": lambda: s.blocks(0, type("T", (), {"tolist": lambda self: 1 / 0})()),
        "head_wave_negative": lambda: s.head(-1, 0, b""),
        "head_wave_huge": lambda: s.head(2**64, 0, b""),
        "head_nf_not_bytes": lambda: s.head(1, 0, "x"),
        "head_arity": lambda: s.head(1),
        "finish_free_row": lambda: s.finish(2),
        "finish_rows_not_a_sequence": lambda: s.finish_rows(5),
        "free_rows_a_free_row": lambda: s.free_rows([0, 2]),
        "free_out_of_range": lambda: s.free(4),
    }
    s.arrive(0, "r0", prompt_len=1)
    for name, fn in cases.items():
        try:
            fn()
            out[name] = "passed"
        except ConfigError:
            out[name] = "ConfigError"
        except (TypeError, OverflowError, ZeroDivisionError) as e:
            out[name] = type(e).__name__
    out["arrive_live_row"] = call(s, "arrive", 0, "again", 1)[0]
    out["still_one_live"] = s.live == 1 and s.holder(0) == "r0"


def references(out):
    """What a freed row held is released when its free takes effect, and everything with the store:
    the engine's request id by its reference count, the bytes and lists the store made by the memory
    tracemalloc sees after many arrivals, tables and frees."""
    req = "req-unique-" + str(random.random())
    base = sys.getrefcount(req)
    s = Native(8)
    s.arrive(3, req, 1, [5, 6])
    s.blocks(3, [7, 8])
    held = sys.getrefcount(req)
    s.free(3)
    s.sent()
    after_free = sys.getrefcount(req)
    s.arrive(3, req, 1)
    del s
    gc.collect()
    out["held_more"] = held > base
    out["released_on_free"] = after_free == base
    out["released_on_dealloc"] = sys.getrefcount(req) == base
    # 2000 lives of a row, each with 200 prompt ids and a table of 64 (~2.5 KB of bytes and lists
    # made per life): what stays is the store's last few rows, not the 5 MB a leak would keep.
    tracemalloc.start()
    s = Native(8)
    prompt, table = list(range(1000, 1200)), np.arange(64)
    before = tracemalloc.get_traced_memory()[0]
    for i in range(2000):
        r = i % 8
        if s.holder(r) is not None:
            s.finish(r)
            s.free(r)
            s.head(i, i - 1, b"")
            s.sent()
        s.arrive(r, f"life-{i}", 200, prompt)
        s.blocks(r, table + i)
    kept = tracemalloc.get_traced_memory()[0] - before
    del s
    gc.collect()
    left = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    out["kept_bytes"], out["left_bytes"] = kept, left
    out["no_leak"] = kept < 200_000 and left < 20_000


if __name__ == "__main__":
    result = {}
    parity(result)
    parity(result, seed=17, paused=0.95, key="paused_steps_compared")
    garbage(result)
    references(result)
    print(json.dumps(result))
