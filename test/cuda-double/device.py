"""The "device" side of the CUDA runtime test double, through ctypes: allocate device memory in
the double, fill it, export its 64-byte IPC handle. Run as a script it is an owner process:

    python3 device.py <libcudart_double.so> <file>...

uploads each file into an allocation of its own, prints one JSON line {"pid", "handles": [hex]},
then holds the memory until stdin closes (or the process is killed: the handle's owner exits).
"""
import ctypes
import json
import os
import sys

H2D, D2H = 1, 2


class Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class DoubleDevice:
    def __init__(self, lib_path: str):
        self.lib = ctypes.CDLL(lib_path)
        self.lib.cudaGetErrorString.restype = ctypes.c_char_p
        self.lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.lib.cudaFree.argtypes = [ctypes.c_void_p]
        self.lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.lib.cudaIpcGetMemHandle.argtypes = [ctypes.POINTER(Handle), ctypes.c_void_p]

    def check(self, err: int, what: str) -> None:
        if err != 0:
            raise RuntimeError(f"{what}: {self.lib.cudaGetErrorString(err).decode()} (code {err})")

    def upload(self, data: bytes) -> int:
        p = ctypes.c_void_p()
        self.check(self.lib.cudaMalloc(ctypes.byref(p), len(data)), "cudaMalloc")
        buf = ctypes.create_string_buffer(data, len(data))
        self.check(self.lib.cudaMemcpy(p, buf, len(data), H2D), "cudaMemcpy H2D")
        return p.value

    def ipc_handle(self, ptr: int) -> bytes:
        h = Handle()
        self.check(self.lib.cudaIpcGetMemHandle(ctypes.byref(h), ctypes.c_void_p(ptr)), "cudaIpcGetMemHandle")
        return ctypes.string_at(ctypes.addressof(h), 64)  # h.reserved would stop at the first NUL

    def free(self, ptr: int) -> None:
        self.check(self.lib.cudaFree(ctypes.c_void_p(ptr)), "cudaFree")


if __name__ == "__main__":
    dev = DoubleDevice(sys.argv[1])
    ptrs = []
    for f in sys.argv[2:]:
        with open(f, "rb") as fh:
            ptrs.append(dev.upload(fh.read()))
    print(json.dumps({"pid": os.getpid(), "handles": [dev.ipc_handle(p).hex() for p in ptrs]}), flush=True)
    sys.stdin.read()
    for p in ptrs:
        dev.free(p)
