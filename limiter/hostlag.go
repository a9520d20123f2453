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
// waits goroutines had to run since its last look, and by how late the
// batcher's timer ran (ranLate). The runtime's histogram sees only the
// waits for one of the process's own threads: when the kernel holds the
// threads back (other processes take the CPUs), the goroutines find no
// queue once they run, and only a clock read against a time due says that
// they ran late. It is not safe for concurrent use.
type hostLag struct {
	sample []metrics.Sample
	// prev is the histogram's counts at the last look.
	prev []uint64
	// late is the most a timer ran late since the last look.
	late time.Duration
}

// ranLate notes that a timer due at due ran at now.
func (l *hostLag) ranLate(due, now time.Time) {
	l.late = max(l.late, now.Sub(due))
}

// waited returns how long the slowest goroutines (hostBusyQuantile of
// them) waited to run since the last call, or how late a timer ran if
// that is longer; zero before it has counts.
func (l *hostLag) waited() time.Duration {
	late := l.late
	l.late = 0
	return max(late, l.schedWaited())
}

// schedWaited is waited by the runtime's histogram alone.
func (l *hostLag) schedWaited() time.Duration {
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
