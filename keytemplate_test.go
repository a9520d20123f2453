package slidingratelimit

import (
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
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
		{"not UTF-8 hashed", "{http.request.header.X-Key}", "/", map[string][]string{"X-Key": {"\xff\xfe"}}, hashedKey("=\xff\xfe"), false},
		{"long value hashed", "{http.request.header.X-Key}", "/", map[string][]string{"X-Key": {string(make([]byte, 100))}}, hashedKey("=" + string(make([]byte, 100))), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "http://example.test"+c.target, nil)
			r.RemoteAddr = "192.0.2.1:4000"
			for k, v := range c.headers {
				r.Header[k] = v
			}
			repl := caddy.NewReplacer()
			r = caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), nil)
			tmpl := parseKeyTemplate(c.template)
			got, fellBack := tmpl.key(r, repl, 32, 64)
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
		if got := groupIP(c.in, c.bits4, c.bits6); got != c.want {
			t.Errorf("groupIP(%q, %d, %d) = %q, want %q", c.in, c.bits4, c.bits6, got, c.want)
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
		if got := knownPlaceholder(name); got != want {
			t.Errorf("knownPlaceholder(%q) = %v, want %v", name, got, want)
		}
	}
}
