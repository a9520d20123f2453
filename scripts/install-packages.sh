#!/usr/bin/env bash
# Installs Debian/Ubuntu packages with apt-get: directly when root, through sudo
# when not. Elsewhere it fails with a message (callers add how to install by hand):
# guessing another package manager's names would be worse.
#
# Usage: scripts/install-packages.sh PACKAGE...
set -euo pipefail

if [ "$#" -eq 0 ]; then
	exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
	echo "error: apt-get not found, so these packages cannot be installed automatically: $*" >&2
	exit 1
fi

# env sets DEBIAN_FRONTEND for apt-get itself (sudo's env_reset would drop an
# exported one); noninteractive because CI has no stdin for debconf prompts.
if [ "$(id -u)" -eq 0 ]; then
	as_root=(env)
elif command -v sudo >/dev/null 2>&1; then
	as_root=(sudo env)
else
	echo "error: not root and sudo is not installed, so apt-get cannot install: $*" >&2
	exit 1
fi

echo "Installing with apt-get: $*"
if ! "${as_root[@]}" DEBIAN_FRONTEND=noninteractive apt-get update -qq ||
	! "${as_root[@]}" DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; then
	echo "error: apt-get could not install: $*" >&2
	exit 1
fi
