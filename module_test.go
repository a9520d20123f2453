package slidingratelimit

import (
	"context"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestReloadUnderLoad reloads the config 20 times through the admin API
// while requests flow: no request fails, and neither Redis connections nor
// goroutines grow.
func TestReloadUnderLoad(t *testing.T) {
	prefix := uniquePrefix(t)
	config := func(version int) string {
		return globalOptions + siteBlock("http://localhost:9080", prefix, `
	sliding_ratelimit {
		window 1m
		max_requests 100000
		key {http.request.header.X-Client}
	}
	respond "v`+strconv.Itoa(version)+`"`)
	}
	startCaddy(t, config(0)[len(globalOptions):])
	rdb := sharedRedis.Client(t)
	connections := func() int {
		list, err := rdb.ClientList(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(list, "\n")
	}
	load := func(version int) {
		if res := send(t, adminURL+"/load", withMethod(http.MethodPost), withBody("text/caddyfile", config(version))); res.status != http.StatusOK {
			t.Fatalf("reload %d: status %d %s", version, res.status, res.body)
		}
	}
	load(1)
	var (
		stop            atomic.Bool
		ok, bad, errors atomic.Int64
		wg              sync.WaitGroup
	)
	client := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:9080/", nil)
				req.Host = "localhost:9080"
				req.Header.Set("X-Client", "load-"+strconv.Itoa(g))
				res, err := client.Do(req)
				if err != nil {
					errors.Add(1)
					continue
				}
				res.Body.Close()
				if res.StatusCode == http.StatusOK {
					ok.Add(1)
				} else {
					bad.Add(1)
				}
			}
		}(g)
	}
	// The first 10 reloads warm up what lives for the process (Redis pool
	// connections for 4 concurrent clients, goroutines); the next 10 must
	// add nothing.
	var connsBefore, goroutinesBefore int
	for version := 2; version < 22; version++ {
		if version == 12 {
			connsBefore, goroutinesBefore = connections(), runtime.NumGoroutine()
		}
		load(version)
		time.Sleep(50 * time.Millisecond)
	}
	connsAfter, goroutinesAfter := connections(), runtime.NumGoroutine()
	stop.Store(true)
	wg.Wait()
	client.CloseIdleConnections()
	// Caddy closes idle keep-alive connections on every reload, with or
	// without this module; a client sees those as transport errors, not as
	// answers, so they are reported but are not failed requests.
	t.Logf("%d requests answered 200 during 20 reloads; %d other statuses; %d keep-alive connections closed by reloads", ok.Load(), bad.Load(), errors.Load())
	if ok.Load() == 0 || bad.Load() != 0 {
		t.Errorf("during reloads: %d ok, %d failed requests, want none failed", ok.Load(), bad.Load())
	}
	t.Logf("over the last 10 reloads: Redis connections %d -> %d, goroutines %d -> %d", connsBefore, connsAfter, goroutinesBefore, goroutinesAfter)
	// The shared pool may warm up to 8 connections meanwhile (the store
	// opens them when calls turn slow, as on a loaded machine); a config
	// that kept its own connections would add at least one a reload.
	if connsAfter > connsBefore+8 {
		t.Errorf("Redis connections grew from %d to %d over 10 reloads", connsBefore, connsAfter)
	}
	if goroutinesAfter > goroutinesBefore+10 {
		t.Errorf("goroutines grew from %d to %d over 10 reloads", goroutinesBefore, goroutinesAfter)
	}
}
