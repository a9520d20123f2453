# Developer entry points. `make run` and `make test` set up what they need
# (redis-server etc.) on a fresh machine that has Go.

GO ?= go
GOFMT ?= $(shell $(GO) env GOROOT)/bin/gofmt

MODULE := github.com/slidingratelimit/caddy-sliding-ratelimit
CADDY_VERSION ?= v2.11.9
XCADDY := github.com/caddyserver/xcaddy/cmd/xcaddy@v0.4.5
# xcaddy runs `go get MODULE`, which the module proxy refuses for an unpublished
# module; pinning the zero pseudo-version makes it use only the local replacement.
MODULE_PIN := $(MODULE)@v0.0.0-00010101000000-000000000000

# Rebuild ./caddy only when the module's sources change (bench/ is its own module).
SOURCES := $(shell find . -name '*.go' -not -path './bench/*' -not -path './.git/*') \
	go.mod go.sum $(wildcard limiter/*.lua)

.PHONY: all build run test test-servers test-loaded fuzz vet lint fmt fmt-check check-build clean help bench soak

all: build

help:
	@echo "make build        build ./caddy with this module (xcaddy)"
	@echo "make run          build, then run Caddyfile.example on :8080 with a Redis (see scripts/run.sh)"
	@echo "make test         install redis-server, prometheus and the LLM SDKs (npm) if needed, go vet, go test -race, and bench/'s tests"
	@echo "make test-servers the tests that talk to Redis again on each server in ../shared/servers (Valkey 8, Redis 8), when it exists"
	@echo "make test-loaded  the budget and exactness tests, 3 times each with -race, while busy loops keep every CPU busy (LOADED_COUNT=n)"
	@echo "make check-build  build and check ./caddy lists http.handlers.sliding_ratelimit"
	@echo "make fuzz         fuzz the Caddyfile parser and the key builder (FUZZTIME=50000x each)"
	@echo "make fmt-check    fail if gofmt would change a file; make fmt fixes them"
	@echo "make lint         go vet"
	@echo "make clean        remove ./caddy"
	@echo "make bench        limiter vs plain Caddy with wrk and Redis; writes BENCHMARKS.md and the figures docs quote (BENCH_FLAGS=-quick: smoke test)"
	@echo "make soak         10 minutes of load with reloads and Redis restarts, then Sentinel failovers and a connection storm; writes SOAK.md (SOAK_DURATION=2m: shorter)"

build: caddy

caddy: $(SOURCES)
	$(GO) run $(XCADDY) build $(CADDY_VERSION) --with $(MODULE_PIN)=. --output ./caddy

run: build
	bash scripts/run.sh

test:
	bash scripts/ensure-redis.sh
	bash scripts/ensure-prometheus.sh
	bash scripts/ensure-node-sdks.sh
	$(GO) vet ./...
	# The soak test builds only with its tag: vet keeps it compiling.
	$(GO) vet -tags soak .
	# One package's tests at a time (-p 1): the fault tests hold decisions to a
	# 100ms timeout, and on two CPUs the limiter package's model tests running
	# beside them slow a burst of requests past it. Compiled first in parallel.
	$(GO) build -race ./...
	$(GO) test -race -count=1 -p 1 -timeout 30m ./...
	# bench/ is a module of its own: its tools' tests (each starts its own Redis).
	cd bench && $(GO) vet ./... && $(GO) test -count=1 ./...

# The tests that talk to Redis, run again on each Redis-compatible server
# built in SERVERS (Valkey 8, Redis 8: see its README), each first on PATH,
# so that everything that starts redis-server starts it. Where SERVERS does
# not exist (a user's clone) it says so and passes: `make test` never needs
# it. SERVER_TESTS: the packages; SERVER_ROOT_RUN: the root package's tests
# (those of Redis itself: its topologies, failures and settings), about a
# minute each. About 5 minutes a server on two cores.
SERVERS ?= ../shared/servers
SERVER_TESTS ?= ./limiter/ ./internal/redisconn/ ./internal/redistest/
SERVER_ROOT_RUN ?= ^(TestRedis|TestFailover|TestSentinel|TestCluster|TestLostScript)
test-servers:
	GO='$(GO)' ROOT_RUN='$(SERVER_ROOT_RUN)' bash scripts/test-servers.sh $(SERVERS) $(SERVER_TESTS)

# A flaky budget shows only on a loaded host: scripts/test-loaded.sh says
# which tests, and starts and kills the busy loops itself.
LOADED_COUNT ?= 3
test-loaded:
	bash scripts/ensure-redis.sh
	bash scripts/ensure-node-sdks.sh
	LOADED_COUNT=$(LOADED_COUNT) GO=$(GO) bash scripts/test-loaded.sh

# Each fuzz target runs alone (go test -fuzz takes one); `make test` already
# runs their seed corpora. The budget is a count of executions, not a duration:
# up to Go 1.26, a duration can end in a spurious "context deadline exceeded"
# failure with no crasher (golang/go#75804), while a count stops cleanly.
# FUZZTIME=10m still works for a long local run.
FUZZTIME ?= 50000x
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzCaddyfile$$' -fuzztime $(FUZZTIME) .
	$(GO) test -run '^$$' -fuzz '^FuzzClientKey$$' -fuzztime $(FUZZTIME) ./internal/clientkey

# Not part of `make test` or CI: it runs for SOAK_DURATION (default 10m),
# without the race detector so that the RSS it prints is the real one.
SOAK_DURATION ?= 10m
soak:
	bash scripts/ensure-redis.sh
	SOAK_DURATION=$(SOAK_DURATION) $(GO) test -tags soak -run '^TestSoak$$|^TestSoakFailover$$|^TestSoakStorm$$' -count=1 -timeout 60m -v .

vet lint:
	$(GO) vet ./...

fmt:
	$(GOFMT) -w .

fmt-check:
	@out="$$($(GOFMT) -l .)"; \
	if [ -n "$$out" ]; then \
		echo "These files are not gofmt-formatted (run 'make fmt'):"; \
		echo "$$out"; \
		exit 1; \
	fi; \
	echo "gofmt: all files formatted"

check-build: build
	./caddy version
	@if ./caddy list-modules | grep -qx 'http.handlers.sliding_ratelimit'; then \
		echo "OK: ./caddy includes http.handlers.sliding_ratelimit"; \
	else \
		echo "FAIL: ./caddy does not list the module http.handlers.sliding_ratelimit (see './caddy list-modules')" >&2; \
		exit 1; \
	fi

clean:
	rm -f ./caddy

# bench/ is its own Go module (its dependencies stay out of users' go.mod); the
# tool builds ./caddy with `make build` itself. Flags: BENCH_FLAGS='-runs 3 -duration 5s'.
# The figures that README.md and docs/ quote are links to cells of BENCHMARKS.md:
# the second step rewrites them from the new file (make test fails when one disagrees).
BENCH_FLAGS ?=
bench:
	cd bench && $(GO) run ./cmd/srlbench $(BENCH_FLAGS)
	$(GO) test -count=1 -run '^TestDocFigures$$' . -update
