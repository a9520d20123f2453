#!/usr/bin/env bash
# Makes sure the clients the SDK tests run are there: node and npm (the
# Debian/Ubuntu packages, installed when missing) and the official SDKs of
# testdata/llmsdk/package.json at the versions of its package-lock.json
# (npm ci): OpenAI (openai), Anthropic (@anthropic-ai/sdk), Gemini
# (@google/genai), Ollama (ollama) and Bedrock
# (@aws-sdk/client-bedrock-runtime, with @smithy/node-http-handler). Where
# npm cannot reach its registry, it says so and exits 0: the tests then
# skip their SDK part with that reason, except in CI (CI=true), where they
# fail.
#
# Usage: scripts/ensure-node-sdks.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
sdks="$here/../testdata/llmsdk"
packages=(openai @anthropic-ai/sdk @google/genai ollama @aws-sdk/client-bedrock-runtime @smithy/node-http-handler)

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	bash "$here/install-packages.sh" nodejs npm
fi

installed() {
	local pkg
	for pkg in "${packages[@]}"; do
		[ -f "$sdks/node_modules/$pkg/package.json" ] || return 1
	done
	[ "$sdks/node_modules/.package-lock.json" -nt "$sdks/package-lock.json" ]
}

if installed; then
	exit 0
fi
if ! (cd "$sdks" && npm ci --no-audit --no-fund --loglevel=error); then
	echo "ensure-node-sdks.sh: npm ci failed (no registry?): the SDK tests will skip (and fail in CI)" >&2
	exit 0
fi
for pkg in "${packages[@]}"; do
	if [ ! -f "$sdks/node_modules/$pkg/package.json" ]; then
		echo "ensure-node-sdks.sh: npm ci did not install $pkg: is it in testdata/llmsdk/package.json?" >&2
		exit 1
	fi
done
