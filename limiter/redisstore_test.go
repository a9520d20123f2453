package limiter

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// scanKeys returns every key of the server that starts with prefix, which
// must hold no glob character.
func scanKeys(t *testing.T, client *redis.Client, prefix string) []string {
	t.Helper()
	var keys []string
	iter := client.Scan(testContext(t), 0, prefix+"*", 1000).Iterator()
	for iter.Next(testContext(t)) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// TestRedisStoreKey checks the key layout and that ParseKey reads every key
// Key builds back, zones with "}:" and client keys made bounded included,
// and tells keys of another prefix or layout apart.
func TestRedisStoreKey(t *testing.T) {
	s := newRedisStore(t, testClient, defaultKeyPrefix)
	if got, want := s.Key("api", "203.0.113.7"), "srl:{203.0.113.7}:api"; got != want {
		t.Errorf("Key = %q, want %q", got, want)
	}
	for _, c := range [][2]string{
		{"api", "203.0.113.7"}, {"login:4xx", "=Bearer abc"}, {"odd}:zone", "2001:db8::/64"},
		{"default@example.com/api/*", "192.0.2.1"}, {"default@a.example,b.example~2:counter:1m", "=k"},
		{"default@#0123456789abcdef", "#" + strings.Repeat("a", 43)}, {"default@server=srv1", "10.0.0.1"},
		{"z", BoundKey("{client}:with braces")}, {"z", BoundKey("\xff\xfe")}, {"", ""},
	} {
		zone, client, ours, ok := s.ParseKey(s.Key(c[0], c[1]))
		if !ours || !ok || zone != c[0] || client != c[1] {
			t.Errorf("ParseKey(Key(%q, %q)) = %q, %q, %v, %v", c[0], c[1], zone, client, ours, ok)
		}
	}
	for key, want := range map[string][2]bool{
		"other:{1.2.3.4}:api": {false, false},
		"srl:1.2.3.4:api":     {true, false},
		"srl:{1.2.3.4}api":    {true, false},
	} {
		if _, _, ours, ok := s.ParseKey(key); ours != want[0] || ok != want[1] {
			t.Errorf("ParseKey(%q): ours %v, ok %v; want %v, %v", key, ours, ok, want[0], want[1])
		}
	}
}

// TestRedisStoreHostileKeys checks the Redis keys that bounded hostile client
// keys make: exactly one per client, bounded in length, each with the whole
// bounded client key as its hash tag.
func TestRedisStoreHostileKeys(t *testing.T) {
	prefix := testPrefix(t)
	s := newRedisStore(t, testClient, prefix)
	const zone = "zone"
	lim := Limit{Window: time.Minute, Max: 1}
	var want []string
	for _, h := range hostileKeys() {
		bound := BoundKey(h.key)
		for range 2 {
			allow1(t, s, Check{Zone: zone, Key: bound, Limit: lim})
		}
		want = append(want, s.Key(zone, bound))
	}
	slices.Sort(want)
	got := scanKeys(t, testClient, prefix)
	if !slices.Equal(got, want) {
		t.Fatalf("Redis keys under %q:\n got %q\nwant %q", prefix, got, want)
	}
	maxLen := len(prefix) + len("{") + maxKeyLen + len("}:") + len(zone)
	for _, key := range got {
		if len(key) > maxLen {
			t.Errorf("Redis key of %d bytes, want <= %d: %.80q...", len(key), maxLen, key)
		}
		// Redis Cluster hashes the part between the first { and the next }.
		rest, ok := strings.CutPrefix(key, prefix+"{")
		tag, _, _ := strings.Cut(rest, "}")
		if !ok || prefix+"{"+tag+"}:"+zone != key {
			t.Errorf("Redis key %q: hash tag not the whole client key", key)
		}
		if tag == "" {
			// Redis Cluster then hashes the whole key name, zone included.
			t.Errorf("Redis key %q: empty hash tag", key)
		}
	}
}

// TestRedisStoreScriptFlush: the store loads the script again after SCRIPT
// FLUSH and FUNCTION FLUSH (NOSCRIPT, Function not found), and the counts
// survive.
func TestRedisStoreScriptFlush(t *testing.T) {
	testScriptFlush(t, newRedisStore(t, testClient, testPrefix(t)))
}

// testScriptFlush: after SCRIPT FLUSH and FUNCTION FLUSH (as a Redis
// restarted without persistence has neither) the store sends the script
// again and decides on the state it had.
func testScriptFlush(t *testing.T, s *RedisStore) {
	ctx := testContext(t)
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: 3}}
	for range 2 {
		allow1(t, s, c)
	}
	flush := func() {
		t.Helper()
		if err := testClient.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := testClient.FunctionFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	flush()
	if r := allow1(t, s, c); !r.d.Allowed || r.d.Remaining != 0 {
		t.Errorf("3rd request of max 3 after the flush: %+v, want Allowed with Remaining 0", r.d)
	}
	exists, err := testClient.ScriptExists(ctx, limitScript.Hash()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(exists, []bool{true}) {
		t.Errorf("script not sent again after the flush: SCRIPT EXISTS = %v", exists)
	}
	flush()
	if r := allow1(t, s, c); r.d.Allowed {
		t.Errorf("4th request of max 3 after the flush admitted: %+v", r.d)
	}
}

// TestRedisStoreRestart: Allow fails while Redis is down, and works again,
// from empty, once it is back.
func TestRedisStoreRestart(t *testing.T) {
	srv := redistest.Start(t)
	s := newRedisStore(t, srv.Client(t), testPrefix(t))
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: 2}}
	for range 2 {
		allow1(t, s, c)
	}
	if r := allow1(t, s, c); r.d.Allowed {
		t.Fatalf("3rd request of max 2 admitted: %+v", r.d)
	}

	srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := s.Allow(ctx, []Check{c}, make([]Decision, 1)); err == nil {
		t.Error("Allow with Redis down: no error")
	}

	srv.Restart(t)
	for i, want := range []Decision{
		{Allowed: true, Remaining: 1, Reset: time.Minute},
		{Allowed: true, Remaining: 0},
		{Allowed: false},
	} {
		r := allow1(t, s, c)
		if r.d.Allowed != want.Allowed || r.d.Remaining != want.Remaining || (i == 0 && exported(r.d) != want) {
			t.Errorf("request %d after restart (empty): %+v, want %+v", i+1, r.d, want)
		}
	}
}

