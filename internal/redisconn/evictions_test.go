package redisconn

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// fastWatch starts a watch of client's Redis under label that reads every
// interval and logs at most every logInterval into an observer, and stops
// it when the test ends.
func fastWatch(t *testing.T, client redis.UniversalClient, label string, interval, logInterval time.Duration) (*evictionWatch, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	w := &evictionWatch{client: client, interval: interval, logInterval: logInterval,
		logger: func() *zap.Logger { return zap.New(core) }}
	w.start(label)
	t.Cleanup(w.stop)
	return w, logs
}

// evictedSeries is the value of label's redis_evicted_keys_total series.
func evictedSeries(label string) float64 {
	return testutil.ToFloat64(evictedKeys.WithLabelValues(label))
}

// evictedByRedis is the evicted_keys that c's server reports.
func evictedByRedis(t *testing.T, c redis.Cmdable) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	v, _ := infoValue(info, "evicted_keys")
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("evicted_keys %q: %v", v, err)
	}
	return n
}

// stopEvicting lifts c's server's maxmemory and returns its evicted_keys,
// which no longer grows: a Redis over its maxmemory goes on evicting in
// the background after the last write.
func stopEvicting(t *testing.T, c redis.Cmdable) int64 {
	t.Helper()
	if err := c.ConfigSet(context.Background(), "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	return evictedByRedis(t, c)
}

// makeEvicting gives c's server a maxmemory a megabyte above what it uses
// now, with allkeys-lru, so that writes past it evict.
func makeEvicting(t *testing.T, c redis.Cmdable) { makeEvictingAbove(t, c, 1<<20) }

// makeEvictingAbove gives c's server a maxmemory margin bytes above what it
// uses now, with allkeys-lru.
func makeEvictingAbove(t *testing.T, c redis.Cmdable, margin int64) {
	t.Helper()
	ctx := context.Background()
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	v, _ := infoValue(info, "used_memory")
	used, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("used_memory %q: %v", v, err)
	}
	for _, kv := range [][2]string{{"maxmemory-policy", "allkeys-lru"}, {"maxmemory", strconv.FormatInt(used+margin, 10)}} {
		if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// fill writes n values of 16 KB under prefix: 3 MB or so past a
// makeEvicting maxmemory evicts some 120 keys.
func fill(t *testing.T, c redis.Cmdable, prefix string, n int) {
	t.Helper()
	value := strings.Repeat("v", 16<<10)
	for i := range n {
		if err := c.Set(context.Background(), fmt.Sprintf("%s:%d", prefix, i), value, 0).Err(); err != nil {
			t.Fatalf("filling redis, value %d: %v", i, err)
		}
	}
}

// waitFor polls cond for up to 10 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// readSince waits until w has read its Redis once more after since.
func (w *evictionWatch) readSince(t *testing.T, since time.Time) {
	t.Helper()
	waitFor(t, "a reading of evicted_keys", func() bool {
		w.tally.reading.Lock()
		defer w.tally.reading.Unlock()
		return w.tally.lastReading.After(since)
	})
}

// loggedEvictions sums the evicted_keys of the eviction warnings.
func loggedEvictions(logs *observer.ObservedLogs) (lines []observer.LoggedEntry, sum int64) {
	for _, e := range logs.FilterMessageSnippet("redis evicted keys").All() {
		lines = append(lines, e)
		sum += e.ContextMap()["evicted_keys"].(int64)
	}
	return lines, sum
}

// TestEvictionsCounted: a Redis at its maxmemory with allkeys-lru evicts
// while it is written to; the series rises by what INFO stats says it
// evicted, and the warning comes once per log interval with the count
// since the last, which adds up to the series, and says what it cost and
// what to do.
func TestEvictionsCounted(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	label := srv.Addr()
	const logInterval = 400 * time.Millisecond
	w, logs := fastWatch(t, c, label, 20*time.Millisecond, logInterval)
	w.readSince(t, time.Time{})
	if got := evictedSeries(label); got != 0 {
		t.Fatalf("series %v before any eviction, want 0", got)
	}

	makeEvicting(t, c)
	// Evictions go on for three log intervals and more.
	start := time.Now()
	for i := 0; time.Since(start) < 3*logInterval+100*time.Millisecond; i++ {
		fill(t, c, "fill"+strconv.Itoa(i), 20)
		time.Sleep(5 * time.Millisecond)
	}
	writing := time.Since(start)
	evicted := stopEvicting(t, c)
	if evicted < 100 {
		t.Fatalf("redis evicted %d keys, want the fill to evict more", evicted)
	}
	waitFor(t, "the series to reach INFO's evicted_keys", func() bool { return evictedSeries(label) >= float64(evicted) })
	if got := evictedSeries(label); got != float64(evicted) {
		t.Errorf("series %v, INFO stats evicted_keys %d", got, evicted)
	}

	// What was counted after the last line is logged once its interval
	// has passed.
	waitFor(t, "the warnings to add up to the count", func() bool { _, sum := loggedEvictions(logs); return sum == evicted })
	lines, _ := loggedEvictions(logs)
	t.Logf("%d keys evicted in %v of writes, %d warnings", evicted, writing.Round(time.Millisecond), len(lines))
	if max := int(writing/logInterval) + 2; len(lines) < 2 || len(lines) > max {
		t.Errorf("%d warnings over %v, want 2 to %d (one per %v)", len(lines), writing, max, logInterval)
	}
	// The watch reads its clock before it logs, and the logger stamps
	// the line a moment after, a moment that varies: two lines' stamps
	// may be a few µs closer than the watch's reads (399.95ms once).
	const stamped = time.Millisecond
	for i := 1; i < len(lines); i++ {
		if gap := lines[i].Time.Sub(lines[i-1].Time); gap < logInterval-stamped {
			t.Errorf("warnings %d and %d %v apart, want at least %v", i, i+1, gap, logInterval)
		}
	}
	first := lines[0]
	if first.Level != zapcore.WarnLevel {
		t.Errorf("level %v, want warn", first.Level)
	}
	for _, want := range []string{"restarted a client's limit", "every key of that redis", "noeviction", "memory"} {
		if !strings.Contains(first.Message, want) {
			t.Errorf("warning %q does not say %q", first.Message, want)
		}
	}
	if got := first.ContextMap()["redis"]; got != label {
		t.Errorf("warning's redis %v, want %s", got, label)
	}
}

// TestEvictionsAcrossRestarts: a Redis restarted empty counts its
// evictions from 0 again, and so does one whose stats CONFIG RESETSTAT
// cleared; the series neither goes back nor jumps, and counts what each
// evicted since.
func TestEvictionsAcrossRestarts(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	label := srv.Addr()
	w, _ := fastWatch(t, c, label, 20*time.Millisecond, time.Hour)
	w.readSince(t, time.Time{})

	makeEvicting(t, c)
	fill(t, c, "before", 200)
	want := float64(stopEvicting(t, c))
	waitFor(t, "the evictions counted", func() bool { return evictedSeries(label) == want })

	srv.Restart(t)
	restarted := time.Now()
	w.readSince(t, restarted)
	if got := evictedSeries(label); got != want {
		t.Fatalf("series %v after a restart, want %v as before it", got, want)
	}
	makeEvicting(t, c)
	fill(t, c, "after", 200)
	afterRestart := stopEvicting(t, c)
	want += float64(afterRestart)
	waitFor(t, "the evictions after the restart counted", func() bool { return evictedSeries(label) >= want })
	if got := evictedSeries(label); got != want {
		t.Errorf("series %v, want %v: the count before the restart and the %d after it", got, want, afterRestart)
	}

	if err := c.ConfigResetStat(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	reset := time.Now()
	w.readSince(t, reset)
	if got := evictedSeries(label); got != want {
		t.Fatalf("series %v after CONFIG RESETSTAT, want %v as before it", got, want)
	}
	makeEvicting(t, c)
	fill(t, c, "reset", 200)
	want += float64(stopEvicting(t, c))
	waitFor(t, "the evictions after CONFIG RESETSTAT counted", func() bool { return evictedSeries(label) >= want })
	if got := evictedSeries(label); got != want {
		t.Errorf("series %v, want %v", got, want)
	}
}

// TestEvictionsOfWhatWasThereBefore: a watch starts from the count Redis
// has, not from 0: the evictions of before are not this Caddy's to report.
func TestEvictionsOfWhatWasThereBefore(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	makeEvicting(t, c)
	fill(t, c, "old", 200)
	label := srv.Addr()
	w, _ := fastWatch(t, c, label, 20*time.Millisecond, time.Hour)
	w.readSince(t, time.Now())
	if got := evictedSeries(label); got != 0 {
		t.Errorf("series %v from %d evictions before the watch, want 0", got, evictedByRedis(t, c))
	}
}

// TestEvictionsOnCluster: on Redis Cluster every primary evicts its own
// keys; the series is their sum.
func TestEvictionsOnCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	c := cluster.Client(t)
	label := "cluster-" + cluster.Addrs()[0]
	w, _ := fastWatch(t, c, label, 20*time.Millisecond, time.Hour)
	w.readSince(t, time.Time{})
	// The cluster has primaries only.
	var nodes []*redis.Client
	for _, addr := range cluster.Addrs() {
		node := cluster.Node(addr).Client(t)
		makeEvicting(t, node)
		nodes = append(nodes, node)
	}
	fill(t, c, "spread", 600)
	var sum int64
	var each []int64
	for _, node := range nodes {
		n := stopEvicting(t, node)
		if n == 0 {
			t.Fatalf("primary %s evicted nothing: want each to evict", node.Options().Addr)
		}
		each = append(each, n)
		sum += n
	}
	waitFor(t, "the evictions of every primary counted", func() bool { return evictedSeries(label) >= float64(sum) })
	if got := evictedSeries(label); got != float64(sum) {
		t.Errorf("series %v, want %d, the primaries' %v", got, sum, each)
	}
}

// TestEvictionsOfTheSentinelsPrimary: through a sentinel the primary of
// the moment is read: after a failover, what the new one evicts counts, and
// the series does not jump by the count the new primary had.
func TestEvictionsOfTheSentinelsPrimary(t *testing.T) {
	st := redistest.StartSentinel(t)
	conn, err := Open(Sentinel, st.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	label := "sentinel-" + st.SentinelAddr()
	w, _ := fastWatch(t, conn.Client(), label, 20*time.Millisecond, time.Hour)
	w.readSince(t, time.Time{})

	// A primary's replication buffers take memory of their own: the
	// margin leaves room for them, or Redis refuses writes.
	const margin = 8 << 20
	first := st.Node(st.Master()).Client(t)
	makeEvictingAbove(t, first, margin)
	fill(t, conn.Client(), "first", 1000)
	want := float64(stopEvicting(t, first))
	if want == 0 {
		t.Fatal("the first primary evicted nothing")
	}
	waitFor(t, "the first primary's evictions counted", func() bool { return evictedSeries(label) >= want })

	st.Failover(t)
	second := st.Node(st.Master()).Client(t)
	runID := func(c redis.Cmdable) string {
		id, _ := infoValue(c.Info(context.Background(), "server").Val(), "run_id")
		return id
	}
	waitFor(t, "the client on the new primary", func() bool { return runID(conn.Client()) == runID(second) })
	w.readSince(t, time.Now())
	if got := evictedSeries(label); got != want {
		t.Fatalf("series %v after the failover, want %v as before it", got, want)
	}
	makeEvictingAbove(t, second, margin)
	fill(t, conn.Client(), "second", 1000)
	secondEvicted := stopEvicting(t, second)
	if secondEvicted == 0 {
		t.Fatal("the new primary evicted nothing")
	}
	want += float64(secondEvicted)
	waitFor(t, "the new primary's evictions counted", func() bool { return evictedSeries(label) >= want })
	if got := evictedSeries(label); got != want {
		t.Errorf("series %v, want %v", got, want)
	}
}

// TestEvictionWatchStopsWithItsConnection: the watch starts with a pooled
// connection, its series at 0, and stops when the last use is closed,
// leaving no goroutine and no series behind.
func TestEvictionWatchStopsWithItsConnection(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	srv := redistest.Start(t)
	url := srv.URL()
	a, err := Open("", url)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open("", url)
	if err != nil {
		t.Fatal(err)
	}
	if a.s.evictions != b.s.evictions {
		t.Fatal("two uses of one connection watch its evictions apart")
	}
	a.s.evictions.readSince(t, time.Time{})
	hasSeries := func() bool {
		registry := prometheus.NewRegistry()
		registry.MustRegister(evictedKeys)
		families, err := registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "redis" && l.GetValue() == srv.Addr() {
						return true
					}
				}
			}
		}
		return false
	}
	if !hasSeries() {
		t.Error("no series while the connection is open")
	}
	a.Close()
	if !hasSeries() {
		t.Error("the series is gone while a use remains")
	}
	b.Close()
	if hasSeries() {
		t.Error("the series outlives the connection")
	}
}

