"""wavebus dtype names and their torch / numpy spellings (mirrors src/artifacts/dtype.ts)."""
from typing import Dict

from .errors import ConfigError

# name -> (item size, npy descr); bf16 and fp8 have no numpy type and travel as raw void items.
DTYPES: Dict[str, tuple] = {
    "float64": (8, "<f8"),
    "float32": (4, "<f4"),
    "float16": (2, "<f2"),
    "bfloat16": (2, "|V2"),
    "int64": (8, "<i8"),
    "int32": (4, "<i4"),
    "int16": (2, "<i2"),
    "int8": (1, "|i1"),
    "uint8": (1, "|u1"),
    "bool": (1, "|b1"),
    "float8_e4m3fn": (1, "|V1"),
    "float8_e5m2": (1, "|V1"),
    # The rest of torch's plain element types: .pt takes any dtype (the seed); complex32 has no
    # numpy type, so .npy refuses it (the agent asks to re-run with pt).
    "float8_e4m3fnuz": (1, "|V1"),
    "float8_e5m2fnuz": (1, "|V1"),
    "uint16": (2, "<u2"),
    "uint32": (4, "<u4"),
    "uint64": (8, "<u8"),
    "complex32": (4, None),
    "complex64": (8, "<c8"),
    "complex128": (16, "<c16"),
}

_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "long": "int64", "int": "int32", "short": "int16",
            "chalf": "complex32", "cfloat": "complex64", "cdouble": "complex128"}


def parse_dtype(name, where: str) -> str:
    """A wavebus dtype name from a name (optionally ``torch.``-prefixed, torch aliases ok) or a torch.dtype."""
    if not isinstance(name, str):
        name = str(name)  # torch.dtype prints as "torch.float32"
    bare = name[len("torch."):] if name.startswith("torch.") else name
    if bare in DTYPES:
        return bare
    if bare in _ALIASES:
        return _ALIASES[bare]
    raise ConfigError(f"{where}: unknown dtype {name!r}; valid: {', '.join(DTYPES)}")


def itemsize(name: str) -> int:
    return DTYPES[name][0]


def npy_descr(name: str) -> str:
    return DTYPES[name][1]


def torch_dtype(name: str, where: str = "dtype"):
    """The torch.dtype for a wavebus name, or None when this torch lacks it (fp8 before torch 2.1)."""
    import torch

    name = parse_dtype(name, where)
    return getattr(torch, name, None)


def torch_dtype_or_raise(name: str, where: str):
    dt = torch_dtype(name, where)
    if dt is None:
        import torch

        raise ConfigError(f"{where}: dtype {name} is not available in torch {torch.__version__}")
    return dt


def from_torch(dtype) -> str:
    return parse_dtype(str(dtype), "dtype")


def wire_name(dtype) -> str:
    """The name a tensor's torch dtype travels under, known here or not: the agent looks at it only
    when the forward is selected, so an unselected forward never fails over a dtype."""
    bare = str(dtype)
    bare = bare[len("torch."):] if bare.startswith("torch.") else bare
    return _ALIASES.get(bare, bare)


