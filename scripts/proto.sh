#!/usr/bin/env bash
# Regenerates the Go code of shared/pluginproto (the protocol package of the SDK
# module, shared/go.mod) and the Python SDK's code
# (sdk/python/switchyard_plugin/_pb) from the .proto files, installing what it
# needs: protoc and grpc_python_plugin from Debian (protobuf-compiler,
# protobuf-compiler-grpc) and the pinned Go plugins through the Go module
# proxy. With --check it regenerates into a temporary tree and fails when the
# committed code differs (stale) or is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PROTOC_GEN_GO=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC=google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2

scripts/apt-install.sh protobuf-compiler protobuf-compiler-grpc
bin="$(pwd)/bin/proto-tools"
mkdir -p "$bin"
GOBIN="$bin" go install "$PROTOC_GEN_GO"
GOBIN="$bin" go install "$PROTOC_GEN_GO_GRPC"
export PATH="$bin:$PATH"

proto=shared/pluginproto
out=$proto
if [ "${1:-}" = "--check" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
protos=$(cd "$proto" && find . -name '*.proto' | sort)
(cd "$proto" && protoc --proto_path=. \
  --go_out="paths=source_relative:$( [ "$out" = "$proto" ] && echo . || echo "$out")" \
  --go-grpc_out="paths=source_relative:$( [ "$out" = "$proto" ] && echo . || echo "$out")" \
  $protos)

# The Python SDK's modules: plugin.proto, and the vendored gRPC health and
# go-plugin controller protos of sdk/python/proto, all mapped into the
# package switchyard_plugin._pb so the generated imports resolve inside it.
pyout=sdk/python
if [ "${1:-}" = "--check" ]; then
  pyout="$out/py"
  mkdir -p "$pyout"
fi
pb=switchyard_plugin/_pb
protoc -I"$pb=$proto/switchyard/plugin/v1" -I"$pb=sdk/python/proto" \
  --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" \
  --python_out="$pyout" --grpc_python_out="$pyout" \
  "$pb/plugin.proto" "$pb/health.proto" "$pb/grpc_controller.proto"

if [ "${1:-}" = "--check" ]; then
  status=0
  for f in $(cd "$out" && find . -name '*.go' | sort); do
    if ! cmp -s "$out/$f" "$proto/$f"; then
      echo "stale generated code: $proto/${f#./} (run make proto)" >&2
      status=1
    fi
  done
  for f in $(cd "$pyout" && find . -name '*.py' | sort); do
    if ! cmp -s "$pyout/$f" "sdk/python/$f"; then
      echo "stale generated code: sdk/python/${f#./} (run make proto)" >&2
      status=1
    fi
  done
  exit $status
fi
