package clientkey

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

func TestKeyTemplate(t *testing.T) {
	for _, c := range []struct {
		name, template, target string
		headers                map[string][]string
		want                   string
		fellBack               bool
	}{
		{"client address", "{http.vars.client_ip}", "/", nil, "192.0.2.1", false},
		{"remote host", "{http.request.remote.host}", "/", nil, "192.0.2.1", false},
		{"header", "{http.request.header.X-Key}", "/", map[string][]string{"X-Key": {"abc"}}, "=abc", false},
		{"header first value", "{http.request.header.X-Key}", "/", map[string][]string{"X-Key": {"abc", "x"}}, "=abc", false},
		{"header missing", "{http.request.header.X-Key}", "/", nil, "192.0.2.1", true},
		{"header that is an address", "{http.request.header.X-Key}", "/", map[string][]string{"X-Key": {"192.0.2.1"}}, "=192.0.2.1", false},
		{"header address grouped", "{http.request.header.X-Key}", "/", map[string][]string{"X-Key": {"2001:db8:1:2::9"}}, "=2001:db8:1:2::/64", false},
		{"query first value", "{http.request.uri.query.k}", "/?k=a%20b&k=x", nil, "=a b", false},
		{"query skips bad pairs", "{http.request.uri.query.k}", "/?k=%zz&k;=1&k=ok", nil, "=ok", false},
		{"query missing", "{http.request.uri.query.k}", "/?j=1", nil, "192.0.2.1", true},
		{"cookie first", "{http.request.cookie.s}", "/", map[string][]string{"Cookie": {"s=one; s=two"}}, "=one", false},
		{"literal and value", "api:{http.request.header.X-Key}", "/", map[string][]string{"X-Key": {"k"}}, "=api:k", false},
		{"constant", "everyone", "/", nil, "=everyone", false},
		{"replacer placeholder", "{http.request.method}", "/", nil, "=GET", false},
		{"composite", "{http.request.header.A}:{http.request.header.B}", "/", map[string][]string{"A": {"x"}, "B": {"y"}}, "=x:y", false},
		{"composite escapes", "{http.request.header.A}:{http.request.header.B}", "/", map[string][]string{"A": {"x:y%@"}, "B": {"z"}}, "=x%3Ay%25%40:z", false},
		{"composite missing part", "{http.request.header.A}:{http.request.header.B}", "/", map[string][]string{"A": {"x"}}, "=x:@192.0.2.1", false},
		{"composite all missing", "{http.request.header.A}:{http.request.header.B}", "/", nil, "192.0.2.1", true},
		{"not UTF-8 hashed", "{http.request.header.X-Key}", "/", map[string][]string{"X-Key": {"\xff\xfe"}}, limiter.BoundKey("=\xff\xfe"), false},
		{"long value hashed", "{http.request.header.X-Key}", "/", map[string][]string{"X-Key": {string(make([]byte, 100))}}, limiter.BoundKey("=" + string(make([]byte, 100))), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "http://example.test"+c.target, nil)
			r.RemoteAddr = "192.0.2.1:4000"
			for k, v := range c.headers {
				r.Header[k] = v
			}
			repl := caddy.NewReplacer()
			r = caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), nil)
			tmpl := Parse(c.template)
			got, fellBack := tmpl.Key(r, repl, 32, 64)
			if got != c.want || fellBack != c.fellBack {
				t.Errorf("key %q (fell back %v), want %q (%v)", got, fellBack, c.want, c.fellBack)
			}
		})
	}
}

func TestGroupIP(t *testing.T) {
	for _, c := range []struct {
		in           string
		bits4, bits6 int
		want         string
	}{
		{"192.0.2.77", 32, 64, "192.0.2.77"},
		{"192.0.2.77", 24, 64, "192.0.2.0/24"},
		{"::ffff:192.0.2.77", 24, 64, "192.0.2.0/24"},
		{"::ffff:192.0.2.77", 32, 64, "192.0.2.77"},
		{"2001:db8:1:2:3:4:5:6", 32, 64, "2001:db8:1:2::/64"},
		{"2001:db8::1", 32, 128, "2001:db8::1"},
		{"fe80::1%eth0", 32, 128, "fe80::1"},
		{"not an address", 24, 48, "not an address"},
	} {
		if got := GroupIP(c.in, c.bits4, c.bits6); got != c.want {
			t.Errorf("GroupIP(%q, %d, %d) = %q, want %q", c.in, c.bits4, c.bits6, got, c.want)
		}
	}
}

func TestKnownPlaceholder(t *testing.T) {
	for name, want := range map[string]bool{
		"http.request.header.X-Api-Key": true,
		"http.request.heder.X-Api-Key":  false,
		"http.request.header.":          false,
		"http.request.remote.host":      true,
		"http.request.uri.query.k":      true,
		"http.vars.client_ip":           true,
		"http.auth.user.id":             true,
		"env.TENANT":                    true,
		"client_ip":                     false,
		"http.jwt.claims.sub":           false,
	} {
		if got := KnownPlaceholder(name); got != want {
			t.Errorf("KnownPlaceholder(%q) = %v, want %v", name, got, want)
		}
	}
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
	templates := []Template{
		Parse("{http.request.header.X-Key}"),
		Parse("k:{http.request.header.X-Key}"),
		Parse("{http.request.header.X-Key}:{http.request.header.X-Other}"),
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
		address := AddressKey("192.0.2.1", 32, 64)
		for _, tmpl := range templates {
			for _, bits := range [][2]int{{32, 64}, {24, 48}, {1, 1}} {
				key, fellBack := tmpl.Key(request(a), repl, bits[0], bits[1])
				if key == "" || len(key) > 64 || strings.ContainsAny(key, "{}") || !utf8.ValidString(key) {
					t.Fatalf("%s: key %q from %q: want 1 to 64 bytes of UTF-8 without braces", tmpl.Raw, key, a)
				}
				if fellBack != (a == "") {
					t.Fatalf("%s: value %q: fell back %v", tmpl.Raw, a, fellBack)
				}
				if a != "" && (key == address || IsAddress(key) || !strings.HasPrefix(key, ValueMark) && !strings.HasPrefix(key, "#")) {
					t.Fatalf("%s: value %q made key %q, outside the value namespace", tmpl.Raw, a, key)
				}
				if repeated, _ := tmpl.Key(request(a, b), repl, bits[0], bits[1]); a != "" && repeated != key {
					t.Fatalf("%s: a repeated header changed the key of %q: %q then %q", tmpl.Raw, a, key, repeated)
				}
				sameGroup := IsAddress(a) && IsAddress(b) && GroupIP(a, bits[0], bits[1]) == GroupIP(b, bits[0], bits[1])
				if other, _ := tmpl.Key(request(b), repl, bits[0], bits[1]); a != b && a != "" && b != "" && !sameGroup && other == key {
					t.Fatalf("%s: values %q and %q share the key %q", tmpl.Raw, a, b, key)
				}
			}
		}
	})
}
