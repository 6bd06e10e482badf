"""The tensor head's columns sent inline in the head (no telemetry ring: the agent made none, or a
step larger than the ring), built with numpy as the agent builds them from a ring slot
(src/client/ring-columns.ts): finish/free events become the flags column, and an event row that
sampled nothing this step is appended with no tokens."""
import numpy as np

from . import wavebus_pb2 as pb


def inline_columns(out: "pb.TelemetryColumns", cols: dict, n: int) -> None:
    rows = np.ascontiguousarray(cols["row"], dtype="<u4")
    counts = cols.get("token_count")
    ids = cols.get("token_ids")
    if ids is not None and counts is None:
        counts = np.ones(n, dtype="<u4")
    flags = np.zeros(n, dtype="<u1")
    extra = np.zeros(0, dtype="<u4")
    if "event_row" in cols:
        ev = np.asarray(cols["event_row"], dtype="<u4")
        fl = np.asarray(cols["event_flags"], dtype="<u1")
        order = np.argsort(ev)
        ev, fl = ev[order], fl[order]
        at = np.searchsorted(ev, rows).clip(0, len(ev) - 1)
        hit = ev[at] == rows
        flags[hit] = fl[at[hit]]
        missing = ~np.isin(ev, rows)
        extra, extra_flags = ev[missing], fl[missing]
        flags = np.concatenate([flags, extra_flags])
    k = len(extra)
    pad0 = np.zeros(k, dtype="<u4")
    out.rows = n + k
    out.slot = np.concatenate([rows, extra]).tobytes()
    out.flags = flags.tobytes()
    if ids is not None:
        out.token_count = np.concatenate([np.asarray(counts, dtype="<u4"), pad0]).tobytes()
        out.token_ids = np.asarray(ids, dtype="<u4").tobytes()
        if "token_logprobs" in cols:
            out.token_logprobs = np.asarray(cols["token_logprobs"], dtype="<f4").tobytes()
    if "draft_len" in cols:
        out.draft_len = np.concatenate([np.asarray(cols["draft_len"], dtype="<u4"), pad0]).tobytes()
        out.accepted = np.concatenate([np.asarray(cols["accepted"], dtype="<u4"), pad0]).tobytes()
