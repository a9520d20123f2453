package slidingratelimit

import (
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/adminapi"
)

// keyedSite is a site on :9080 limited by key, max_requests 2 a minute.
func keyedSite(t *testing.T, key string) string {
	return siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		window 1m
		max_requests 2
		key `+key+`
	}
	respond "ok"`)
}

// TestForgedKeyCannotSpendAnotherClientsQuota: a header that holds another
// client's address lands in the value namespace, never on the key that
// client falls back to.
func TestForgedKeyCannotSpendAnotherClientsQuota(t *testing.T) {
	startCaddy(t, keyedSite(t, "{http.request.header.Authorization}"))
	attacker, victim := from("127.0.0.2"), from("127.0.0.1")
	forged := withHeader("Authorization", "127.0.0.1")
	expect(t, "127.0.0.2 sending Authorization: 127.0.0.1", site, []int{200, 200, 429}, attacker, forged)
	expect(t, "127.0.0.1 without the header", site, []int{200, 200, 429}, victim)
	// And the other way round: the victim's fallback key spends nothing of
	// the value the attacker used up.
	expect(t, "127.0.0.3 sending Authorization: 127.0.0.1", site, []int{429}, from("127.0.0.3"), forged)
}

// TestRepeatedValuesDoNotDodgeTheLimit: the key is the first value, the one
// the application reads, for headers, query parameters and cookies.
func TestRepeatedValuesDoNotDodgeTheLimit(t *testing.T) {
	for _, c := range []struct {
		name, key string
		first     func() (string, map[string][]string)
		repeated  func() (string, map[string][]string)
	}{
		{"header", "{http.request.header.Authorization}",
			func() (string, map[string][]string) { return site, map[string][]string{"Authorization": {"Bearer Z"}} },
			func() (string, map[string][]string) {
				return site, map[string][]string{"Authorization": {"Bearer Z", "junk1"}}
			}},
		{"query", "{http.request.uri.query.apikey}",
			func() (string, map[string][]string) { return site + "?apikey=k1", nil },
			func() (string, map[string][]string) { return site + "?apikey=k1&apikey=x1", nil }},
		{"cookie", "{http.request.cookie.session}",
			func() (string, map[string][]string) { return site, map[string][]string{"Cookie": {"session=s1"}} },
			func() (string, map[string][]string) {
				return site, map[string][]string{"Cookie": {"session=s1; session=x1", "session=x2"}}
			}},
		{"caddyfile shorthand", "{header.Authorization}",
			func() (string, map[string][]string) { return site, map[string][]string{"Authorization": {"Bearer Y"}} },
			func() (string, map[string][]string) {
				return site, map[string][]string{"Authorization": {"Bearer Y", "junk2"}}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			startCaddy(t, keyedSite(t, c.key))
			client := from("127.0.0.2")
			url, headers := c.first()
			expect(t, "first value alone", url, []int{200, 200}, client, withHeaders(headers))
			url, headers = c.repeated()
			expect(t, "first value repeated with others", url, []int{429}, client, withHeaders(headers))
			// Another value is another client.
			expect(t, "another first value", site+"?apikey=other", []int{200}, client, withHeaders(map[string][]string{
				"Authorization": {"Bearer other"}, "Cookie": {"session=other"}}))
		})
	}
}

// TestCompositeKeys: a template of several placeholders falls back to the
// client address only when all of them are empty; a missing part is keyed by
// address within the others; moving text between parts makes another key.
func TestCompositeKeys(t *testing.T) {
	startCaddy(t, keyedSite(t, "{http.request.header.X-Org}:{http.request.header.X-User}"))
	two, three := from("127.0.0.2"), from("127.0.0.3")

	expect(t, "127.0.0.2, no headers", site, []int{200, 200, 429}, two)
	expect(t, "127.0.0.3, no headers", site, []int{200}, three)

	orgOnly := withHeader("X-Org", "acme")
	expect(t, "127.0.0.2, X-Org only", site, []int{200, 200, 429}, two, orgOnly)
	expect(t, "127.0.0.3, X-Org only", site, []int{200}, three, orgOnly)

	full := map[string][]string{"X-Org": {"acme"}, "X-User": {"u1"}}
	expect(t, "127.0.0.2, org and user", site, []int{200, 200, 429}, two, withHeaders(full))
	expect(t, "127.0.0.3, the same org and user", site, []int{429}, three, withHeaders(full))
	shifted := withHeader("X-Org", "acme:u1")
	expect(t, "127.0.0.3, org 'acme:u1' and no user", site, []int{200}, three, shifted)
	shifted = withHeaders(map[string][]string{"X-Org": {"acme"}, "X-User": {":u1"}})
	expect(t, "127.0.0.3, org 'acme' and user ':u1'", site, []int{200}, three, shifted)
	fakeMissing := map[string][]string{"X-Org": {"acme"}, "X-User": {"@127.0.0.2"}}
	expect(t, "127.0.0.3, user '@127.0.0.2' (the stand-in of a missing user)", site, []int{200}, three, withHeaders(fakeMissing))
}

// TestSitesWithDifferentLimitsDoNotShare: two handlers of one site with the
// three-line form and their own limits, on one Redis and key prefix, count
// apart; two zones
// of the same name and limit share, as asked; the admin API addresses an
// ambiguous name by identity.
func TestSitesWithDifferentLimitsDoNotShare(t *testing.T) {
	prefix := uniquePrefix(t)
	startCaddy(t, siteBlock(":9080", prefix, `
	sliding_ratelimit /a* {
		window 1m
		max_requests 3
	}
	sliding_ratelimit /b* {
		window 1h
		max_requests 100
	}
	sliding_ratelimit /s1* {
		zone shared 1m 2
	}
	sliding_ratelimit /s2* {
		zone shared 1m 2
	}
	respond "ok"`))
	client := from("127.0.0.2")
	expect(t, "100/h site", site+"b", []int{200, 200, 200, 200, 200}, client)
	expect(t, "3/min site after five on the other", site+"a", []int{200, 200, 200, 429}, client)
	expect(t, "zone shared on one handler", site+"s1", []int{200}, client)
	expect(t, "zone shared on the other", site+"s2", []int{200, 429}, client)

	status, raw := adminDo(t, http.MethodGet, "/sliding_ratelimit/zones/default/keys/127.0.0.2")
	body := string(raw)
	if status != http.StatusConflict || !strings.Contains(body, "default@/a*") || !strings.Contains(body, "default@/b*") {
		t.Errorf("GET by the ambiguous name: %d %s, want 409 naming both identities", status, body)
	}
	// A site that answers every host has its directives' routes at the top
	// of its server: each handler is named by its own path matcher.
	for identity, count := range map[string]int64{"default@/a*": 3, "default@/b*": 5, "shared": 2} {
		if s := adminState(t, url.PathEscape(identity), "127.0.0.2"); s.Count != count {
			t.Errorf("GET %s: count %d, want %d", identity, s.Count, count)
		}
	}
}

// TestCachedRetryAfterIsTheTrueWait: denials from the deny cache tell the
// wait Redis reports, rounded up, not one trimmed for clock drift (a day's
// window: 86 s early before).
func TestCachedRetryAfterIsTheTrueWait(t *testing.T) {
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		zone daily 24h 1
	}
	respond "ok"`))
	client := from("127.0.0.2")
	expect(t, "first", site, []int{200}, client)
	hits := cacheHits("daily")
	for i := 0; i < 3; i++ {
		res := send(t, site, client)
		status, h := res.status, res.header
		if status != http.StatusTooManyRequests {
			t.Fatalf("denial %d: status %d", i+1, status)
		}
		told, err := strconv.ParseInt(h.Get("Retry-After"), 10, 64)
		if err != nil {
			t.Fatalf("Retry-After %q: %v", h.Get("Retry-After"), err)
		}
		truth := adminState(t, "daily", "127.0.0.2").RetryAfterSeconds
		if told < int64(math.Floor(truth)) || told > int64(math.Ceil(truth))+1 {
			t.Errorf("denial %d: Retry-After %d, Redis says %.3f s", i+1, told, truth)
		}
		if !strings.Contains(h.Get("RateLimit"), ";t="+h.Get("Retry-After")) {
			t.Errorf("denial %d: RateLimit %q, want t= the Retry-After %s", i+1, h.Get("RateLimit"), h.Get("Retry-After"))
		}
		time.Sleep(300 * time.Millisecond)
	}
	if cacheHits("daily") == hits {
		t.Fatal("no denial came from the deny cache; the test would not cross it")
	}
	// The admin API's seconds are rounded to the millisecond.
	_, raw := adminDo(t, http.MethodGet, "/sliding_ratelimit/zones/daily/keys/127.0.0.2")
	for _, field := range []string{"window_seconds", "reset_seconds", "retry_after_seconds"} {
		if !regexp.MustCompile(`"` + field + `":\d+(\.\d{1,3})?[,}]`).Match(raw) {
			t.Errorf("%s not in whole milliseconds: %s", field, raw)
		}
	}
}

