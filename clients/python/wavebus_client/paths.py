"""Where this rank's agent is: its socket and mailbox, from the environment `wavebus launch` sets."""
import os
from typing import Tuple

from .errors import ConfigError


def env_paths(env) -> Tuple[str, str]:
    run_dir = env.get("WAVEBUS_RUN_DIR", "")
    if not run_dir:
        raise ConfigError(
            "Client.connect(): WAVEBUS_RUN_DIR is not set; run the engine under `wavebus launch` "
            "(or its agents) or pass endpoint= and mailbox=", "ERR_ENV")
    lr = env.get("LOCAL_RANK", "")
    if lr == "":
        raise ConfigError("Client.connect(): LOCAL_RANK is not set; it names this process's agent (agent-local<LOCAL_RANK>.sock)", "ERR_ENV")
    if not lr.isdigit():
        raise ConfigError(f"Client.connect(): LOCAL_RANK must be a non-negative integer, got {lr!r}", "ERR_ENV")
    l = int(lr)
    return f"ipc://{os.path.join(run_dir, f'agent-local{l}.sock')}", os.path.join(run_dir, f"mailbox-local{l}")
