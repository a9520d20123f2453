package slidingratelimit

import (
	"net/http"
	"strings"
	"testing"
)

// TestPlansPerAPIKey is the recipe of README.md and docs/zones.md, with
// smaller limits: a map names each key's plan, and zone matchers give each
// plan its limit.
func TestPlansPerAPIKey(t *testing.T) {
	startCaddy(t, `
:9080 {
	map {http.request.header.X-Api-Key} {plan} {
		gold-key-1 gold
		gold-key-2 gold
		default    free
	}
	sliding_ratelimit {
		key {http.request.header.X-Api-Key}
		zone gold 1m 5 {
			match {
				vars {plan} gold
			}
		}
		zone free 1m 2 {
			match {
				not vars {plan} gold
			}
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "{plan}"
}`)
	client := from("127.0.0.2")
	for _, c := range []struct {
		key, zone string
		admitted  int
	}{
		{"gold-key-1", "gold", 5},
		{"gold-key-2", "gold", 5},
		{"free-key", "free", 2},
	} {
		for i := 1; i <= c.admitted+1; i++ {
			res := send(t, site, client, withHeader("X-Api-Key", c.key))
			status, h := res.status, res.header
			want := http.StatusOK
			if i > c.admitted {
				want = http.StatusTooManyRequests
			}
			if status != want {
				t.Errorf("%s, request %d: status %d, want %d", c.key, i, status, want)
			}
			if policy := h.Get("RateLimit-Policy"); !strings.HasPrefix(policy, `"`+c.zone+`"`) || strings.Contains(policy, ",") {
				t.Errorf("%s: RateLimit-Policy %q, want the %s zone alone", c.key, policy, c.zone)
			}
		}
	}
}
