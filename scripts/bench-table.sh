#!/usr/bin/env bash
# Every bench once, in one sequence, on one commit: the run behind docs/benchmarks.md's table.
# Each line of OUT is one bench's JSON result with its provenance (commit, start, seconds, load
# average before and after). Needs root for the network-namespace aggregate bench.
#   bash scripts/bench-table.sh [OUT]        (default: bench-table.jsonl; about an hour on 2 cores)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench-table.jsonl}"
: >"$out"
run() {
  echo "== wavebus bench $*" >&2
  if ! node bin/wavebus.js bench "$@" --json >>"$out"; then
    echo "{\"bench\":\"$1\",\"failed\":true,\"args\":\"$*\"}" >>"$out"
  fi
}
run bus --agents 8
run overhead --forward-ms 3 --rounds 5 --lookahead-waves 3 --cpu-window --syscalls
run overhead --ranks 8 --forward-ms 3 --rounds 1 --steps 1000 --lookahead-waves 3 --cpu-window --syscalls
run overhead --forward-ms 1 --rounds 5 --lookahead-waves 3
run overhead --engine python --running 1024 --forward-ms 3 --rounds 3 --lookahead-waves 3 --cpu-window
run overhead --engine python --running 1024 --forward-ms 3 --rounds 1 --steps 400 --lookahead-waves 3 --no-seed-baseline --cpu-window --rank-divergence
run client --lang python --requests 1,64,256,1024,4096
run client --lang ts --requests 1,64,256,1024,4096
run client --lang python --requests 1024,4096 --forward spin
run client --lang ts --requests 1024,4096 --forward spin
run transformers
run rank-digest
run detectors --requests 1024
run dump --size-mb 256 --format all --runs 3
run aggregate --size-mb 64
run aggregate --netns --runs 3
run auth
run recorder
run fuzz --frames 100000
run soak --agents 64 --waves 10000 --dp 2
echo "results: $out" >&2
