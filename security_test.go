package slidingratelimit

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

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
	tester := startCaddy(t, site)
	for i, want := range []int{200, 200, 429, 429} {
		res := getWith(t, tester.Client, "http://localhost:9080/", map[string]string{"X-Forwarded-For": "203.0.113." + string(rune('1'+i))})
		if res.StatusCode != want {
			t.Errorf("no trusted_proxies, request %d with a new X-Forwarded-For: %d, want %d", i+1, res.StatusCode, want)
		}
	}
}

func TestTrustedProxiesForwardedClientIP(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(`{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	grace_period 1ns
	servers {
		trusted_proxies static 127.0.0.1/32 ::1/128
	}
}
http://localhost:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 2
		key {client_ip}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "{client_ip}"
}`, "caddyfile")
	for i, c := range []struct {
		xff  string
		want int
	}{
		{"203.0.113.1", 200}, {"203.0.113.2", 200}, {"203.0.113.3", 200},
		{"203.0.113.1", 200}, {"203.0.113.1", 429},
	} {
		res := getWith(t, tester.Client, "http://localhost:9080/", map[string]string{"X-Forwarded-For": c.xff})
		if res.StatusCode != c.want {
			t.Errorf("request %d from %s through a trusted proxy: %d, want %d", i+1, c.xff, res.StatusCode, c.want)
		}
	}
}

// TestSecretsStayOutOfLogs: at the default level, neither the Redis password
// nor a client key appears in Caddy's log, through denials and Redis
// failures alike.
func TestSecretsStayOutOfLogs(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	down := redistest.Start(t)
	downURL := "redis://default:s3cretpw@" + down.Addr() + "/0"
	down.Stop()
	tester := caddytest.NewTester(t)
	tester.InitServer(`{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	grace_period 1ns
	log {
		output file `+logFile+`
		level INFO
	}
}
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
}`, "caddyfile")
	secretKey := map[string]string{"X-Client": "secret-client-key-123"}
	for i := 0; i < 3; i++ {
		getWith(t, tester.Client, "http://localhost:9080/limited", secretKey)
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		getWith(t, tester.Client, "http://localhost:9080/broken", secretKey)
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
	if res := getWith(t, tester.Client, "http://localhost:9080/broken", nil); res.StatusCode != http.StatusOK {
		t.Errorf("fail open: %d", res.StatusCode)
	}
}