// TestKeyTyposAndFallbacksSpeakUp: a placeholder no request has is warned
// about at provision; keys that fall back to the client address are counted
// and logged at most once a minute.
func TestKeyTyposAndFallbacksSpeakUp(t *testing.T) {
	logFile := startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		zone typo 1m 100 {
			key {http.request.heder.X-Api-Key}
		}
		zone header 1m 100 {
			key {header.X-Api-Key}
		}
	}
	respond "ok"`), withGlobals(`
servers {
	metrics
}`))
	before := scrape(t, `caddy_sliding_ratelimit_key_fallbacks_total{zone="header"}`)
	client := from("127.0.0.2")
	expect(t, "without X-Api-Key", site, []int{200, 200, 200}, client)
	if got := scrape(t, `caddy_sliding_ratelimit_key_fallbacks_total{zone="header"}`) - before; got != 3 {
		t.Errorf("key_fallbacks_total of zone header rose by %v, want 3", got)
	}
	logs, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logs), "http.request.heder.X-Api-Key") || !strings.Contains(string(logs), "not one Caddy provides") {
		t.Errorf("no warning about the misspelt placeholder; log:\n%s", logs)
	}
	if strings.Contains(string(logs), `"placeholder":"{http.request.header.X-Api-Key}"`) {
		t.Errorf("a correct placeholder was warned about; log:\n%s", logs)
	}
	if n := strings.Count(string(logs), `"zone":"header","key":"{http.request.header.X-Api-Key}"`); n != 1 {
		t.Errorf("%d fallback log lines for zone header after 3 requests, want 1; log:\n%s", n, logs)
	}
}

// TestCounterWithSmallLimitWarns: the counter's estimate can block a client
// for up to two windows when max_requests is small; provision says so.
func TestCounterWithSmallLimitWarns(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	err := validateCaddyfile(t, `{
	log {
		output file `+logFile+`
	}
}
:0 {
	sliding_ratelimit {
		zone small 1m 1 {
			algorithm counter
		}
		zone large 1m 100 {
			algorithm counter
		}
	}
	respond "ok"
}`)
	if err != nil {
		t.Fatal(err)
	}
	logs, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logs), "up to two windows") || !strings.Contains(string(logs), `"zone":"small"`) {
		t.Errorf("no warning for the counter with max_requests 1; log:\n%s", logs)
	}
	if strings.Contains(string(logs), `"zone":"large","max_requests":100`) {
		t.Errorf("warned about the counter with max_requests 100; log:\n%s", logs)
	}
}

// TestUnbalancedKeyFailsTheConfig: a key whose placeholder is left open is no
// placeholder at all, so five clients with five API keys would share one
// bucket; the config is refused, naming the key and the Caddyfile line (or,
// in JSON, the zone). A constant key on purpose still loads: one limit for
// every client.
func TestUnbalancedKeyFailsTheConfig(t *testing.T) {
	for _, key := range []string{"{http.request.header.X-Api-Key", "{client_ip", "}{client_ip}", "{{client_ip}}", "x{}"} {
		caddyfile := `:0 {
	sliding_ratelimit {
		window 1m
		max_requests 5
		key ` + key + `
		redis ` + sharedRedis.URL() + `
	}
	respond "ok"
}`
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
		if err == nil || !strings.Contains(err.Error(), "key \"") || !strings.HasSuffix(err.Error(), "at Caddyfile:5") {
			t.Errorf("Caddyfile key %s: error %v, want one naming the key and line 5", key, err)
		}
	}

	config := `{"apps": {"http": {"servers": {"s": {"listen": [":0"], "routes": [{"handle": [
		{"handler": "sliding_ratelimit", "redis": "` + sharedRedis.URL() + `", "zones": [
			{"name": "api", "window": "1m", "max_requests": 5, "key": "{http.request.header.X-Api-Key"}]}]}]}}}}}`
	err := caddy.Validate(mustConfig(t, []byte(config)))
	if want := `zone api: key "{http.request.header.X-Api-Key": the placeholder "{http.request.header.X-Api-Key" has no closing '}'`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("JSON: error %v, want one containing %q", err, want)
	}

	startCaddy(t, keyedSite(t, "global"))
	two, three := from("127.0.0.2"), from("127.0.0.3")
	expect(t, "first client, constant key", site, []int{200, 200}, two)
	expect(t, "second client, constant key", site, []int{429}, three)
}

// TestKeyFallbacksCountPerZone: two zones keyed by the same missing header
// fall back together, and each counts its fallbacks (a zone that reuses an
// earlier zone's key counted none before).
func TestKeyFallbacksCountPerZone(t *testing.T) {
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {header.X-Api-Key}
		zone kfa 1m 100
		zone kfb 1h 1000
	}
	respond "ok"`), withGlobals(`
servers {
	metrics
}`))
	series := func(zone string) string {
		return `caddy_sliding_ratelimit_key_fallbacks_total{zone="` + zone + `"}`
	}
	beforeA, beforeB := scrape(t, series("kfa")), scrape(t, series("kfb"))
	expect(t, "without X-Api-Key", site, []int{200, 200, 200}, from("127.0.0.2"))
	expect(t, "with X-Api-Key", site, []int{200}, from("127.0.0.2"), withHeader("X-Api-Key", "k1"))
	for zone, before := range map[string]float64{"kfa": beforeA, "kfb": beforeB} {
		if got := scrape(t, series(zone)) - before; got != 3 {
			t.Errorf("key_fallbacks_total of zone %s rose by %v, want 3", zone, got)
		}
	}
}

