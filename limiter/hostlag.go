package limiter

import (
	"math"
	"runtime/metrics"
	"time"
)

// schedLatencies is the Go runtime's histogram of how long goroutines
// waited, runnable, before they ran: a goroutine woken by its Redis reply
// or by its channel waits there behind every other runnable goroutine of
// the process, so when it grows, time passes that no Redis spends.
const schedLatencies = "/sched/latencies:seconds"

// hostBusyShare is the part of a timeout that the slowest goroutines
// (hostBusyQuantile) must have waited to run for the host to count as
// busy. On this project's 2-core test machine, 5,000 clients connecting
// at once made the 99th percentile 7 to 50 ms in every tenth of a second;
// a loaded but healthy Caddy keeps it near 1 ms.
const (
	hostBusyShare    = 10
	hostBusyQuantile = 0.99
)

// hostLag tells a host whose CPUs are behind from a slow Redis, by the
// waits goroutines had to run since its last look. It is not safe for
// concurrent use.
type hostLag struct {
	sample []metrics.Sample
	// prev is the histogram's counts at the last look.
	prev []uint64
}

// waited returns how long the slowest goroutines (hostBusyQuantile of
// them) waited to run since the last call; zero before it has counts.
func (l *hostLag) waited() time.Duration {
	if l.sample == nil {
		l.sample = []metrics.Sample{{Name: schedLatencies}}
	}
	metrics.Read(l.sample)
	if l.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0
	}
	h := l.sample[0].Value.Float64Histogram()
	if len(l.prev) != len(h.Counts) {
		l.prev = make([]uint64, len(h.Counts))
	}
	var total uint64
	for i, c := range h.Counts {
		total += c - l.prev[i]
	}
	if total == 0 {
		return 0
	}
	var seen uint64
	at := len(h.Counts) - 1
	for i, c := range h.Counts {
		if seen += c - l.prev[i]; float64(seen) >= hostBusyQuantile*float64(total) {
			at = i
			break
		}
	}
	copy(l.prev, h.Counts)
	// The bucket's upper bound; the last one's is +Inf, its lower then.
	bound := h.Buckets[at+1]
	if math.IsInf(bound, 1) {
		bound = h.Buckets[at]
	}
	return time.Duration(bound * float64(time.Second))
}
