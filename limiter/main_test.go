package limiter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// testRedis is the redis-server shared by the package's tests. Tests never
// flush it: each one works under its own random key prefix and client keys.
var (
	testRedis  *redistest.Server
	testClient *redis.Client
)

func TestMain(m *testing.M) {
	srv, err := redistest.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, "limiter tests need a redis-server:", err)
		os.Exit(1)
	}
	testRedis = srv
	testClient = redis.NewClient(&redis.Options{Addr: srv.Addr()})
	code := m.Run()
	testClient.Close()
	srv.Close()
	// Every store and batcher the tests made was closed: none may
	// leave a goroutine behind.
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left after the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// randomID returns 16 random hex characters, safe in a Redis glob pattern.
func randomID(tb testing.TB) string {
	tb.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// testPrefix returns a Redis key prefix no other test uses.
func testPrefix(tb testing.TB) string { return "test:" + randomID(tb) + ":" }

// testKey returns a client key no other test uses.
func testKey(tb testing.TB) string { return "client-" + randomID(tb) }

// tol is the tolerance of every comparison between a duration a store
// reports and the real time measured around the calls.
const tol = 5 * time.Millisecond

// call is one Allow call with one check, and the real time around it: the
// store's clock read happens somewhere in [start, end].
type call struct {
	start, end time.Time
	d          Decision
}

// allow1 decides one check and fails the test on an error.
func allow1(tb testing.TB, s Store, c Check) call {
	tb.Helper()
	ds, start, end := allowN(tb, s, c)
	return call{start: start, end: end, d: ds[0]}
}

// allowN decides checks in one Allow call and fails the test on an error.
func allowN(tb testing.TB, s Store, checks ...Check) (ds []Decision, start, end time.Time) {
	tb.Helper()
	ds = make([]Decision, len(checks))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start = time.Now()
	err := s.Allow(ctx, checks, ds)
	end = time.Now()
	if err != nil {
		tb.Fatalf("Allow(%+v): %v", checks, err)
	}
	return ds, start, end
}

// untilAged bounds the time, seen from call c, until the admission made by
// call a ages out of window w: a's clock read is in [a.start, a.end] and c's in
// [c.start, c.end].
func untilAged(a call, cStart, cEnd time.Time, w time.Duration) (lo, hi time.Duration) {
	return w - cEnd.Sub(a.start), w - cStart.Sub(a.end)
}

// exported returns d with only its exported fields, to compare with a
// Decision literal.
func exported(d Decision) Decision {
	d.held = holding{}
	return d
}

// checkWithin fails unless lo-tol <= got <= hi+tol.
func checkWithin(tb testing.TB, what string, got, lo, hi time.Duration) {
	tb.Helper()
	if got < lo-tol || got > hi+tol {
		tb.Errorf("%s = %v, want in [%v, %v] (±%v)", what, got, lo, hi, tol)
	}
}

// timed runs a scenario whose assertions depend on the machine keeping to
// some timing (a sleep not overshooting by hundreds of milliseconds, say).
// The scenario measures that timing and returns a non-empty reason when it
// was not kept, before asserting anything that depends on it; timed then
// runs it again with a fresh client key. Genuine failures are reported by
// the scenario with t.Errorf or t.Fatalf and end the retries.
func timed(t *testing.T, run func(t *testing.T, key string) (slow string)) {
	t.Helper()
	const attempts = 3
	for i := 1; i <= attempts; i++ {
		slow := run(t, testKey(t))
		if slow == "" || t.Failed() {
			return
		}
		t.Logf("attempt %d inconclusive, retrying: %s", i, slow)
	}
	t.Fatalf("the machine was too slow for the scenario's timing %d times in a row", attempts)
}

// sleepUntil sleeps until deadline (at once if it has passed).
func sleepUntil(deadline time.Time) { time.Sleep(time.Until(deadline)) }

// newRedisStore returns a store on client under prefix, closed when the test
// ends. Its timeout is long: the tests' contexts set their deadlines.
func newRedisStore(tb testing.TB, client redisClient, prefix string) *RedisStore {
	s := NewRedisStore(client, RedisOptions{KeyPrefix: prefix, Timeout: time.Minute})
	tb.Cleanup(func() { s.Close() })
	return s
}
