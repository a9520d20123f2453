#!/usr/bin/env bash
# Makes sure the clients the AI gateway test runs are there: node and npm
# (the Debian/Ubuntu packages, installed when missing) and the official
# OpenAI and Anthropic SDKs at the versions of testdata/llmsdk/package-lock.json
# (npm ci). Where npm cannot reach its registry, it says so and exits 0: the
# test then skips its SDK part with that reason.
#
# Usage: scripts/ensure-node-sdks.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
sdks="$here/../testdata/llmsdk"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	bash "$here/install-packages.sh" nodejs npm
fi

if [ -d "$sdks/node_modules/openai" ] && [ -d "$sdks/node_modules/@anthropic-ai/sdk" ] &&
	[ "$sdks/node_modules/.package-lock.json" -nt "$sdks/package-lock.json" ]; then
	exit 0
fi
if ! (cd "$sdks" && npm ci --no-audit --no-fund --loglevel=error); then
	echo "ensure-node-sdks.sh: npm ci failed (no registry?): the SDK tests will skip" >&2
fi
