package redisconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// breakerClock is a fake clock that moves only when told to.
type breakerClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *breakerClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *breakerClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// onlyAllow gives a fake Store whose test is about Allow the rest of the
// interface: each answers nothing.
type onlyAllow struct{}

func (onlyAllow) Peek(context.Context, []limiter.Check, []limiter.Decision) error   { return nil }
func (onlyAllow) Settle(context.Context, []limiter.Check, []limiter.Decision) error { return nil }
func (onlyAllow) Extend(context.Context, []limiter.Check, []limiter.Decision) error { return nil }
func (onlyAllow) Reset(context.Context, string, string) error                       { return nil }

// breakerStore is a fake Store that counts its calls and answers with whatever
// its answer function says (success when nil).
type breakerStore struct {
	onlyAllow
	calls  atomic.Int64
	answer atomic.Pointer[func(context.Context) error]
}

func (s *breakerStore) Allow(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision) error {
	s.calls.Add(1)
	if f := s.answer.Load(); f != nil {
		return (*f)(ctx)
	}
	for i := range decisions {
		decisions[i] = limiter.Decision{Allowed: true}
	}
	return nil
}

// set makes the store answer with f.
func (s *breakerStore) set(f func(context.Context) error) { s.answer.Store(&f) }

// fail makes the store fail with err, or succeed when err is nil.
func (s *breakerStore) fail(err error) {
	if err == nil {
		s.answer.Store(nil)
		return
	}
	s.set(func(context.Context) error { return err })
}

var errBreakerTestStore = errors.New("fake store down")

// breakerChanges records OnStateChange calls.
type breakerChanges struct {
	mu  sync.Mutex
	got []string
}

func (c *breakerChanges) record(from, to BreakerState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, from.String()+"->"+to.String())
}

func (c *breakerChanges) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

// check fails the test unless exactly want were recorded so far.
func (c *breakerChanges) check(t *testing.T, want ...string) {
	t.Helper()
	if got := c.list(); !slices.Equal(got, want) {
		t.Errorf("state changes = %q, want %q", got, want)
	}
}

// testBreaker is a breaker with the one store it guards in these tests.
type testBreaker struct {
	*Breaker
	limiter.Store
}

// newTestBreaker returns a breaker guarding a fake store, on a fake clock,
// recording its state changes.
func newTestBreaker(t *testing.T, opts BreakerOptions) (*testBreaker, *breakerStore, *breakerClock, *breakerChanges) {
	t.Helper()
	store := &breakerStore{}
	clock := &breakerClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	changes := &breakerChanges{}
	if opts.OnStateChange == nil {
		opts.OnStateChange = changes.record
	}
	b := NewBreaker(opts)
	b.now = clock.Now
	return &testBreaker{b, b.Guard(store)}, store, clock, changes
}

var breakerTestCheck = []limiter.Check{{Zone: "z", Key: "k", Limit: limiter.Limit{Window: time.Second, Max: 10}}}

// breakerCall makes one Allow call with a background context.
func breakerCall(b limiter.Store) error {
	return breakerCallCtx(context.Background(), b)
}

func breakerCallCtx(ctx context.Context, b limiter.Store) error {
	return b.Allow(ctx, breakerTestCheck, make([]limiter.Decision, 1))
}

// wantState fails the test unless b is in state want.
func wantState(t *testing.T, b interface{ State() BreakerState }, want BreakerState) {
	t.Helper()
	if got := b.State(); got != want {
		t.Fatalf("state = %v, want %v", got, want)
	}
}

// openBreaker fails calls until b opens, checking that it takes exactly
// failures calls.
func openBreaker(t *testing.T, b *testBreaker, store *breakerStore, failures int) {
	t.Helper()
	store.fail(errBreakerTestStore)
	for i := 1; i <= failures; i++ {
		wantState(t, b, BreakerClosed)
		if err := breakerCall(b); !errors.Is(err, errBreakerTestStore) {
			t.Fatalf("failing call %d: err = %v, want the store's error", i, err)
		}
	}
	wantState(t, b, BreakerOpen)
}

func TestBreakerStateString(t *testing.T) {
	for s, want := range map[BreakerState]string{
		BreakerClosed:   "closed",
		BreakerOpen:     "open",
		BreakerHalfOpen: "half-open",
		BreakerState(7): "BreakerState(7)",
	} {
		if got := s.String(); got != want {
			t.Errorf("BreakerState(%d).String() = %q, want %q", int(s), got, want)
		}
	}
}

func TestBreakerDefaults(t *testing.T) {
	for _, opts := range []BreakerOptions{{}, {Failures: -1, Cooldown: -time.Second}} {
		b, store, clock, changes := newTestBreaker(t, opts)
		openBreaker(t, b, store, defaultBreakerFailures)
		clock.Advance(defaultBreakerCooldown - time.Nanosecond)
		if err := breakerCall(b); !errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("%+v: call before the default cool-down: err = %v, want ErrBreakerOpen", opts, err)
		}
		clock.Advance(time.Nanosecond)
		store.fail(nil)
		if err := breakerCall(b); err != nil {
			t.Fatalf("%+v: probe after the default cool-down: %v", opts, err)
		}
		wantState(t, b, BreakerClosed)
		changes.check(t, "closed->open", "open->half-open", "half-open->closed")
	}
}

