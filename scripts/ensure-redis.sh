#!/usr/bin/env bash
# Makes sure the Redis programs the tests and `make run` use are on PATH, installing
# the Debian/Ubuntu packages that provide them when they are missing. The tests
# start their own redis-server / redis-sentinel processes on free ports, so a Redis
# service the package may have started on 6379 is neither needed nor in the way.
#
# Usage: scripts/ensure-redis.sh [PROGRAM...]
#   default programs: redis-server redis-cli redis-sentinel
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [ "$#" -eq 0 ]; then
	set -- redis-server redis-cli redis-sentinel
fi

# The Debian/Ubuntu package that provides each program.
package_of() {
	case "$1" in
	redis-server) echo redis-server ;;
	redis-cli) echo redis-tools ;;
	redis-sentinel) echo redis-sentinel ;;
	*)
		echo "ensure-redis.sh: unknown program '$1'" >&2
		return 1
		;;
	esac
}

missing_programs=()
missing_packages=()
for prog in "$@"; do
	pkg="$(package_of "$prog")"
	if ! command -v "$prog" >/dev/null 2>&1; then
		missing_programs+=("$prog")
		missing_packages+=("$pkg")
	fi
done

if [ "${#missing_programs[@]}" -eq 0 ]; then
	exit 0
fi

echo "Not found on PATH: ${missing_programs[*]}"
if ! bash "$here/install-packages.sh" "${missing_packages[@]}"; then
	cat >&2 <<EOF
error: could not install ${missing_programs[*]}.
  Debian/Ubuntu:    sudo apt-get update && sudo apt-get install -y ${missing_packages[*]}
  macOS (Homebrew): brew install redis
  Fedora/RHEL:      sudo dnf install redis
EOF
	exit 1
fi

# An install that "worked" but left a program off PATH would only fail later, less clearly.
for prog in "${missing_programs[@]}"; do
	if ! command -v "$prog" >/dev/null 2>&1; then
		echo "error: $prog is still not on PATH after installing ${missing_packages[*]}." >&2
		exit 1
	fi
done
echo "Installed: ${missing_programs[*]}"
