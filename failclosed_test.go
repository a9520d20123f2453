package slidingratelimit

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestFailClosedOutageDoesNotFloodTheLog: Redis frozen under load with
// fail_mode closed. Each request gets a 503 with Retry-After; the log gets the
// module's own failure line at most once a second, not an error-level line
// per request from Caddy's error path. With handle_errors, the 503 is still
// shaped there, and Caddy logs those handled errors at debug level only.
func TestFailClosedOutageDoesNotFloodTheLog(t *testing.T) {
	for _, c := range []struct {
		name, errors, body string
	}{
		{"without handle_errors", "", ""},
		{"with handle_errors", `
	handle_errors {
		respond "shaped {err.status_code}" {err.status_code}
	}`, "shaped 503"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Start(t)
			logFile := startCaddy(t, `
:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 1000
		redis `+srv.URL()+`
		timeout 100ms
		fail_mode closed
	}
	respond "ok"`+c.errors+`
}`)
			expect(t, "Redis up", site, []int{200}, from("127.0.0.2"))
			if err := srv.Freeze(); err != nil {
				t.Fatal(err)
			}
			defer srv.Thaw()

			// Workers are goroutines, where send may not end the test: they
			// send through the client it uses.
			client := clientAt(t, "127.0.0.2")
			const workers, each = 4, 200
			type answer struct {
				status           int
				retryAfter, body string
			}
			answers := make(chan answer, workers*each)
			start := time.Now()
			var wg sync.WaitGroup
			for range workers {
				wg.Go(func() {
					for range each {
						res, err := client.Get(site)
						if err != nil {
							t.Error(err)
							return
						}
						body, _ := io.ReadAll(res.Body)
						res.Body.Close()
						answers <- answer{res.StatusCode, res.Header.Get("Retry-After"), string(body)}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			close(answers)
			n, wrong := 0, 0
			for a := range answers {
				n++
				if a.status != http.StatusServiceUnavailable || a.retryAfter != "1" || a.body != c.body {
					if wrong++; wrong == 1 {
						t.Errorf("answer %d: %d, Retry-After %q, body %q; want 503, Retry-After 1, body %q", n, a.status, a.retryAfter, a.body, c.body)
					}
				}
			}
			if wrong > 0 {
				t.Errorf("%d of %d answers wrong", wrong, n)
			}

			// The throttled failure line comes at once, then at most once a
			// second.
			most := int(elapsed/time.Second) + 1
			errorLines := logLines(t, logFile, `"level":"error"`)
			if len(errorLines) > most {
				t.Errorf("%d error-level log lines for %d fail-closed answers in %v, want at most %d: %s",
					len(errorLines), n, elapsed.Round(time.Millisecond), most, strings.Join(errorLines[:min(len(errorLines), 3)], "\n"))
			}
			if lines := logLines(t, logFile, `"logger":"http.log.error"`); len(lines) > 0 {
				t.Errorf("%d lines of Caddy's error log at INFO and above, want none: %s", len(lines), lines[0])
			}
			if lines := logLines(t, logFile, `"level":"error"`, "rate limit store unavailable"); len(lines) == 0 {
				t.Error("no line says the store is unavailable")
			}
			t.Logf("%d answers of 503 in %v: %d error-level log lines", n, elapsed.Round(time.Millisecond), len(errorLines))
		})
	}
}
