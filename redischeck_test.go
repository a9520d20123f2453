package slidingratelimit

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// validateCaddyfile adapts a Caddyfile and provisions it as Caddy would
// before serving it, without serving it.
func validateCaddyfile(t *testing.T, caddyfile string) error {
	t.Helper()
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	return caddy.Validate(mustConfig(t, cfgJSON))
}

func mustConfig(t *testing.T, cfgJSON []byte) *caddy.Config {
	t.Helper()
	cfg := new(caddy.Config)
	if err := caddy.StrictUnmarshalJSON(cfgJSON, cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestRedisRefusalsFailTheConfig: what no retry can fix is reported at
// provision in Redis's own words, instead of a config that loads and then
// fails every request (open: no limit at all).
func TestRedisRefusalsFailTheConfig(t *testing.T) {
	notRedis := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notRedis.Close)
	for _, c := range []struct {
		name, url, want string
	}{
		{"database index out of range", "redis://" + sharedRedis.Addr() + "/99", "DB index is out of range"},
		{"not a redis server", "redis://" + strings.TrimPrefix(notRedis.URL, "http://") + "/0", "redis"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := validateCaddyfile(t, `
:0 {
	sliding_ratelimit {
		window 1m
		max_requests 5
		redis `+c.url+`
	}
	respond "ok"
}`)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("provision error %v, want one containing %q", err, c.want)
			}
			if strings.Contains(err.Error(), "unexpected type") {
				t.Errorf("a decoding error stands for Redis's answer: %v", err)
			}
		})
	}
}

// TestUnreachableRedisStillLoads: a Redis that is down at provision may come
// up later; the config loads and the fail mode answers meanwhile.
func TestUnreachableRedisStillLoads(t *testing.T) {
	down := redistest.Start(t)
	url := down.URL()
	down.Stop()
	in := newInstance(t, `{"window": "1m", "max_requests": 2, "redis": "`+url+`", "fail_mode": "closed", "timeout": "50ms"}`)
	if status := send(t, "/", to(in), from("192.0.2.7")).status; status != http.StatusServiceUnavailable {
		t.Fatalf("redis down, fail_mode closed: %d, want 503", status)
	}
}
