package slidingratelimit

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// FuzzCaddyfile feeds arbitrary subdirective text to the parser: it may
// reject it, never panic. `make test` runs the seeds; `go test -fuzz
// FuzzCaddyfile` searches further.
func FuzzCaddyfile(f *testing.F) {
	for _, seed := range []string{
		"window 1m\nmax_requests 5",
		"zone a 1s 10\nzone b 1h 100 {\nkey {http.request.header.X}\n}",
		"window 1m\nmax_requests 5\nredis cluster redis://a:1?addr=b:2",
		"zone x {\nmatch {\npath /a\n}\nwindow 1s\nmax_requests 1\n}",
		"window -1\nmax_requests ten",
		"zone {\n}",
		"ipv6_prefix 200\nheaders legacy\nlog_keys",
	} {
		f.Add(seed)
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	f.Fuzz(func(t *testing.T, body string) {
		caddyfile := ":8080 {\n\tsliding_ratelimit {\n" + body + "\n\t}\n}\n"
		_, _, _ = adapter.Adapt([]byte(caddyfile), nil)
	})
}

// FuzzClientKey: whatever a client sends, the key is non-empty, at most
// 64 bytes, free of hash-tag braces, and the same input gives the same key.
func FuzzClientKey(f *testing.F) {
	for _, seed := range []string{
		"", "192.0.2.1", "2001:db8::1", "::ffff:192.0.2.1", "fe80::1%eth0",
		strings.Repeat("k", 100), "a{b}c", "#x", "\r\n\x00", "ключ",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		r := httptest.NewRequest("GET", "http://example.test/", nil)
		r.Header["X-Key"] = []string{value}
		repl := caddy.NewReplacer()
		repl.Set("http.request.header.X-Key", value)
		for _, bits := range [][2]int{{32, 64}, {24, 48}, {1, 1}, {32, 128}} {
			key := clientKey(r, repl, "{http.request.header.X-Key}", bits[0], bits[1])
			if key == "" || len(key) > 64 || strings.ContainsAny(key, "{}") {
				t.Fatalf("key %q from %q: want 1 to 64 bytes without braces", key, value)
			}
			if again := clientKey(r, repl, "{http.request.header.X-Key}", bits[0], bits[1]); again != key {
				t.Fatalf("key of %q changed: %q then %q", value, key, again)
			}
		}
	})
}
