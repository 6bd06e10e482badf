#!/usr/bin/env bash
# Two hosts, 8 GPUs each, TP 8 x PP 2, under torchrun with wavebus beside it.
# Run this same script on every host, with NODE_RANK=0 on the host whose address is MASTER:
#
#   host A:  MASTER=10.0.0.1 NODE_RANK=0 ./launch/torchrun-multinode.sh
#   host B:  MASTER=10.0.0.1 NODE_RANK=1 ./launch/torchrun-multinode.sh
#
# wavebus launch starts the coordinator on node 0 (bus on MASTER:29600 and :29601), one agent per
# local rank on each host, waits until every last-PP agent is on the bus, then runs torchrun with
# WAVEBUS_RUN_DIR / WAVEBUS_COORDINATOR / WAVEBUS_TP... in its environment. When torchrun exits,
# the agents and the coordinator are stopped and this script exits with torchrun's code.
set -euo pipefail

: "${MASTER:?set MASTER to the IP address of node 0}"
: "${NODE_RANK:?set NODE_RANK to 0 on the master host, 1 on the other}"
NNODES=${NNODES:-2}
NPROC=${NPROC:-8}
WAVEBUS_PORT=${WAVEBUS_PORT:-29600}   # bus: PUB on this port, ROUTER on this port + 1
TORCH_PORT=${TORCH_PORT:-29500}       # torchrun's own rendezvous port: must differ from the bus ports

# --insecure: the bus binds a non-loopback address in plain text; use it only on a trusted
# cluster network, or replace it with --curve-dir DIR (CURVE keys, docs/security.md).
exec wavebus launch \
  --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$NPROC" \
  --master-addr "$MASTER" --port "$WAVEBUS_PORT" \
  --tp 8 --pp 2 \
  --insecure \
  -- \
  torchrun \
    --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$NPROC" \
    --master-addr "$MASTER" --master-port "$TORCH_PORT" \
    serve.py --tensor-parallel-size 8 --pipeline-parallel-size 2 "$@"
