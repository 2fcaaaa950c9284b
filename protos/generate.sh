#!/usr/bin/env bash
# Generates the Python stubs (messages, gRPC and mypy type stubs) for every
# proto under protos/ into services/attestpb/ (or into $1, which is how CI
# checks that the committed stubs are current).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/services/attestpb}"
py="${PYTHON:-$root/.venv/bin/python}"
# protoc finds the mypy plugins on PATH, next to the interpreter.
export PATH="$(dirname "$py"):$PATH"
rm -rf "$out/attest"
mkdir -p "$out"
cd "$root/protos"
mapfile -t files < <(find attest -name '*.proto' | sort)
"$py" -m grpc_tools.protoc -I . \
  --python_out="$out" --grpc_python_out="$out" \
  --mypy_out="$out" --mypy_grpc_out="$out" \
  "${files[@]}"
# Every generated directory becomes a namespace-package portion, so
# attest.<service>.v1 merges with the hand-written attest.<service> package
# without rewriting any import.
find "$out/attest" -name '__init__.py' -delete
find "$out/attest" -type d -empty -delete
echo "generated ${#files[@]} protos into ${out#"$root"/}"
