#!/usr/bin/env bash
# screenshots.sh takes the screenshots docs/pages.md shows (project, task, run and workspace
# pages at 1400 and 390 px) from a fresh demo install in headless Chromium, into docs/screenshots/.
# Needs what the browser tests need (make deps: chromium, PostgreSQL, bubblewrap).
set -euo pipefail
cd "$(dirname "$0")/.."
./static/vendor.sh
BERTH_DOCS_SCREENSHOTS="$PWD/docs/screenshots" go test -count=1 -run TestDocsScreenshots -v ./cmd/berth/ | grep -E 'wrote|PASS|FAIL|ok'
