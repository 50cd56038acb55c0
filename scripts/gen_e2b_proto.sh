#!/usr/bin/env bash
# Regenerate execbox's envd protobuf + Connect layer from the vendored .proto files (E2B's envd
# interface definitions, spec/envd/ in e2b-dev/E2B). Needs a throwaway venv with the generators:
#   python3 -m venv /tmp/gen && /tmp/gen/bin/pip install grpcio-tools \
#       protoc-gen-py==0.6.0 protoc-gen-connectrpc==0.12.1
# (grpcio-tools pulls a newer google protobuf than the service pins, hence the separate venv.)
set -euo pipefail
GEN_VENV=${GEN_VENV:-/tmp/gen}
here=$(cd "$(dirname "$0")/.." && pwd)
pkg="$here/src/execbox/service/e2b_compat"
PATH="$GEN_VENV/bin:$PATH" "$GEN_VENV/bin/python" -m grpc_tools.protoc -I "$pkg/proto" \
    --py_out="$pkg/envd_gen" --connectrpc_out="$pkg/envd_gen" \
    process/process.proto filesystem/filesystem.proto
touch "$pkg/envd_gen/__init__.py" "$pkg/envd_gen/process/__init__.py" "$pkg/envd_gen/filesystem/__init__.py"
