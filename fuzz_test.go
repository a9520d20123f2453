package slidingratelimit

import (
	"testing"

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
