package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// The naive peer does what most Redis rate limiters do (Traefik's, a
// redis_rate behind an HTTP server): one script call per request, from a
// pool of connections, nothing batched. It is a small Go HTTP server in
// this process: a plain port that answers "ok", and two limited ports that
// first call go-redis/redis_rate v10 Allow on the request's X-Client, with
// the limited site's limit, one on the bench's Redis and one through the
// 1 ms latency proxy. wrk loads it with the many clients script, as it
// loads Caddy, so the two show side by side what batching wins (round
// trips, Redis CPU) and where it does not (the time a request waits).

// naivePool is the naive peer's connections to Redis, per limited port.
const naivePool = 64

// naivePeer is the naive peer's server; its URLs have no trailing slash.
type naivePeer struct {
	servers          []*http.Server
	clients          []*redis.Client
	plain, near, far string
}

// startNaive starts the naive peer's ports, on redisURL and farURL.
func startNaive(ctx context.Context, redisURL, farURL string) (*naivePeer, error) {
	n := &naivePeer{}
	var err error
	if n.plain, err = n.serve(nil); err != nil {
		return nil, n.stopWith(err)
	}
	for _, u := range []struct {
		redis string
		url   *string
	}{{redisURL, &n.near}, {farURL, &n.far}} {
		client := redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(u.redis, "redis://"), PoolSize: naivePool})
		n.clients = append(n.clients, client)
		lim := redis_rate.NewLimiter(client)
		// Load the script before the measured time, as the others do.
		if _, err := lim.Allow(ctx, "naive-warmup", anchorLimit); err != nil {
			return nil, n.stopWith(fmt.Errorf("naive peer: redis_rate Allow: %w", err))
		}
		if *u.url, err = n.serve(lim); err != nil {
			return nil, n.stopWith(err)
		}
	}
	say("naive peer (redis_rate per request, pool %d): plain %s, limited %s, Redis %d ms away %s", naivePool, n.plain, n.near, farLatencyMs, n.far)
	return n, nil
}

// serve starts a port answering "ok", after lim's Allow when lim is set;
// a request it denies gets a 429, one it could not decide a 500.
func (n *naivePeer) serve(lim *redis_rate.Limiter) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("naive peer: %w", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if lim != nil {
			res, err := lim.Allow(r.Context(), "naive:"+r.Header.Get("X-Client"), anchorLimit)
			if err != nil {
				http.Error(w, "rate limit: "+err.Error(), http.StatusInternalServerError)
				return
			}
			if res.Allowed == 0 {
				w.WriteHeader(http.StatusTooManyRequests)
				return
			}
		}
		_, _ = w.Write([]byte("ok"))
	}), ReadHeaderTimeout: 10 * time.Second}
	n.servers = append(n.servers, srv)
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			say("naive peer: %v", err)
		}
	}()
	return "http://" + l.Addr().String(), nil
}

func (n *naivePeer) stopWith(err error) error {
	n.stop()
	return err
}

func (n *naivePeer) stop() {
	for _, s := range n.servers {
		_ = s.Close()
	}
	for _, c := range n.clients {
		_ = c.Close()
	}
}

// naiveResult is the naive peer's runs: near pairs its plain and limited
// ports, far its plain port and the limited one 1 ms away (the same plain
// run).
type naiveResult struct{ near, far []pair }

// runNaive loads the naive peer's ports cfg.runs times each with script,
// rotating which goes first.
func runNaive(ctx context.Context, cfg config, meter *cpuMeter, n *naivePeer, script string) (naiveResult, error) {
	var res naiveResult
	for i := 0; i < cfg.runs; i++ {
		var plain, near, far wrkResult
		runs := []struct {
			url string
			out *wrkResult
		}{{n.plain, &plain}, {n.near, &near}, {n.far, &far}}
		for j := range runs {
			r := runs[(i+j)%len(runs)]
			meter.settle(ctx, cfg.settle)
			w, err := runWrk(ctx, cfg, meter, cfg.duration, script, r.url+"/")
			if err != nil {
				return res, fmt.Errorf("naive peer: %w", err)
			}
			*r.out = w
		}
		res.near = append(res.near, pair{plain: plain, limited: near})
		res.far = append(res.far, pair{plain: plain, limited: far})
		say("%-12s naive peer: plain %6.0f req/s p50 %s; limited %6.0f req/s p50 %s (%.1f%% 429); 1 ms away %6.0f req/s p50 %s",
			"", plain.rps(), ms(plain.p50), near.rps(), ms(near.p50), 100*near.deniedShare(), far.rps(), ms(far.p50))
	}
	return res, nil
}
