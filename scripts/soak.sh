#!/usr/bin/env bash
# make soak: SOAK_MINUTES (default 10) of mixed runs against a real `berth serve` and
# `berth worker` on the embedded PostgreSQL, SIGKILLing the worker and the postmaster at random,
# then the four counts of issue 13 (see docs/soak.md). Extra arguments go to cmd/berth-soak
# (e.g. -keep, -seed N, -settle 5m). Needs bin/berth (make build), the PostgreSQL server
# binaries and bubblewrap (make deps installs both).
set -euo pipefail
cd "$(dirname "$0")/.."
export SOAK_MINUTES="${SOAK_MINUTES:-10}"
if [[ ! -x bin/berth ]]; then
	echo "bin/berth is missing: run make build" >&2
	exit 1
fi
command -v bwrap >/dev/null || { echo "bubblewrap (bwrap) is missing: run make deps" >&2; exit 1; }
go build -o bin/berth-soak ./cmd/berth-soak
exec ./bin/berth-soak -berth bin/berth "$@"
