package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The waits scenario: clients that send faster than their limit to a zone
// with a wait, so that requests are held for their slot instead of denied.
// Each client keeps waitsConns requests in flight against waitsMax a
// second: a request waits about waitsConns/waitsMax s for its slot, within
// the zone's wait of 1 s, so none should be denied, and together the
// clients should be admitted their whole budget, waitsClients*waitsMax
// requests a second, no more and no less. It runs after the other
// scenarios, on a site of its own that it adds to the running Caddy through
// the admin API (a config change: it reloads the apps, which the other
// scenarios, done by then, do not see). The load comes from this tool, not
// wrk: each request is held, so the load is a number of clients in flight,
// not a rate.
const (
	waitsClients = 20
	waitsMax     = 50
	waitsConns   = 25
	waitsPrefix  = "srlwaits:"
)

// waitsRun is one run of the waits scenario.
type waitsRun struct {
	admitted, denied, other int64
	elapsed                 time.Duration
	p50, p99                time.Duration
	redis                   redisDelta
	decided                 float64 // decisions by Redis, from Caddy's metrics
	cpu                     cpuUse
}

// waitsLimitRPS is what the clients' limits admit in all, per second.
func waitsLimitRPS() float64 { return waitsClients * waitsMax }

func (w waitsRun) rps() float64 { return float64(w.admitted) / w.elapsed.Seconds() }

// share is the admitted rate over the limit's: 1 when every slot is used.
func (w waitsRun) share() float64 { return w.rps() / waitsLimitRPS() }

func (w waitsRun) caddyUsecPerRequest() float64 {
	n := w.admitted + w.denied + w.other
	if n == 0 {
		return math.NaN()
	}
	return w.cpu.caddySeconds * 1e6 / float64(n)
}

func (w waitsRun) scriptCallsPerRequest() float64 {
	n := w.admitted + w.denied + w.other
	if n == 0 {
		return math.NaN()
	}
	return float64(w.redis.scriptCalls) / float64(n)
}

// waitsSite is the JSON server the scenario adds: the limited site's
// response behind a zone with a wait.
func waitsSite(port int, redisURL string) ([]byte, error) {
	return json.Marshal(map[string]any{
		"listen": []string{"127.0.0.1:" + strconv.Itoa(port)},
		"routes": []any{map[string]any{"handle": []any{
			map[string]any{
				"handler": "sliding_ratelimit", "window": "1s", "max_requests": waitsMax, "wait": "1s",
				"key": "{http.request.header.X-Client}", "redis": redisURL, "key_prefix": waitsPrefix,
			},
			map[string]any{"handler": "static_response", "status_code": 200, "body": "ok"},
		}}},
	})
}

// runWaits adds the waits site to Caddy and loads it cfg.runs times.
func runWaits(ctx context.Context, cfg config, rc *redis.Client, meter *cpuMeter, admin, redisURL string) ([]waitsRun, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	body, err := waitsSite(port, redisURL)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, admin+"/config/apps/http/servers/srlwaits", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("adding the waits site: %w", err)
	}
	answer, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("adding the waits site: %s %s", res.Status, answer)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	if err := getOK(ctx, url, "srlbench-ready"); err != nil {
		return nil, err
	}
	var runs []waitsRun
	for i := 0; i < cfg.runs; i++ {
		// Each run starts with empty windows: the previous run's
		// admissions, a second old at most, age out while it settles.
		meter.settle(ctx, max(cfg.settle, 2*time.Second))
		run, err := loadWaits(ctx, cfg, rc, meter, admin, url)
		if err != nil {
			return runs, err
		}
		say("%-12s run %d/%d: %6.0f req/s admitted of %.0f the limit allows (%.3f), %d denied, p50 %s, p99 %s, Caddy CPU %.1f us/req, %.3f script calls/req",
			"waits", i+1, cfg.runs, run.rps(), waitsLimitRPS(), run.share(), run.denied, ms(run.p50), ms(run.p99),
			run.caddyUsecPerRequest(), run.scriptCallsPerRequest())
		runs = append(runs, run)
	}
	return runs, nil
}

