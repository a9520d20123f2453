package slidingratelimit

import (
	"net/http"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
)

// TestAnnouncedKeys: an announced key that is one of the backend's is
// forgotten in its deny cache; one of another prefix, zone or client leaves
// the cache alone; one of its prefix that it cannot read clears the cache,
// which is exact whatever the key meant.
func TestAnnouncedKeys(t *testing.T) {
	prefix := uniquePrefix(t)
	in := newInstance(t, `{"zones": [{"name": "ann", "window": "1m", "max_requests": 1}],
		"redis": "`+sharedRedis.URL()+`", "key_prefix": "`+prefix+`"}`)
	// The first subscription clears the cache: after it, only the
	// announcements below do.
	waitSubscribed(t, in.Handler)
	const ip = "192.0.2.61"
	send(t, "/", to(in), from(ip))
	for _, c := range []struct {
		name, key string
		forgets   bool
	}{
		{"another prefix", "other:{" + ip + "}:ann:1m:1", false},
		{"another zone", prefix + "{" + ip + "}:login:1m:1", false},
		{"another client", prefix + "{192.0.2.62}:ann:1m:1", false},
		{"a layout of another version", prefix + "{" + ip + "}", true},
		{"the client", prefix + "{" + ip + "}:ann:1m:1", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if status := send(t, "/", to(in), from(ip)).status; status != http.StatusTooManyRequests || cached(in.Handler) != 1 {
				t.Fatalf("status %d, %d cached; want 429 and 1", status, cached(in.Handler))
			}
			in.backend.Announced(c.key, redisconn.Reset)
			want := 1
			if c.forgets {
				want = 0
			}
			if got := cached(in.Handler); got != want {
				t.Errorf("%s: %d cached after the announcement, want %d", c.key, got, want)
			}
		})
	}
}
