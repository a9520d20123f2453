package slidingratelimit

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// usageUpstream starts a real HTTP upstream for reverse_proxy that answers
// as each request's headers ask, as an LLM API reports token usage:
//
//	X-Test-Status        the status (default 200)
//	X-Test-Usage         a header X-Usage, once per value
//	X-Test-Trailer       a trailer X-Usage announced in the Trailer header
//	X-Test-Late-Trailer  a trailer X-Usage not announced
//	X-Test-Bytes         a body of this many bytes (default "ok")
//	X-Test-Chunk         the body in chunks of this many bytes, each flushed
//	X-Test-Chunk-Delay   a pause before each chunk
//
// It returns the upstream's host:port.
func usageUpstream(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		if r.Header.Get("X-Test-Trailer") != "" {
			h.Set("Trailer", "X-Usage")
		}
		for _, v := range r.Header.Values("X-Test-Usage") {
			h.Add("X-Usage", v)
		}
		status := http.StatusOK
		if s, err := strconv.Atoi(r.Header.Get("X-Test-Status")); err == nil {
			status = s
		}
		w.WriteHeader(status)
		body := []byte("ok")
		if n, err := strconv.Atoi(r.Header.Get("X-Test-Bytes")); err == nil {
			body = []byte(strings.Repeat("x", n))
		}
		chunk, _ := strconv.Atoi(r.Header.Get("X-Test-Chunk"))
		delay, _ := time.ParseDuration(r.Header.Get("X-Test-Chunk-Delay"))
		if chunk <= 0 {
			chunk = len(body)
		}
		for len(body) > 0 {
			time.Sleep(delay)
			n := min(chunk, len(body))
			if _, err := w.Write(body[:n]); err != nil {
				return
			}
			body = body[n:]
			w.(http.Flusher).Flush()
		}
		if v := r.Header.Get("X-Test-Trailer"); v != "" {
			h.Set("X-Usage", v)
		}
		if v := r.Header.Get("X-Test-Late-Trailer"); v != "" {
			h.Set(http.TrailerPrefix+"X-Usage", v)
		}
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// unitsUsed polls the admin API until the client's units in the zone are
// want, or a second passes, and returns the last count: the settle step runs
// once the response is done, which a client may see a moment before.
func unitsUsed(t *testing.T, zone, key string, want int64) int64 {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		got := adminState(t, zone, key).Count
		if got == want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(5 * time.Millisecond)
	}
}