// TestBreakerConsecutiveFailures: N consecutive failures open the breaker;
// N-1 failures between successes never do.
func TestBreakerConsecutiveFailures(t *testing.T) {
	const n = 4
	b, store, _, changes := newTestBreaker(t, BreakerOptions{Failures: n, Cooldown: time.Second})
	for round := range 50 {
		store.fail(errBreakerTestStore)
		for range n - 1 {
			if err := breakerCall(b); !errors.Is(err, errBreakerTestStore) {
				t.Fatalf("round %d: err = %v, want the store's error", round, err)
			}
		}
		wantState(t, b, BreakerClosed)
		store.fail(nil)
		if err := breakerCall(b); err != nil {
			t.Fatalf("round %d: success: %v", round, err)
		}
	}
	if got, want := store.calls.Load(), int64(50*n); got != want {
		t.Errorf("store calls = %d, want %d", got, want)
	}
	changes.check(t)
	openBreaker(t, b, store, n)
	changes.check(t, "closed->open")
}

// TestBreakerOpenSkipsStore: while open, calls fail at once with
// ErrBreakerOpen and the store is not called, until the cool-down ends.
func TestBreakerOpenSkipsStore(t *testing.T) {
	const cooldown = 300 * time.Millisecond
	b, store, clock, changes := newTestBreaker(t, BreakerOptions{Failures: 2, Cooldown: cooldown})
	openBreaker(t, b, store, 2)
	store.fail(nil)
	calls := store.calls.Load()
	for i := range 1000 {
		if i%100 == 0 {
			clock.Advance(cooldown / 11)
		}
		err := breakerCall(b)
		if !errors.Is(err, ErrBreakerOpen) || err != ErrBreakerOpen {
			t.Fatalf("call %d while open: err = %v, want ErrBreakerOpen", i, err)
		}
	}
	clock.Advance(cooldown - 10*(cooldown/11) - time.Nanosecond) // 1ns short of the cool-down
	if err := breakerCall(b); err != ErrBreakerOpen {
		t.Fatalf("call 1ns before the end of the cool-down: err = %v, want ErrBreakerOpen", err)
	}
	if got := store.calls.Load() - calls; got != 0 {
		t.Fatalf("store called %d times while open, want 0", got)
	}
	wantState(t, b, BreakerOpen)
	changes.check(t, "closed->open")

	clock.Advance(time.Nanosecond)
	if err := breakerCall(b); err != nil {
		t.Fatalf("probe: %v", err)
	}
	if got := store.calls.Load() - calls; got != 1 {
		t.Fatalf("store called %d times by the probe, want 1", got)
	}
	wantState(t, b, BreakerClosed)
	changes.check(t, "closed->open", "open->half-open", "half-open->closed")
}

// TestBreakerSingleProbe: after the cool-down, exactly one of many concurrent
// callers reaches the store; the others wait for its outcome. If the probe
// succeeds, the breaker closes and they go on to the store; if it fails, it
// opens for another cool-down and they get ErrBreakerOpen.
func TestBreakerSingleProbe(t *testing.T) {
	for _, probeOK := range []bool{true, false} {
		t.Run(fmt.Sprintf("probe ok %v", probeOK), func(t *testing.T) {
			const (
				cooldown = time.Second
				callers  = 32
			)
			b, store, clock, changes := newTestBreaker(t, BreakerOptions{Failures: 3, Cooldown: cooldown, MaxCooldown: cooldown})
			openBreaker(t, b, store, 3)
			calls := store.calls.Load()

			entered := make(chan struct{})
			release := make(chan struct{})
			var probes atomic.Int64
			store.set(func(context.Context) error {
				if probes.Add(1) == 1 {
					close(entered)
					<-release
				}
				if probeOK {
					return nil
				}
				return errBreakerTestStore
			})
			clock.Advance(cooldown)

			// All callers start together; one becomes the probe and
			// blocks in the store; the others wait.
			start := make(chan struct{})
			errs := make([]error, callers)
			var wg sync.WaitGroup
			for i := range callers {
				wg.Go(func() {
					<-start
					errs[i] = breakerCall(b)
				})
			}
			close(start)
			breakerWait(t, "the probe to reach the store", entered)
			wantState(t, b, BreakerHalfOpen)
			changes.check(t, "closed->open", "open->half-open")
			// Nobody else reaches the store while the probe runs, and
			// a caller whose deadline passes while it waits is told so.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			if err := breakerCallCtx(ctx, b); err != ErrBreakerOpen {
				t.Fatalf("call whose deadline passes during the probe: err = %v, want ErrBreakerOpen", err)
			}
			if got := store.calls.Load() - calls; got != 1 {
				t.Fatalf("store called %d times while the probe runs, want 1", got)
			}
			close(release)
			wg.Wait()

			var failed, open int
			for _, err := range errs {
				switch {
				case err == ErrBreakerOpen:
					open++
				case err != nil:
					failed++
					if !errors.Is(err, errBreakerTestStore) {
						t.Errorf("err = %v, want the store's error or ErrBreakerOpen", err)
					}
				}
			}
			store.fail(nil)
			if probeOK {
				if open != 0 || failed != 0 {
					t.Errorf("%d callers got ErrBreakerOpen and %d an error after a successful probe, want none", open, failed)
				}
				if got := store.calls.Load() - calls; got != callers {
					t.Errorf("store called %d times, want %d: the probe, then every waiting caller", got, callers)
				}
				wantState(t, b, BreakerClosed)
				changes.check(t, "closed->open", "open->half-open", "half-open->closed")
				return
			}
			if failed != 1 || open != callers-1 {
				t.Errorf("after a failed probe: %d store errors and %d ErrBreakerOpen, want 1 and %d", failed, open, callers-1)
			}
			if got := store.calls.Load() - calls; got != 1 {
				t.Errorf("store called %d times, want 1 (the probe)", got)
			}
			wantState(t, b, BreakerOpen)
			changes.check(t, "closed->open", "open->half-open", "half-open->open")
			// Open for another whole cool-down, from the probe's failure.
			calls = store.calls.Load()
			clock.Advance(cooldown - time.Nanosecond)
			if err := breakerCall(b); err != ErrBreakerOpen {
				t.Fatalf("call in the second cool-down: err = %v, want ErrBreakerOpen", err)
			}
			if got := store.calls.Load() - calls; got != 0 {
				t.Fatalf("store called %d times in the second cool-down, want 0", got)
			}
			clock.Advance(time.Nanosecond)
			if err := breakerCall(b); err != nil {
				t.Fatalf("second probe: %v", err)
			}
			wantState(t, b, BreakerClosed)
			changes.check(t, "closed->open", "open->half-open", "half-open->open", "open->half-open", "half-open->closed")
		})
	}
}

