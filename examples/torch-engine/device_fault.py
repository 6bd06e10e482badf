"""TEST DOUBLE: a faulty device. No hardware here fails on demand, so a host-level file stands in for
a device that computes one matmul wrong: every process on that "host" (the engine and any replay run
there) names the file in TORCH_ENGINE_DEVICE_FAULT_FILE, and while the file exists each MLP
up-projection matmul of the layer it names, run on the device index it names, gets `add` on column
0 of its output. A process on another "host" names another file (or none): its matmuls are right.
`wavebus verdict` tells such a device from software (docs/verdict.md); nothing else uses this.

The file: {"device": D, "layer": L, "add": A} (JSON). A file that does not parse is an error, not a
healthy device: the double must never pass silently for a misconfigured test.
"""
import json
import os
import threading

ENV = "TORCH_ENGINE_DEVICE_FAULT_FILE"
_here = threading.local()  # the device index this thread computes on (replay.py runs ranks as threads)


def set_device(index: int) -> None:
    _here.index = index


def corrupt(layer: int, out):
    """The up-projection's output of `layer`, as the faulty device gives it (in place), or as it is."""
    path = os.environ.get(ENV)
    if not path or not os.path.exists(path):
        return out
    with open(path) as f:
        try:
            spec = json.load(f)
            device, at, add = int(spec["device"]), int(spec["layer"]), float(spec["add"])
        except (ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"device_fault: {path}: expected {{\"device\": D, \"layer\": L, \"add\": A}}: {e}")
    if at == layer and getattr(_here, "index", None) == device:
        out[:, 0] += add
    return out
