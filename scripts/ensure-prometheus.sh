#!/usr/bin/env bash
# Makes sure prometheus and promtool, which the monitoring tests run (the
# rules' unit tests, and a Prometheus scraping a test Caddy), are on PATH,
# installing Debian's prometheus package (it has both) when they are missing.
# The package may start a Prometheus service on :9090; the tests start their
# own on free ports and never use one they did not start.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

missing=()
for prog in prometheus promtool; do
	command -v "$prog" >/dev/null 2>&1 || missing+=("$prog")
done
if [ "${#missing[@]}" -eq 0 ]; then
	exit 0
fi

echo "Not found on PATH: ${missing[*]}"
if ! bash "$here/install-packages.sh" prometheus; then
	cat >&2 <<EOT
error: could not install ${missing[*]}.
  Debian/Ubuntu:    sudo apt-get update && sudo apt-get install -y prometheus
  macOS (Homebrew): brew install prometheus
  Elsewhere:        https://prometheus.io/download/ (both programs are in the tarball)
EOT
	exit 1
fi

for prog in "${missing[@]}"; do
	if ! command -v "$prog" >/dev/null 2>&1; then
		echo "error: $prog is still not on PATH after installing prometheus." >&2
		exit 1
	fi
done
echo "Installed: ${missing[*]}"
