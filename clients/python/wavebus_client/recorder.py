"""The flight recorder's writer (docs/recorder.md): each forward's inputs and context copied into a
ring of the last K forwards in a file the agent created and maps out after a crash. Per forward:
one copy of the inputs, no message, no system call. The layout is proto/layouts.json's "recorder"
(shm_layout.py; the agent reads it with src/agent/recorder-ring.ts, the TypeScript client writes it
with src/client/recorder.ts)."""
import ctypes
import mmap
import os
import sys
import time

from . import wavebus_pb2 as pb
from .errors import ConfigError
from .shm_layout import layout

_L = layout("recorder")
_H, _S = _L.struct("header"), _L.struct("slot")
HEADER = _H.nbytes
SLOT_HEADER = _S.nbytes
NOTE_MAX = _H["note"].nbytes
MAGIC, VERSION, FLAG_TOO_LARGE = _L.constant("magic"), _L.constant("version"), _L.constant("flag_too_large")
_MAGIC, _VERSION, _SLOTS, _STRIDE = _H["magic"], _H["version"], _H["slots"], _H["stride"]
_FORWARDS, _PID, _NOTE_LEN, _NOTE = _H["forwards"], _H["pid"], _H["note_len"], _H["note"]
_COMMIT, _ENTRY_LEN, _FLAGS, _DATA_LEN = _S["commit"], _S["entry_len"], _S["flags"], _S["data_len"]


def _align8(n: int) -> int:
    return (n + 7) & ~7


class Recorder:
    """The client's side of one ring file (opened from the path the agent's hello gave)."""

    def __init__(self, path: str):
        where = f"flight recorder ring {path}"
        # No link followed: the path came from the agent's socket; the file is the agent's, 0600.
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            size = os.fstat(fd).st_size
            if size < HEADER:
                raise ConfigError(f"{where}: {size} bytes, shorter than its header ({HEADER})")
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        magic, version, slots = _MAGIC.read(self._mm), _VERSION.read(self._mm), _SLOTS.read(self._mm)
        stride = _STRIDE.read(self._mm)
        if magic != MAGIC or version != VERSION:
            self._mm.close()
            raise ConfigError(f"{where}: not a version {VERSION} ring (magic {magic:#x}, version {version})")
        if slots < 1 or stride <= SLOT_HEADER or stride % 8 or HEADER + slots * stride > size:
            self._mm.close()
            raise ConfigError(f"{where}: {slots} slots of {stride} bytes do not fit its {size} bytes")
        self.path, self.slots, self.stride = path, slots, stride
        # A client that comes back to the same ring goes on numbering where the last one stopped.
        self.forwards = _FORWARDS.read(self._mm)
        _PID.write(self._mm, 0, os.getpid())
        self._base = ctypes.c_char.from_buffer(self._mm)
        self._addr = ctypes.addressof(self._base)
        self.too_large = 0

    def record(self, ctx: "pb.ForwardContext", tins, sources, wave: int) -> None:
        """Copy one forward: ``sources[i]`` gives input i's bytes (see ``input_source``)."""
        n = self.forwards
        off = HEADER + (n % self.slots) * self.stride
        mm = self._mm
        # Odd: forward n is being written; a reader (or a crash now) leaves this slot out.
        _COMMIT.write(mm, off, 2 * n + 1)
        self.forwards = n + 1
        _FORWARDS.write(mm, 0, n + 1)
        nbytes = [s[1] for s in sources]
        entry = pb.RecorderEntry(context=ctx, inputs=tins, input_bytes=nbytes, forward=n + 1, wave=wave,
                                 unix_ms=int(time.time() * 1000)).SerializeToString()
        data = off + SLOT_HEADER + _align8(len(entry))
        flags, total = 0, sum(nbytes)
        if data + total > off + self.stride:
            # Never half a forward: the entry alone (if it fits) says what did not.
            flags, total = FLAG_TOO_LARGE, 0
            self.too_large += 1
            if off + SLOT_HEADER + len(entry) > off + self.stride:
                entry = b""
        else:
            pos = data
            for src, nb in sources:
                if nb:
                    if isinstance(src, int):
                        ctypes.memmove(self._addr + pos, src, nb)
                    else:  # a device tensor's bytes: torch copies them (synchronously to pageable memory)
                        import torch

                        torch.frombuffer(mm, dtype=torch.uint8, count=nb, offset=pos).copy_(src)
                pos += nb
        _ENTRY_LEN.write(mm, off, len(entry))
        _FLAGS.write(mm, off, flags)
        _DATA_LEN.write(mm, off, total)
        mm[off + SLOT_HEADER:off + SLOT_HEADER + len(entry)] = entry
        _COMMIT.write(mm, off, 2 * n + 2)  # whole

    def note(self, text: str) -> None:
        """Why the engine is about to die (an uncaught exception), for the agent's crash.json."""
        b = text.encode("utf-8", "replace")[:NOTE_MAX]
        self._mm[_NOTE.at:_NOTE.at + len(b)] = b
        _NOTE_LEN.write(self._mm, 0, len(b))

    def close(self) -> None:
        del self._base
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass


def input_source(item, tin: "pb.TensorInput", regions):
    """(address or device-tensor bytes, nbytes) of one before_forward input, already checked by
    input_proto: a host tensor or a host region is copied by address, a CUDA one through torch."""
    region = regions[tin.region]
    if not isinstance(item, (tuple, list)):
        nb = item.numel() * item.element_size()
        if item.is_cuda:
            import torch

            return item.reshape(-1).view(torch.uint8), nb
        return item.data_ptr(), nb
    numel = 1
    for d in tin.shape:
        numel *= d
    owner = region.owner
    if region.kind == "cuda":
        import torch

        if not isinstance(owner, torch.Tensor):
            raise ConfigError(f"flight recorder: CUDA region {region.name!r} has no tensor to copy from")
        flat = owner.reshape(-1).view(torch.uint8)
        nb = numel * _itemsize(tin.dtype, owner)
        return flat[tin.offset:tin.offset + nb], nb
    if region.base_ptr is None:
        raise ConfigError(f"flight recorder: region {region.name!r} has no address in this process (register it with base_ptr)")
    return region.base_ptr + tin.offset, numel * _itemsize(tin.dtype, owner)


def _itemsize(dtype: str, owner) -> int:
    from . import dtypes

    try:
        return dtypes.itemsize(dtype)
    except Exception:  # a torch-only dtype name (wire_name): ask torch
        import torch

        return torch.empty((), dtype=getattr(torch, dtype)).element_size()


_hooked = []


def install_excepthook(rec: Recorder) -> None:
    """An uncaught exception writes its type and message into the ring before the process dies."""
    if _hooked:
        _hooked[0] = rec
        return
    _hooked.append(rec)
    prev = sys.excepthook

    def hook(t, v, tb):
        try:
            _hooked[0].note(f"uncaught {t.__name__}: {v}")
        except Exception:  # noqa: BLE001 (the engine is dying: never hide its own error)
            pass
        prev(t, v, tb)

    sys.excepthook = hook
