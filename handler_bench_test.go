package slidingratelimit

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// benchmarkServeHTTP measures ServeHTTP alone: the request is prepared once
// per goroutine as Caddy's server would, then replayed with a new client IP
// per request (keys cycle through clients, all under the limit) or one IP.
func benchmarkServeHTTP(b *testing.B, config string, clients int) {
	in := newInstance(&testing.T{}, config)
	b.Cleanup(func() { in.Cleanup() })
	ips := make([]string, clients)
	for i := range ips {
		ips[i] = "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
	}
	var next atomic.Int64
	// A server without handle_errors routes, as in the bench Caddyfile.
	srv := new(caddyhttp.Server)
	b.ReportAllocs()
	// 50 concurrent requests, as the load tests use.
	b.SetParallelism(25)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := httptest.NewRecorder()
		for pb.Next() {
			r := httptest.NewRequest(http.MethodGet, "http://example.test/", nil)
			r.RemoteAddr = ips[int(next.Add(1))%clients] + ":40000"
			r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, srv)
			_ = in.ServeHTTP(w, r, okHandler)
		}
	})
}

// BenchmarkPrepareRequest is the harness alone, to subtract from the others.
func BenchmarkPrepareRequest(b *testing.B) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		w := httptest.NewRecorder()
		for pb.Next() {
			r := httptest.NewRequest(http.MethodGet, "http://example.test/", nil)
			r.RemoteAddr = "10.0.0.1:40000"
			r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, new(caddyhttp.Server))
			_ = okHandler.ServeHTTP(w, r)
		}
	})
}

func BenchmarkServeHTTPMemory(b *testing.B) {
	b.Run("many-clients", func(b *testing.B) {
		benchmarkServeHTTP(b, `{"window": "1m", "max_requests": 1000000000}`, 10000)
	})
	b.Run("one-bot", func(b *testing.B) {
		benchmarkServeHTTP(b, `{"window": "1m", "max_requests": 10}`, 1)
	})
}

func BenchmarkServeHTTPRedis(b *testing.B) {
	b.Run("many-clients", func(b *testing.B) {
		benchmarkServeHTTP(b, `{"window": "1m", "max_requests": 1000000000, "redis": "`+sharedRedis.URL()+`", "key_prefix": "bench:", "timeout": "1s"}`, 10000)
	})
	b.Run("one-bot", func(b *testing.B) {
		benchmarkServeHTTP(b, `{"window": "1m", "max_requests": 10, "redis": "`+sharedRedis.URL()+`", "key_prefix": "bench:", "timeout": "1s"}`, 1)
	})
}