// breakerWait waits for ch to be closed, failing the test after 10s.
func breakerWait(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("waited 10s for %s", what)
	}
}

// waitDone returns a channel closed when wg is done.
func waitDone(wg *sync.WaitGroup) <-chan struct{} {
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	return ch
}

// canceledCtx returns a context its client has cancelled.
func canceledCtx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	cancel()
	return ctx
}

// storeSeesCancel makes the store fail as a real one does when its caller's
// context is done: with the context's error, wrapped.
func storeSeesCancel(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("running script: %w", err)
	}
	return errBreakerTestStore
}

// TestBreakerClientCancel: calls whose client went away count neither as
// failures nor as successes, closed or half-open; deadlines count.
func TestBreakerClientCancel(t *testing.T) {
	const cooldown = time.Second
	b, store, clock, changes := newTestBreaker(t, BreakerOptions{Failures: 3, Cooldown: cooldown})
	store.set(storeSeesCancel)
	for i := range 100 {
		if err := breakerCallCtx(canceledCtx(), b); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled call %d: err = %v, want context.Canceled", i, err)
		}
	}
	wantState(t, b, BreakerClosed)

	// Cancelled calls do not reset the count either: 2 failures, cancels,
	// 1 failure open it.
	breakerCall(b)
	breakerCall(b)
	for range 10 {
		breakerCallCtx(canceledCtx(), b)
	}
	wantState(t, b, BreakerClosed)
	breakerCall(b)
	wantState(t, b, BreakerOpen)
	changes.check(t, "closed->open")

	// A cancelled probe gives no verdict: still half-open, and the next
	// caller probes.
	clock.Advance(cooldown)
	calls := store.calls.Load()
	for range 3 {
		if err := breakerCallCtx(canceledCtx(), b); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled probe: err = %v, want context.Canceled", err)
		}
		wantState(t, b, BreakerHalfOpen)
	}
	if got := store.calls.Load() - calls; got != 3 {
		t.Fatalf("store called %d times by 3 cancelled probes, want 3", got)
	}
	store.fail(nil)
	if err := breakerCall(b); err != nil {
		t.Fatalf("probe after cancelled probes: %v", err)
	}
	wantState(t, b, BreakerClosed)
	changes.check(t, "closed->open", "open->half-open", "half-open->closed")

	// These count: a deadline, the store's own context.Canceled while the
	// caller's context is live, and another error while it is cancelled.
	for _, tc := range []struct {
		name  string
		ctx   func() (context.Context, context.CancelFunc)
		store func(context.Context) error
	}{
		{"deadline exceeded", func() (context.Context, context.CancelFunc) {
			return context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		}, storeSeesCancel},
		{"store's own Canceled", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Hour)
		}, func(context.Context) error { return fmt.Errorf("pool: %w", context.Canceled) }},
		{"store error after cancel", func() (context.Context, context.CancelFunc) {
			return canceledCtx(), func() {}
		}, func(context.Context) error { return errBreakerTestStore }},
	} {
		b, store, _, _ := newTestBreaker(t, BreakerOptions{Failures: 3, Cooldown: cooldown})
		store.set(tc.store)
		for range 3 {
			ctx, cancel := tc.ctx()
			if err := breakerCallCtx(ctx, b); err == nil {
				t.Fatalf("%s: no error", tc.name)
			}
			cancel()
		}
		if got := b.State(); got != BreakerOpen {
			t.Errorf("%s: state after 3 = %v, want open", tc.name, got)
		}
	}
}