// TestRedisStoreDeniedWritesNothing hammers a full key, alone and together
// with a zone that has room: neither key's value changes (DUMP), nor do their
// TTLs grow.
func TestRedisStoreDeniedWritesNothing(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingCounter} {
		t.Run(algo.String(), func(t *testing.T) {
			ctx := testContext(t)
			s := newRedisStore(t, testClient, testPrefix(t))
			key := testKey(t)
			const max = 5
			full := Check{Zone: "full", Key: key, Limit: Limit{Window: time.Minute, Max: max, Algorithm: algo}}
			open := Check{Zone: "open", Key: key, Limit: Limit{Window: time.Minute, Max: 100, Algorithm: algo}}
			for range max {
				allow1(t, s, full)
			}
			allow1(t, s, open)

			type state struct {
				dump string
				pttl time.Duration
			}
			read := func(zone string) state {
				k := s.Key(zone, key)
				dump, err := testClient.Dump(ctx, k).Result()
				if err != nil {
					t.Fatalf("DUMP %s: %v", k, err)
				}
				pttl, err := testClient.PTTL(ctx, k).Result()
				if err != nil {
					t.Fatal(err)
				}
				return state{dump, pttl}
			}
			if algo == SlidingLog {
				if n := len(readRing(t, testClient, s.Key("full", key), redisNow(t, testClient)).times); n != max {
					t.Fatalf("admissions kept in the full key = %d; want %d", n, max)
				}
			}
			fullBefore, openBefore := read("full"), read("open")
			for range 200 {
				if r := allow1(t, s, full); r.d.Allowed {
					t.Fatalf("request over max %d admitted: %+v", max, r.d)
				}
				if ds, _, _ := allowN(t, s, open, full); Admitted(ds) {
					t.Fatalf("two zones, one full, admitted: %+v", ds)
				}
			}
			if algo == SlidingLog {
				if n := len(readRing(t, testClient, s.Key("full", key), redisNow(t, testClient)).times); n != max {
					t.Errorf("admissions kept in the full key after 200 denials = %d; want %d", n, max)
				}
			}
			for _, z := range []struct {
				zone          string
				before, after state
			}{
				{"full", fullBefore, read("full")},
				{"open", openBefore, read("open")},
			} {
				if z.after.dump != z.before.dump {
					t.Errorf("zone %s: value changed by denied requests", z.zone)
				}
				if z.after.pttl > z.before.pttl {
					t.Errorf("zone %s: PTTL grew from %v to %v by denied requests", z.zone, z.before.pttl, z.after.pttl)
				}
			}
		})
	}
}

