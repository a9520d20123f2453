#!/usr/bin/env bash
# Runs `go test -race` on the given packages once per Redis-compatible server
# in SERVERS (each a folder with redis-server, redis-sentinel and redis-cli,
# see its README), with that server first on PATH, then the root package's
# tests that ROOT_RUN matches (none when it is empty). Where SERVERS does not
# exist it says so and passes: a user's clone has no such folder.
#
# Usage: [ROOT_RUN=regexp] scripts/test-servers.sh SERVERS PACKAGE...
set -euo pipefail

servers=$1
shift
go=${GO:-go}

if [ ! -d "$servers" ]; then
	echo "test-servers: no $servers, skipped"
	exit 0
fi

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT

# program DIR NAME prints the program DIR/NAME stands for: itself, or, where a
# copy turned the link into a file holding its target's name, that target.
program() {
	local path=$1/$2
	if [ -x "$path" ]; then
		echo "$path"
	elif [ -f "$path" ] && [ "$(wc -c <"$path")" -lt 256 ] && [ -x "$1/$(cat "$path")" ]; then
		echo "$1/$(cat "$path")"
	else
		echo "test-servers: $path is neither a program nor a link to one" >&2
		return 1
	fi
}

found=0
for dir in "$servers"/*/; do
	dir=$(cd "$dir" && pwd)
	[ -e "$dir/redis-server" ] || continue
	found=1
	# Links under the standard names: redis-sentinel must keep its name,
	# which tells the server to run as a sentinel.
	rm -f "$bin"/*
	for name in redis-server redis-sentinel redis-cli; do
		ln -s "$(program "$dir" "$name")" "$bin/$name"
	done
	version=$(PATH="$bin:$PATH" redis-server --version)
	echo "== $(basename "$dir"): $version"
	PATH="$bin:$PATH" "$go" test -race -count=1 -p 1 "$@"
	if [ -n "${ROOT_RUN:-}" ]; then
		PATH="$bin:$PATH" "$go" test -race -count=1 -run "$ROOT_RUN" .
	fi
done
if [ "$found" = 0 ]; then
	echo "test-servers: no server folder with a redis-server in $servers" >&2
	exit 1
fi
