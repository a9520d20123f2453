package slidingratelimit

import (
	"net/http"
	"strings"
	"testing"
)

// TestRunningCaddyRefusesConfigMistakes: a reload of a running Caddy with a
// key whose placeholder is left open, or a misspelt subdirective, is refused
// with words that say what to change, and the running config keeps serving
// and limiting.
func TestRunningCaddyRefusesConfigMistakes(t *testing.T) {
	prefix := uniquePrefix(t)
	siteWith := func(lines string) string {
		return `
:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 2
		redis ` + sharedRedis.URL() + `
		key_prefix ` + prefix + `
` + lines + `
	}
	respond "ok"
}`
	}
	startCaddy(t, siteWith("\t\tkey {http.request.header.X-Api-Key}"))
	client := from("127.0.0.2")
	alice := map[string][]string{"X-Api-Key": {"alice"}}
	expect(t, "alice before the reloads", site, []int{200}, client, withHeaders(alice))

	for _, c := range []struct{ lines, want string }{
		{"\t\tkey {http.request.header.X-Api-Key", `key \"{http.request.header.X-Api-Key\": the placeholder \"{http.request.header.X-Api-Key\" has no closing '}', so the key would be the same text for every client: one bucket for all, at Caddyfile:15`},
		{"\t\tmax_request 10", `unrecognized subdirective 'max_request' (did you mean max_requests?), at Caddyfile:15`},
		{"\t\tzone api 1m 5 {\n\t\t\tkye {http.request.header.X-Api-Key}\n\t\t}", `zone api: unrecognized subdirective 'kye' (did you mean key?), at Caddyfile:16`},
		{"\t\tzone line 1s 5 {\n\t\t\twait 17s\n\t\t}", `zone line: wait 17s is longer than 16 windows of 1s, the most a request may wait, at Caddyfile:17`},
	} {
		res := send(t, adminURL+"/load", withMethod(http.MethodPost), withBody("text/caddyfile", globalOptions+siteWith(c.lines)))
		if res.status != http.StatusBadRequest || !strings.Contains(res.body, c.want) {
			t.Errorf("loading %q: %d %s, want 400 with %s", c.lines, res.status, res.body, c.want)
		}
	}
	// The running config still keys by the header: alice has one request
	// left, bob his own two.
	expect(t, "alice after the refused reloads", site, []int{200, 429}, client, withHeaders(alice))
	expect(t, "bob", site, []int{200, 200}, client, withHeader("X-Api-Key", "bob"))
}