// TestBreakerStaleResults: a call that started before the breaker opened and
// closed again does not count in the new closed state.
func TestBreakerStaleResults(t *testing.T) {
	const cooldown = time.Second
	b, store, clock, changes := newTestBreaker(t, BreakerOptions{Failures: 2, Cooldown: cooldown})
	entered := make(chan struct{})
	release := make(chan struct{})
	store.set(func(context.Context) error {
		close(entered)
		<-release
		return errBreakerTestStore
	})
	staleErr := make(chan error)
	go func() { staleErr <- breakerCall(b) }()
	<-entered

	openBreaker(t, b, store, 2)
	clock.Advance(cooldown)
	store.fail(nil)
	if err := breakerCall(b); err != nil {
		t.Fatal(err)
	}
	wantState(t, b, BreakerClosed)
	close(release)
	if err := <-staleErr; !errors.Is(err, errBreakerTestStore) {
		t.Fatalf("stale call: err = %v, want the store's error", err)
	}
	// One more failure would open it, had the stale one counted.
	store.fail(errBreakerTestStore)
	breakerCall(b)
	wantState(t, b, BreakerClosed)
	breakerCall(b)
	wantState(t, b, BreakerOpen)
	changes.check(t, "closed->open", "open->half-open", "half-open->closed", "closed->open")
}

// TestBreakerProbePanic: a store that panics in the probe does not leave the
// breaker half-open with nobody allowed to probe.
func TestBreakerProbePanic(t *testing.T) {
	b, store, clock, _ := newTestBreaker(t, BreakerOptions{Failures: 1, Cooldown: time.Second})
	openBreaker(t, b, store, 1)
	clock.Advance(time.Second)
	store.set(func(context.Context) error { panic("boom") })
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("store's panic not passed on")
			}
		}()
		breakerCall(b)
	}()
	wantState(t, b, BreakerHalfOpen)
	store.fail(nil)
	if err := breakerCall(b); err != nil {
		t.Fatalf("probe after a panicking probe: %v", err)
	}
	wantState(t, b, BreakerClosed)
}

// TestBreakerConcurrentChanges hammers a breaker from many goroutines while
// the store flips between failing and answering and the clock moves: every
// state change is reported once, in order (each starts where the previous
// ended), and the last one ends in the current state.
func TestBreakerConcurrentChanges(t *testing.T) {
	const cooldown = time.Millisecond
	b, store, clock, changes := newTestBreaker(t, BreakerOptions{Failures: 3, Cooldown: cooldown, MaxCooldown: 2 * cooldown})
	// The store fails for 20 calls, answers for 20, and so on.
	var storeCalls atomic.Int64
	store.set(func(ctx context.Context) error {
		if storeCalls.Add(1)/20%2 == 0 {
			return storeSeesCancel(ctx)
		}
		return ctx.Err()
	})
	var callers sync.WaitGroup
	for g := range 8 {
		callers.Go(func() {
			for i := range 5000 {
				ctx := context.Background()
				if (g+i)%5 == 0 {
					ctx = canceledCtx()
				}
				breakerCallCtx(ctx, b)
				if i%4 == 0 {
					clock.Advance(cooldown / 10)
				}
			}
		})
	}
	callers.Wait()

	got := changes.list()
	if len(got) < 100 {
		t.Fatalf("only %d state changes: %q", len(got), got)
	}
	valid := map[string]bool{
		"closed->open": true, "open->half-open": true,
		"half-open->closed": true, "half-open->open": true,
	}
	prev := BreakerClosed.String()
	for i, c := range got {
		if !valid[c] {
			t.Fatalf("change %d: %q is not a valid transition", i, c)
		}
		from, to, _ := cutArrow(c)
		if from != prev {
			t.Fatalf("change %d: %q does not start where change %d ended (%s): %q", i, c, i-1, prev, got)
		}
		prev = to
	}
	if prev != b.State().String() {
		t.Errorf("last change ends in %s, state is %v", prev, b.State())
	}
	t.Logf("%d state changes", len(got))
}

func cutArrow(s string) (from, to string, ok bool) {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '-' && s[i+1] == '>' {
			return s[:i], s[i+2:], true
		}
	}
	return s, "", false
}

// TestBreakerOnStateChangeReentrant: OnStateChange runs outside the locks,
// so it may read the state and even make calls that change it.
func TestBreakerOnStateChangeReentrant(t *testing.T) {
	var b *testBreaker
	var got []string
	b, store, _, _ := newTestBreaker(t, BreakerOptions{
		Failures: 1,
		Cooldown: time.Second,
		OnStateChange: func(from, to BreakerState) {
			got = append(got, from.String()+"->"+to.String()+"("+b.State().String()+")")
			if to == BreakerOpen && len(got) == 1 {
				// Runs after the cool-down: becomes a probe, fails,
				// opens the breaker again from inside the callback.
				b.now = func() time.Time { return time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC) }
				breakerCall(b)
			}
		},
	})
	openBreaker(t, b, store, 1)
	want := []string{"closed->open(open)", "open->half-open(open)", "half-open->open(open)"}
	// Each change is reported after the ones before it, though made while
	// the callback ran.
	if !slices.Equal(got, want) {
		t.Errorf("changes = %q, want %q", got, want)
	}
}

// breakerNoopStore admits everything and allocates nothing.
type breakerNoopStore struct{ onlyAllow }

func (breakerNoopStore) Allow(context.Context, []limiter.Check, []limiter.Decision) error { return nil }

// TestBreakerClosedNoAllocs: the closed path allocates nothing.
func TestBreakerClosedNoAllocs(t *testing.T) {
	b := NewBreaker(BreakerOptions{OnStateChange: func(from, to BreakerState) {}}).Guard(breakerNoopStore{})
	ctx := context.Background()
	ds := make([]limiter.Decision, 1)
	if n := testing.AllocsPerRun(1000, func() { b.Allow(ctx, breakerTestCheck, ds) }); n != 0 {
		t.Errorf("closed Allow: %v allocations per call, want 0", n)
	}
}

