"""The tensor head's sparse part as protobuf bytes, built from pieces encoded once per event.

A WaveHeadRequest's wire form is its fields one after another, and a repeated field's entries may
come in any number of runs: so the head a step writes into the ring is the concatenation of the
bindings and block tables it carries, each encoded once when the engine reported it (arrive,
blocks), inside the few bytes of the wave and the two enclosing lengths. A step builds no protobuf
object and serializes nothing. The field numbers come from the generated descriptors (proto/
wavebus.proto), not from copies here; test/tensor-head.test.ts compares the bytes with the
protobuf library's.
"""
from . import wavebus_pb2 as pb

_LEN, _VARINT = 2, 0


def _tag(message, name: str, wire: int) -> bytes:
    return _varint((message.DESCRIPTOR.fields_by_name[name].number << 3) | wire)


def _varint(v: int) -> bytes:
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


_HEAD_WAVE = _tag(pb.WaveHeadRequest, "wave", _VARINT)
_HEAD_TELEMETRY = _tag(pb.WaveHeadRequest, "telemetry", _LEN)
_TELE_WAVE = _tag(pb.StepTelemetry, "wave", _VARINT)
_TELE_COLUMNS = _tag(pb.StepTelemetry, "columns", _LEN)
# For _native.Slots, which writes the same bytes: a head's four tags, then those of a binding's and a
# table's entries (_native_arrive.h names them in this order).
TAGS = (_HEAD_WAVE, _HEAD_TELEMETRY, _TELE_WAVE, _TELE_COLUMNS,
        _tag(pb.TelemetryColumns, "bind", _LEN), _tag(pb.TelemetryColumns, "blocks", _LEN),
        _tag(pb.SlotBinding, "slot", _VARINT), _tag(pb.SlotBinding, "req_id", _LEN), _tag(pb.SlotBinding, "prompt_len", _VARINT),
        _tag(pb.SlotBinding, "prompt_token_ids", _LEN), _tag(pb.SlotBlocks, "slot", _VARINT), _tag(pb.SlotBlocks, "block_ids", _LEN))
_SMALL = [_varint(i) for i in range(128)]  # one byte: 0..127
_HIGH = [bytes((i | 0x80,)) for i in range(128)]  # a low 7 bits with more to come


def _uv(v: int) -> bytes:
    # A head's wave and lengths: two or three table look-ups up to 2^21 (a wave a day at 30 ms a step).
    if v < 16384:
        return _SMALL[v] if v < 128 else _HIGH[v & 0x7F] + _SMALL[v >> 7]
    if v < 2097152:
        return _HIGH[v & 0x7F] + _HIGH[(v >> 7) & 0x7F] + _SMALL[v >> 14]
    return _varint(v)


def bind_bytes(row: int, req_id: str, prompt_len: int, prompt_token_ids=()) -> bytes:
    """One TelemetryColumns.bind entry, as its wire bytes (field tag and length included)."""
    return pb.TelemetryColumns(bind=[pb.SlotBinding(slot=row, req_id=req_id, prompt_len=prompt_len, prompt_token_ids=prompt_token_ids)]).SerializeToString()


def blocks_bytes(row: int, block_ids) -> bytes:
    """One TelemetryColumns.blocks entry, as its wire bytes."""
    return pb.TelemetryColumns(blocks=[pb.SlotBlocks(slot=row, block_ids=block_ids)]).SerializeToString()


def head_bytes(wave: int, tele_wave: int, columns: bytes, non_finite: bytes = b"") -> bytes:
    """WaveHeadRequest{wave, telemetry{wave, non_finite, columns}}: ``columns`` is TelemetryColumns'
    wire bytes (bind and blocks entries), ``non_finite`` StepTelemetry's non_finite entries'. Zero
    and empty fields are left out, as the library leaves them out; telemetry is always there (the
    head of every step carries one, if empty)."""
    if columns:
        # The sparse part (kilobytes) is copied once, added last to the few bytes before it.
        lead = (_TELE_WAVE + _uv(tele_wave) if tele_wave else b"") + non_finite + _TELE_COLUMNS + _uv(len(columns))
        return (_HEAD_WAVE + _uv(wave) if wave else b"") + _HEAD_TELEMETRY + _uv(len(lead) + len(columns)) + lead + columns
    tele = (_TELE_WAVE + _uv(tele_wave) if tele_wave else b"") + non_finite
    return (_HEAD_WAVE + _uv(wave) if wave else b"") + _HEAD_TELEMETRY + _uv(len(tele)) + tele