// TestRedisStoreTTL: a log key expires an eighth of a window after its newest
// admission ages out (the slack spares a busy key a new expiry at each
// admission), so an idle client costs Redis nothing after that.
func TestRedisStoreTTL(t *testing.T) {
	ctx := testContext(t)
	s := newRedisStore(t, testClient, testPrefix(t))
	const (
		w    = 300 * time.Millisecond
		keep = w + w/8 + 2*time.Millisecond // and the rounding to milliseconds
	)
	timed(t, func(t *testing.T, key string) string {
		c := Check{Zone: "z", Key: key, Limit: Limit{Window: w, Max: 3}}
		k := s.Key(c.Zone, c.Key)
		pttl := func() (time.Duration, time.Time) {
			d, err := testClient.PTTL(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			return d, time.Now()
		}

		r1 := allow1(t, s, c)
		got, at := pttl()
		if at.Sub(r1.start) > w/2 {
			return "a stall between the admission and PTTL"
		}
		if got <= 0 || got > keep {
			t.Errorf("PTTL after the first admission = %v, want in (0, %v]", got, keep)
		}
		time.Sleep(100 * time.Millisecond)
		r2 := allow1(t, s, c)
		got, at = pttl()
		if at.Sub(r2.start) > w/2 {
			return "a stall between the admission and PTTL"
		}
		// The key lives until the second admission ages out, and a little.
		checkWithin(t, "PTTL after the second admission", got, keep-at.Sub(r2.start)-time.Millisecond, keep)

		sleepUntil(r2.end.Add(keep + 50*time.Millisecond))
		if n, err := testClient.Exists(ctx, k).Result(); err != nil || n != 0 {
			t.Errorf("key %q still exists (%d, %v) after its last admission aged out", k, n, err)
		}
		return ""
	})
}

// TestRedisStoreCounterTTL: a counter key weighs until the end of the fixed
// window after its last admission's, and expires then.
func TestRedisStoreCounterTTL(t *testing.T) {
	ctx := testContext(t)
	s := newRedisStore(t, testClient, testPrefix(t))
	const w = 200 * time.Millisecond
	timed(t, func(t *testing.T, key string) string {
		c := Check{Zone: "z", Key: key, Limit: Limit{Window: w, Max: 3, Algorithm: SlidingCounter}}
		k := s.Key(c.Zone, c.Key)
		r := allow1(t, s, c)
		if !r.d.Allowed {
			t.Fatalf("first request denied: %+v", r.d)
		}
		got, err := testClient.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		// 2w minus the time elapsed in the admission's fixed window: more
		// than w, less what has passed since.
		elapsed := time.Since(r.start)
		if elapsed > w/2 {
			return "a stall between the admission and PTTL"
		}
		if lo := w - elapsed - tol; got <= lo || got > 2*w {
			t.Errorf("PTTL after an admission = %v; want in (%v, %v]", got, lo, 2*w)
		}
		sleepUntil(r.end.Add(2*w + 50*time.Millisecond))
		if n, err := testClient.Exists(ctx, k).Result(); err != nil || n != 0 {
			t.Errorf("key %q still exists (%d, %v) two windows after its last admission", k, n, err)
		}
		return ""
	})
}

// TestRedisStoreErrors: errors are returned, not turned into decisions.
func TestRedisStoreErrors(t *testing.T) {
	s := newRedisStore(t, testClient, testPrefix(t))
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: 3}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Allow(ctx, []Check{c}, make([]Decision, 1)); err == nil {
		t.Error("Allow with a canceled context: no error")
	}
}

// TestRedisStoreUnfixableErrors: errors that no retry can fix reach every
// caller as what they are (a refused database index, a missing or wrong
// password), alone or batched with others, never as a reply that could not
// be decoded.
func TestRedisStoreUnfixableErrors(t *testing.T) {
	srv := redistest.Start(t)
	if err := srv.Client(t).ConfigSet(context.Background(), "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		opts redis.Options
		want string
	}{
		{"db-index", redis.Options{Password: "s3cret", DB: 99}, "DB index is out of range"},
		{"wrong-password", redis.Options{Password: "wrong"}, "WRONGPASS"},
		{"no-password", redis.Options{}, "NOAUTH"},
	} {
		// Redis answers a call of more than 10 arguments (a batch of 7
		// or more) from a connection that has not authenticated with a
		// protocol error instead, and says so.
		unauthenticated := c.want == "NOAUTH"
		t.Run(c.name, func(t *testing.T) {
			opts := c.opts
			opts.Addr = srv.Addr()
			client := redis.NewClient(&opts)
			t.Cleanup(func() { client.Close() })
			s := newRedisStore(t, client, testPrefix(t))
			check := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: 3}}
			errs := make(chan error, 8)
			var wg sync.WaitGroup
			for range cap(errs) {
				wg.Go(func() { errs <- s.Allow(testContext(t), []Check{check}, make([]Decision, 1)) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if unauthenticated && err != nil && strings.Contains(err.Error(), "unauthenticated multibulk length") {
					continue
				}
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Errorf("Allow: error %v, want one that says %q", err, c.want)
				}
			}
		})
	}
}
