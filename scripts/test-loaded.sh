#!/usr/bin/env bash
# Runs the budget tests (the AI gateway's tokens and spend fleets) and the
# exactness tests, LOADED_COUNT times each (default 3), with -race, while
# busy loops, LOADED_LOOPS per CPU (default 4), keep every CPU busy: on such a host a decision's
# deadline passes because the CPUs run the process late, not because Redis
# is slow, and a limiter that took that for Redis failing would let
# requests through unlimited (fail_mode open) and overspend a budget, which
# each of these tests fails on. `make test` alone passes on an idle machine
# whatever the limiter does under load.
#
# The test binaries are built first, on a quiet machine; the loops are
# started next, and killed when the tests end, fail or are interrupted,
# and in any case after LOADED_BOUND (default 25m).
#
# Usage: scripts/test-loaded.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
go=${GO:-go}
count=${LOADED_COUNT:-3}
bound=${LOADED_BOUND:-25m}

# The tests that fail when a limit or a budget is exceeded, or a charge is
# lost: the fleets of the recipes (images, hang-ups, billed dimensions), a soft limit
# crossed once by a fleet, a month shared by two instances, and the exactness of one store, of the
# model, and of several instances sharing one Redis.
root_tests='^(TestAIGatewayFleet|TestSpendFleet|TestDimensionsFleet|TestCostLLMFleetWithImages|TestAIGatewayHangUpFleet|TestSoftLimitOnceAcrossInstances|TestMonthBudgetResetsAtMidnightOfTheFirst|TestExactAcrossInstances|TestUnitsExactAcrossInstances|TestWaitsExactAcrossInstances)$'
limiter_tests='^(TestExactUnderConcurrency|TestLeasesUnderConcurrency|TestStoresMatchModel)$'

bin=$(mktemp -d)
loops=()
stop() {
	for pid in "${loops[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	wait "${loops[@]}" 2>/dev/null || true
	rm -rf "$bin"
}
trap stop EXIT

"$go" test -race -c -o "$bin/root.test" .
"$go" test -race -c -o "$bin/limiter.test" ./limiter

# Several per CPU: the loops share the scheduler's group of this session
# with the tests' processes (two Caddy instances, Redis, the SDKs' node
# clients), which then get a small part of the CPUs, as on a shared
# machine; one per CPU left the old limiter passing on an otherwise idle
# machine.
cpus=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
for _ in $(seq $((${LOADED_LOOPS:-4} * cpus))); do
	timeout "$bound" sh -c 'while :; do :; done' &
	loops+=("$!")
done
echo "test-loaded: ${#loops[@]} busy loops on $cpus CPUs, each test $count times"

# Each binary runs in its package's directory, as go test runs it. Verbose,
# but only the tests' own lines: what each fleet admitted and spent.
summary() { grep -E '^(=== RUN|--- |PASS|FAIL|ok)|^ +[a-z_]+_test\.go:[0-9]+: ' || true; }
(cd limiter && "$bin/limiter.test" -test.v -test.run "$limiter_tests" -test.count "$count" -test.timeout "$bound") | summary
"$bin/root.test" -test.v -test.run "$root_tests" -test.count "$count" -test.timeout "$bound" | summary
echo "test-loaded: passed"
