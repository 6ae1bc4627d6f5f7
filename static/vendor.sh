#!/usr/bin/env bash
# vendor.sh installs the pinned npm packages (package-lock.json) and copies
# their browser builds into static/vendor/, where static.go embeds them.
# It is idempotent and cheap when nothing changed: the Makefile runs it
# before every go build and go test.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"

# npm keeps its own record of the installed tree in node_modules/.package-lock.json;
# reinstall when it is missing or older than the committed lockfile.
if [[ ! -d node_modules || package-lock.json -nt node_modules/.package-lock.json ]]; then
	if ! command -v npm >/dev/null 2>&1; then
		echo "vendor.sh: npm not found; install Node.js (npm) to build the front-end assets" >&2
		exit 1
	fi
	npm ci --no-audit --no-fund --loglevel=error
	touch -c node_modules/.package-lock.json
fi

# source in node_modules -> name in vendor/
files=(
	"node_modules/htmx.org/dist/htmx.min.js:htmx.min.js"
	"node_modules/htmx-ext-sse/dist/sse.min.js:htmx-ext-sse.min.js"
	"node_modules/@xterm/xterm/lib/xterm.js:xterm.js"
	"node_modules/@xterm/xterm/css/xterm.css:xterm.css"
	"node_modules/@xterm/addon-fit/lib/addon-fit.js:addon-fit.js"
)

mkdir -p vendor
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

keep=(.gitkeep)
for entry in "${files[@]}"; do
	src="${entry%%:*}"
	name="${entry##*:}"
	if [[ ! -f "$src" ]]; then
		echo "vendor.sh: $src is missing; did a package change its layout?" >&2
		exit 1
	fi
	# Drop sourceMappingURL comments: the maps are not shipped, and the
	# browser would ask for an unhashed name that the handler answers with 404.
	sed '/^\/[/*]# sourceMappingURL=/d' "$src" >"$tmp/$name"
	# Rewrite only on change so repeated runs leave vendor/ untouched.
	if ! cmp -s "$tmp/$name" "vendor/$name"; then
		mv "$tmp/$name" "vendor/$name"
		chmod 0644 "vendor/$name"
	fi
	keep+=("$name")
done
[[ -e vendor/.gitkeep ]] || : >vendor/.gitkeep

# Remove anything else, so a renamed or dropped file does not linger in the embed.
for path in vendor/* vendor/.[!.]*; do
	[[ -e "$path" ]] || continue
	base="${path#vendor/}"
	stale=1
	for k in "${keep[@]}"; do
		[[ "$base" == "$k" ]] && stale=0 && break
	done
	if ((stale)); then
		rm -rf -- "$path"
	fi
done
