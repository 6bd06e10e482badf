#!/usr/bin/env bash
# wavebus on a real GPU, before trusting a dump (docs/native.md "Checking a GPU host").
# With the real CUDA driver and a CUDA-enabled torch: a KV pool on the GPU exported with the
# Python client's cuda_region(), an agent that dumps a request and snapshots a forward, files
# compared bit-exact with the GPU tensors, an fp8 .pt loaded by torch, and the agent's copy
# copy time (dump.json "copy": its gathers from GPU memory into host memory, all regions at once,
# before any file is written) next to torch's device-to-host copy of as many bytes into pinned memory.
# One "PASS:" / "FAIL:" line per check.
# Exit: 0 every check passed; 1 some check failed; 2 setup error (no node, no dist/, no torch);
#       3 SKIP: no CUDA device here (nothing was checked).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
NODE=${NODE:-node}

command -v "$NODE" >/dev/null || { echo "SETUP: node not found (set NODE)"; exit 2; }
[ -f dist/src/index.js ] || { echo "SETUP: dist/ is missing: run 'npx tsc -p tsconfig.json' first"; exit 2; }
[ -f build/Release/wavebus_native.node ] || { echo "SETUP: the native addon is missing: run 'npx node-gyp rebuild' first"; exit 2; }
"$PY" -c 'import torch' 2>/dev/null || { echo "SETUP: $PY cannot import torch (set PYTHON)"; exit 2; }

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "SKIP: no CUDA device (torch.cuda.is_available() is False; torch $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)'))"
  exit 3
fi
avail=$("$NODE" -e "const n=require('$ROOT/dist/src/native').native; const a=n.cudaAvailable(); console.log((a.available?'yes ':'no ')+a.reason)")
case "$avail" in
  yes*) echo "PASS: agent CUDA backend: ${avail#yes }" ;;
  *) echo "FAIL: agent CUDA backend: ${avail#no } (set WAVEBUS_CUDART to your libcudart.so)"; exit 1 ;;
esac

WORK=$(mktemp -d /tmp/wavebus-gpu-check.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$ROOT/clients/python${PYTHONPATH:+:$PYTHONPATH}"
# One rank: coordinator + agent (test/cuda-double/job.js, here with the real libcudart), engine in Python.
"$PY" -c 'import json,sys; json.dump({"root": sys.argv[1], "reqId": "req-gpu-check-1", "regions": [], "snapshot": {"enable": True}, "python": [sys.argv[2], sys.argv[3], "req-gpu-check-1"]}, open(sys.argv[1] + "/spec.json", "w"))' \
  "$WORK" "$PY" "$ROOT/scripts/gpu-check/engine.py"
if ! "$NODE" "$ROOT/test/cuda-double/job.js" "$WORK/spec.json" >"$WORK/out.json" 2>"$WORK/err.log"; then
  echo "FAIL: agent + engine run: $(tail -c 2000 "$WORK/err.log")"
  exit 1
fi
"$PY" - "$WORK/out.json" <<'PYEOF'
import json, sys
out = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
m = out["manifest"]
print(("PASS" if m.get("complete") else "FAIL") + ": manifest complete: " + json.dumps({k: m.get(k) for k in ("completed_ranks", "failed_ranks")}))
for status, line in out["python"]["checks"]:
    print(f"{status}: {line}")
py = out["python"]
a, t = py.get("agent_copy"), py["torch_d2h"]
gbps = lambda x: x["bytes"] / x["seconds"] / 1e9
torch_line = f"torch cudaMemcpy D2H of {t['bytes']} bytes into pinned memory (best of 5): {gbps(t):.2f} GB/s"
if not a or not a.get("seconds"):
    print("FAIL: agent copy time: the dump's dump.json has no \"copy\" figure (dist/ older than this script?)")
    print("INFO: " + torch_line)
    sys.exit(1)
print(f"INFO: agent copy, GPU -> host memory, of {a['bytes']} bytes ({py['regions']} regions x {py['blocks']} scattered blocks, one dump, "
      f"first use: pinned chunks allocated and host buffers faulted in): {a['seconds'] * 1e3:.1f} ms, {gbps(a):.2f} GB/s")
print("INFO: " + torch_line)
print(f"INFO: agent / torch bandwidth: {gbps(a) / gbps(t):.2f}" + ("" if a["bytes"] == t["bytes"] else " (byte counts differ!)"))
sys.exit(0 if m.get("complete") and all(s == "PASS" for s, _ in out["python"]["checks"]) else 1)
PYEOF
