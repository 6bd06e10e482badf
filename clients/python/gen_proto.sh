#!/usr/bin/env bash
# Regenerate wavebus_client/wavebus_pb2.py from proto/wavebus.proto (protoc 3.21, Debian's
# protobuf-compiler). Usage: clients/python/gen_proto.sh [OUT_DIR]  (default: the package).
# test/python-client.test.ts runs this into a temp dir and checks it equals the committed file.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$here/wavebus_client}"
mkdir -p "$out"
protoc -I "$root/proto" --python_out="$out" "$root/proto/wavebus.proto"
