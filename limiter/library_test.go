package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// libraryStore starts a redis-server of its own (with flags) and a store
// on it, which has loaded nothing there yet.
func libraryStore(t *testing.T, flags ...string) (*redis.Client, *RedisStore) {
	t.Helper()
	client := redistest.StartWith(t, flags...).Client(t)
	s := NewRedisStore(client, RedisOptions{KeyPrefix: testPrefix(t), Timeout: 2 * time.Second})
	t.Cleanup(func() { s.Close() })
	return client, s
}

// callCounts returns how many times srv ran each of limit.lua's ways in:
// FCALL, EVALSHA and EVAL.
func callCounts(t *testing.T, client *redis.Client) (fcall, evalsha, eval float64) {
	t.Helper()
	f := infoFields(t, client, "commandstats", "cmdstat_fcall.calls", "cmdstat_evalsha.calls", "cmdstat_eval.calls")
	return f["cmdstat_fcall.calls"], f["cmdstat_evalsha.calls"], f["cmdstat_eval.calls"]
}

// scriptLoads returns how many times Redis ran SCRIPT LOAD.
func scriptLoads(t *testing.T, client *redis.Client) float64 {
	t.Helper()
	return infoFields(t, client, "commandstats", "cmdstat_script|load.calls")["cmdstat_script|load.calls"]
}

