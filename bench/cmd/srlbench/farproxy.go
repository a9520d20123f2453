package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// farLatencyMs is how far away the "Redis 1 ms away" scenario puts Redis:
// every reply from Redis is held this long, so each round trip costs it once,
// as on a network where Redis is on another host in the same region.
const farLatencyMs = 1

// farProxy is a TCP proxy in this process between the far limited site and
// Redis, with a Toxiproxy latency toxic on the replies. In-process, so the
// bench needs no other binary; its CPU time counts as this tool's (self).
type farProxy struct {
	proxy *toxiproxy.Proxy
	url   string // redis://127.0.0.1:<port> of the proxy
}

// startFarProxy listens on a free loopback port and forwards to redisURL.
func startFarProxy(redisURL string) (*farProxy, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "redis-far", listen, strings.TrimPrefix(redisURL, "redis://"))
	if err := srv.Collection.Add(p, true); err != nil {
		return nil, fmt.Errorf("starting the latency proxy: %w", err)
	}
	toxic := fmt.Sprintf(`{"name":"far","type":"latency","stream":"downstream","attributes":{"latency":%d}}`, farLatencyMs)
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
		p.Stop()
		return nil, fmt.Errorf("adding the latency toxic: %w", err)
	}
	say("latency proxy %s -> %s (+%d ms per reply)", listen, redisURL, farLatencyMs)
	return &farProxy{proxy: p, url: "redis://" + listen}, nil
}

func (f *farProxy) stop() { f.proxy.Stop() }

// pingRTT is the median time of sequential PINGs to url: how far Redis
// really is through the proxy (the toxic's sleep and the proxy's own
// copying add to the 1 ms), and directly, for the report.
func pingRTT(ctx context.Context, url string, n int) (time.Duration, error) {
	rc := redisClient(url)
	defer rc.Close()
	if err := rc.Ping(ctx).Err(); err != nil { // dial outside the measurement
		return 0, err
	}
	rtts := make([]time.Duration, n)
	for i := range rtts {
		start := time.Now()
		if err := rc.Ping(ctx).Err(); err != nil {
			return 0, fmt.Errorf("PING %s: %w", url, err)
		}
		rtts[i] = time.Since(start)
	}
	slices.Sort(rtts)
	return rtts[n/2], nil
}
