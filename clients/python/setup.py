"""The C fast path of the per-step ring writes (wavebus_client/_native.c; docs/python-client.md,
"The native path"). optional=True: without a compiler or the interpreter's headers pip installs the
pure-Python package, whose numpy path writes the same bytes. Everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("wavebus_client._native", ["wavebus_client/_native.c"], depends=["wavebus_client/_native_crc.h", "wavebus_client/_native_cast.h", "wavebus_client/_native_bytes.h", "wavebus_client/_native_slots.h", "wavebus_client/_native_arrive.h"], extra_compile_args=["-O2"], optional=True)])
