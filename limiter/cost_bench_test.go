package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// infoFields returns the named fields of INFO section, as numbers; a field
// of commandstats such as "cmdstat_evalsha.usec" names the stat and its part.
func infoFields(tb testing.TB, client *redis.Client, section string, names ...string) map[string]float64 {
	tb.Helper()
	info, err := client.Info(context.Background(), section).Result()
	if err != nil {
		tb.Fatal(err)
	}
	out := make(map[string]float64)
	for line := range strings.Lines(info) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		for _, want := range names {
			stat, part, sub := strings.Cut(want, ".")
			switch {
			case !sub && name == want:
				out[want], _ = strconv.ParseFloat(value, 64)
			case sub && name == stat:
				for kv := range strings.SplitSeq(value, ",") {
					if k, v, _ := strings.Cut(kv, "="); k == part {
						out[want], _ = strconv.ParseFloat(v, 64)
					}
				}
			}
		}
	}
	return out
}

// floorScript is the least a decision can cost Redis: one read and one
// write of the client's value, batched as limit.lua batches.
var floorScript = redis.NewScript(`
for _, key in ipairs(KEYS) do
  redis.call('SET', key, redis.call('GET', key), 'PX', 120000)
end
return #KEYS`)

// cpuMode is how BenchmarkRedisCPUPerDecision sends its decisions.
type cpuMode int

const (
	// viaStore: 32 concurrent callers of a RedisStore, which batches them
	// as they come.
	viaStore cpuMode = iota
	// batch32: limit.lua calls of exactly 32 decisions each, two in flight,
	// as a script (EVALSHA).
	batch32
	// function32: the same through the library (FCALL).
	function32
	// floor32: floorScript calls of 32 keys each, two in flight.
	floor32
)

func (m cpuMode) String() string { return [...]string{"store", "batch32", "function32", "floor32"}[m] }

// BenchmarkRedisCPUPerDecision measures Redis's CPU per decision of the
// sliding log at several limits, over many clients, each client's ring full
// of admissions spread over the window with its oldest ones just aged out,
// so that every decision admits, overwriting the oldest slot, and finds its
// remaining and reset by search: the steady state of a client at its limit.
// Above 4*ringMerge the ring is the units ring of merged entries the script
// keeps there (mergedRing). Clients are fewer at the largest limits, to
// bound the memory they take.
// Decisions go through a RedisStore from 32 concurrent callers, and as
// script calls of exactly 32 decisions; at max 60 the floor (a GET and a
// SET per key, batched alike) is measured too, on the same keys, as the
// reference that a loaded machine shifts along with the rest. The units
// scenario (units/settle: each request allowed, then settled to its real
// cost; units/allow: the same allows alone, its reference; units/peek: each
// allow followed by a peek of its zone, the least a second request that
// reads the ring costs; units/empty: each followed by a request the script
// answers without touching the ring, the least a request of its own costs)
// counts a request as one decision. It reports
// INFO cpu's delta and INFO commandstats' script time per decision; it
// asserts nothing about them.
//
//	go test -run '^$' -bench RedisCPUPerDecision -benchtime 1x ./limiter/
func BenchmarkRedisCPUPerDecision(b *testing.B) {
	for _, limit := range []int{60, 1000, 10_000, 100_000} {
		modes := []cpuMode{viaStore, batch32, function32}
		if 18+6*limit <= ringSmall {
			modes = append(modes, floor32)
		}
		for _, mode := range modes {
			b.Run(fmt.Sprintf("max%d/%s", limit, mode), func(b *testing.B) {
				clients := min(10_000, 20_000_000/limit)
				rounds := max(3, 20_000/clients)
				for b.Loop() {
					redisCPUPerDecision(b, limit, clients, rounds, mode)
				}
			})
		}
	}
	for _, then := range []unitsThen{thenSettle, thenNothing, thenPeek, thenEmpty} {
		b.Run("units/"+then.String(), func(b *testing.B) {
			for b.Loop() {
				redisCPUPerUnits(b, then)
			}
		})
	}
}

