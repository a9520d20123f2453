//go:build soak

package slidingratelimit

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestSoak runs Caddy in this process for SOAK_DURATION (default 10m) under
// mixed load, reloading its config every 30s and restarting Redis (empty)
// every 2 minutes, and prints each minute the process's RSS, its goroutines,
// Redis's connections and the fail-mode counts. Afterwards it checks that
// fresh keys are limited exactly, and writes the figures to SOAK.md. Run it
// with `make soak`; it is not part of `make test`.
func TestSoak(t *testing.T) {
	duration := 10 * time.Minute
	if s := os.Getenv("SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("SOAK_DURATION: %v", err)
		}
		duration = d
	}
	const (
		maxRequests  = 50
		window       = "10s"
		reloadEvery  = 30 * time.Second
		restartEvery = 2 * time.Minute
	)
	srv := redistest.Start(t)
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	// Two configs that differ in what a reload must carry over: the fail
	// mode and the header style.
	config := func(variant int) []byte {
		failMode, headers := failClosed, headersDraft
		if variant%2 == 1 {
			failMode, headers = failLocal, headersLegacy
		}
		return []byte(fmt.Sprintf(`{
	"admin": {"disabled": true},
	"logging": {"logs": {"default": {"level": "ERROR"}}},
	"apps": {"http": {"grace_period": 1000000000, "servers": {"soak": {
		"listen": [%q],
		"routes": [{"handle": [
			{"handler": "sliding_ratelimit", "window": %q, "max_requests": %d,
			 "redis": %q, "key_prefix": "soak:", "timeout": "100ms",
			 "fail_mode": %q, "headers": %q},
			{"handler": "static_response", "body": "ok"}
		]}]
	}}}}
}`, addr, window, maxRequests, srv.URL(), failMode, headers))
	}
	if err := caddy.Load(config(0), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })

	var statuses [600]atomic.Int64
	var transportErrors atomic.Int64
	get := func(c *http.Client) int {
		res, err := c.Get("http://" + addr + "/")
		if err != nil {
			transportErrors.Add(1)
			return 0
		}
		res.Body.Close()
		if res.StatusCode < len(statuses) {
			statuses[res.StatusCode].Add(1)
		}
		return res.StatusCode
	}
	stop := make(chan struct{})
	var load sync.WaitGroup
	// Mixed load: four clients flooding (mostly denied, from the deny
	// cache), twenty under their limit (five requests a second each).
	for i := range 24 {
		c := soakClient("127.0.0." + strconv.Itoa(10+i))
		pause := time.Duration(0)
		if i >= 4 {
			pause = 200 * time.Millisecond
		}
		load.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				get(c)
				time.Sleep(pause)
			}
		})
	}

	rdb := srv.Client(t)
	var rows []string
	header := "| minute | RSS MB | goroutines | Redis connections | requests | 200 | 429 | 503 | failed closed | local | reloads | Redis restarts |"
	rows = append(rows, header, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	t.Log(header)
	start := time.Now()
	reloads, restarts := 0, 0
	nextReload, nextRestart, nextReport := start.Add(reloadEvery), start.Add(restartEvery), start.Add(time.Minute)
	for time.Since(start) < duration {
		time.Sleep(time.Second)
		now := time.Now()
		if now.After(nextReload) {
			reloads++
			if err := caddy.Load(config(reloads), true); err != nil {
				t.Errorf("reload %d: %v", reloads, err)
			}
			nextReload = nextReload.Add(reloadEvery)
		}
		if now.After(nextRestart) {
			restarts++
			srv.Restart(t)
			nextRestart = nextRestart.Add(restartEvery)
		}
		if now.After(nextReport) {
			total := int64(0)
			for i := range statuses {
				total += statuses[i].Load()
			}
			row := fmt.Sprintf("| %d | %.0f | %d | %d | %d | %d | %d | %d | %.0f | %.0f | %d | %d |",
				int(time.Since(start).Round(time.Minute)/time.Minute), rssMB(), runtime.NumGoroutine(), redisConnections(rdb),
				total, statuses[200].Load(), statuses[429].Load(), statuses[503].Load(),
				testutil.ToFloat64(limiterMetrics.decisions.WithLabelValues(defaultZone, resultFailedClosed)),
				testutil.ToFloat64(limiterMetrics.decisions.WithLabelValues(defaultZone, resultLocalAllowed))+
					testutil.ToFloat64(limiterMetrics.decisions.WithLabelValues(defaultZone, resultLocalDenied)),
				reloads, restarts)
			rows = append(rows, row)
			t.Log(row)
			nextReport = nextReport.Add(time.Minute)
		}
	}
	close(stop)
	load.Wait()

	// Exactness on fresh keys, once Redis decides again.
	probe := soakClient("127.0.0.200")
	for deadline := time.Now().Add(10 * time.Second); ; {
		if res, err := probe.Get("http://" + addr + "/"); err == nil {
			res.Body.Close()
			if res.Header.Get("RateLimit") != "" || res.Header.Get("X-RateLimit-Limit") != "" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no decision by Redis within 10s after the load")
		}
		time.Sleep(50 * time.Millisecond)
	}
	var exact []string
	var wrong atomic.Int64
	var clients sync.WaitGroup
	for i := range 10 {
		c := soakClient("127.0.0." + strconv.Itoa(210+i))
		clients.Go(func() {
			var admitted atomic.Int64
			var burst sync.WaitGroup
			for range maxRequests + 20 {
				burst.Go(func() {
					if res, err := c.Get("http://" + addr + "/"); err == nil {
						res.Body.Close()
						if res.StatusCode == http.StatusOK {
							admitted.Add(1)
						}
					}
				})
			}
			burst.Wait()
			if admitted.Load() != maxRequests {
				wrong.Add(1)
				t.Errorf("fresh client %d: %d of %d admitted, want exactly %d", i, admitted.Load(), maxRequests+20, maxRequests)
			}
		})
	}
	clients.Wait()
	exact = append(exact, fmt.Sprintf("Afterwards, 10 fresh clients sent %d requests each at once: %d of them got other than exactly %d admitted.",
		maxRequests+20, wrong.Load(), maxRequests))
	t.Log(exact[0])

	report := fmt.Sprintf(`# Soak

%v of mixed load on Caddy with this module in one process (%s, GOMAXPROCS %d): four clients
flooding and twenty at five requests a second, limit %d per %s, fail_mode alternating closed and local;
a config reload every %v and a Redis restart (empty) every %v. Written by `+"`make soak`"+`.

%s

%d transport errors (connections closed by reloads). %s
`, duration, runtime.Version(), runtime.GOMAXPROCS(0), maxRequests, window, reloadEvery, restartEvery,
		strings.Join(rows, "\n"), transportErrors.Load(), exact[0])
	if err := os.WriteFile("SOAK.md", []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
}

// soakClient sends requests from ip, on keep-alive connections.
func soakClient(ip string) *http.Client {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dialer.DialContext, MaxIdleConnsPerHost: 100}}
}

// rssMB returns the resident set size of this process in MB, or -1.
func rssMB() float64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(status)
	if m == nil {
		return -1
	}
	kb, _ := strconv.Atoi(string(m[1]))
	return float64(kb) / 1024
}

// redisConnections returns Redis's connected_clients, or -1 while it is
// away.
func redisConnections(rdb *redis.Client) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := rdb.Info(ctx, "clients").Result()
	if err != nil {
		return -1
	}
	m := regexp.MustCompile(`connected_clients:(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
