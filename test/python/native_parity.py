"""test/python-native.test.ts's Python side: the per-step ring writes through wavebus_client._native
and through the numpy path, on the same inputs, into ring files this script makes in DIR as the
agent lays them out (proto/layouts.json through shm_layout.py). Prints one JSON line per check.
usage: native_parity.py CHECK DIR   (CHECK: telemetry, digest, crc, garbage)
"""
import json
import os
import struct
import sys
import zlib

import numpy as np

from wavebus_client import _native
from wavebus_client.digest import COLUMNS, SLOT_BYTES, SLOT_HEADERS, SLOTS, DecisionRing, _HEADER, input_digest, token_digest
from wavebus_client.errors import ConfigError
from wavebus_client.ring import ARRAY_ORDER, BIT, HEADER, HEADER_BYTES, MAGIC, VERSION, TelemetryRing, column_offsets
from wavebus_client.shm_layout import layout

check, d = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(7)


def make_telemetry(name, slots=4, rows=64, tokens=128, events=16, extra=512):
    _, stride = column_offsets(rows, tokens, events, extra)
    buf = bytearray(HEADER_BYTES + slots * stride)
    buf[0:8] = MAGIC
    for f, v in (("version", VERSION), ("slots", slots), ("max_rows", rows), ("max_tokens", tokens), ("max_events", events), ("max_extra", extra)):
        struct.pack_into("<I", buf, HEADER[f], v)
    struct.pack_into("<Q", buf, HEADER["slot_bytes"], stride)
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        f.write(buf)
    return path


def make_decision(name, max_rows=256, max_in=512):
    L = layout("decision")
    size = COLUMNS + SLOTS * 4 * (max_rows + 2 * max_in + max_rows + 1)
    buf = bytearray(size)
    for f, v in zip(_HEADER, (L.constant("magic"), L.constant("version"), SLOTS, max_rows, max_in)):
        f.write(buf, 0, v)
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        f.write(buf)
    return path


def read(path):
    with open(path, "rb") as f:
        return f.read()


