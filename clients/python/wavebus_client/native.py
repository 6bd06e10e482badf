"""Which path the per-step ring writes take (docs/python-client.md, "The native path"): the C
extension wavebus_client._native (built by ``pip install`` of clients/python, or in place by the
repository's npm install) or the numpy path beside it in ring.py and digest.py. Both write the same
bytes (test/python-native.test.ts). ``WAVEBUS_PY_NATIVE``: unset or ``auto``, the native path when
it is built; ``0``, the numpy path always; ``1``, the native path or a ConfigError."""
import os

from .errors import ConfigError

VAR = "WAVEBUS_PY_NATIVE"
_loaded = {}  # the variable's value -> the module or None


def load():
    """The _native module, or None for the numpy path (as WAVEBUS_PY_NATIVE says)."""
    value = os.environ.get(VAR, "auto")
    try:
        return _loaded[value]
    except KeyError:
        pass
    if value not in ("auto", "0", "1"):
        raise ConfigError(f"{VAR} must be 0 (the numpy path), 1 (the native path, or an error) or auto (the native path when built), got {value!r}")
    mod = None
    if value != "0":
        try:
            from . import _native as mod
        except ImportError as e:  # not built, or built for another interpreter: the numpy path
            if value == "1":
                raise ConfigError(f"{VAR}=1 but wavebus_client._native does not load ({e}); build it (docs/python-client.md) or unset {VAR}") from None
            mod = None
    _loaded[value] = mod
    return mod