// waitForCalls allows one request at a time on s until Redis has run one
// through FCALL (want true) or it is clear that none goes so: a second
// after the store could have loaded the library. It fails the test if any
// decision is not the one a limit of max admits in order.
func waitForCalls(t *testing.T, s *RedisStore, client *redis.Client, key string, max int64, want bool) {
	t.Helper()
	limit := Limit{Window: time.Minute, Max: max}
	deadline := time.Now().Add(2 * loadEvery)
	if !want {
		deadline = time.Now().Add(time.Second)
	}
	for i := 0; ; i++ {
		d := make([]Decision, 1)
		if err := s.Allow(context.Background(), []Check{{Zone: "z", Key: key, Limit: limit, Cost: 1}}, d); err != nil {
			t.Fatalf("decision %d: %v", i+1, err)
		}
		if fcall, _, _ := callCounts(t, client); fcall > 0 || time.Now().After(deadline) {
			if (fcall > 0) != want {
				t.Fatalf("after %d decisions Redis ran %v FCALLs, want them to be %v", i+1, fcall, want)
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCallsGoThroughTheLibrary: on Redis 7 a store loads the library and
// its calls go through FCALL; a library lost (FUNCTION FLUSH, as a restart
// of a Redis without persistence loses it, SCRIPT FLUSH too) costs no
// decision, and the store loads it again.
func TestCallsGoThroughTheLibrary(t *testing.T) {
	client, s := libraryStore(t)
	key := testKey(t)
	waitForCalls(t, s, client, key, 1_000, true)

	fcall0, evalsha0, eval0 := callCounts(t, client)
	limit := Limit{Window: time.Minute, Max: 3}
	admitted := 0
	for range 10 {
		d := make([]Decision, 1)
		if err := s.Allow(context.Background(), []Check{{Zone: "z3", Key: key, Limit: limit, Cost: 1}}, d); err != nil {
			t.Fatal(err)
		}
		if d[0].Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Errorf("admitted %d of 10 under a limit of 3", admitted)
	}
	fcall, evalsha, eval := callCounts(t, client)
	if fcall-fcall0 != 10 || evalsha != evalsha0 || eval != eval0 {
		t.Errorf("10 decisions: %v FCALL, %v EVALSHA, %v EVAL, want 10, 0, 0", fcall-fcall0, evalsha-evalsha0, eval-eval0)
	}

	for _, cmd := range [][]any{{"function", "flush"}, {"script", "flush"}} {
		if err := client.Do(context.Background(), cmd...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	d := make([]Decision, 1)
	if err := s.Allow(context.Background(), []Check{{Zone: "z3", Key: key, Limit: limit, Cost: 1}}, d); err != nil {
		t.Fatalf("the first decision after the library was flushed: %v", err)
	}
	if d[0].Allowed {
		t.Error("a client at its limit was admitted after the library was flushed")
	}
	if _, _, e := callCounts(t, client); e != eval {
		t.Errorf("after the flush the call went %v times as EVAL, want none (SCRIPT LOAD, then EVALSHA)", e-eval)
	}
	if n := scriptLoads(t, client); n != 1 {
		t.Errorf("after the flush SCRIPT LOAD ran %v times, want once", n)
	}
	fcall, _, _ = callCounts(t, client)
	deadline := time.Now().Add(2 * loadEvery)
	for {
		if err := s.Allow(context.Background(), []Check{{Zone: "z3", Key: key, Limit: limit, Cost: 1}}, d); err != nil {
			t.Fatal(err)
		}
		if f, _, _ := callCounts(t, client); f > fcall {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no FCALL within %v of the library's flush", 2*loadEvery)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestScriptsWhereFunctionIsMissing: a Redis without FUNCTION (before 7,
// or an ACL that refuses it) decides through EVALSHA alone.
func TestScriptsWhereFunctionIsMissing(t *testing.T) {
	client, s := libraryStore(t, "--rename-command", "FUNCTION", "")
	waitForCalls(t, s, client, testKey(t), 1_000, false)
	if !s.batch.library.refused.Load() {
		t.Error("the store did not take note that Redis has no FUNCTION")
	}
	if _, evalsha, _ := callCounts(t, client); evalsha == 0 {
		t.Error("no EVALSHA: the decisions went some other way")
	}
}

// TestScriptsStayLoaded: without FUNCTION, the script is loaded once with
// SCRIPT LOAD and called by its hash, even while other clients run so many
// EVALs that Redis 7.4 and later and Valkey 8 evict the scripts EVAL cached
// (500 of them at most): never sent whole with a request. Before, on Redis
// 8.0-m01 and Valkey 8.0.1, each of the 5 decisions went as an EVAL.
func TestScriptsStayLoaded(t *testing.T) {
	client, s := libraryStore(t, "--rename-command", "FUNCTION", "")
	ctx := context.Background()
	key := testKey(t)
	limit := Limit{Window: time.Minute, Max: 1_000}
	const rounds, others = 5, 1_000
	evals := 0
	for round := range rounds {
		d := make([]Decision, 1)
		if err := s.Allow(ctx, []Check{{Zone: "z", Key: key, Limit: limit, Cost: 1}}, d); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if !d[0].Allowed {
			t.Fatalf("round %d: denied under a limit of %d", round, limit.Max)
		}
		pipe := client.Pipeline()
		for i := range others {
			pipe.Eval(ctx, fmt.Sprintf("return %d", round*others+i), nil)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		evals += others
	}
	_, evalsha, eval := callCounts(t, client)
	if got := eval - float64(evals); got != 0 {
		t.Errorf("%d decisions sent the whole script %v times (EVAL), want never", rounds, got)
	}
	if evalsha < rounds {
		t.Errorf("%d decisions made %v EVALSHA calls, want one each at least", rounds, evalsha)
	}
	if n := scriptLoads(t, client); n != 1 {
		t.Errorf("SCRIPT LOAD ran %v times, want once", n)
	}
}

// TestFullRedisStillDecidesThroughScripts: Redis at maxmemory refuses a
// function that may write before it runs, where it runs a script until its
// first write; a batch of denials (no write) is still decided by Redis, and
// a batch that must record gets the OOM error.
func TestFullRedisStillDecidesThroughScripts(t *testing.T) {
	client, s := libraryStore(t)
	key := testKey(t)
	waitForCalls(t, s, client, key, 1, true) // the client is at its limit
	ctx := context.Background()
	if err := client.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer client.ConfigSet(ctx, "maxmemory", "0")
	check := func(k string) Check {
		return Check{Zone: "z", Key: k, Limit: Limit{Window: time.Minute, Max: 1}, Cost: 1}
	}
	d := make([]Decision, 1)
	if err := s.Allow(ctx, []Check{check(key)}, d); err != nil {
		t.Fatalf("a client at its limit in a full Redis: %v, want a denial", err)
	}
	if d[0].Allowed {
		t.Error("a client at its limit was admitted")
	}
	err := s.Allow(ctx, []Check{check(testKey(t))}, d)
	if !OutOfMemory(err) {
		t.Errorf("a new client in a full Redis: %v, want its OOM error", err)
	}
}