def telemetry_steps(ring_rows=64, ring_tokens=128):
    """Steps as engines pass them: every dtype an engine holds, spec columns, events, extra."""
    out = []
    for k in range(12):
        n = int(rng.integers(0, ring_rows + 1))
        row_dt = [np.int64, np.int32, np.uint32, np.int16, np.uint64][k % 5]
        ids_dt = [np.int32, np.int64, np.uint32, np.int8, np.uint16][k % 5]
        lp_dt = [np.float32, np.float64][k % 2]
        rows = rng.integers(-5, ring_rows, n).astype(row_dt)  # negatives: wrapped alike by both paths
        present, arrays = BIT["row"], [rows]
        tokens = n
        if k % 3 == 0:
            counts = rng.integers(0, 3, n).astype(np.int64)
            tokens = min(int(counts.sum()), ring_tokens)
            counts[:] = 0
            if n:
                counts[0] = tokens
            arrays.append(counts)
            present |= BIT["token_count"]
        ids = rng.integers(-(1 << 40), 1 << 40, tokens).astype(ids_dt)
        lps = (rng.standard_normal(tokens) * 1e3).astype(lp_dt)
        if k % 4 == 1:
            lps[: tokens // 2] = np.nan
        arrays += [ids, lps]
        present |= BIT["token_ids"] | BIT["token_logprobs"]
        if k % 2:
            arrays += [rng.integers(0, 5, n), rng.integers(0, 5, n).astype(np.int32)]
            present |= BIT["draft_len"] | BIT["accepted"]
        ev = int(rng.integers(0, 5))
        ev_rows = [int(x) for x in rng.integers(0, ring_rows, ev)]
        ev_flags = [int(x) for x in rng.integers(1, 4, ev)]
        extra = bytes(rng.integers(0, 256, int(rng.integers(0, 400)), dtype=np.uint8)) if k % 5 else b""
        out.append((100 + k, present, arrays, n, tokens, ev_rows, ev_flags, extra))
    return out


def telemetry():
    """Byte-identical files from both paths over the same steps (twice round the ring), and which path ran."""
    res = {}
    files = {}
    steps = telemetry_steps()
    for mode in ("1", "0"):
        os.environ["WAVEBUS_PY_NATIVE"] = mode
        files[mode] = make_telemetry(f"tele-{mode}")
        ring = TelemetryRing(files[mode])
        seqs = [ring.write(*s) for s in steps]
        res[mode] = {"seqs": seqs, **ring.stats}
        ring.close()
    res["identical"] = read(files["1"]) == read(files["0"])
    res["bytes"] = len(read(files["1"]))
    # A non-contiguous column and a dtype the C side does not cast take the numpy path, same bytes.
    odd = []
    for mode in ("1", "0"):
        os.environ["WAVEBUS_PY_NATIVE"] = mode
        p = make_telemetry(f"odd-{mode}")
        ring = TelemetryRing(p)
        base = np.arange(40, dtype=np.int64)
        ring.write(1, BIT["row"], [base[::2]], 20, 0, [], [])  # strided
        ring.write(2, BIT["row"] | BIT["token_ids"], [base[:4], np.array([1.0, 2.0, 3.0, 4.0])], 4, 4, [], [])  # float ids
        ring.write(3, BIT["row"] | BIT["token_ids"], [base[:4], np.arange(4, dtype=">i4")], 4, 4, [], [])  # big-endian
        ring.write(4, BIT["row"], [np.array([True, False])], 2, 0, [1], [3], b"x")  # bool
        odd.append((read(p), dict(ring.stats)))
        ring.close()
    res["odd_identical"] = odd[0][0] == odd[1][0]
    res["odd_stats"] = odd[0][1]
    return res


def digest():
    """Byte-identical decision rings from both paths, and the digests equal to their definition."""
    res = {}
    files = {}
    calls = []
    for k in range(40):
        n = int(rng.integers(0, 300))  # past max_rows 256 at times: the digest alone
        dt = [np.int64, np.int32, np.uint32, np.int16, np.uint64][k % 5]
        ids = rng.integers(-(1 << 35), 1 << 35, n).astype(dt)
        pos = None if k % 3 == 0 else rng.integers(0, 1 << 20, n).astype([np.int64, np.int32][k % 2])
        starts = None if k % 2 else np.arange(min(n, 300) + 1, dtype=[np.int64, np.int32][(k // 2) % 2])
        if k % 7 == 3:
            ids = ids[::-1]  # a negative stride: numpy's path
        calls.append((k, ids, pos, starts))
    for mode in ("1", "0"):
        os.environ["WAVEBUS_PY_NATIVE"] = mode
        files[mode] = make_decision(f"dec-{mode}")
        ring = DecisionRing(files[mode])
        got = []
        for k, ids, pos, starts in calls:
            got.append(ring.decided(k, ids))
            got.append(ring.inputs(k, ids, pos, starts))
        res[mode] = {"crcs": got, **ring.stats}
        ring.close()
    res["identical"] = read(files["1"]) == read(files["0"])
    want = []
    for k, ids, pos, starts in calls:
        want += [token_digest(ids), input_digest(ids, pos)]
    res["definition"] = res["1"]["crcs"] == want
    return res


def crc():
    """_native.crc32 against zlib.crc32: every length 0..9000 at offsets 0..7 (unaligned), chained."""
    data = bytes(rng.integers(0, 256, 9100, dtype=np.uint8))
    bad = []
    for n in range(0, 9001):
        off = n % 8
        chunk = data[off:off + n]
        seed = (n * 2654435761) & 0xFFFFFFFF
        want = zlib.crc32(chunk, seed)
        if _native.crc32(chunk) != zlib.crc32(chunk) or _native.crc32(chunk, seed) != want or _native.crc32(chunk, seed, True) != want:
            bad.append(n)
    mv = memoryview(data)[3:4099]
    return {"mismatches": bad[:10], "view": _native.crc32(mv) == zlib.crc32(mv), "empty": _native.crc32(b""), "kind": _native.crc_kind()}


def garbage():
    """Garbage to the C calls: each refused with ConfigError (or taken by numpy's path: None), never a
    store outside the slot. Every byte of the file outside the slot asked for is compared after."""
    out = {}
    p = make_telemetry("garbage")
    os.environ["WAVEBUS_PY_NATIVE"] = "1"
    ring = TelemetryRing(p)
    mm = ring._mm
    plan = ring._nplan[1]
    lo = HEADER_BYTES + ring.stride
    hi = lo + ring.stride
    ok = np.arange(8, dtype=np.uint32)
    q = list(struct.unpack(f"<{len(plan) // 8}q", plan))

    head, column = _native.RING_PLAN, _native.RING_PLAN_COLUMN

    def with_plan(name, v, col=None):
        """The plan with one field changed (a column's, of the first column, with ``col``)."""
        x = list(q)
        x[len(head) + column.index(name) if col else head.index(name)] = v
        return struct.pack(f"<{len(x)}q", *x)

    cases = {
        "rows_past_capacity": (mm, plan, 2, 1, BIT["row"], [np.arange(65, dtype=np.uint32)], 65, 0, [], [], b""),
        "rows_huge": (mm, plan, 2, 1, BIT["row"], [ok], 1 << 40, 0, [], [], b""),
        "rows_negative": (mm, plan, 2, 1, BIT["row"], [ok], -1, 0, [], [], b""),
        "length_not_rows": (mm, plan, 2, 1, BIT["row"], [ok], 7, 0, [], [], b""),
        "tokens_past_capacity": (mm, plan, 2, 1, BIT["row"] | BIT["token_ids"], [ok, np.zeros(129, np.uint32)], 8, 129, [], [], b""),
        "more_arrays_than_present": (mm, plan, 2, 1, BIT["row"], [ok, ok], 8, 0, [], [], b""),
        "fewer_arrays_than_present": (mm, plan, 2, 1, BIT["row"] | BIT["token_ids"], [ok], 8, 8, [], [], b""),
        "arrays_not_a_sequence": (mm, plan, 2, 1, BIT["row"], 5, 8, 0, [], [], b""),
        "events_past_capacity": (mm, plan, 2, 1, BIT["row"], [ok], 8, 0, list(range(17)), [1] * 17, b""),
        "events_unequal": (mm, plan, 2, 1, BIT["row"], [ok], 8, 0, [1, 2], [1], b""),
        "event_row_negative": (mm, plan, 2, 1, BIT["row"], [ok], 8, 0, [-1], [1], b""),
        "event_flag_big": (mm, plan, 2, 1, BIT["row"], [ok], 8, 0, [1], [256], b""),
        "event_not_int": (mm, plan, 2, 1, BIT["row"], [ok], 8, 0, ["x"], [1], b""),
        "extra_past_capacity": (mm, plan, 2, 1, BIT["row"], [ok], 8, 0, [], [], b"x" * 513),
        "seq_odd": (mm, plan, 3, 1, BIT["row"], [ok], 8, 0, [], [], b""),
        "plan_short": (mm, plan[:-8], 2, 1, BIT["row"], [ok], 8, 0, [], [], b""),
        "plan_slot_past_file": (mm, with_plan("base", len(mm) - 10), 2, 1, BIT["row"], [ok], 8, 0, [], [], b""),
        "plan_column_outside_slot": (mm, with_plan("at", hi - 4, col=True), 2, 1, BIT["row"], [ok], 8, 0, [], [], b""),
        "plan_capacity_huge": (mm, with_plan("cap", 1 << 50, col=True), 2, 1, BIT["row"], [ok], 8, 0, [], [], b""),
        "plan_written_in_slot": (mm, with_plan("written", lo), 2, 1, BIT["row"], [ok], 8, 0, [], [], b"x"),
        "plan_negative_base": (mm, with_plan("base", -8), 2, 1, BIT["row"], [ok], 8, 0, [], [], b""),
        "read_only_map": (b"\0" * len(mm), plan, 2, 1, BIT["row"], [ok], 8, 0, [], [], b""),
        "wrong_arg_count": (mm, plan),
        "wave_negative": (mm, plan, 2, -1, BIT["row"], [ok], 8, 0, [], [], b""),
        "wave_not_int": (mm, plan, 2, "1", BIT["row"], [ok], 8, 0, [], [], b""),
        "not_contiguous": (mm, plan, 2, 1, BIT["row"], [np.arange(16, dtype=np.uint32)[::2]], 8, 0, [], [], b""),
        "float_rows": (mm, plan, 2, 1, BIT["row"], [np.zeros(8)], 8, 0, [], [], b""),
        "object_array": (mm, plan, 2, 1, BIT["row"], [np.array([object()] * 8)], 8, 0, [], [], b""),
        "list_not_array": (mm, plan, 2, 1, BIT["row"], [[1, 2, 3, 4, 5, 6, 7, 8]], 8, 0, [], [], b""),
    }
    before = read(p)
    for name, args in cases.items():
        try:
            r = _native.ring_write(*args)
            out[name] = "numpy_path" if r is None else f"written:{r}"
        except ConfigError as e:
            out[name] = "ConfigError"
        except (TypeError, ValueError, OverflowError, BufferError) as e:
            out[name] = type(e).__name__
    after = read(p)
    out["outside_slot_unchanged"] = before[:lo] == after[:lo] and before[hi:] == after[hi:]
    out["slot_unchanged"] = before[lo:hi] == after[lo:hi]
    ring.close()
    # The decision ring's call: the same.
    p = make_decision("garbage-dec")
    ring = DecisionRing(p)
    mm = ring._mm
    lo, hi = ring._ncol[2]
    dcases = {
        "past_capacity": (mm, lo, hi, 0, 1, lo, 256, np.zeros(257, np.int32)),
        "cap_past_slot": (mm, lo, hi, 0, 1, lo, 257, np.zeros(4, np.int32)),
        "region_past_file": (mm, len(mm) - 8, len(mm) + 8, 0, 1, len(mm) - 8, 4, np.zeros(4, np.int32)),
        "misaligned": (mm, lo, hi, 0, 1, lo + 2, 4, np.zeros(4, np.int32)),
        "ncrc_past_pairs": (mm, lo, hi, 0, 2, lo, 4, np.zeros(4, np.int32)),
        "odd_argument_count": (mm, lo, hi, 0, 1, lo, 4),
        "too_many_pairs": (mm, lo, hi, 0, 1, *([lo, 1, np.zeros(1, np.int32)] * 5)),
        "float_column": (mm, lo, hi, 0, 1, lo, 4, np.zeros(4, np.float32)),
        "bool_column": (mm, lo, hi, 0, 1, lo, 4, np.zeros(4, bool)),
        "strided": (mm, lo, hi, 0, 1, lo, 4, np.zeros(8, np.int32)[::2]),
        "huge_cap": (mm, lo, hi, 0, 1, lo, 1 << 62, np.zeros(4, np.int32)),
        "negative_at": (mm, -4, hi, 0, 1, -4, 4, np.zeros(4, np.int32)),
    }
    before = read(p)
    for name, args in dcases.items():
        try:
            r = _native.copy_i32_crc(*args)
            out["digest_" + name] = "numpy_path" if r is None else f"written:{r}"
        except ConfigError:
            out["digest_" + name] = "ConfigError"
        except (TypeError, ValueError, OverflowError, BufferError) as e:
            out["digest_" + name] = type(e).__name__
    out["digest_file_unchanged"] = before == read(p)
    ring.close()
    return out


if __name__ == "__main__":
    print(json.dumps({"telemetry": telemetry, "digest": digest, "crc": crc, "garbage": garbage}[check]()))
