#!/usr/bin/env bash
# Regenerates the driver protocol's Go code (environment/driverpb) from driver.proto. Needs protoc
# (apt protobuf-compiler); the Go generators are pinned here and built from the module proxy.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
GOBIN=$bin go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
GOBIN=$bin go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.3.0
PATH=$bin:$PATH protoc --proto_path=environment/driverpb \
  --go_out=environment/driverpb --go_opt=paths=source_relative \
  --go-grpc_out=environment/driverpb --go-grpc_opt=paths=source_relative \
  environment/driverpb/driver.proto
