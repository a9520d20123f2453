package slidingratelimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// benchmarkServeHTTP measures ServeHTTP alone: the request is prepared once
// per goroutine as Caddy's server would, then replayed with a new client IP
// per request (keys cycle through clients, all under the limit) or one IP.
func benchmarkServeHTTP(b *testing.B, config string, clients int) {
	benchmarkServeHTTPWith(b, config, clients, okHandler)
}

// benchmarkServeHTTPWith is benchmarkServeHTTP with next as the next handler.
func benchmarkServeHTTPWith(b *testing.B, config string, clients int, next caddyhttp.Handler) {
	in := newInstance(&testing.T{}, config)
	b.Cleanup(func() { in.Cleanup() })
	ips := make([]string, clients)
	for i := range ips {
		ips[i] = "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
	}
	var turn atomic.Int64
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
			r.RemoteAddr = ips[int(turn.Add(1))%clients] + ":40000"
			r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, srv)
			_ = in.ServeHTTP(w, r, next)
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

// BenchmarkServeHTTPCountStatus is what count_status costs on Redis: a
// response whose status counts keeps its admission (no more than any
// request), one that does not is given back with one more script call. It
// reports Redis script calls per request.
func BenchmarkServeHTTPCountStatus(b *testing.B) {
	config := `{"window": "1m", "max_requests": 1000000000, "count_status": [401], "redis": "` + sharedRedis.URL() + `", "key_prefix": "bench:", "timeout": "1s"}`
	for _, c := range []struct {
		name   string
		status int
	}{{"counted-401", http.StatusUnauthorized}, {"given-back-200", http.StatusOK}} {
		b.Run(c.name, func(b *testing.B) {
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				w.WriteHeader(c.status)
				return nil
			})
			before := scriptCalls(b)
			benchmarkServeHTTPWith(b, config, 10000, next)
			b.ReportMetric(float64(scriptCalls(b)-before)/float64(b.N), "script-calls/op")
		})
	}
}

// scriptCalls is how many FCALL, EVALSHA and EVAL calls the shared Redis has
// run.
func scriptCalls(b *testing.B) int64 {
	info, err := sharedRedis.Client(b).Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_fcall:calls=", "cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
			if rest, ok := strings.CutPrefix(line, cmd); ok {
				n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				total += n
			}
		}
	}
	return total
}

// BenchmarkServeHTTPSettle is what a cost settled after the response costs
// on Redis: each request reserves 1 unit and is settled to the 5 its
// response reports, with one more script call, batched as decisions are.
// It reports Redis script calls per request.
func BenchmarkServeHTTPSettle(b *testing.B) {
	config := `{"window": "1m", "max_requests": 1000000000, "settle": {"header": "X-Usage"}, "redis": "` + sharedRedis.URL() + `", "key_prefix": "bench:", "timeout": "1s"}`
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("X-Usage", "5")
		w.WriteHeader(http.StatusOK)
		return nil
	})
	before := scriptCalls(b)
	benchmarkServeHTTPWith(b, config, 10000, next)
	b.ReportMetric(float64(scriptCalls(b)-before)/float64(b.N), "script-calls/op")
}