// BenchmarkBreakerClosed measures the breaker's cost on the hot path: a
// closed breaker around a store that does nothing, against that store alone.
func BenchmarkBreakerClosed(b *testing.B) {
	for _, bc := range []struct {
		name  string
		store limiter.Store
	}{
		{"noop", breakerNoopStore{}},
		{"breaker", NewBreaker(BreakerOptions{}).Guard(breakerNoopStore{})},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				checks := []limiter.Check{{Zone: "bench", Key: "k", Limit: limiter.Limit{Window: time.Minute, Max: 100}}}
				ds := make([]limiter.Decision, 1)
				for pb.Next() {
					if err := bc.store.Allow(ctx, checks, ds); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// commandCounter is a go-redis hook that counts the commands a client sends.
type commandCounter struct{ n atomic.Int64 }

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// TestBreakerRedis wraps a RedisStore on a redis-server of its own, configured
// as the module configures its clients, in a breaker, and takes the server
// away: frozen (SIGSTOP: connections stay open, nothing answers) or stopped
// (connections refused). Calls fail within their deadline, the breaker opens
// after 3 and then answers in microseconds without a command to Redis, and
// it closes again within 2s of the server's return.
func TestBreakerRedis(t *testing.T) {
	const (
		failures = 3
		cooldown = 200 * time.Millisecond
		deadline = 50 * time.Millisecond
		// slack is how late a failing call may return after its deadline.
		slack = 150 * time.Millisecond
	)
	for _, outage := range []struct {
		name         string
		down         func(*testing.T, *redistest.Server)
		up           func(*testing.T, *redistest.Server)
		wantDeadline bool
		// opensAfter is how many failed calls open the breaker: a refused
		// dial opens it at once.
		opensAfter int
	}{
		{
			name: "freeze",
			down: func(t *testing.T, s *redistest.Server) {
				if err := s.Freeze(); err != nil {
					t.Fatal(err)
				}
			},
			up: func(t *testing.T, s *redistest.Server) {
				if err := s.Thaw(); err != nil {
					t.Fatal(err)
				}
			},
			wantDeadline: true,
			opensAfter:   failures,
		},
		{
			name:       "stop",
			down:       func(t *testing.T, s *redistest.Server) { s.Stop() },
			up:         func(t *testing.T, s *redistest.Server) { s.Restart(t) },
			opensAfter: 1,
		},
	} {
		t.Run(outage.name, func(t *testing.T) {
			srv := redistest.Start(t)
			opts, err := redis.ParseURL(srv.URL())
			if err != nil {
				t.Fatal(err)
			}
			// As the handler sets them on its clients: honour the
			// deadline, dial once, never retry a script.
			opts.ContextTimeoutEnabled = true
			opts.DialerRetries = 1
			opts.MaxRetries = -1
			client := redis.NewClient(opts)
			t.Cleanup(func() { client.Close() })
			commands := &commandCounter{}
			client.AddHook(commands)

			changes := &breakerChanges{}
			breaker := NewBreaker(BreakerOptions{
				Failures:      failures,
				Cooldown:      cooldown,
				MaxCooldown:   cooldown,
				OnStateChange: changes.record,
			})
			// The server is this test's own: a fixed prefix and key are its alone.
			store := limiter.NewRedisStore(client, limiter.RedisOptions{KeyPrefix: "test:", Timeout: time.Minute})
			t.Cleanup(func() { store.Close() })
			b := &testBreaker{breaker, breaker.Guard(store)}
			check := []limiter.Check{{Zone: "z", Key: "client", Limit: limiter.Limit{Window: time.Minute, Max: 1 << 30}}}
			call := func() (time.Duration, error) {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				defer cancel()
				ds := make([]limiter.Decision, 1)
				start := time.Now()
				err := b.Allow(ctx, check, ds)
				elapsed := time.Since(start)
				if err == nil && !ds[0].Allowed {
					t.Fatalf("denied under the limit: %+v", ds[0])
				}
				return elapsed, err
			}
			for range 5 {
				if _, err := call(); err != nil {
					t.Fatalf("before the outage: %v", err)
				}
			}
			var openedAfter time.Time

			outage.down(t, srv)
			for i := 1; i <= outage.opensAfter; i++ {
				wantState(t, b, BreakerClosed)
				if i == outage.opensAfter {
					openedAfter = time.Now() // a lower bound of the opening
				}
				elapsed, err := call()
				if err == nil || errors.Is(err, ErrBreakerOpen) {
					t.Fatalf("call %d in the outage: err = %v, want Redis's error", i, err)
				}
				if outage.wantDeadline && !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
					t.Errorf("call %d to a frozen Redis: err = %v, want a timeout", i, err)
				}
				if !outage.wantDeadline && !IsDialError(err) {
					t.Errorf("call %d to a stopped Redis: err = %v, want a refused dial", i, err)
				}
				if elapsed > deadline+slack {
					t.Errorf("call %d in the outage took %v, want about the %v deadline", i, elapsed, deadline)
				}
				t.Logf("call %d in the outage: %v after %v", i, err, elapsed)
			}
			openedBefore := time.Now() // an upper bound of the opening
			wantState(t, b, BreakerOpen)

			// Open: calls return at once, no command reaches Redis. Only
			// calls surely inside the cool-down are checked.
			sent := commands.n.Load()
			var n int
			var slowest time.Duration
			for time.Since(openedAfter) < cooldown-20*time.Millisecond && n < 1000 {
				elapsed, err := call()
				if err != ErrBreakerOpen {
					t.Fatalf("call %d while open: err = %v, want ErrBreakerOpen", n, err)
				}
				if elapsed > 5*time.Millisecond {
					t.Errorf("call %d while open took %v, want < 5ms", n, elapsed)
				}
				slowest = max(slowest, elapsed)
				n++
			}
			if n == 0 {
				t.Fatal("the machine was too slow to make a call inside the cool-down")
			}
			if got := commands.n.Load() - sent; got != 0 {
				t.Errorf("%d commands sent to Redis while the breaker was open, want 0", got)
			}
			t.Logf("%d calls while open, slowest %v", n, slowest)

			// A probe while Redis is still away fails and opens the
			// breaker for another cool-down.
			time.Sleep(time.Until(openedBefore.Add(cooldown + time.Millisecond)))
			if _, err := call(); err == nil || errors.Is(err, ErrBreakerOpen) {
				t.Fatalf("probe with Redis away: err = %v, want Redis's error", err)
			}
			wantState(t, b, BreakerOpen)
			sent = commands.n.Load()
			if _, err := call(); err != ErrBreakerOpen {
				t.Fatalf("call after a failed probe: err = %v, want ErrBreakerOpen", err)
			}
			if got := commands.n.Load() - sent; got != 0 {
				t.Errorf("%d commands sent to Redis after a failed probe, want 0", got)
			}

			outage.up(t, srv)
			back := time.Now()
			var recovered time.Duration
			for {
				_, err := call()
				if err == nil {
					recovered = time.Since(back)
					break
				}
				if time.Since(back) > 2*time.Second {
					t.Fatalf("no decision within 2s of Redis's return: %v (state %v, changes %q)", err, b.State(), changes.list())
				}
				time.Sleep(5 * time.Millisecond)
			}
			wantState(t, b, BreakerClosed)
			got := changes.list()
			t.Logf("decisions again %v after Redis came back; changes %q", recovered, got)
			// Closed->open, then probes (open->half-open->open) until one
			// succeeds (half-open->closed).
			if len(got) < 3 || got[0] != "closed->open" || got[len(got)-1] != "half-open->closed" {
				t.Errorf("state changes = %q, want closed->open, probes, half-open->closed", got)
			}
			for range 5 {
				if _, err := call(); err != nil {
					t.Fatalf("after recovery: %v", err)
				}
			}
		})
	}
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// TestBreakerCooldownGrows: each failed probe doubles the cool-down up to
// MaxCooldown; a success resets it.
func TestBreakerCooldownGrows(t *testing.T) {
	const base, maxCooldown = 10 * time.Millisecond, 40 * time.Millisecond
	b, store, clock, _ := newTestBreaker(t, BreakerOptions{Failures: 1, Cooldown: base, MaxCooldown: maxCooldown})
	for round := range 2 {
		openBreaker(t, b, store, 1)
		for i, want := range []time.Duration{base, 2 * base, 4 * base, maxCooldown, maxCooldown} {
			clock.Advance(want - time.Nanosecond)
			if err := breakerCall(b); err != ErrBreakerOpen {
				t.Fatalf("round %d, cool-down %d: call 1ns before its end (%v): err = %v, want ErrBreakerOpen", round, i, want, err)
			}
			clock.Advance(time.Nanosecond)
			if err := breakerCall(b); !errors.Is(err, errBreakerTestStore) {
				t.Fatalf("round %d, cool-down %d: probe at its end (%v): err = %v, want the store's error", round, i, want, err)
			}
			wantState(t, b, BreakerOpen)
		}
		clock.Advance(maxCooldown)
		store.fail(nil)
		if err := breakerCall(b); err != nil {
			t.Fatalf("round %d: probe: %v", round, err)
		}
		wantState(t, b, BreakerClosed)
	}
}

// TestBreakerDialErrorOpensAtOnce: a refused connection or an unknown host
// opens the breaker on the first failure, not after Failures of them.
func TestBreakerDialErrorOpensAtOnce(t *testing.T) {
	for name, err := range map[string]error{
		"refused":      fmt.Errorf("running script: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}),
		"unknown host": &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "redis.invalid", IsNotFound: true}},
		"dns":          &net.DNSError{Err: "server misbehaving", Name: "redis.invalid"},
	} {
		b, store, _, changes := newTestBreaker(t, BreakerOptions{Failures: 5})
		store.fail(err)
		if got := breakerCall(b); got != err {
			t.Errorf("%s: err = %v, want the store's", name, got)
		}
		wantState(t, b, BreakerOpen)
		changes.check(t, "closed->open")
	}
	// A read error on an open connection is not a dial error.
	b, store, _, _ := newTestBreaker(t, BreakerOptions{Failures: 2})
	store.fail(&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET})
	breakerCall(b)
	wantState(t, b, BreakerClosed)
	breakerCall(b)
	wantState(t, b, BreakerOpen)
}

// TestBreakerSharedByStores: one breaker guards several stores (handlers with
// their own prefixes on one Redis client): failures of either count together,
// an open breaker spares both, a probe through either closes it for both, and
// each transition is reported once.
func TestBreakerSharedByStores(t *testing.T) {
	b, first, clock, changes := newTestBreaker(t, BreakerOptions{Failures: 4, Cooldown: time.Second, MaxCooldown: time.Second})
	second := &breakerStore{}
	other := b.Guard(second)
	first.fail(errBreakerTestStore)
	second.fail(errBreakerTestStore)
	for i := range 4 {
		wantState(t, b, BreakerClosed)
		s := limiter.Store(b)
		if i%2 == 1 {
			s = other
		}
		if err := breakerCall(s); !errors.Is(err, errBreakerTestStore) {
			t.Fatalf("failure %d: err = %v", i, err)
		}
	}
	wantState(t, b, BreakerOpen)
	if got := first.calls.Load() + second.calls.Load(); got != 4 {
		t.Fatalf("stores called %d times, want 4", got)
	}
	for _, s := range []limiter.Store{b, other} {
		if err := breakerCall(s); err != ErrBreakerOpen {
			t.Fatalf("while open: err = %v, want ErrBreakerOpen", err)
		}
	}
	if got := first.calls.Load() + second.calls.Load(); got != 4 {
		t.Fatalf("stores called %d times in all after opening, want still 4", got)
	}
	clock.Advance(time.Second)
	second.fail(nil)
	first.fail(nil)
	if err := breakerCall(other); err != nil {
		t.Fatalf("probe through the second store: %v", err)
	}
	if err := breakerCall(b); err != nil {
		t.Fatalf("first store after the second's probe: %v", err)
	}
	changes.check(t, "closed->open", "open->half-open", "half-open->closed")
}

// TestBreakerDeadStoreLoad floods a breaker, on the real clock and with the
// default options, whose store is dead: refusing at once, or frozen until
// each call's deadline. The store receives the calls that open the breaker,
// then one probe per cool-down; the test logs the calls per second and checks
// them against that bound, which a slow machine only lowers.
func TestBreakerDeadStoreLoad(t *testing.T) {
	const (
		flood    = time.Second
		callers  = 8
		deadline = 20 * time.Millisecond
	)
	refused := fmt.Errorf("running script: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	for _, tc := range []struct {
		name  string
		store func(context.Context) error
	}{
		{"refused", func(context.Context) error { return refused }},
		{"frozen", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			breaker := NewBreaker(BreakerOptions{})
			store := &breakerStore{}
			store.set(tc.store)
			guarded := breaker.Guard(store)
			var requests atomic.Int64
			stop := time.Now().Add(flood)
			var wg sync.WaitGroup
			for range callers {
				wg.Go(func() {
					for time.Now().Before(stop) {
						ctx, cancel := context.WithTimeout(context.Background(), deadline)
						breakerCallCtx(ctx, guarded)
						cancel()
						requests.Add(1)
					}
				})
			}
			wg.Wait()
			calls := store.calls.Load()
			// The failures that open it (all callers may be in flight),
			// then at most one probe per shortest cool-down.
			bound := int64(defaultBreakerFailures+callers) + int64(flood/defaultBreakerCooldown)
			t.Logf("%s: %d requests in %v, %d reached the store (%.0f/s; bound %d)", tc.name, requests.Load(), flood, calls, float64(calls)/flood.Seconds(), bound)
			if calls > bound {
				t.Errorf("a dead store received %d calls in %v, want at most %d", calls, flood, bound)
			}
		})
	}
}

