package slidingratelimit

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

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
		"window 1m\nmax_requests {http.request.header.X-Quota} 5\ncost {http.request.header.X-Cost}\nsettle header X-Usage",
		"zone t 1m {header.Q} 5 {\nsettle bytes\ncost 2\n}",
		"window 1m\nmax_requests {x}\ncost 0\nsettle header",
	} {
		f.Add(seed)
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	f.Fuzz(func(t *testing.T, body string) {
		caddyfile := ":8080 {\n\tsliding_ratelimit {\n" + body + "\n\t}\n}\n"
		_, _, _ = adapter.Adapt([]byte(caddyfile), nil)
	})
}

// FuzzClientKey: whatever a client sends, the key is 1 to 64 bytes of UTF-8
// (which the admin API can print) without hash-tag braces; no value can make an address key (the key another client,
// or the same client without the header, gets); two different first values
// never share a key, unless both are addresses in one prefix; and a repeated
// header adds nothing to the first.
func FuzzClientKey(f *testing.F) {
	for _, seed := range [][2]string{
		{"", ""}, {"192.0.2.1", "x"}, {"2001:db8::1", "2001:db8::2"}, {"::ffff:192.0.2.1", ""},
		{"fe80::1%eth0", "a"}, {strings.Repeat("k", 100), "b"}, {"a{b}c", "a"}, {"#x", "=x"},
		{"\r\n\x00", ":"}, {"ключ", "@127.0.0.1"}, {"=192.0.2.1", "192.0.2.1"}, {"a:b", "a%3Ab"}, {"\xff\xfe", "\xff\xfd"},
	} {
		f.Add(seed[0], seed[1])
	}
	templates := []keyTemplate{
		parseKeyTemplate("{http.request.header.X-Key}"),
		parseKeyTemplate("k:{http.request.header.X-Key}"),
		parseKeyTemplate("{http.request.header.X-Key}:{http.request.header.X-Other}"),
	}
	request := func(values ...string) *http.Request {
		r := httptest.NewRequest("GET", "http://example.test/", nil)
		r.RemoteAddr = "192.0.2.1:4000"
		if len(values) > 0 && values[0] != "" {
			r.Header["X-Key"] = values
		}
		return r
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		repl := caddy.NewReplacer()
		address := addressKey("192.0.2.1", 32, 64)
		for _, tmpl := range templates {
			for _, bits := range [][2]int{{32, 64}, {24, 48}, {1, 1}} {
				key, fellBack := tmpl.key(request(a), repl, bits[0], bits[1])
				if key == "" || len(key) > 64 || strings.ContainsAny(key, "{}") || !utf8.ValidString(key) {
					t.Fatalf("%s: key %q from %q: want 1 to 64 bytes of UTF-8 without braces", tmpl.raw, key, a)
				}
				if fellBack != (a == "") {
					t.Fatalf("%s: value %q: fell back %v", tmpl.raw, a, fellBack)
				}
				if a != "" && (key == address || isAddress(key) || !strings.HasPrefix(key, valueKeyMark) && !strings.HasPrefix(key, "#")) {
					t.Fatalf("%s: value %q made key %q, outside the value namespace", tmpl.raw, a, key)
				}
				if repeated, _ := tmpl.key(request(a, b), repl, bits[0], bits[1]); a != "" && repeated != key {
					t.Fatalf("%s: a repeated header changed the key of %q: %q then %q", tmpl.raw, a, key, repeated)
				}
				sameGroup := isAddress(a) && isAddress(b) && groupIP(a, bits[0], bits[1]) == groupIP(b, bits[0], bits[1])
				if other, _ := tmpl.key(request(b), repl, bits[0], bits[1]); a != b && a != "" && b != "" && !sameGroup && other == key {
					t.Fatalf("%s: values %q and %q share the key %q", tmpl.raw, a, b, key)
				}
			}
		}
	})
}
