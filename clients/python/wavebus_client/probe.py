"""The probe: every module's output (and, on request, its inputs) of one forward, per rank.

Forward hooks on a ``torch.nn.Module`` tree copy each tensor a module returns the moment the hook
sees it (``detach().clone()`` to the CPU: fused kernels change tensors in place later), in
execution order, with the module's qualified name, its call number within the forward, dtype,
shape and how the tensor is split across TP ranks. ``write()`` puts them in a snapshot-layout
bundle ``<root>/rank<g>/call<N>/`` (``tensor<i>.npy|pt`` + ``meta.json`` with a ``probe`` section),
written under a temporary name and renamed, so ``wavebus inspect`` checks it, ``load_call_dir``
loads it and ``wavebus bisect`` compares two trees of them (docs/bisect.md).

Off unless asked: nothing is hooked until ``attach()``; ``detach()`` removes every hook.

Split kinds (declared once per module type, ``splits={ColumnParallelLinear: COLUMN, ...}``):

- ``column``: each rank holds a slice along ``dim`` (default the last): a column-parallel linear's
  output (heads, MLP columns, vocabulary). Assembled by concatenation in tp_rank order.
- ``row``: each rank holds a slice along ``dim`` (default 0): rows (sequence-parallel activations).
- ``replicated``: every rank holds the whole tensor: norms, embeddings, a row-parallel linear's
  output once it has been all-reduced. Each rank's copy is compared on its own.

Default: a type whose name has ``ColumnParallel`` is column, every other type (``torch.nn.Linear``
included: an unsharded linear computes the whole output on every rank; a ``RowParallel`` one
all-reduces inside) is replicated. An engine whose split is a property of the module's name, not
its type (transformers' ``tp_plan``: every projection is an ``nn.Linear``), passes
``split_for(name, module, io)``, consulted first (``None``: fall back to the types).
"""
import fnmatch
import json
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from . import dtypes
from .checksum import crc32c_file, format_checksum
from .errors import ConfigError

SCHEMA = 1
SPLIT_KINDS = ("column", "row", "replicated")
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)(?:\.|$)")


@dataclass(frozen=True)
class Split:
    kind: str
    dim: Optional[int] = None

    def __post_init__(self):
        if self.kind not in SPLIT_KINDS:
            raise ConfigError(f"split kind must be one of {', '.join(SPLIT_KINDS)}, got {self.kind!r}")
        if self.kind == "replicated" and self.dim is not None:
            raise ConfigError("a replicated split has no dim")

    def resolved_dim(self, ndim: int) -> Optional[int]:
        if self.kind == "replicated":
            return None
        d = self.dim if self.dim is not None else (-1 if self.kind == "column" else 0)
        if not -ndim <= d < ndim:
            raise ConfigError(f"split dim {d} is outside a {ndim}-d tensor")
        return d % ndim


COLUMN, ROW, REPLICATED = Split("column"), Split("row"), Split("replicated")


def default_split(module) -> Split:
    return COLUMN if "ColumnParallel" in type(module).__name__ else REPLICATED


