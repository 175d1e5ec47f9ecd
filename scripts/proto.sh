#!/usr/bin/env bash
# Regenerates pluginproto's Go code from its .proto files, installing what it
# needs: protoc from Debian (protobuf-compiler) and the pinned Go plugins
# through the Go module proxy. With --check it regenerates into a temporary
# tree and fails when the committed code differs (stale).
set -euo pipefail
cd "$(dirname "$0")/.."

PROTOC_GEN_GO=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC=google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2

if ! command -v protoc >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq protobuf-compiler >/dev/null
  fi
fi
bin="$(pwd)/bin/proto-tools"
mkdir -p "$bin"
GOBIN="$bin" go install "$PROTOC_GEN_GO"
GOBIN="$bin" go install "$PROTOC_GEN_GO_GRPC"
export PATH="$bin:$PATH"

out=pluginproto
if [ "${1:-}" = "--check" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
protos=$(cd pluginproto && find . -name '*.proto' | sort)
(cd pluginproto && protoc --proto_path=. \
  --go_out="paths=source_relative:$( [ "$out" = pluginproto ] && echo . || echo "$out")" \
  --go-grpc_out="paths=source_relative:$( [ "$out" = pluginproto ] && echo . || echo "$out")" \
  $protos)

if [ "${1:-}" = "--check" ]; then
  status=0
  for f in $(cd "$out" && find . -name '*.go' | sort); do
    if ! cmp -s "$out/$f" "pluginproto/$f"; then
      echo "stale generated code: pluginproto/$f (run make proto)" >&2
      status=1
    fi
  done
  exit $status
fi
