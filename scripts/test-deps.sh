#!/usr/bin/env bash
# Installs what Berth's tests need on a fresh Debian/Ubuntu machine, and nothing that is already
# there: PostgreSQL server binaries (the tests start their own private cluster), Node/npm for the
# front-end packages, git, Chromium for the browser tests, bubblewrap for the jail,
# openssh-server for the ssh driver's tests, and podman, runc and docker-registry for the
# environment plugins' tests. Needs root (or sudo) only when
# something is missing.
set -euo pipefail

need=()
have_pg() {
  command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ] && return 0
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}
have_pg || need+=(postgresql)
command -v npm >/dev/null 2>&1 || need+=(nodejs npm)
command -v git >/dev/null 2>&1 || need+=(git)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# Every command Berth runs goes through a bubblewrap jail; the ssh driver's tests start sshd.
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
# Environment plugins (environment/plugin*, cmd/berth-driver-podman, oci): rootful podman with runc
# (Debian's crun 1.8 refuses hosts whose cgroups are in hybrid mode), a registry to run on
# loopback, and protoc to regenerate the driver protocol (scripts/gen-proto.sh).
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)

# npm tools of the tests, version-pinned, in a 0755 directory outside /root and /tmp (so the
# jail's berth-run user can read it; BERTH_TEST_NPM moves it): Vite for the preview test
# (handlers/preview_vite_test.go) and the MCP Inspector, a real MCP client, for the MCP test
# (cmd/berth/mcp_inspector_test.go).
vite_version=8.4.0
inspector_version=2.12.0
npm_version_of() {
  node -p "require('$1/node_modules/$2/package.json').version" 2>/dev/null
}
install_vite() {
  local dir=${BERTH_TEST_NPM:-/var/tmp/berth-test-npm}
  local want=()
  [ "$(npm_version_of "$dir" vite)" = "$vite_version" ] || want+=("vite@$vite_version")
  [ "$(npm_version_of "$dir" @modelcontextprotocol/inspector)" = "$inspector_version" ] ||
    want+=("@modelcontextprotocol/inspector@$inspector_version")
  [ ${#want[@]} -eq 0 ] && return 0
  echo "test-deps: npm install ${want[*]} into $dir"
  mkdir -p "$dir" && chmod 0755 "$dir"
  (umask 022 && npm install --prefix "$dir" --no-audit --no-fund --silent "${want[@]}")
}

if [ ${#need[@]} -eq 0 ]; then
  install_vite
  exit 0
fi
echo "test-deps: installing ${need[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "test-deps: need root to install ${need[*]}" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
install_vite