// loadWaits keeps waitsConns requests of each of waitsClients clients in
// flight for cfg.duration and counts what came back.
func loadWaits(ctx context.Context, cfg config, rc *redis.Client, meter *cpuMeter, admin, url string) (waitsRun, error) {
	var run waitsRun
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: waitsClients * waitsConns}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	redisBefore, err := readRedis(ctx, rc)
	if err != nil {
		return run, err
	}
	decBefore, err := readDecisions(ctx, admin)
	if err != nil {
		return run, err
	}
	cpuBefore := meter.snap()
	start := time.Now()
	deadline := start.Add(cfg.duration)
	var admitted, denied, other atomic.Int64
	var mu sync.Mutex
	var latencies []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	for c := range waitsClients {
		key := "wait-" + strconv.Itoa(c)
		for range waitsConns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []time.Duration
				for time.Now().Before(deadline) && ctx.Err() == nil {
					sent := time.Now()
					status, err := getStatus(ctx, client, url, key)
					if err != nil {
						mu.Lock()
						firstErr = cmp.Or(firstErr, err)
						mu.Unlock()
						return
					}
					if time.Now().After(deadline) {
						// Answered after the run: not counted, as wrk counts.
						break
					}
					mine = append(mine, time.Since(sent))
					switch status {
					case http.StatusOK:
						admitted.Add(1)
					case http.StatusTooManyRequests:
						denied.Add(1)
					default:
						other.Add(1)
					}
				}
				mu.Lock()
				latencies = append(latencies, mine...)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	run.elapsed = cfg.duration
	run.cpu = meter.use(cpuBefore, meter.snap(), 0)
	if firstErr != nil {
		return run, firstErr
	}
	redisAfter, err := readRedis(ctx, rc)
	if err != nil {
		return run, err
	}
	decAfter, err := readDecisions(ctx, admin)
	if err != nil {
		return run, err
	}
	run.redis = redisAfter.sub(redisBefore)
	d := decAfter.sub(decBefore)
	run.decided = d["allowed"] + d["denied"]
	run.admitted, run.denied, run.other = admitted.Load(), denied.Load(), other.Load()
	slices.Sort(latencies)
	if len(latencies) > 0 {
		run.p50, run.p99 = latencies[len(latencies)/2], latencies[len(latencies)*99/100]
	}
	return run, nil
}

// getStatus sends one GET as a client and returns its status, body read.
func getStatus(ctx context.Context, client *http.Client, url, key string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Client", key)
	res, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode, err
}

// waitsSection reports the waits scenario: medians over its runs.
func (r report) waitsSection(p func(string, ...any)) {
	if len(r.waits) == 0 {
		return
	}
	med := func(f func(waitsRun) float64) float64 {
		xs := make([]float64, len(r.waits))
		for i, w := range r.waits {
			xs[i] = f(w)
		}
		return median(xs)
	}
	p("## Waits")
	p("")
	p("%d clients (`X-Client`), each with %d requests in flight, on a site of its own behind `window 1s`,", waitsClients, waitsConns)
	p("`max_requests %d`, `wait 1s` (Redis on this host): each request is held for its slot, about", waitsMax)
	p("%.1f s, instead of denied. The limits admit %s req/s in all; a limiter that wastes slots admits less, one", float64(waitsConns)/waitsMax, thousands(waitsLimitRPS()))
	p("that overfills more (a run that starts with empty windows admits up to one window more). Latency is the")
	p("whole request as the client sees it, its wait included. Medians of %d runs of %s.", len(r.waits), r.cfg.duration)
	p("")
	p("| | median |")
	p("|---|--:|")
	p("| admitted req/s | %s |", thousands(med(waitsRun.rps)))
	p("| share of the limit | %.3f |", med(waitsRun.share))
	p("| denied (429) | %s |", thousands(med(func(w waitsRun) float64 { return float64(w.denied) })))
	p("| other statuses | %s |", thousands(med(func(w waitsRun) float64 { return float64(w.other) })))
	p("| p50 | %s |", ms(time.Duration(med(func(w waitsRun) float64 { return float64(w.p50) }))))
	p("| p99 | %s |", ms(time.Duration(med(func(w waitsRun) float64 { return float64(w.p99) }))))
	p("| Caddy CPU us/req | %s |", num(med(waitsRun.caddyUsecPerRequest), 1))
	p("| script calls/req | %s |", num(med(waitsRun.scriptCallsPerRequest), 3))
	p("| Redis CPU us/decision | %s |", num(med(func(w waitsRun) float64 { return w.redis.cpuUsecPer(w.decided) }), 1))
	p("")
}