// TestKeysThatAreNotUTF8RoundTrip: two clients keyed by header values that
// differ only in bytes that are not UTF-8 are listed as two keys, each of
// which GET reads and DELETE resets, through the admin API and the command,
// one at a time: the other stays blocked.
func TestKeysThatAreNotUTF8RoundTrip(t *testing.T) {
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone raw_bytes 1m 1
	}
	respond "ok"`))
	client := from("127.0.0.2")
	fe := withHeader("X-Client", "\xff\xfe")
	fd := withHeader("X-Client", "\xff\xfd")
	expect(t, `\xff\xfe`, site, []int{200, 429}, client, fe)
	expect(t, `\xff\xfd`, site, []int{200, 429}, client, fd)

	blocked := adminBlocked(t, "")
	if blocked.Count != 2 || len(blocked.Blocked) != 2 || blocked.Blocked[0].Key == blocked.Blocked[1].Key {
		t.Fatalf("blocked: %+v, want two entries with different keys", blocked)
	}
	for _, b := range blocked.Blocked {
		if !utf8.ValidString(b.Key) || strings.ContainsRune(b.Key, utf8.RuneError) {
			t.Errorf("blocked key %q: want text that JSON carries as it is", b.Key)
		}
	}
	// Which listed key is whose: the raw bytes, percent-encoded in the path,
	// name the same key as the listing.
	feKey := adminState(t, "raw_bytes", "%FF%FE").Key
	fdKey := adminState(t, "raw_bytes", "%FF%FD").Key
	if feKey == fdKey || !listed(blocked, feKey) || !listed(blocked, fdKey) {
		t.Fatalf("keys of the raw bytes: %q and %q, want two different keys, both listed in %+v", feKey, fdKey, blocked.Blocked)
	}
	for _, key := range []string{feKey, fdKey} {
		if s := adminState(t, "raw_bytes", url.PathEscape(key)); s.Key != key || s.Count != 1 || s.Remaining != 0 {
			t.Errorf("GET %s: %+v, want that key with count 1, remaining 0", key, s)
		}
	}

	// DELETE through the admin API, with the key as listed: only that client
	// is admitted again.
	if r := adminReset(t, "raw_bytes", url.PathEscape(feKey)); r.Key != feKey {
		t.Errorf("DELETE %s: %+v", feKey, r)
	}
	expect(t, `\xff\xfe after its reset`, site, []int{200}, client, fe)
	expect(t, `\xff\xfd after the other's reset`, site, []int{429}, client, fd)

	// The command: the listed key goes back to status and reset as printed,
	// in its table and in its JSON.
	b := commandJSON[adminapi.BlockedAnswer](t, "blocked")
	if len(b.Blocked) != 1 || !listed(b, fdKey) {
		t.Fatalf("command blocked --json: %+v, want only %s listed", b, fdKey)
	}
	out, err := runCommand(t, "blocked", "--address", "localhost:2999")
	if err != nil || !strings.Contains(out, " "+fdKey+" ") {
		t.Errorf("command blocked printed %q (%v), want %s in the table as it is", out, err, fdKey)
	}
	if s := commandJSON[adminapi.KeyState](t, "status", "--zone", "raw_bytes", "--key", fdKey); s.Key != fdKey || s.Count != 1 {
		t.Errorf("command status --key %s: %+v, want count 1", fdKey, s)
	}
	if s := commandJSON[adminapi.KeyState](t, "status", "--zone", "raw_bytes", "--key", "\xff\xfd"); s.Key != fdKey {
		t.Errorf(`command status --key \xff\xfd: %+v, want key %s`, s, fdKey)
	}
	if r := commandJSON[adminapi.ResetAnswer](t, "reset", "--zone", "raw_bytes", "--key", fdKey); r.Key != fdKey || !r.Reset {
		t.Errorf("command reset --key %s: %+v", fdKey, r)
	}
	expect(t, `\xff\xfd after its reset`, site, []int{200}, client, fd)
	if got := send(t, site, client, fe).status; got != http.StatusTooManyRequests {
		t.Errorf(`\xff\xfe, admitted once since its reset: status %d, want 429`, got)
	}
}

// listed reports whether key is in the blocked list.
func listed(b adminapi.BlockedAnswer, key string) bool {
	for _, c := range b.Blocked {
		if c.Key == key {
			return true
		}
	}
	return false
}
