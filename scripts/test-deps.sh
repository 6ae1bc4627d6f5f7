#!/usr/bin/env bash
# Installs what Berth's tests need on a fresh Debian/Ubuntu machine, and nothing that is already
# there: PostgreSQL server binaries (the tests start their own private cluster), Node/npm for the
# front-end packages, git, Chromium for the browser tests, bubblewrap for the jail and
# openssh-server for the ssh driver's tests. Needs root (or sudo) only when
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

if [ ${#need[@]} -eq 0 ]; then
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