// unitsThen is what the units scenario of BenchmarkRedisCPUPerDecision
// sends after each request's allow.
type unitsThen int

const (
	// thenSettle: the settle of the request's real cost.
	thenSettle unitsThen = iota
	// thenNothing: the allows alone, the reference.
	thenNothing
	// thenPeek: a peek of the same zone, a second request of the batch that
	// reads the ring and writes nothing: what a settle that reads the ring
	// costs at least.
	thenPeek
	// thenEmpty: an extend of the log zone, a second request of the batch
	// that the script reads and answers but that neither reads nor writes
	// the ring: what a request of its own costs at least.
	thenEmpty
)

func (t unitsThen) String() string { return [...]string{"settle", "allow", "peek", "empty"}[t] }

func redisCPUPerDecision(b *testing.B, max, clients, rounds int, mode cpuMode) {
	const (
		window  = time.Minute
		callers = 32
	)
	srv := redistest.Start(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: callers, ContextTimeoutEnabled: true})
	defer client.Close()
	ctx := context.Background()
	s := NewRedisStore(client, RedisOptions{KeyPrefix: "srl:", Timeout: 10 * time.Second})
	defer s.Close()
	key := func(i int) string { return "198.51." + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&0xff) }
	lim := Limit{Window: window, Max: int64(max)}

	now, err := client.Time(ctx).Result()
	if err != nil {
		b.Fatal(err)
	}
	var ring []byte
	if max > 4*ringMerge {
		ring = mergedRing(now.UnixMicro(), window, int64(max))
	} else { // full rings whose oldest rounds+1 times have aged out
		step := window.Microseconds() / int64(max)
		first := now.UnixMicro() - window.Microseconds() - int64(rounds+1)*step
		times := make([]int64, max)
		for k := range times {
			times[k] = first + int64(k)*step
		}
		ring = encodeRing(max, times)
	}
	setRings(b, client, clients, func(i int) string { return s.Key("z", key(i)) }, ring, 2*window)
	allow1(b, s, Check{Zone: "warmup", Key: "warmup", Limit: lim}) // load the script
	if err := floorScript.Load(ctx, client).Err(); err != nil {
		b.Fatal(err)
	}
	if err := loadLibrary(ctx, client); err != nil {
		b.Fatal(err)
	}
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	cpuBefore := infoFields(b, client, "cpu", "used_cpu_user", "used_cpu_sys")

	var next, denied atomic.Int64
	decisions := int64(clients * rounds)
	start := time.Now()
	var wg sync.WaitGroup
	if mode == viaStore {
		for range callers {
			wg.Go(func() {
				checks := []Check{{Zone: "z", Limit: lim}}
				ds := make([]Decision, 1)
				for {
					n := next.Add(1) - 1
					if n >= decisions {
						return
					}
					checks[0].Key = key(int(n % int64(clients)))
					if err := s.Allow(ctx, checks, ds); err != nil {
						b.Error(err)
						return
					}
					if !ds[0].Allowed {
						denied.Add(1)
					}
				}
			})
		}
	} else {
		for range 2 { // two calls in flight: Redis never waits for the next
			wg.Go(func() {
				for {
					n := next.Add(callers) - callers
					if n >= decisions {
						return
					}
					keys := make([]string, 0, callers)
					var args []byte
					var checks []Check
					for j := n; j < n+callers && j < decisions; j++ {
						c := Check{Zone: "z", Key: key(int(j % int64(clients))), Limit: lim}
						keys = append(keys, s.Key(c.Zone, c.Key))
						checks = append(checks, c)
						args = appendRequest(args, opAllow, []Check{c}, make([]Decision, 1), 0, nil)
					}
					if mode == floor32 {
						if err := floorScript.Run(ctx, client, keys).Err(); err != nil {
							b.Error(err)
						}
						continue
					}
					var reply any
					var err error
					if mode == function32 {
						reply, err = client.FCall(ctx, functionName, keys, args).Result()
					} else {
						reply, err = limitScript.Run(ctx, client, keys, args).Result()
					}
					if err != nil {
						b.Error(err)
						return
					}
					r, err := checkReply(reply, replyLen(len(keys), len(keys)))
					if err != nil {
						b.Error(err)
						return
					}
					ds := make([]Decision, 1)
					for _, c := range checks {
						decodeReply(r[:replyLen(1, 1)], opAllow, []Check{c}, ds, 0, nil)
						r = r[replyLen(1, 1):]
						if !ds[0].Allowed {
							denied.Add(1)
						}
					}
				}
			})
		}
	}
	wg.Wait()
	if denied.Load() != 0 {
		b.Errorf("%d of %d decisions denied: the rings were not as meant", denied.Load(), decisions)
	}
	reportRedisCPU(b, client, cpuBefore, decisions, time.Since(start), fmt.Sprintf("max %d, %s, %d clients at their limit", max, mode, clients))
}