// ExampleBreaker guards the stores of two handlers on one Redis client with
// one breaker: a Redis that refuses connections opens it for both at once.
func ExampleBreaker() {
	breaker := NewBreaker(BreakerOptions{
		OnStateChange: func(from, to BreakerState) { fmt.Println(from, "->", to) },
	})
	refusing := &breakerStore{}
	refusing.fail(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	api := breaker.Guard(refusing)  // one handler's store
	site := breaker.Guard(refusing) // another's, on the same client

	checks := []limiter.Check{{Zone: "api", Key: "client", Limit: limiter.Limit{Window: time.Minute, Max: 100}}}
	decisions := make([]limiter.Decision, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	fmt.Println(api.Allow(ctx, checks, decisions) != nil)
	fmt.Println(site.Allow(ctx, checks, decisions) == ErrBreakerOpen, refusing.calls.Load())
	// Output:
	// closed -> open
	// true
	// true 1
}

// leaseLostStore answers every Extend with a lost lease and counts its calls.
type leaseLostStore struct {
	breakerStore
	extends, settles atomic.Int64
}

func (s *leaseLostStore) Extend(context.Context, []limiter.Check, []limiter.Decision) error {
	s.extends.Add(1)
	return fmt.Errorf("extending leases: %w", limiter.ErrLeaseLost)
}

func (s *leaseLostStore) Settle(context.Context, []limiter.Check, []limiter.Decision) error {
	s.settles.Add(1)
	return nil
}

// TestBreakerLeaseLostIsNoFailure: a lease that expired before Extend is the
// store's answer, not its failure: the breaker stays closed. Every method
// goes through the breaker: while it is open, Settle does not reach the
// store either.
func TestBreakerLeaseLostIsNoFailure(t *testing.T) {
	store := &leaseLostStore{}
	b := NewBreaker(BreakerOptions{Failures: 2})
	g := b.Guard(store)
	for range 5 {
		if err := g.Extend(context.Background(), breakerTestCheck, make([]limiter.Decision, 1)); !errors.Is(err, limiter.ErrLeaseLost) {
			t.Fatalf("Extend: %v, want ErrLeaseLost", err)
		}
	}
	wantState(t, b, BreakerClosed)
	store.fail(errBreakerTestStore)
	for range 2 {
		_ = g.Allow(context.Background(), breakerTestCheck, make([]limiter.Decision, 1))
	}
	wantState(t, b, BreakerOpen)
	if err := g.Settle(context.Background(), breakerTestCheck, make([]limiter.Decision, 1)); !errors.Is(err, ErrBreakerOpen) || store.settles.Load() != 0 {
		t.Errorf("Settle while open: %v, %d store calls; want ErrBreakerOpen and none", err, store.settles.Load())
	}
}

// TestBreakerOutOfMemoryIsNoFailure: a Redis at maxmemory with noeviction
// refuses the script's writes, but it answers: however many refusals come
// in a row, the breaker stays closed (and a half-open probe that meets one
// closes it), so the other handlers on that Redis, and the reads it still
// serves, go on.
func TestBreakerOutOfMemoryIsNoFailure(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	store := limiter.NewRedisStore(client, limiter.RedisOptions{KeyPrefix: "test:oom:", Timeout: time.Second})
	t.Cleanup(func() { store.Close() })
	ctx := context.Background()
	for _, cmd := range [][]any{{"config", "set", "maxmemory-policy", "noeviction"}, {"config", "set", "maxmemory", "1"}} {
		if err := client.Do(ctx, cmd...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = client.ConfigSet(ctx, "maxmemory", "0").Err() })

	clock := &breakerClock{t: time.Unix(1, 0)}
	b := NewBreaker(BreakerOptions{Failures: 2})
	b.now = clock.Now
	g := b.Guard(store)
	check := []limiter.Check{{Zone: "z", Key: "client", Limit: limiter.Limit{Window: time.Minute, Max: 10}}}
	for i := range 5 {
		err := g.Allow(ctx, check, make([]limiter.Decision, 1))
		if !limiter.OutOfMemory(err) {
			t.Fatalf("Allow %d on a full Redis: %v, want an OOM error", i, err)
		}
	}
	wantState(t, b, BreakerClosed)

	// A probe that meets a full Redis closes the breaker: Redis answered.
	b.transition(b.epoch.Load(), BreakerOpen)
	clock.Advance(time.Minute)
	if err := g.Allow(ctx, check, make([]limiter.Decision, 1)); !limiter.OutOfMemory(err) {
		t.Fatalf("probe on a full Redis: %v, want an OOM error", err)
	}
	wantState(t, b, BreakerClosed)
}

// TestBreakerOpenings: Openings counts the outages callers saw, each time
// the breaker opened from closed, not the probes that failed while it was
// open.
func TestBreakerOpenings(t *testing.T) {
	store := &breakerStore{}
	clock := &breakerClock{t: time.Unix(1, 0)}
	b := NewBreaker(BreakerOptions{Failures: 2})
	b.now = clock.Now
	g := b.Guard(store)
	allow := func() { _ = g.Allow(context.Background(), breakerTestCheck, make([]limiter.Decision, 1)) }
	store.fail(errBreakerTestStore)
	allow()
	allow()
	wantState(t, b, BreakerOpen)
	clock.Advance(time.Minute)
	allow() // a probe that fails
	wantState(t, b, BreakerOpen)
	if got := b.Openings(); got != 1 {
		t.Errorf("after one outage with a failed probe: %d openings, want 1", got)
	}
	store.fail(nil)
	clock.Advance(time.Minute)
	allow()
	wantState(t, b, BreakerClosed)
	store.fail(errBreakerTestStore)
	allow()
	allow()
	if got := b.Openings(); got != 2 {
		t.Errorf("after two outages: %d openings, want 2", got)
	}
}

// TestBreakerHostBusyIsNoFailure: a decision that missed its deadline while
// this host's CPUs held it up (a connection storm) says nothing of Redis:
// however many come in a row, the breaker stays closed, and a probe that
// meets one neither closes nor reopens it.
func TestBreakerHostBusyIsNoFailure(t *testing.T) {
	store := &breakerStore{}
	clock := &breakerClock{t: time.Unix(1, 0)}
	b := NewBreaker(BreakerOptions{Failures: 2})
	b.now = clock.Now
	g := b.Guard(store)
	busy := fmt.Errorf("rate limit decision not made in time: %w (%w)", limiter.ErrHostBusy, context.DeadlineExceeded)
	store.fail(busy)
	for range 10 {
		if err := g.Allow(context.Background(), breakerTestCheck, make([]limiter.Decision, 1)); !errors.Is(err, limiter.ErrHostBusy) {
			t.Fatalf("Allow: %v, want the store's ErrHostBusy", err)
		}
	}
	wantState(t, b, BreakerClosed)
	if got := b.Openings(); got != 0 {
		t.Errorf("%d openings, want none", got)
	}

	b.transition(b.epoch.Load(), BreakerOpen)
	clock.Advance(time.Minute)
	_ = g.Allow(context.Background(), breakerTestCheck, make([]limiter.Decision, 1))
	wantState(t, b, BreakerHalfOpen)
	store.fail(nil)
	if err := g.Allow(context.Background(), breakerTestCheck, make([]limiter.Decision, 1)); err != nil {
		t.Fatalf("the next probe: %v", err)
	}
	wantState(t, b, BreakerClosed)
}
