package limiter

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// BenchmarkStoreLatency is the time a decision spends in the store, against
// a PING's round trip on the same path: Redis on this host, and with each
// reply 1ms away (a fault proxy). Callers decide at a steady pace (each
// waits pause between its decisions), so the load is the same whatever the
// store does with it; the rate decides whether calls queue. With no pause,
// callers decide in a closed loop, as wrk's connections do in make bench:
// the store's latency is then its throughput. The naive
// callers are the peer: each sends its own script call, as most Redis rate
// limiters do, with no batcher between it and the client's pool.
//
//	go test -run '^$' -bench StoreLatency -benchtime 1x ./limiter/
func BenchmarkStoreLatency(b *testing.B) {
	for _, far := range []time.Duration{0, time.Millisecond} {
		for _, load := range []struct {
			callers int
			pause   time.Duration
		}{{1, time.Millisecond}, {16, 5 * time.Millisecond}, {64, 5 * time.Millisecond}, {50, 0}} {
			for _, naive := range []bool{false, true} {
				name := fmt.Sprintf("far%v/callers%d/batched", far, load.callers)
				if naive {
					name = fmt.Sprintf("far%v/callers%d/naive", far, load.callers)
				}
				b.Run(name, func(b *testing.B) {
					for b.Loop() {
						storeLatency(b, far, load.callers, load.pause, naive)
					}
				})
			}
		}
	}
}

func storeLatency(b *testing.B, far time.Duration, callers int, pause time.Duration, naive bool) {
	const measure = 2 * time.Second
	srv := redistest.Start(b)
	addr := srv.Addr()
	if far > 0 {
		proxy := redistest.StartFaultProxy(b, addr)
		proxy.Latency(b, redistest.Downstream, far, 0)
		addr = proxy.Addr()
	}
	client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, ContextTimeoutEnabled: true})
	defer client.Close()
	s := NewRedisStore(client, RedisOptions{Timeout: time.Second})
	defer s.Close()
	ctx := context.Background()
	lim := Limit{Window: time.Minute, Max: 1 << 40}
	allow1(b, s, Check{Zone: "z", Key: "warmup", Limit: lim})

	pings := make([]time.Duration, 0, 200)
	for range cap(pings) {
		start := time.Now()
		if err := client.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		pings = append(pings, time.Since(start))
	}

	var (
		mu    sync.Mutex
		lat   []time.Duration
		sent  []time.Duration
		wg    sync.WaitGroup
		next  atomic.Int64
		calls = redisCalls(b, client)
	)
	end := time.Now().Add(measure)
	for range callers {
		wg.Go(func() {
			checks := []Check{{Zone: "z", Limit: lim}}
			ds := make([]Decision, 1)
			var own, ownSent []time.Duration
			for time.Now().Before(end) {
				checks[0].Key = "198.51." + strconv.Itoa(int(next.Add(1)%10_000))
				start := time.Now()
				if naive {
					keys := []string{s.Key(checks[0].Zone, checks[0].Key)}
					args := appendRequest(nil, opAllow, checks, ds, 0, nil)
					reply, err := limitScript.Run(ctx, client, keys, args).Result()
					var s string
					if err == nil {
						s, err = checkReply(reply, replyLen(1, 1))
					}
					if err == nil {
						decodeReply(s[:replyLen(1, 1)], opAllow, checks, ds, 0, nil)
					}
					if err != nil {
						b.Error(err)
						return
					}
				} else if err := s.Allow(ctx, checks, ds); err != nil {
					b.Error(err)
					return
				}
				own = append(own, time.Since(start))
				ownSent = append(ownSent, time.UnixMicro(ds[0].held.at).Sub(start))
				if pause > 0 {
					time.Sleep(pause)
				}
			}
			mu.Lock()
			lat = append(lat, own...)
			sent = append(sent, ownSent...)
			mu.Unlock()
		})
	}
	wg.Wait()
	calls = redisCalls(b, client) - calls
	slices.Sort(lat)
	slices.Sort(sent)
	slices.Sort(pings)
	q := func(d []time.Duration, p float64) float64 {
		return float64(d[int(p*float64(len(d)-1))].Microseconds())
	}
	b.ReportMetric(q(pings, 0.5), "ping-p50-us")
	b.ReportMetric(q(lat, 0.5), "p50-us")
	b.ReportMetric(q(lat, 0.99), "p99-us")
	// How long a decision waited before its call ran in Redis (read
	// from Redis's clock, on this host): its turn, the goroutines woken
	// for it, the way there.
	b.ReportMetric(q(sent, 0.5), "ran-p50-us")
	b.ReportMetric(q(sent, 0.99), "ran-p99-us")
	b.ReportMetric(float64(len(lat))/measure.Seconds(), "decisions/s")
	b.ReportMetric(float64(len(lat))/float64(calls), "decisions/call")
}

// redisCalls is how many script calls Redis has run.
func redisCalls(b *testing.B, client *redis.Client) float64 {
	f := infoFields(b, client, "commandstats", "cmdstat_fcall.calls", "cmdstat_evalsha.calls", "cmdstat_eval.calls")
	return f["cmdstat_fcall.calls"] + f["cmdstat_evalsha.calls"] + f["cmdstat_eval.calls"]
}
