package slidingratelimit

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

func TestSpoofedForwardedForDoesNotChangeTheKey(t *testing.T) {
	site := `
http://localhost:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 2
		redis ` + sharedRedis.URL() + `
		key_prefix ` + uniquePrefix(t) + `
	}
	respond "ok"
}`
	startCaddy(t, site)
	for i, want := range []int{200, 200, 429, 429} {
		res := send(t, "http://localhost:9080/", withHeader("X-Forwarded-For", "203.0.113."+string(rune('1'+i))))
		if res.status != want {
			t.Errorf("no trusted_proxies, request %d with a new X-Forwarded-For: %d, want %d", i+1, res.status, want)
		}
	}
}

func TestTrustedProxiesForwardedClientIP(t *testing.T) {
	startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 2
		key {client_ip}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "{client_ip}"
}`, withGlobals(`
servers {
	trusted_proxies static 127.0.0.1/32 ::1/128
}`))
	for i, c := range []struct {
		xff  string
		want int
	}{
		{"203.0.113.1", 200}, {"203.0.113.2", 200}, {"203.0.113.3", 200},
		{"203.0.113.1", 200}, {"203.0.113.1", 429},
	} {
		res := send(t, "http://localhost:9080/", withHeader("X-Forwarded-For", c.xff))
		if res.status != c.want {
			t.Errorf("request %d from %s through a trusted proxy: %d, want %d", i+1, c.xff, res.status, c.want)
		}
	}
}

// TestSecretsStayOutOfLogs: at the default level, neither the Redis password
// nor a client key appears in Caddy's log, through denials and Redis
// failures alike.
func TestSecretsStayOutOfLogs(t *testing.T) {
	down := redistest.Start(t)
	downURL := "redis://default:s3cretpw@" + down.Addr() + "/0"
	down.Stop()
	logFile := startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit /limited {
		window 1m
		max_requests 1
		key {http.request.header.X-Client}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	sliding_ratelimit /broken {
		window 1m
		max_requests 1
		key {http.request.header.X-Client}
		redis `+downURL+`
		timeout 50ms
	}
	respond "ok"
}`)
	secretKey := withHeader("X-Client", "secret-client-key-123")
	for i := 0; i < 3; i++ {
		send(t, "http://localhost:9080/limited", secretKey)
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		send(t, "http://localhost:9080/broken", secretKey)
		time.Sleep(20 * time.Millisecond)
	}
	logs, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logs), "rate limit store unavailable") {
		t.Errorf("the Redis failure was not logged at all; log:\n%s", logs)
	}
	failures := strings.Count(string(logs), "rate limit store unavailable")
	if failures > 3 {
		t.Errorf("%d failure lines in 1.5s, want at most one a second", failures)
	}
	for _, secret := range []string{"s3cretpw", "secret-client-key-123"} {
		if strings.Contains(string(logs), secret) {
			t.Errorf("log holds %q:\n%s", secret, logs)
		}
	}
	if res := send(t, "http://localhost:9080/broken"); res.status != http.StatusOK {
		t.Errorf("fail open: %d", res.status)
	}
}
