package slidingratelimit

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// failoverFigures is what one failover under load measured.
type failoverFigures struct {
	// maxRequests is the zone's limit; mostAdmitted the most admitted to a
	// client in the window that spans the failover, over both instances;
	maxRequests, mostAdmitted int
	// outage is from the kill to the first decision from the new primary.
	outage time.Duration
	// acked are the admissions the old primary acknowledged to a direct
	// store in the last moments before the kill, lost those the new
	// primary does not hold.
	acked, lost int64
}

// measureFailover runs clients against two instances on a Sentinel set
// (fail_mode local), each client part-way through its window, kills the
// primary (SIGKILL) and keeps the load on until the sentinel has promoted
// the replica and decisions come from it again, all within one window.
// Beside it, a store of its own writes to other keys up to the kill, to
// measure what asynchronous replication loses.
func measureFailover(t *testing.T, clients int) failoverFigures {
	t.Helper()
	const (
		maxRequests = 40
		window      = 30 * time.Second
	)
	sentinel := redistest.StartSentinel(t)
	prefix := uniquePrefix(t)
	config := func(name string) string {
		return fmt.Sprintf(`{"window": %q, "max_requests": %d, "redis_topology": "sentinel", "redis": %q,
			"key_prefix": %q, "timeout": "100ms", "fail_mode": "local"}`,
			window.String(), maxRequests, sentinel.URL()+"&client_name="+name, prefix)
	}
	fleet := []*instance{newInstance(t, config("failover_a")), newInstance(t, config("failover_b"))}
	deadline := time.Now().Add(10 * time.Second)
	for _, in := range fleet {
		for in.backend.conn.Instances() != len(fleet) {
			if time.Now().After(deadline) {
				t.Fatalf("an instance counts %d instances, want %d", in.backend.conn.Instances(), len(fleet))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	start := time.Now()
	var mu sync.Mutex
	admitted := make([]int, clients)
	ask := func(c, i int) int {
		a := send(t, "/", to(fleet[i%len(fleet)]), from(fmt.Sprintf("192.0.2.%d", c+1)))
		if a.status == http.StatusOK {
			mu.Lock()
			admitted[c]++
			mu.Unlock()
		}
		return a.status
	}
	// Part-way: half the limit each, from Redis, over both instances.
	for c := range clients {
		for i := range maxRequests / 2 {
			if status := ask(c, i); status != http.StatusOK {
				t.Fatalf("client %d, request %d before the failover: %d", c, i, status)
			}
		}
	}

	// The store that measures replication's loss writes up to the kill.
	probe := limiter.NewRedisStore(fleet[0].backend.conn.Client(), limiter.RedisOptions{KeyPrefix: prefix + "probe:", Timeout: time.Second})
	defer probe.Close()
	probeCheck := func(i int) limiter.Check {
		return limiter.Check{Zone: "probe", Key: fmt.Sprint(i & 15), Limit: limiter.Limit{Window: time.Hour, Max: 1 << 40}}
	}
	acked, stop, probing := make([]int64, 16), make(chan struct{}), sync.WaitGroup{}
	probing.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			d := make([]limiter.Decision, 1)
			if err := probe.Allow(context.Background(), []limiter.Check{probeCheck(i)}, d); err == nil && d[0].Allowed {
				acked[i%16]++
			}
		}
	})
	time.Sleep(300 * time.Millisecond)

	old := sentinel.Master()
	killed := time.Now()
	sentinel.Node(old).Stop()
	close(stop)
	probing.Wait()

	// The load goes on, each client a request every 20ms alternating the
	// instances, until the new primary decides and two seconds more.
	var figures failoverFigures
	var load sync.WaitGroup
	done := make(chan struct{})
	load.Go(func() {
		defer close(done)
		for time.Since(start) < window-3*time.Second {
			d := make([]limiter.Decision, 1)
			if sentinel.Master() != old && probe.Allow(context.Background(), []limiter.Check{probeCheck(-1)}, d) == nil {
				figures.outage = time.Since(killed)
				time.Sleep(2 * time.Second)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	for c := range clients {
		load.Go(func() {
			for i := 0; ; i++ {
				ask(c, i)
				select {
				case <-done:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		})
	}
	load.Wait()
	if figures.outage == 0 {
		t.Fatalf("no decision from the new primary within the window (sentinel names %q, was %q)", sentinel.Master(), old)
	}
	if elapsed := time.Since(start); elapsed >= window {
		t.Fatalf("the run took %v, longer than the window %v: its counts span more than one", elapsed, window)
	}

	figures.maxRequests = maxRequests
	for _, n := range admitted {
		figures.mostAdmitted = max(figures.mostAdmitted, n)
	}
	for i := range acked {
		d := make([]limiter.Decision, 1)
		if err := probe.Peek(context.Background(), []limiter.Check{probeCheck(i)}, d); err != nil {
			t.Fatal(err)
		}
		held := probeCheck(i).Limit.Max - d[0].Remaining
		figures.acked += acked[i]
		figures.lost += max(0, acked[i]-held)
	}
	return figures
}

// TestFailoverLocalSharesTheLimit: through a real Sentinel failover (the
// primary killed, the replica promoted), two instances with fail_mode local
// hand no client more than 1.2 times its limit in the window that spans the
// failover: each started from what Redis last said of the client and took
// its share of what was left, and what they admitted was charged to the new
// primary once it answered.
func TestFailoverLocalSharesTheLimit(t *testing.T) {
	f := measureFailover(t, 10)
	t.Logf("failover: %v from the kill to a decision from the new primary; most admitted to a client in the window %d of %d; "+
		"asynchronous replication lost %d of %d admissions acknowledged up to the kill",
		f.outage.Round(time.Millisecond), f.mostAdmitted, f.maxRequests, f.lost, f.acked)
	if limit := f.maxRequests * 12 / 10; f.mostAdmitted > limit {
		t.Errorf("a client got %d admitted in the window spanning the failover, want at most %d (1.2 x %d)", f.mostAdmitted, limit, f.maxRequests)
	}
}
