package slidingratelimit

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
)

// TestTrustedProxiesStrictKeysTheClient is docs/keys.md's case through
// Caddy: behind a proxy that appends the address it saw to
// X-Forwarded-For (here every request comes from 127.0.0.2, a trusted
// proxy, for the client 198.51.100.7), {client_ip} is without
// trusted_proxies_strict the header's first value, which the client wrote
// itself: a new value each time is a new key and a fresh limit. With it,
// Caddy reads the header from the right and keys the client by the address
// the proxy saw.
func TestTrustedProxiesStrictKeysTheClient(t *testing.T) {
	doc, err := os.ReadFile("docs/keys.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := false
	for _, f := range fences(string(doc)) {
		documented = documented || f.lang == "caddyfile" && strings.Contains(f.text, "trusted_proxies_strict")
	}
	if !documented {
		t.Error("docs/keys.md has no Caddyfile with trusted_proxies_strict")
	}

	for _, c := range []struct {
		name    string
		servers string
		want    int
	}{
		{"without strict", "servers {\n\ttrusted_proxies static 127.0.0.0/8\n}", 5},
		{"with trusted_proxies_strict", "servers {\n\ttrusted_proxies static 127.0.0.0/8\n\ttrusted_proxies_strict\n}", 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		window 1m
		max_requests 3
	}
	respond "ok"`), withGlobals(c.servers))
			through := 0
			for i := range 5 {
				// The client's own value first, then what the proxy appends.
				xff := fmt.Sprintf("203.0.113.%d, 198.51.100.7", i+1)
				if send(t, site, from("127.0.0.2"), withHeader("X-Forwarded-For", xff)).status == http.StatusOK {
					through++
				}
			}
			if through != c.want {
				t.Errorf("%d of 5 requests through a limit of 3, want %d", through, c.want)
			}
		})
	}
}
