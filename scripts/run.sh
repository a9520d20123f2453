#!/usr/bin/env bash
# Runs the freshly built ./caddy with Caddyfile.example, or with the Caddyfile that
# $CADDYFILE names (`make run` builds it first; `CADDYFILE=my.Caddyfile make run`).
# Caddyfile.example serves 127.0.0.1:8080, its admin API on localhost:2019.
# Which Redis, in order:
#   1. $REDIS_URL, if it is set and answers PING;
#   2. a throw-away redis-server started here on 127.0.0.1:6379, or on a free port from
#      20000 to 49999 when 6379 is taken (no persistence), stopped on exit;
#   3. none: REDIS_URL is left empty and the module uses its in-process store.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

CADDYFILE="${CADDYFILE:-Caddyfile.example}"

if [ ! -x ./caddy ]; then
	echo "error: ./caddy not found; build it with 'make build' (or use 'make run')." >&2
	exit 1
fi
if [ ! -f "$CADDYFILE" ]; then
	echo "error: $CADDYFILE not found." >&2
	exit 1
fi

# Shows a Redis URL without its password.
redact() {
	sed -E 's#(://)[^@/]*@#\1***@#' <<<"$1"
}

# True if something accepts TCP connections on 127.0.0.1:$1 (bash's /dev/tcp: no extra tools).
port_in_use() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Runs a command with a time limit where coreutils' timeout exists (macOS has none),
# so a Redis address that swallows packets cannot hang the start.
with_timeout() {
	if command -v timeout >/dev/null 2>&1; then
		timeout "$@"
	else
		shift
		"$@"
	fi
}

# True if the Redis on 127.0.0.1:$1 answers PING.
redis_port_ping() {
	[ "$(with_timeout 2 redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = PONG ]
}

redis_pid=""
caddy_pid=""
redis_dir=""

cleanup() {
	trap - EXIT INT TERM
	# Ctrl-C may also have ended a pager or `| tee` reading our output: a write to
	# it must not kill us (SIGPIPE) before Redis is stopped and its folder removed.
	trap '' PIPE
	if [ -n "$caddy_pid" ] && kill -0 "$caddy_pid" 2>/dev/null; then
		kill -TERM "$caddy_pid" 2>/dev/null || true
		wait "$caddy_pid" 2>/dev/null || true
	fi
	if [ -n "$redis_pid" ] && kill -0 "$redis_pid" 2>/dev/null; then
		echo "Stopping the local redis-server (pid $redis_pid)." 2>/dev/null || true
		kill -TERM "$redis_pid" 2>/dev/null || true
		wait "$redis_pid" 2>/dev/null || true
	fi
	if [ -n "$redis_dir" ]; then
		rm -rf "$redis_dir"
	fi
}

# Starts redis-server on 127.0.0.1:$1 in the background; true once it answers PING.
start_redis_on() {
	local port="$1"
	# A config file rather than flags: `save ""` as a command-line argument is
	# handled differently across Redis versions.
	cat >"$redis_dir/redis.conf" <<EOF
bind 127.0.0.1
port $port
save ""
appendonly no
dir "$redis_dir"
logfile "$redis_dir/redis.log"
daemonize no
EOF
	redis-server "$redis_dir/redis.conf" &
	redis_pid=$!
	for _ in $(seq 1 50); do
		if redis_port_ping "$port"; then
			return 0
		fi
		if ! kill -0 "$redis_pid" 2>/dev/null; then
			break
		fi
		sleep 0.1
	done
	# Did not come up (most likely someone took the port first): clean up, let the caller retry.
	kill -TERM "$redis_pid" 2>/dev/null || true
	wait "$redis_pid" 2>/dev/null || true
	redis_pid=""
	return 1
}

# Starts a local redis-server on 6379 if free, else on a free port; sets REDIS_URL.
start_local_redis() {
	local port
	redis_dir="$(mktemp -d -t sliding-ratelimit-redis.XXXXXX)"
	trap cleanup EXIT
	trap 'cleanup; exit 130' INT
	trap 'cleanup; exit 143' TERM
	port=6379
	for _ in $(seq 1 20); do
		if ! port_in_use "$port" && start_redis_on "$port"; then
			REDIS_URL="redis://127.0.0.1:$port"
			return 0
		fi
		# Below 55535 so the same port choice also works for a Redis Cluster bus (port+10000).
		port=$((20000 + RANDOM % 30000))
	done
	echo "warning: could not start a local redis-server; last log:" >&2
	tail -n 5 "$redis_dir/redis.log" >&2 2>/dev/null || true
	cleanup
	redis_dir=""
	return 1
}

redis_note=""
url_given="${REDIS_URL:-}"
REDIS_URL=""

if [ -n "$url_given" ]; then
	if ! command -v redis-cli >/dev/null 2>&1; then
		bash scripts/ensure-redis.sh redis-cli || true
	fi
	if ! command -v redis-cli >/dev/null 2>&1; then
		# Cannot check it; the user asked for it, so use it as given.
		REDIS_URL="$url_given"
		redis_note="from \$REDIS_URL (not checked: redis-cli is not installed)"
	elif [ "$(with_timeout 5 redis-cli -u "$url_given" ping 2>/dev/null)" = PONG ]; then
		REDIS_URL="$url_given"
		redis_note="from \$REDIS_URL"
	else
		echo "warning: \$REDIS_URL=$(redact "$url_given") does not answer PING; falling back to a local redis-server." >&2
	fi
fi

if [ -z "$REDIS_URL" ]; then
	if bash scripts/ensure-redis.sh redis-server redis-cli && start_local_redis; then
		redis_note="local redis-server started by this script (pid $redis_pid, no persistence), stopped on exit"
	else
		REDIS_URL=""
		redis_note="no redis-server available: REDIS_URL is empty, so the module uses its in-process store (this instance only)"
	fi
fi

export REDIS_URL

# What Caddyfile.example serves; another Caddyfile says its own addresses.
serves=""
try="the addresses $CADDYFILE serves"
if [ "$CADDYFILE" = Caddyfile.example ]; then
	serves=" (serves http://localhost:8080; admin API on localhost:2019)"
	try="for i in \$(seq 1 12); do curl -si http://localhost:8080/api/hello | grep -iE '^(HTTP|Retry-After|RateLimit)'; done"
fi

cat <<EOF

=== sliding_ratelimit demo ===
Redis:  ${REDIS_URL:+$(redact "$REDIS_URL") - }${redis_note}
Config: $CADDYFILE${serves}
Try:    ${try}
Stop:   Ctrl-C

EOF

if [ -z "$redis_pid" ]; then
	# Nothing of ours to clean up: let caddy take over the process (signals go straight to it).
	exec ./caddy run --config "$CADDYFILE" --adapter caddyfile
fi

# Caddy runs in the background and we `wait`, because a trapped signal interrupts
# `wait` at once but not a foreground child; the trap then stops Caddy and Redis.
./caddy run --config "$CADDYFILE" --adapter caddyfile &
caddy_pid=$!
status=0
wait "$caddy_pid" || status=$?
caddy_pid=""
exit "$status"
