package limiter

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestBatchBusyHost: a deadline that passes while the host's CPUs hold the
// process's goroutines back (the runtime's scheduling latencies, replaced
// here) is not Redis failing. With every reply late by more than the
// timeout, as a reply is whose reader waits to run behind thousands of
// connections: on a busy host each decision is still made, in its graces;
// a Redis that does not answer in them fails with ErrHostBusy, which the
// breaker leaves uncounted; on a quiet host the same late replies time out
// at the deadline as before.
func TestBatchBusyHost(t *testing.T) {
	const (
		timeout = 100 * time.Millisecond
		callers = 20
		late    = 150 * time.Millisecond
	)
	proxy := redistest.StartFaultProxy(t, testRedis.Addr())
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	s := NewRedisStore(client, RedisOptions{KeyPrefix: testPrefix(t), Timeout: timeout})
	t.Cleanup(func() { s.Close() })
	limit := Limit{Window: time.Minute, Max: 10}
	allow1(t, s, Check{Zone: "z", Key: testKey(t), Limit: limit}) // the script loaded, a connection open

	type result struct {
		took time.Duration
		err  error
		d    Decision
	}
	burst := func() []result {
		// As the batcher finds it when a deadline passes or a request
		// waited for a flusher.
		s.batch.mu.Lock()
		s.batch.hostBusy(time.Now())
		s.batch.mu.Unlock()
		results := make([]result, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				ds := make([]Decision, 1)
				start := time.Now()
				err := s.Allow(context.Background(), []Check{{Zone: "z", Key: testKey(t), Limit: limit}}, ds)
				results[i] = result{time.Since(start), err, ds[0]}
			})
		}
		wg.Wait()
		return results
	}
	var busy atomicBool
	s.batch.mu.Lock()
	s.batch.waited = func() time.Duration {
		if busy.Load() {
			return timeout
		}
		return 0
	}
	s.batch.mu.Unlock()
	fault := proxy.Latency(t, redistest.Downstream, late, 0)

	busy.Store(true)
	for _, r := range burst() {
		if r.err != nil || !r.d.Allowed {
			t.Errorf("busy host, reply %v late: %+v, %v after %v; want a decision", late, r.d, r.err, r.took)
		} else if r.took < timeout {
			t.Errorf("busy host: decided after %v, before the reply %v late could come", r.took, late)
		}
	}

	// A reply later than all the graces.
	proxy.RemoveFault(t, fault)
	fault = proxy.Latency(t, redistest.Downstream, (maxGraces+2)*timeout, 0)
	for _, r := range burst() {
		if !errors.Is(r.err, ErrHostBusy) || !errors.Is(r.err, context.DeadlineExceeded) {
			t.Errorf("busy host, no reply in the graces: %v after %v, want ErrHostBusy", r.err, r.took)
		}
		if r.took < timeout || r.took > (maxGraces+1)*timeout+timeout/2 {
			t.Errorf("busy host, no reply in the graces: answered after %v, want between %v and its graces", r.took, timeout)
		}
	}

	proxy.RemoveFault(t, fault)
	proxy.Latency(t, redistest.Downstream, late, 0)
	busy.Store(false)
	s.batch.mu.Lock()
	s.batch.busyUntil.Store(time.Time{})
	s.batch.lagAt = time.Time{}
	s.batch.mu.Unlock()
	for _, r := range burst() {
		if !errors.Is(r.err, context.DeadlineExceeded) || errors.Is(r.err, ErrHostBusy) {
			t.Errorf("quiet host, reply %v late: %v, want Redis's timeout", late, r.err)
		}
		if r.took < timeout || r.took > timeout+timeout/2 {
			t.Errorf("quiet host: answered after %v, want at the %v timeout", r.took, timeout)
		}
	}
}

// atomicBool is a flag the test sets while the batcher reads it.
type atomicBool struct {
	mu sync.Mutex
	v  bool
}

func (b *atomicBool) Load() bool   { b.mu.Lock(); defer b.mu.Unlock(); return b.v }
func (b *atomicBool) Store(v bool) { b.mu.Lock(); b.v = v; b.mu.Unlock() }

// TestHostLagCountsLateTimers: a timer that ran late makes the host busy
// as the runtime's scheduling latencies do: when other processes take the
// CPUs, the kernel runs the process's threads late and the runtime sees no
// goroutine wait in its own queue.
func TestHostLagCountsLateTimers(t *testing.T) {
	var l hostLag
	l.waited()
	now := time.Now()
	l.ranLate(now.Add(-30*time.Millisecond), now)
	l.ranLate(now.Add(-time.Millisecond), now)
	if got := l.waited(); got < 30*time.Millisecond {
		t.Errorf("waited %v after a timer ran 30ms late, want at least 30ms", got)
	}
	if got := l.waited(); got >= 30*time.Millisecond {
		t.Errorf("waited %v at the next look, with no timer late since, want less than 30ms", got)
	}
}

// TestBatchSilentOnlyWhileCallsAreOut: Redis is silent only while a call
// is out with nothing read for maxGraces timeouts. A fleet that makes a few
// calls a second leaves long gaps between replies, which say nothing of
// Redis: taken for silence, they made every late decision of a busy host
// fail open.
func TestBatchSilentOnlyWhileCallsAreOut(t *testing.T) {
	const timeout = 100 * time.Millisecond
	b := &batcher{timeout: timeout}
	now := time.Now()
	b.replied.Store(now.Add(-time.Minute))
	if b.silent(now) {
		t.Error("silent with no call out, its last reply a minute ago")
	}
	ended := b.calling(now.Add(-(maxGraces + 1) * timeout))
	if !b.silent(now) {
		t.Errorf("not silent with a call out %v and nothing read", (maxGraces+1)*timeout)
	}
	other := b.calling(now)
	other(nil)
	if b.silent(time.Now()) {
		t.Error("silent right after a reply, a call still out")
	}
	ended(nil)
	if b.silent(time.Now().Add(time.Hour)) {
		t.Error("silent with no call out")
	}
}