// mergedRing returns the ring limit.lua keeps for a client at a limit above
// 4*ringMerge: a units ring of ringMerge entries spread over the window,
// each merging max/ringMerge admissions, its oldest three just aged out. A
// count ring of max admissions turns into one at its first record, which a
// benchmark prefilled with it would measure in place of the steady state.
func mergedRing(now int64, window time.Duration, max int64) []byte {
	const entries = ringMerge
	step := window.Microseconds() / (entries - 3)
	times, units := make([]int64, entries), make([]int64, entries)
	for k := range times {
		times[k] = now - window.Microseconds() - 3*step + int64(k)*step
		units[k] = max / entries
	}
	return encodeUnitsRing(2*entries, times, units, max, now/1000+2*window.Milliseconds())
}

// setRings stores ring under key(i) for each of n clients, with the
// expiry ttl, in pipelines of 100.
func setRings(b *testing.B, client *redis.Client, n int, key func(int) string, ring []byte, ttl time.Duration) {
	ctx := context.Background()
	pipe := client.Pipeline()
	for i := range n {
		pipe.Set(ctx, key(i), ring, ttl)
		if i%100 == 99 {
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}
}

// reportRedisCPU reports Redis's CPU (INFO cpu's delta from cpuBefore) and
// its script time (INFO commandstats, reset before: EVALSHA's and FCALL's)
// per decision.
func reportRedisCPU(b *testing.B, client *redis.Client, cpuBefore map[string]float64, decisions int64, elapsed time.Duration, what string) {
	inner := []string{"get", "set", "getrange", "setrange", "pexpire", "time", "del"}
	names := []string{"cmdstat_evalsha.usec", "cmdstat_evalsha.calls", "cmdstat_fcall.usec", "cmdstat_fcall.calls"}
	for _, c := range inner {
		names = append(names, "cmdstat_"+c+".calls", "cmdstat_"+c+".usec")
	}
	stats := infoFields(b, client, "commandstats", names...)
	var breakdown strings.Builder
	for _, c := range inner {
		if n := stats["cmdstat_"+c+".calls"]; n > 0 {
			fmt.Fprintf(&breakdown, " %s %.2f/decision (%.2f µs each);", c, n/float64(decisions), stats["cmdstat_"+c+".usec"]/n)
		}
	}
	cpu := []string{"used_cpu_user", "used_cpu_sys"}
	cpuAfter := infoFields(b, client, "cpu", cpu...)
	cpuUsec := (cpuAfter["used_cpu_user"] + cpuAfter["used_cpu_sys"] - cpuBefore["used_cpu_user"] - cpuBefore["used_cpu_sys"]) * 1e6
	usec, calls := stats["cmdstat_evalsha.usec"]+stats["cmdstat_fcall.usec"], stats["cmdstat_evalsha.calls"]+stats["cmdstat_fcall.calls"]
	perDecision := usec / float64(decisions)
	b.ReportMetric(perDecision, "script-µs/decision")
	b.ReportMetric(cpuUsec/float64(decisions), "cpu-µs/decision")
	b.ReportMetric(float64(decisions)/calls, "decisions/call")
	b.Logf("%s, %d decisions in %v: Redis CPU %.2f µs/decision, in the script %.2f µs/decision (%.0f calls, %.0f of them FCALL, %.1f decisions each);%s",
		what, decisions, elapsed.Round(time.Millisecond), cpuUsec/float64(decisions), perDecision,
		calls, stats["cmdstat_fcall.calls"], float64(decisions)/calls, breakdown.String())
}

// redisCPUPerUnits is the units scenario of make bench: 10,000 clients far
// under a budget of 1,000,000 units a minute, each request reserving 1 unit
// and, when settle is set, settled to 1 to 50 units right after (a second
// script call, batched as decisions are). Each client's units ring starts
// with 36 admissions over the last 70 s, the oldest 3 aged out (as a client
// of that scenario holds after a few runs). A decision here is a request:
// its allow and its settle.
func redisCPUPerUnits(b *testing.B, then unitsThen) {
	const (
		window  = time.Minute
		clients = 10_000
		rounds  = 3
		callers = 32
		held    = 36
	)
	srv := redistest.Start(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: callers, ContextTimeoutEnabled: true})
	defer client.Close()
	ctx := context.Background()
	s := NewRedisStore(client, RedisOptions{KeyPrefix: "srl:", Timeout: 10 * time.Second})
	defer s.Close()
	key := func(i int) string { return "units-" + strconv.Itoa(i) }
	lim := Limit{Window: window, Max: 1_000_000}

	now := redisNow(b, client)
	// Spread over the window, the newest a step ago, the oldest three aged
	// out: admissions in the future would put every new one after them.
	step := window.Microseconds() / (held - 3)
	times, units := make([]int64, held), make([]int64, held)
	for k := range times {
		times[k] = now - window.Microseconds() - 3*step + int64(k)*step
		units[k] = 1 + int64(k*7)%50
	}
	ring := encodeUnitsRing(64, times, units, lim.Max, now/1000+2*window.Milliseconds())
	setRings(b, client, clients, func(i int) string { return s.Key("z", key(i)) }, ring, 2*window)
	if r := readRing(b, client, s.Key("z", key(0)), now); len(r.times) != held {
		b.Fatalf("prefilled ring holds %d admissions, want %d", len(r.times), held)
	}
	allow1(b, s, Check{Zone: "warmup", Key: "warmup", Limit: lim}) // load the script
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	cpuBefore := infoFields(b, client, "cpu", "used_cpu_user", "used_cpu_sys")
	var next, denied atomic.Int64
	decisions := int64(clients * rounds)
	start := time.Now()
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			checks := []Check{{Zone: "z", Limit: lim}}
			ds := make([]Decision, 1)
			for {
				n := next.Add(1) - 1
				if n >= decisions {
					return
				}
				checks[0].Key, checks[0].Cost = key(int(n%clients)), 0
				if err := s.Allow(ctx, checks, ds); err != nil {
					b.Error(err)
					return
				}
				if !ds[0].Allowed {
					denied.Add(1)
				}
				var err error
				switch then {
				case thenSettle:
					checks[0].Cost = 1 + n%50
					err = s.Settle(ctx, checks, ds)
				case thenPeek:
					err = s.Peek(ctx, checks, ds)
				case thenEmpty: // a log zone's extend is done in Go: sent as is, the script only answers it
					if err = s.do(ctx, methodExtend, nil, checks, ds, nil, 0); errors.Is(err, ErrLeaseLost) {
						err = nil
					}
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if denied.Load() != 0 {
		b.Errorf("%d of %d requests denied under a budget they never reach", denied.Load(), decisions)
	}
	what := [...]string{"allow then settle", "allow alone", "allow then peek", "allow then an empty request"}[then]
	reportRedisCPU(b, client, cpuBefore, decisions, time.Since(start), fmt.Sprintf("units, %s, %d clients", what, clients))
}

// BenchmarkRedisMemoryPerClient measures what Redis holds for a client at
// its limit of 60, 1,000 and 10,000 admissions, filled through the store:
// MEMORY USAGE of its key and the used_memory delta per client; and, for a
// budget of 100,000 units spent by requests of 1 to 1,000 units (about 200
// admissions), what it holds per admission.
//
//	go test -run '^$' -bench RedisMemoryPerClient -benchtime 1x ./limiter/
func BenchmarkRedisMemoryPerClient(b *testing.B) {
	for _, c := range []struct {
		name         string
		max, clients int
		units        bool
	}{{"max60", 60, 1000, false}, {"max1000", 1000, 100, false}, {"max10000", 10_000, 10, false}, {"units", 100_000, 100, true}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				redisMemoryPerClient(b, c.max, c.clients, c.units)
			}
		})
	}
}

