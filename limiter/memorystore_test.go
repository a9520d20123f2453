package limiter

import (
	"testing"
	"time"
)

// TestMemoryStoreSweep: the sweep drops state exactly when it stops weighing
// on decisions (a log key one window after its newest admission, a counter
// key at the end of the fixed window after its last admission's) and keeps
// the rest. The store's clock is driven by the test.
func TestMemoryStoreSweep(t *testing.T) {
	var now time.Duration
	s := newMemoryStoreAt(func() int64 { return now.Microseconds() })

	const w = time.Second
	logCheck := Check{Zone: "log", Key: "k", Limit: Limit{Window: w, Max: 5}}
	counterCheck := Check{Zone: "counter", Key: "k", Limit: Limit{Window: w, Max: 5, Algorithm: SlidingCounter}}
	busy := Check{Zone: "busy", Key: "k", Limit: Limit{Window: time.Hour, Max: 5}}

	now = 1500 * time.Millisecond // half-way through the counter's fixed window [1s, 2s)
	allow1(t, s, logCheck)
	allow1(t, s, counterCheck)
	allow1(t, s, busy)

	steps := []struct {
		at   time.Duration
		want int // states left after a sweep at
	}{
		{2499 * time.Millisecond, 3},
		{2500 * time.Millisecond, 2}, // the log admission aged out
		{2999 * time.Millisecond, 2}, // the counter still weighs in [2s, 3s)
		{3000 * time.Millisecond, 1},
	}
	for _, st := range steps {
		now = st.at
		s.sweep()
		if got := s.len(); got != st.want {
			t.Errorf("Len after a sweep at %v = %d, want %d", st.at, got, st.want)
		}
	}
	if r := allow1(t, s, busy); !r.d.Allowed || r.d.Remaining != 3 {
		t.Errorf("kept key after the sweeps: %+v, want Allowed with Remaining 3", r.d)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if r := allow1(t, s, logCheck); !r.d.Allowed || r.d.Remaining != 4 {
		t.Errorf("after Close: %+v, want Allowed with Remaining 4", r.d)
	}
}
