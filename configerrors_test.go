package slidingratelimit

import (
	"io"
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
	client := clientAt(t, "127.0.0.2")
	alice := map[string][]string{"X-Api-Key": {"alice"}}
	expect(t, "alice before the reloads", client, site, alice, 200)

	for _, c := range []struct{ lines, want string }{
		{"\t\tkey {http.request.header.X-Api-Key", `key \"{http.request.header.X-Api-Key\": the placeholder \"{http.request.header.X-Api-Key\" has no closing '}', so the key would be the same text for every client: one bucket for all, at Caddyfile:15`},
		{"\t\tmax_request 10", `unrecognized subdirective 'max_request' (did you mean max_requests?), at Caddyfile:15`},
		{"\t\tzone api 1m 5 {\n\t\t\tkye {http.request.header.X-Api-Key}\n\t\t}", `zone api: unrecognized subdirective 'kye' (did you mean key?), at Caddyfile:16`},
	} {
		req, err := http.NewRequest(http.MethodPost, adminURL+"/load", strings.NewReader(globalOptions+siteWith(c.lines)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "text/caddyfile")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), c.want) {
			t.Errorf("loading %q: %d %s, want 400 with %s", c.lines, res.StatusCode, body, c.want)
		}
	}
	// The running config still keys by the header: alice has one request
	// left, bob his own two.
	expect(t, "alice after the refused reloads", client, site, alice, 200, 429)
	expect(t, "bob", client, site, map[string][]string{"X-Api-Key": {"bob"}}, 200, 200)
}
