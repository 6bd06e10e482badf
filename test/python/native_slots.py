"""test/python-native.test.ts's Python side for _native.Slots (the tensor batch's rows and events in C,
slot_batch.py NativeSlotEvents): the same random calls to SlotEvents and to NativeSlotEvents, every
result, error text, event list and head compared; garbage to the C primitives; references released.
Prints one JSON line. usage: native_slots.py
"""
import gc
import json
import random
import sys

import numpy as np

from wavebus_client import _native
from wavebus_client import wavebus_pb2 as pb
from wavebus_client.errors import ConfigError
from wavebus_client.slot_batch import SlotEvents, native_slot_events

Native = native_slot_events(_native)
BAD_ROWS = [-1, 1.0, True, "0", 2**70, None, [0]]


def call(obj, name, *args):
    try:
        return ("ok", getattr(obj, name)(*args))
    except ConfigError as e:
        return ("ConfigError", str(e))


def parity(out):
    """Random arrivals (with and without prompt ids), tables, finishes, frees, resend_all and bad
    rows; after each step's calls both stores agree on everything, then on the head's bytes."""
    random.seed(5)
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
                    args = ("arrive", row, f"q{trial}-{step}-{row}", random.choice([0, 5, 300]), [1, 2**32 - 1] if random.random() < 0.2 else None)
                elif op < 0.55:
                    args = ("blocks", row, [random.randrange(2**32) for _ in range(random.randint(0, 6))] if random.random() < 0.7 else [1, 2])
                elif op < 0.7:
                    args = ("finish", row)
                elif op < 0.85:
                    args = ("free", row)
                else:
                    args = ("resend_all",)
                ra, rb = call(a, *args), call(b, *args)
                assert ra == rb, (trial, step, args, ra, rb)
                errors += ra[0] != "ok"
            assert a.event_columns() == b.event_columns(), (trial, step)
            assert a.new_bytes() == b.new_bytes(), (trial, step)
            assert (a.pending_events(), a.live) == (b.pending_events(), b.live), (trial, step)
            assert all(a.holder(r) == b.holder(r) and a.table_ids(r) == b.table_ids(r) and a.row_flags(r) == b.row_flags(r) for r in range(m))
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
    out["heads_compared"], out["errors_compared"] = heads, errors


def garbage(out):
    """The C primitives given what Python never passes: each a ConfigError or a TypeError, never a crash."""
    s = Native(4)
    cases = {
        "init_zero_rows": lambda: _native.Slots.__init__(Native.__new__(Native), 0, (b"", b"", b"", b""), print),
        "init_huge_rows": lambda: _native.Slots.__init__(Native.__new__(Native), 2**40, (b"", b"", b"", b""), print),
        "init_three_tags": lambda: _native.Slots.__init__(Native.__new__(Native), 4, (b"", b"", b""), print),
        "init_tag_not_bytes": lambda: _native.Slots.__init__(Native.__new__(Native), 4, ("", b"", b"", b""), print),
        "init_held_not_callable": lambda: _native.Slots.__init__(Native.__new__(Native), 4, (b"", b"", b"", b""), 3),
        "uninitialised_finish": lambda: _native.Slots.__new__(_native.Slots).finish(0),
        "uninitialised_head": lambda: _native.Slots.__new__(_native.Slots).head(1, 0, b""),
        "uninitialised_sparse": lambda: _native.Slots.__new__(_native.Slots).sparse_bytes(),
        "bind_row_out_of_range": lambda: s._bind(9, "r", 0, b"x", b"x"),
        "bind_negative_row": lambda: s._bind(-1, "r", 0, b"x", b"x"),
        "bind_req_not_str": lambda: s._bind(0, b"r", 0, b"x", b"x"),
        "bind_bytes_not_bytes": lambda: s._bind(0, "r", 0, "x", b"x"),
        "bind_plen_too_big": lambda: s._bind(0, "r", 2**33, b"x", b"x"),
        "bind_plen_negative": lambda: s._bind(0, "r", -1, b"x", b"x"),
        "bind_arity": lambda: s._bind(0, "r"),
        "set_table_not_live": lambda: s._set_table(1, [1], b"x"),
        "set_table_ids_not_list": lambda: s._set_table(0, (1,), b"x"),
        "head_wave_negative": lambda: s.head(-1, 0, b""),
        "head_wave_huge": lambda: s.head(2**64, 0, b""),
        "head_nf_not_bytes": lambda: s.head(1, 0, "x"),
        "head_arity": lambda: s.head(1),
        "finish_free_row": lambda: s.finish(2),
        "free_out_of_range": lambda: s.free(4),
    }
    s._bind(0, "r0", 1, b"first", b"resend")
    for name, fn in cases.items():
        try:
            fn()
            out[name] = "passed"
        except ConfigError:
            out[name] = "ConfigError"
        except (TypeError, OverflowError) as e:
            out[name] = type(e).__name__
    out["bind_live_row"] = call(s, "_bind", 0, "again", 1, b"x", b"x")[0]
    out["still_one_live"] = s.live == 1 and s.holder(0) == "r0"


def references(out):
    """What a freed row held is released when its free takes effect, and everything with the store."""
    req, first, resend, ids, tb = "req-unique-" + str(random.random()), b"f" * 40 + b"1", b"r" * 40 + b"2", [7, 8], b"t" * 40 + b"3"
    base = [sys.getrefcount(x) for x in (req, first, resend, ids, tb)]
    s = Native(8)
    s._bind(3, req, 1, first, resend)
    s._set_table(3, ids, tb)
    held = [sys.getrefcount(x) for x in (req, first, resend, ids, tb)]
    s.sparse_bytes()  # the new binding's own bytes are released once a head took them
    s.free(3)
    s.sent()
    after_free = [sys.getrefcount(x) for x in (req, first, resend, ids, tb)]
    s._bind(3, req, 1, first, resend)
    s._set_table(3, ids, tb)
    del s
    gc.collect()
    after_del = [sys.getrefcount(x) for x in (req, first, resend, ids, tb)]
    out["held_more"] = all(h > b for h, b in zip(held, base))
    out["released_on_free"] = after_free == base
    out["released_on_dealloc"] = after_del == base


if __name__ == "__main__":
    result = {}
    parity(result)
    garbage(result)
    references(result)
    print(json.dumps(result))