def layer_index(name: str) -> Optional[int]:
    """The decoder layer a qualified name belongs to (``model.layers.3.mlp`` -> 3), else None."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def _matcher(patterns: Optional[Iterable[str]]):
    """Glob patterns (fnmatch), or regular expressions written ``re:<expr>`` (searched)."""
    if patterns is None:
        return lambda name: True
    pats = []
    for p in patterns:
        if not isinstance(p, str) or not p:
            raise ConfigError(f"probe include: patterns are non-empty strings, got {p!r}")
        if p.startswith("re:"):
            try:
                rx = re.compile(p[3:])
            except re.error as e:
                raise ConfigError(f"probe include: {p!r} is not a regular expression ({e})") from None
            pats.append(rx.search)
        else:
            pats.append(lambda n, p=p: fnmatch.fnmatchcase(n, p))
    return lambda name: any(m(name) for m in pats)


def parse_layers(spec: Optional[str]) -> Optional[Tuple[int, int]]:
    """'3' or '1-4' (inclusive) -> (lo, hi); None or '' -> no layer filter."""
    if spec is None or spec == "":
        return None
    m = re.fullmatch(r"(\d+)(?:-(\d+))?", spec.strip())
    if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
        raise ConfigError(f"probe layers: expected N or LO-HI (LO <= HI), got {spec!r}")
    lo = int(m.group(1))
    return lo, int(m.group(2)) if m.group(2) is not None else lo


class Probe:
    """Records one forward's module outputs on this rank; see the module docstring."""

    def __init__(self, model, *, global_rank: int = 0, tp_rank: int = 0, tp_size: int = 1, pp_rank: int = 0,
                 pp_size: int = 1, dp_rank: int = 0, cp_rank: int = 0, splits: Optional[Dict[type, Split]] = None,
                 include: Optional[Iterable[str]] = None, layers: Optional[Tuple[int, int]] = None,
                 inputs: bool = False, fmt: str = "npy", label: str = "probe",
                 split_for: Optional[Callable[[str, Any, str], Optional[Split]]] = None):
        if fmt not in ("npy", "pt"):
            raise ConfigError(f"probe format must be npy or pt, got {fmt!r}")
        for k, v in (("global_rank", global_rank), ("tp_rank", tp_rank), ("pp_rank", pp_rank), ("dp_rank", dp_rank),
                     ("cp_rank", cp_rank)):
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"probe {k}: expected an integer >= 0, got {v!r}")
        if not isinstance(tp_size, int) or not 0 <= tp_rank < tp_size or not isinstance(pp_size, int) or not 0 <= pp_rank < pp_size:
            raise ConfigError(f"probe: need 0 <= tp_rank < tp_size and 0 <= pp_rank < pp_size, got tp {tp_rank}/{tp_size}, pp {pp_rank}/{pp_size}")
        self.model, self.fmt, self.label, self.inputs = model, fmt, label, inputs
        self.identity = {"global_rank": global_rank, "tp_rank": tp_rank, "pp_rank": pp_rank, "dp_rank": dp_rank,
                         "cp_rank": cp_rank}
        self.tp_size, self.pp_size = tp_size, pp_size
        self.splits = dict(splits or {})
        self.split_for = split_for
        self.want = _matcher(include)
        self.layers = layers
        self.handles: List[Any] = []
        self.records: List[Dict[str, Any]] = []
        self.tensors: List[Any] = []
        self.calls: Dict[str, int] = {}
        self.problems: List[str] = []

    # ------------------------------------------------------------------ hooks
    def selected(self, name: str) -> bool:
        if not name or not self.want(name):  # the root module ('') is the whole forward: its output is the last leaf's
            return False
        li = layer_index(name)
        return self.layers is None or li is None or self.layers[0] <= li <= self.layers[1]

    def split_of(self, module, name: Optional[str] = None, io: str = "output") -> Split:
        if self.split_for is not None and name is not None:
            s = self.split_for(name, module, io)
            if s is not None:
                return s
        if io == "input":
            return getattr(module, "probe_input_split", REPLICATED)
        for cls in type(module).__mro__:  # the most specific declared type wins
            if cls in self.splits:
                return self.splits[cls]
        return default_split(module)

    def attach(self) -> "Probe":
        if self.handles:
            return self
        for name, module in self.model.named_modules():
            if not self.selected(name):
                continue
            split = self.split_of(module, name)
            if self.inputs:
                self.handles.append(module.register_forward_pre_hook(self._pre_hook(name)))
            self.handles.append(module.register_forward_hook(self._hook(name, split)))
        return self

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def __enter__(self):
        return self.attach()

    def __exit__(self, *exc):
        self.detach()

    def begin(self) -> None:
        """Forget what was recorded: the next forward starts at call 0 of every module."""
        self.records, self.tensors, self.calls, self.problems = [], [], {}, []

    def _pre_hook(self, name):
        def hook(module, args):
            call = self.calls.get(name, 0)  # the forward hook counts the call when it ends
            for i, t in enumerate(args):
                self._record(name, call, "input", i, t, None, module)
        return hook

    def _hook(self, name, split):
        def hook(module, args, output):
            call = self.calls.get(name, 0)
            self.calls[name] = call + 1
            outs = output if isinstance(output, (tuple, list)) else (output,)
            for i, t in enumerate(outs):
                self._record(name, call, "output", i, t, split, module)
        return hook

    def _record(self, name, call, io, arg, t, split, module):
        import torch

        if not isinstance(t, torch.Tensor):
            return
        if split is None:  # an input: split_for's, else its module type's probe_input_split (a row-parallel linear's is column), else replicated
            split = self.split_of(module, name, "input")
        if t.dim() == 0:
            split = REPLICATED
        try:
            dim = split.resolved_dim(t.dim())
        except ConfigError as e:  # a hook never fails the forward: write() refuses the bundle instead
            self.problems.append(f"{name} {io} {arg}: {e}")
            return
        copy = t.detach().to("cpu", copy=True)
        self.records.append({"index": len(self.records), "module": name, "call": call, "io": io, "arg": arg,
                             "dtype": dtypes.from_torch(copy.dtype), "shape": list(copy.shape), "split": split.kind,
                             "split_dim": dim})
        self.tensors.append(copy)

    # ------------------------------------------------------------------ bundle
    def write(self, root: str, call_index: int) -> str:
        """The recorded forward as ``<root>/rank<g>/call<call_index>/``; returns that path. Written
        whole under a temporary name and renamed: a reader sees no bundle or a complete one."""
        if not isinstance(call_index, int) or call_index < 0:
            raise ConfigError(f"probe write: call_index must be an integer >= 0, got {call_index!r}")
        if self.problems:  # whole or not at all: a record the hooks could not take leaves no bundle
            raise ConfigError(f"probe write: {len(self.problems)} record(s) could not be taken: {'; '.join(self.problems[:3])}")
        parent = os.path.join(root, f"rank{self.identity['global_rank']}")
        os.makedirs(parent, mode=0o700, exist_ok=True)
        final = os.path.join(parent, f"call{call_index}")
        tmp = os.path.join(parent, f".call{call_index}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        os.mkdir(tmp, 0o700)
        try:
            files = []
            for i, t in enumerate(self.tensors):
                name = f"tensor{i}.{self.fmt}"
                path = os.path.join(tmp, name)
                _write_tensor(path, t, self.fmt)
                files.append({"name": name, "bytes": os.path.getsize(path), "checksum": format_checksum(crc32c_file(path))})
            meta = dict(self.identity, schema=SCHEMA, hash=self.label, format=self.fmt, call_index=call_index,
                        selected_by=["probe"], files=files,
                        inputs=[{"index": r["index"], "dtype": r["dtype"], "shape": r["shape"]} for r in self.records],
                        probe={"tp_size": self.tp_size, "pp_size": self.pp_size, "records": self.records})
            _write_file(os.path.join(tmp, "meta.json"), (json.dumps(meta, sort_keys=True, indent=2) + "\n").encode())
            _fsync_dir(tmp)
            if os.path.lexists(final):  # a rerun replaces the earlier bundle whole (as snapshots do)
                aside = os.path.join(parent, f".call{call_index}.old-{os.getpid()}-{secrets.token_hex(4)}")
                os.rename(final, aside)
                os.rename(tmp, final)
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.rename(tmp, final)
            _fsync_dir(parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def npy_bytes(t) -> bytes:
    """A .npy file of tensor t: value-preserving raw bytes; bf16 as |V2 and fp8 as |V1 (docs/snapshots.md)."""
    import torch

    name = dtypes.from_torch(t.dtype)
    descr = dtypes.npy_descr(name)
    if descr is None:
        raise ConfigError(f"probe: dtype {name} has no .npy representation; use format pt")
    t = t.contiguous()
    if name == "bfloat16" or name.startswith("float8_"):
        raw = t.view(torch.int16 if name == "bfloat16" else torch.uint8).numpy().tobytes()
    else:
        raw = t.numpy().tobytes()
    shape = "(" + "".join(f"{d}, " for d in t.shape)[:-2] + ("," if t.dim() == 1 else "") + ")"
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * (pad % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode("latin-1") + raw


def _write_tensor(path: str, t, fmt: str) -> None:
    if fmt == "npy":
        _write_file(path, npy_bytes(t))
        return
    import io
    import torch

    buf = io.BytesIO()
    torch.save(t.contiguous(), buf)
    _write_file(path, buf.getvalue())
