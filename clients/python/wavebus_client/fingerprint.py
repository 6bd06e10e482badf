"""What this rank runs, sent once in the hello (wavebus.Fingerprint): versions, the device, and the
environment variables that change numerics or communication. The same allow-list and secret rule
as the TypeScript client (src/client/fingerprint.ts); the agent and the coordinator apply them again.
torch is never imported here: its versions and the device are read only if the engine loaded it."""
import hashlib
import os
import platform
import socket
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


CPUINFO = "/proc/cpuinfo"


def _cpu_facts(cpuinfo: str = CPUINFO) -> dict:
    """The first processor's model, microcode and flags (a digest: the list is long) from /proc/cpuinfo."""
    facts = {}
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError as e:
        return {"cpu_error": f"{cpuinfo}: {e.strerror}"}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in ("model name", "microcode", "vendor_id", "cpu family", "model", "stepping") and key not in facts:
            facts[key] = value[:128]
        elif key in ("flags", "Features") and "flags" not in facts:
            flags = sorted(set(value.split()))
            facts["flags"] = f"{len(flags)} flags, sha256 {hashlib.sha256(' '.join(flags).encode()).hexdigest()[:16]}"
    names = {"model name": "cpu_model", "microcode": "cpu_microcode", "vendor_id": "cpu_vendor", "cpu family": "cpu_family",
             "model": "cpu_model_number", "stepping": "cpu_stepping", "flags": "cpu_flags"}
    return {names[k]: v for k, v in facts.items()}


def device_fingerprint(index: int, cpuinfo: str = CPUINFO) -> dict:
    """What computed on device `index` in this process, for `wavebus verdict` to name a faulty device:
    the host, the torch build, and the CPU (model, microcode, flags) or the CUDA device (name, UUID,
    driver). Plain strings, each bounded; torch is read only if the caller loaded it."""
    torch = sys.modules.get("torch")
    out = {"hostname": socket.gethostname()[:64], "index": int(index), "kind": "cpu"}
    if torch is not None:
        out["torch"] = f"{torch.__version__} git {getattr(torch.version, 'git_version', '') or 'unknown'}"[:128]
    try:
        if torch is not None and torch.cuda.is_available() and index < torch.cuda.device_count():
            props = torch.cuda.get_device_properties(index)
            out.update(kind="cuda", device_name=str(props.name)[:128], device_uuid=str(getattr(props, "uuid", "") or "")[:64],
                       cuda_runtime=str(torch.version.cuda or ""))
            get = getattr(torch._C, "_cuda_getDriverVersion", None)
            if get is not None:
                d = int(get())
                out["cuda_driver"] = f"{d // 1000}.{(d % 1000) // 10}"
            return out
    except Exception as e:  # a broken CUDA setup: say so, still name the host
        out["cuda_error"] = str(e)[:200]
    out["device_name"] = "cpu"
    out.update(_cpu_facts(cpuinfo))
    return out
