"""What torchrun does for its workers (Debian's torchrun 1.13 fails on Python 3.11): start one
process per local rank with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK set."""
import os
import subprocess
import sys

nproc = int(os.environ["WAVEBUS_NPROC_PER_NODE"])
node = int(os.environ.get("WAVEBUS_NODE_RANK", "0"))
world = nproc * int(os.environ.get("WAVEBUS_NNODES", "1"))
procs = []
for local in range(nproc):
    env = dict(os.environ, RANK=str(node * nproc + local), LOCAL_RANK=str(local), WORLD_SIZE=str(world),
               LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK=str(node), MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"))
    procs.append(subprocess.Popen([sys.executable] + sys.argv[1:], env=env))
sys.exit(max(p.wait() for p in procs))