func redisMemoryPerClient(b *testing.B, max, clients int, units bool) {
	const workers = 16
	srv := redistest.Start(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: workers})
	defer client.Close()
	ctx := context.Background()
	s := NewRedisStore(client, RedisOptions{KeyPrefix: "srl:", Timeout: 10 * time.Second})
	defer s.Close()
	lim := Limit{Window: time.Hour, Max: int64(max)}
	key := func(i int) string { return "203.0." + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&0xff) }
	allow1(b, s, Check{Zone: "warmup", Key: "warmup", Limit: lim})
	before := infoFields(b, client, "memory", "used_memory")["used_memory"]
	// Each client: requests until its budget is spent; by units, costs of
	// 1 to 1,000 in a fixed sequence.
	var next, admissions atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			ds := make([]Decision, 1)
			for {
				i := int(next.Add(1) - 1)
				if i >= clients {
					return
				}
				checks := []Check{{Zone: "default", Key: key(i), Limit: lim}}
				for n := 0; ; n++ {
					if units {
						checks[0].Cost = 1 + int64(n*7919%1000)
					} else if n == max {
						break
					}
					if err := s.Allow(ctx, checks, ds); err != nil {
						b.Errorf("client %d, request %d: %v", i, n, err)
						return
					}
					if !ds[0].Allowed {
						if !units {
							b.Errorf("client %d, request %d: %+v", i, n, ds[0])
						}
						break
					}
					admissions.Add(1)
				}
			}
		})
	}
	wg.Wait()
	after := infoFields(b, client, "memory", "used_memory")["used_memory"]
	var usage int64
	for i := range clients {
		k := s.Key("default", key(i))
		ring := readRing(b, client, k, redisNow(b, client))
		held := int64(len(ring.times))
		if ring.units != nil { // a large count ring turns into units that merge
			held = 0
			for _, u := range ring.units {
				held += u
			}
		}
		if !units && held != int64(max) {
			b.Fatalf("%s holds %d admissions, want %d", k, held, max)
		}
		n, err := client.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			b.Fatal(err)
		}
		usage += n
	}
	delta := (after - before) / float64(clients)
	mean := float64(usage) / float64(clients)
	held := float64(admissions.Load()) / float64(clients)
	b.ReportMetric(mean, "memory-usage-B/client")
	b.ReportMetric(delta, "used-memory-B/client")
	b.ReportMetric(mean/held, "B/admission")
	b.Logf("max %d%s, %d clients at their limit, %.0f admissions each: MEMORY USAGE %.0f bytes (%.2f per admission), used_memory delta %.0f bytes (%.2f per admission)",
		max, map[bool]string{true: " units"}[units], clients, held, mean, mean/held, delta, delta/held)
}
