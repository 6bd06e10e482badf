"""The shared-memory byte layouts between processes and languages, from their one description,
proto/layouts.json (docs/layouts.md), which this package carries as shm_layouts_data.py (generated).
The same checks as src/shm-layouts.ts: a field outside its struct, two that overlap, a misaligned
number or an unknown type is refused naming the field."""
import json
import re
import struct
from typing import Dict

from .errors import WavebusError
from .shm_layouts_data import LAYOUTS

_FMT = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "i32": "i", "i64": "q", "f32": "f", "f64": "d"}
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


class Column:
    """One array of a layout's ``columns``: ``count`` (a u32 field, "struct.field") values of ``type``;
    ``bit`` is its index (its bit in a ``present`` word); ``dtype`` the numpy dtype string."""

    __slots__ = ("name", "type", "size", "count_struct", "count", "bit", "dtype")

    def __init__(self, name, type_, count_struct, count, bit):
        self.name, self.type, self.count_struct, self.count, self.bit = name, type_, count_struct, count, bit
        self.size = struct.calcsize("<" + _FMT[type_])
        self.dtype = "<" + {"u": "u", "i": "i", "f": "f"}[type_[0]] + str(self.size)


def _align8(n: int) -> int:
    return (n + 7) & ~7


class Layout:
    def __init__(self, name: str, raw: dict):
        where = f"layouts.{name}"
        self.name = name
        self.constants = {c: _count((v or {}).get("value"), f"{where}.constants.{c}.value") for c, v in (raw.get("constants") or {}).items()}
        self.structs = {s: Struct(s, v, f"{where}.structs.{s}") for s, v in (raw.get("structs") or {}).items()}
        self.columns_after = None
        self.columns = []
        cols = raw.get("columns")
        if cols is not None:
            cw = f"{where}.columns"
            after = cols.get("after")
            if not isinstance(after, str) or after not in self.structs:
                raise _bad(f"{cw}.after", f"names no struct of the layout: {json.dumps(after)}")
            if self.structs[after].nbytes % 8:
                raise _bad(f"{cw}.after", f"struct {after}'s {self.structs[after].nbytes} bytes are not 8-aligned")
            self.columns_after = after
            items = cols.get("items")
            for bit, c in enumerate(items if isinstance(items, list) else []):
                iw = f"{cw}.items[{bit}]"
                cname = c.get("name")
                if not isinstance(cname, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", cname):
                    raise _bad(f"{iw}.name", f"expected a snake_case name, got {json.dumps(cname)}")
                if any(o.name == cname for o in self.columns):
                    raise _bad(f"{iw}.name", f"a second column {cname}")
                t = c.get("type")
                if t not in _FMT:
                    raise _bad(f"{iw}.type", f"unknown type {json.dumps(t)} (one of {', '.join(_FMT)})")
                cnt = c.get("count")
                cs, _, cf = cnt.partition(".") if isinstance(cnt, str) else ("", "", "")
                fld = self.structs[cs].fields.get(cf) if cs in self.structs else None
                if fld is None or fld.type != "u32":
                    raise _bad(f"{iw}.count", f"names no u32 field (struct.field) of the layout: {json.dumps(cnt)}")
                self.columns.append(Column(cname, t, cs, cf, bit))

    def place_columns(self, counts: Dict[str, int]):
        """Every column's place for these capacities (keyed by the count field's name): a dict name ->
        (offset in the unit, capacity, Column), and the unit's bytes (as src/shm-layouts.ts computes)."""
        at = self.structs[self.columns_after].nbytes if self.columns_after else 0
        out = {}
        for c in self.columns:
            n = counts.get(c.count)
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise _bad(f"layouts.{self.name}.columns.{c.name}", f"capacity {c.count} is {n!r}, not a non-negative integer")
            out[c.name] = (at, n, c)
            at += _align8(n * c.size)
        return out, _align8(at)

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
