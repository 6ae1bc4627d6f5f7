#!/usr/bin/env bash
# Installs WeTTY (npm wetty: xterm.js + node-pty), the peer web terminal make bench measures
# Berth's bridge against, into a cache directory outside the repository, and prints that
# directory (the benchmarks find it in BERTH_BENCH_WETTY). An install that is already there is
# reused. node-pty compiles with node-gyp when npm has no prebuilt binary for this machine
# (python3, make and g++). On failure it says why on stderr and exits non-zero; make bench then
# reports Berth against the raw pty only.
set -euo pipefail
version=3.2.0
dir=${BERTH_BENCH_WETTY_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/berth-bench/wetty-$version}

works() {
  [ "$(node -p "require('$dir/node_modules/wetty/package.json').version" 2>/dev/null)" = "$version" ] &&
    (cd "$dir" && node -e "require('node-pty')" 2>/dev/null)
}

command -v node >/dev/null 2>&1 || { echo "bench-wetty: node is not installed (make deps installs it)" >&2; exit 1; }
if ! works; then
  echo "bench-wetty: installing wetty@$version into $dir" >&2
  mkdir -p "$dir"
  [ -f "$dir/package.json" ] || echo '{"name":"berth-bench-wetty","private":true}' >"$dir/package.json"
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error "wetty@$version" >&2)
  # npm may leave install scripts unrun: build node-pty's binding when it did not load.
  works || (cd "$dir" && npm rebuild node-pty --foreground-scripts >&2) || true
  works || { echo "bench-wetty: wetty@$version is installed in $dir but node-pty does not load" >&2; exit 1; }
fi
echo "$dir"