// TestEvictionCount: what a reading adds to the series, server by server:
// nothing for a server first seen (unless it started since the last
// reading), what its count grew by, and all of a count that went down.
func TestEvictionCount(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(1_000_000+int64(s), 0) }
	type reading struct {
		at       int
		readings []serverReading
		want     int64
	}
	for _, c := range []struct {
		name  string
		steps []reading
	}{
		{"first sight is a baseline", []reading{
			{0, []serverReading{{"a", 500, 3600}}, 0},
			{5, []serverReading{{"a", 520, 3605}}, 20},
			{10, []serverReading{{"a", 520, 3610}}, 0},
		}},
		{"a restart between two readings counts the new server's all", []reading{
			{0, []serverReading{{"a", 500, 3600}}, 0},
			{5, []serverReading{{"b", 700, 3}}, 700},
			{10, []serverReading{{"b", 710, 8}}, 10},
		}},
		{"a restart during an outage", []reading{
			{0, []serverReading{{"a", 500, 3600}}, 0},
			{5, nil, 0},
			{60, []serverReading{{"b", 40, 30}}, 40},
		}},
		{"a failover to a server up for long is a baseline", []reading{
			{0, []serverReading{{"a", 500, 3600}}, 0},
			{5, []serverReading{{"b", 90, 7200}}, 0},
			{10, []serverReading{{"b", 95, 7205}}, 5},
		}},
		{"back to a server seen before", []reading{
			{0, []serverReading{{"a", 500, 3600}}, 0},
			{5, []serverReading{{"b", 90, 7200}}, 0},
			{10, []serverReading{{"a", 530, 3610}}, 30},
		}},
		{"a count that went down was reset", []reading{
			{0, []serverReading{{"a", 500, 3600}}, 0},
			{5, []serverReading{{"a", 12, 3605}}, 12},
		}},
		{"no run_id, no uptime", []reading{
			{0, []serverReading{{"host:6379", 500, -1}}, 0},
			{5, []serverReading{{"host:6379", 510, -1}}, 10},
			{10, []serverReading{{"host:6379", 4, -1}}, 4},
		}},
		{"primaries of a cluster", []reading{
			{0, []serverReading{{"a", 10, 100}, {"b", 20, 100}}, 0},
			{5, []serverReading{{"a", 15, 105}, {"b", 27, 105}, {"c", 3, 2}}, 15},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			label := "count-" + strings.ReplaceAll(c.name, " ", "-")
			tally := acquireTally(label)
			defer tally.release()
			var total int64
			for i, step := range c.steps {
				if got := tally.count(at(step.at), step.readings); got != step.want {
					t.Errorf("reading %d at %ds: %d, want %d", i+1, step.at, got, step.want)
				}
				total += step.want
			}
			if got := evictedSeries(label); got != float64(total) {
				t.Errorf("series %v, want %d", got, total)
			}
		})
	}
}
