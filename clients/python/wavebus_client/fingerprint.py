"""What this rank runs, sent once in the hello (wavebus.Fingerprint): versions, the device, and the
environment variables that change numerics or communication. The same allow-list and secret rule
as the TypeScript client (src/client/fingerprint.ts); the agent and the coordinator apply them again.
torch is never imported here: its versions and the device are read only if the engine loaded it."""
import os
import platform
import sys
from typing import Mapping, Optional

from . import wavebus_pb2 as pb
from .version import __version__

ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "VLLM_", "CUBLAS_")
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


def looks_secret(name: str) -> bool:
    up = name.upper()
    return any(w in up for w in SECRET_WORDS)


def fingerprint_env(env: Mapping[str, str]):
    """The allow-listed variables, sorted; a secret-looking name goes without its value."""
    out = []
    for name in sorted(n for n in env if n.startswith(ENV_PREFIXES)):
        if looks_secret(name):
            out.append(pb.EnvEntry(name=name, redacted=True))
        else:
            out.append(pb.EnvEntry(name=name, value=str(env[name])))
    return out


def _torch_facts():
    """(torch version, CUDA runtime, CUDA driver, device name), each '' where absent."""
    torch = sys.modules.get("torch")
    if torch is None:
        return "", "", "", "cpu"
    version = str(getattr(torch, "__version__", ""))
    runtime = str(getattr(torch.version, "cuda", "") or "")
    driver, device = "", "cpu"
    try:
        # Only a CUDA context the engine already made: a fingerprint never initialises the device.
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            device = torch.cuda.get_device_name(torch.cuda.current_device())
            get = getattr(torch._C, "_cuda_getDriverVersion", None)
            if get is not None:
                d = int(get())
                driver = f"{d // 1000}.{(d % 1000) // 10}"
    except Exception:  # a broken CUDA setup must not stop the hello
        pass
    return version, runtime, driver, device


def client_fingerprint(engine_version: str = "", device_name: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> "pb.Fingerprint":
    tv, rt, drv, dev = _torch_facts()
    return pb.Fingerprint(
        wavebus_version=__version__, language="python", runtime_version=f"python {platform.python_version()}",
        torch_version=tv, cuda_runtime_version=rt, cuda_driver_version=drv, engine_version=str(engine_version or ""),
        device_name=device_name or dev, env=fingerprint_env(os.environ if env is None else env))
