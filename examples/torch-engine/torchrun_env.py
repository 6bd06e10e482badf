"""What torchrun does for its workers (Debian's torchrun 1.13 fails on Python 3.11): start one
process per local rank with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR and MASTER_PORT set. Usage (under `wavebus launch`, which sets WAVEBUS_NPROC_PER_NODE):
    wavebus launch --nproc-per-node 2 --tp 2 -- python3 torchrun_env.py engine.py --out DIR
"""
import os
import signal
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    nproc = int(os.environ.get("WAVEBUS_NPROC_PER_NODE") or os.environ.get("NPROC_PER_NODE", "1"))
    node = int(os.environ.get("WAVEBUS_NODE_RANK", "0"))
    world = nproc * int(os.environ.get("WAVEBUS_NNODES", "1"))
    master_port = os.environ.get("MASTER_PORT") or str(free_port())
    procs = []

    # A stop for the job (wavebus launch forwards SIGTERM) stops the workers too, and this process
    # waits for them: otherwise they would serve on, orphaned, after the job is gone.
    def forward(sig, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    for local in range(nproc):
        env = dict(os.environ, RANK=str(node * nproc + local), LOCAL_RANK=str(local), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK=str(node), MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                   MASTER_PORT=master_port)
        procs.append(subprocess.Popen([sys.executable] + sys.argv[1:], env=env))
    return max(p.wait() for p in procs)  # a worker stopped by a signal: negative, so 0 only if all exited 0


if __name__ == "__main__":
    sys.exit(main())
