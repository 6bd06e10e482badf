"""The shared-memory byte layouts between processes and languages, from their one description,
proto/layouts.json (docs/layouts.md), which this package carries as shm_layouts_data.py (generated).
The same checks as src/shm-layouts.ts: a field outside its struct, two that overlap, a misaligned
number or an unknown type is refused naming the field."""
import json
import struct
from typing import Dict

from .errors import WavebusError
from .shm_layouts_data import LAYOUTS

_FMT = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "i32": "i", "i64": "q", "f64": "d"}
_FILE = "proto/layouts.json"


def _bad(where: str, why: str) -> WavebusError:
    return WavebusError(f"{_FILE}: {where}: {why}", "ERR_LAYOUT")


def _count(v, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise _bad(where, f"expected a non-negative integer, got {json.dumps(v)}")
    return v


class Field:
    """One field: its offset from the struct's start, its type and length; ``st`` packs a number."""

    __slots__ = ("name", "at", "type", "nbytes", "st")

    def __init__(self, name: str, at: int, type_: str, nbytes: int):
        self.name, self.at, self.type, self.nbytes = name, at, type_, nbytes
        self.st = struct.Struct("<" + _FMT[type_]) if type_ in _FMT else None

    def read(self, buf, base: int = 0):
        return self.st.unpack_from(buf, base + self.at)[0]

    def write(self, buf, base: int, value) -> None:
        self.st.pack_into(buf, base + self.at, value)


class Struct:
    __slots__ = ("name", "nbytes", "fields")

    def __init__(self, name: str, raw: dict, where: str):
        self.name = name
        self.nbytes = _count(raw.get("bytes"), f"{where}.bytes")
        self.fields: Dict[str, Field] = {}
        for fname, f in (raw.get("fields") or {}).items():
            fw = f"{where}.fields.{fname}"
            t = f.get("type")
            if t != "bytes" and t not in _FMT:
                raise _bad(fw, f"unknown type {json.dumps(t)} (one of {', '.join([*_FMT, 'bytes'])})")
            at = _count(f.get("at"), f"{fw}.at")
            n = _count(f.get("bytes"), f"{fw}.bytes") if t == "bytes" else struct.calcsize("<" + _FMT[t])
            if t != "bytes" and at % n:
                raise _bad(fw, f"a {t} at {at} is not {n}-aligned")
            if at + n > self.nbytes:
                raise _bad(fw, f"bytes {at}..{at + n} lie outside the struct's {self.nbytes}")
            for o in self.fields.values():
                if at < o.at + o.nbytes and o.at < at + n:
                    raise _bad(fw, f"bytes {at}..{at + n} overlap field {o.name} ({o.at}..{o.at + o.nbytes})")
            self.fields[fname] = Field(fname, at, t, n)

    def __getitem__(self, name: str) -> Field:
        f = self.fields.get(name)
        if f is None:
            raise _bad(self.name, f"no field {name}")
        return f


class Layout:
    def __init__(self, name: str, raw: dict):
        where = f"layouts.{name}"
        self.name = name
        self.constants = {c: _count((v or {}).get("value"), f"{where}.constants.{c}.value") for c, v in (raw.get("constants") or {}).items()}
        self.structs = {s: Struct(s, v, f"{where}.structs.{s}") for s, v in (raw.get("structs") or {}).items()}

    def struct(self, name: str) -> Struct:
        s = self.structs.get(name)
        if s is None:
            raise _bad(f"layouts.{self.name}", f"no struct {name}")
        return s

    def constant(self, name: str) -> int:
        if name not in self.constants:
            raise _bad(f"layouts.{self.name}", f"no constant {name}")
        return self.constants[name]


_loaded: Dict[str, Layout] = {}


def layout_names():
    return list(LAYOUTS)


def layout(name: str) -> Layout:
    """One layout, checked (once)."""
    got = _loaded.get(name)
    if got is None:
        raw = LAYOUTS.get(name)
        if raw is None:
            raise _bad("layouts", f"no layout {name!r} (there are: {', '.join(LAYOUTS)})")
        got = _loaded[name] = Layout(name, raw)
    return got
