#!/usr/bin/env bash
# The unit prices of this host: a system call, a clock read, a wake-up round trip between two
# processes (scripts/host-costs.c). One JSON line; run it beside a bench to read its figures.
#   bash scripts/host-costs.sh
set -euo pipefail
bin="$(mktemp -d)/host-costs"
trap 'rm -rf "$(dirname "$bin")"' EXIT
cc -O1 -o "$bin" "$(dirname "$0")/host-costs.c"
"$bin"
