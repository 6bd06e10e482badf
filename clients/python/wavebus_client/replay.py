"""Load a snapshot call dir back into the positional list of torch tensors, for replay.

A call dir holds ``tensor<i>.<format>`` (npy | pt | safetensors) and ``meta.json`` with
``format``, ``inputs`` [{index, dtype, shape}] and ``files`` [{name, bytes, checksum}].
Every tensor is checked against meta.json; errors name the file.
"""
import json
import os
import struct
import warnings
from typing import Any, Dict, List, Tuple

from . import dtypes
from .checksum import crc32c_file, format_checksum
from .errors import ConfigError, ReplayError

FORMATS = ("npy", "pt", "safetensors")
SCHEMA = 1
_ST_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "U16": "uint16", "U32": "uint32", "U64": "uint64",
}
_NP_PLAIN = {"float64": "<f8", "float32": "<f4", "float16": "<f2", "int64": "<i8", "int32": "<i4", "int16": "<i2",
             "int8": "|i1", "uint8": "|u1", "bool": "|b1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
             "complex64": "<c8", "complex128": "<c16"}


def _fail(path: str, what: str) -> "ReplayError":
    return ReplayError(f"{path}: {what}")


def read_meta(call_dir: str) -> Dict[str, Any]:
    path = os.path.join(call_dir, "meta.json")
    try:
        with open(path, "r", encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise _fail(path, "missing (an incomplete or foreign call dir)") from None
    except ValueError as e:
        raise _fail(path, f"not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise _fail(path, "the top level must be an object")
    if meta.get("schema") != SCHEMA:
        raise _fail(path, f"schema {meta.get('schema')!r} is not supported (this loader reads schema {SCHEMA})")
    fmt = meta.get("format")
    if fmt not in FORMATS:
        raise _fail(path, f"field \"format\" must be one of {', '.join(FORMATS)}, got {fmt!r}")
    inputs = meta.get("inputs")
    if not isinstance(inputs, list):
        raise _fail(path, "field \"inputs\" must be a list")
    for i, inp in enumerate(inputs):
        if not isinstance(inp, dict):
            raise _fail(path, f"inputs[{i}] must be an object")
        if inp.get("index") != i:
            raise _fail(path, f"inputs[{i}].index must be {i} (inputs are listed in order), got {inp.get('index')!r}")
        try:
            inp["dtype"] = dtypes.parse_dtype(inp.get("dtype"), f"inputs[{i}].dtype")
        except ConfigError as e:
            raise _fail(path, str(e)) from None
        shape = inp.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise _fail(path, f"inputs[{i}].shape must be a list of non-negative integers, got {shape!r}")
    files = meta.get("files", [])
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise _fail(path, "field \"files\" must be a list of objects")
    for i, f in enumerate(files):
        if not isinstance(f.get("name"), str) or not isinstance(f.get("bytes"), int) or not isinstance(f.get("checksum"), str):
            raise _fail(path, f"files[{i}] must have name (string), bytes (integer) and checksum (string), got {f!r}")
    return meta


def _torch_from_bits(arr, dtype_name: str, path: str):
    """numpy array of raw element bits (int16 for bf16, uint8 for fp8) -> torch tensor of the real dtype."""
    import numpy as np
    import torch

    if not arr.flags.c_contiguous:  # (not np.ascontiguousarray: it turns 0-d into 1-d)
        arr = arr.copy(order="C")
    if dtype_name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    if dtype_name.startswith("float8_"):
        t = torch.from_numpy(arr.view(np.uint8))
        real = getattr(torch, dtype_name, None)
        if real is None:
            warnings.warn(f"{path}: torch {torch.__version__} has no {dtype_name}; returning its raw bits as uint8", stacklevel=3)
            return t
        return t.view(real)
    if dtype_name in ("uint16", "uint32", "uint64") and getattr(torch, dtype_name, None) is None:
        warnings.warn(f"{path}: torch {torch.__version__} has no {dtype_name}; returning a numpy array", stacklevel=3)
        return arr
    return torch.from_numpy(arr)


def _load_npy(path: str, dtype_name: str):
    import numpy as np

    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as e:
        raise _fail(path, f"not a loadable .npy ({e})") from None
    want = dtypes.npy_descr(dtype_name)
    if arr.dtype.str != want:
        raise _fail(path, f"holds {arr.dtype.str}, but meta.json says {dtype_name} (stored as {want})")
    return _torch_from_bits(arr, dtype_name, path), list(arr.shape)


def _load_pt(path: str, dtype_name: str):
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        hint = ""
        if getattr(torch, dtype_name, None) is None:
            hint = f"; torch {torch.__version__} cannot load {dtype_name} from .pt (use format npy or a newer torch)"
        raise _fail(path, f"torch.load failed ({e}){hint}") from None
    if isinstance(obj, dict):
        if "tensor" in obj:
            obj = obj["tensor"]
        else:
            ts = [v for v in obj.values() if isinstance(v, torch.Tensor)]
            if len(ts) != 1:
                raise _fail(path, f"holds a dict with {len(ts)} tensors and no 'tensor' key; expected one tensor")
            obj = ts[0]
    if not isinstance(obj, torch.Tensor):
        raise _fail(path, f"holds a {type(obj).__name__}, expected a tensor")
    got = dtypes.from_torch(obj.dtype)
    if got != dtype_name:
        raise _fail(path, f"holds {got}, but meta.json says {dtype_name}")
    return obj, list(obj.shape)


def read_safetensors(path: str) -> Dict[str, Tuple[str, List[int], bytes]]:
    """{name: (wavebus dtype, shape, raw bytes)} of a .safetensors file (checks the layout rules)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise _fail(path, "shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise _fail(path, f"header length {n} runs past the end of the file ({size} bytes)")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except ValueError as e:
            raise _fail(path, f"header is not valid JSON ({e})") from None
        data = f.read()
    if not isinstance(header, dict):
        raise _fail(path, "header must be a JSON object")
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(e, dict) or e.get("dtype") not in _ST_DTYPES:
            raise _fail(path, f"tensor {name!r}: unknown or missing dtype {e.get('dtype') if isinstance(e, dict) else e!r}")
        dt = _ST_DTYPES[e["dtype"]]
        shape, offs = e.get("shape"), e.get("data_offsets")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise _fail(path, f"tensor {name!r}: bad shape {shape!r}")
        if not isinstance(offs, list) or len(offs) != 2 or not 0 <= offs[0] <= offs[1] <= len(data):
            raise _fail(path, f"tensor {name!r}: data_offsets {offs!r} outside the {len(data)}-byte data buffer")
        numel = 1
        for d in shape:
            numel *= d
        if offs[1] - offs[0] != numel * dtypes.itemsize(dt):
            raise _fail(path, f"tensor {name!r}: {offs[1] - offs[0]} bytes for shape {shape} of {dt}")
        out[name] = (dt, shape, data[offs[0]:offs[1]])
    return out


def _load_safetensors(path: str, dtype_name: str):
    import numpy as np

    entries = read_safetensors(path)
    if len(entries) != 1:
        raise _fail(path, f"holds {len(entries)} tensors, expected one")
    (dt, shape, raw), = entries.values()
    if dt != dtype_name:
        raise _fail(path, f"holds {dt}, but meta.json says {dtype_name}")
    if dt in _NP_PLAIN:
        arr = np.frombuffer(bytearray(raw), dtype=_NP_PLAIN[dt]).reshape(shape)
    else:
        arr = np.frombuffer(bytearray(raw), dtype=np.int16 if dt == "bfloat16" else np.uint8).reshape(shape)
    return _torch_from_bits(arr, dt, path), shape


_LOADERS = {"npy": _load_npy, "pt": _load_pt, "safetensors": _load_safetensors}


def verify_files(call_dir: str, meta: Dict[str, Any], checksums: bool = True) -> None:
    """Sizes (and, with ``checksums``, CRC-32C) of every file listed in meta.json."""
    for f in meta.get("files", []):
        path = os.path.join(call_dir, f["name"])
        if os.path.basename(f["name"]) != f["name"]:
            raise _fail(os.path.join(call_dir, "meta.json"), f"files entry {f['name']!r} is not a plain file name")
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            raise _fail(path, "listed in meta.json but missing") from None
        if size != f["bytes"]:
            raise _fail(path, f"{size} bytes, meta.json says {f['bytes']}")
        if checksums:
            got = format_checksum(crc32c_file(path))
            if got != f["checksum"]:
                raise _fail(path, f"checksum {got} does not match meta.json's {f['checksum']}")


def load_call_dir(call_dir: str, verify: bool = True, withheld_ok: bool = False) -> Tuple[Dict[str, Any], list]:
    """(meta, [tensor0, tensor1, ...]) of one call dir (the rules of docs/snapshots.md).

    Sizes are always checked against meta.json; ``verify`` (default) also checks every CRC-32C.
    An input the flight recorder withheld (token ids, save_sensitive_info false; meta.json's
    ``withheld``) has no file: an error naming it, or None in its place with ``withheld_ok``.
    """
    call_dir = os.path.expanduser(call_dir)  # docs show "~/.cache/..."
    if not os.path.isdir(call_dir):
        raise ReplayError(f"{call_dir}: not a directory")
    meta = read_meta(call_dir)
    fmt = meta["format"]
    inputs = meta["inputs"]
    verify_files(call_dir, meta, checksums=verify)
    withheld = {w["index"]: w for w in meta.get("withheld", []) if isinstance(w, dict) and isinstance(w.get("index"), int)}
    expected = [f"tensor{i}.{fmt}" for i in range(len(inputs))]
    listed = {f["name"] for f in meta.get("files", [])}
    for name in sorted(os.listdir(call_dir)):
        if name == "meta.json":
            continue
        if name not in expected:
            raise _fail(os.path.join(call_dir, name), f"not described by meta.json, which lists {len(inputs)} inputs (format {fmt})")
        if "files" in meta and name not in listed:
            raise _fail(os.path.join(call_dir, name), "not listed in meta.json's files")
    tensors = []
    for i, inp in enumerate(inputs):
        path = os.path.join(call_dir, expected[i])
        if i in withheld:
            if not withheld_ok:
                w = withheld[i]
                raise _fail(path, f"input {i} ({w.get('name', '?')}) was withheld: {w.get('reason', '?')}; "
                                  "replay needs the flush written with report.save_sensitive_info true")
            tensors.append(None)
            continue
        if not os.path.isfile(path):
            raise _fail(path, f"missing (meta.json lists {len(inputs)} inputs, format {fmt})")
        t, shape = _LOADERS[fmt](path, inp["dtype"])
        if shape != inp["shape"]:
            raise _fail(path, f"shape {shape}, but meta.json says {inp['shape']}")
        tensors.append(t)
    return meta, tensors
