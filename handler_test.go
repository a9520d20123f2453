package slidingratelimit

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

func TestLimitThroughCaddy(t *testing.T) {
	startCaddy(t, siteBlock("http://localhost:9080", uniquePrefix(t), `
	sliding_ratelimit {
		window 1m
		max_requests 5
		key {http.request.header.X-Client}
	}
	respond "ok"`))
	for i := 1; i <= 5; i++ {
		res := send(t, "http://localhost:9080/", withHeader("X-Client", "alice"))
		if res.status != http.StatusOK || res.body != "ok" {
			t.Fatalf("request %d: got %d %q, want 200 ok", i, res.status, res.body)
		}
		if got, want := res.header.Get("RateLimit-Policy"), `"default";q=5;w=60`; got != want {
			t.Errorf("request %d: RateLimit-Policy = %q, want %q", i, got, want)
		}
		if got, want := res.header.Get("RateLimit"), `"default";r=`+strconv.Itoa(5-i)+`;t=60`; got != want {
			t.Errorf("request %d: RateLimit = %q, want %q", i, got, want)
		}
		if got := res.header.Get("Retry-After"); got != "" {
			t.Errorf("request %d: admitted with Retry-After %q", i, got)
		}
	}

	res := send(t, "http://localhost:9080/", withHeader("X-Client", "alice"))
	if got, want := res.status, http.StatusTooManyRequests; got != want {
		t.Fatalf("6th request: status %d, want %d", got, want)
	}
	retry, err := strconv.Atoi(res.header.Get("Retry-After"))
	if err != nil || retry < 59 || retry > 60 {
		t.Errorf("6th request: Retry-After %q, want 59 or 60 (the first admission ages out in a minute)", res.header.Get("Retry-After"))
	}
	if got, want := res.header.Get("RateLimit"), `"default";r=0;t=`+strconv.Itoa(retry); got != want {
		t.Errorf("6th request: RateLimit = %q, want %q", got, want)
	}

	res = send(t, "http://localhost:9080/", withHeader("X-Client", "bob"))
	if got, want := res.status, http.StatusOK; got != want {
		t.Errorf("another client: status %d, want %d", got, want)
	}
}

func TestHandleErrorsSeesPlaceholders(t *testing.T) {
	startCaddy(t, siteBlock("http://localhost:9080", uniquePrefix(t), `
	sliding_ratelimit {
		window 1m
		max_requests 1
		key {http.request.header.X-Client}
	}
	respond "ok"
	handle_errors 429 {
		respond "zone={http.sliding_ratelimit.zone} limit={http.sliding_ratelimit.limit} remaining={http.sliding_ratelimit.remaining} retry={http.sliding_ratelimit.retry_after} reset={http.sliding_ratelimit.reset}" 429
	}`))
	send(t, "http://localhost:9080/", withHeader("X-Client", "carol"))
	res := send(t, "http://localhost:9080/", withHeader("X-Client", "carol"))
	if got, want := res.status, http.StatusTooManyRequests; got != want {
		t.Fatalf("status %d, want %d", got, want)
	}
	retry := res.header.Get("Retry-After")
	if want := "zone=default limit=1 remaining=0 retry=" + retry + " reset=" + retry; res.body != want {
		t.Errorf("body %q, want %q", res.body, want)
	}
	if res.header.Get("RateLimit-Policy") == "" {
		t.Error("handle_errors response lost the RateLimit-Policy header")
	}
}

func TestMatcherLimitsOnlyWhatItMatches(t *testing.T) {
	startCaddy(t, siteBlock("http://localhost:9080", uniquePrefix(t), `
	sliding_ratelimit /api/* {
		window 1m
		max_requests 1
		key {http.request.header.X-Client}
	}
	respond "ok"`))
	for i := 0; i < 5; i++ {
		if res := send(t, "http://localhost:9080/static/file", withHeader("X-Client", "dave")); res.status != http.StatusOK {
			t.Fatalf("unmatched path: status %d, want 200", res.status)
		}
	}
	if res := send(t, "http://localhost:9080/api/a", withHeader("X-Client", "dave")); res.status != http.StatusOK {
		t.Fatalf("first /api request: status %d, want 200", res.status)
	}
	if res := send(t, "http://localhost:9080/api/b", withHeader("X-Client", "dave")); res.status != http.StatusTooManyRequests {
		t.Fatalf("second /api request: status %d, want 429", res.status)
	}
	res := send(t, "http://localhost:9080/static/file", withHeader("X-Client", "dave"))
	if res.status != http.StatusOK || res.header.Get("RateLimit") != "" {
		t.Fatalf("unmatched path after a block: status %d, RateLimit %q; want 200 and no header", res.status, res.header.Get("RateLimit"))
	}
}

func TestTwoHandlersShareOneLimit(t *testing.T) {
	prefix := uniquePrefix(t)
	limit := `
	sliding_ratelimit {
		window 1m
		max_requests 5
		key {http.request.header.X-Client}
	}
`
	startCaddy(t, siteBlock("http://localhost:9080", prefix, limit+`	respond "a"`)+
		siteBlock("http://localhost:9081", prefix, limit+`	respond "b"`))
	sites := []string{"http://localhost:9080/", "http://localhost:9081/"}
	for i := 0; i < 5; i++ {
		if res := send(t, sites[i%2], withHeader("X-Client", "erin")); res.status != http.StatusOK {
			t.Fatalf("request %d on %s: status %d, want 200", i+1, sites[i%2], res.status)
		}
	}
	for _, site := range sites {
		if res := send(t, site, withHeader("X-Client", "erin")); res.status != http.StatusTooManyRequests {
			t.Errorf("%s after 5 shared admissions: status %d, want 429", site, res.status)
		}
	}
}

func TestLegacyAndNoHeaders(t *testing.T) {
	prefix := uniquePrefix(t)
	startCaddy(t, siteBlock("http://localhost:9080", prefix, `
	sliding_ratelimit {
		window 90s
		max_requests 3
		key {http.request.header.X-Client}
		headers legacy
	}
	respond "ok"`)+siteBlock("http://localhost:9081", prefix+"off:", `
	sliding_ratelimit {
		window 1m
		max_requests 1
		key {http.request.header.X-Client}
		headers off
	}
	respond "ok"`))
	res := send(t, "http://localhost:9080/", withHeader("X-Client", "frank"))
	for header, want := range map[string]string{
		"RateLimit-Policy":      `"default";q=3;w=90`,
		"RateLimit":             `"default";r=2;t=90`,
		"X-RateLimit-Limit":     "3",
		"X-RateLimit-Remaining": "2",
		"X-RateLimit-Reset":     "90",
	} {
		if got := res.header.Get(header); got != want {
			t.Errorf("legacy: %s = %q, want %q", header, got, want)
		}
	}

	send(t, "http://localhost:9081/", withHeader("X-Client", "frank"))
	res = send(t, "http://localhost:9081/", withHeader("X-Client", "frank"))
	if res.status != http.StatusTooManyRequests {
		t.Fatalf("headers off: status %d, want 429", res.status)
	}
	if res.header.Get("RateLimit") != "" || res.header.Get("RateLimit-Policy") != "" {
		t.Errorf("headers off: got RateLimit headers %v", res.header)
	}
	if res.header.Get("Retry-After") == "" {
		t.Error("headers off: a 429 must still carry Retry-After")
	}
}

func TestInProcessStoreWithoutRedis(t *testing.T) {
	client := "inproc-" + uniquePrefix(t)
	startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 2
		key {http.request.header.X-Client}
	}
	respond "ok"
}`)
	for i, want := range []int{200, 200, 429, 429} {
		if res := send(t, "http://localhost:9080/", withHeader("X-Client", client)); res.status != want {
			t.Fatalf("request %d: status %d, want %d", i+1, res.status, want)
		}
	}
}

// TestRedisPlaceholderThatExpandsToNothingWarns: `redis {env.NAME}` with the
// variable unset or empty keeps the limits in process, one count per
// instance: that is warned about, naming the placeholder, while a variable
// that is set reaches its Redis without a word.
func TestRedisPlaceholderThatExpandsToNothingWarns(t *testing.T) {
	t.Setenv("SRL_TEST_REDIS_EMPTY", "")
	t.Setenv("SRL_TEST_REDIS_SET", sharedRedis.URL())
	logFile := startCaddy(t, `
:9080 {
	handle /empty {
		sliding_ratelimit {
			zone empty 1m 2
			redis {env.SRL_TEST_REDIS_EMPTY}
		}
		respond "ok"
	}
	handle /set {
		sliding_ratelimit {
			zone set 1m 2
			redis {env.SRL_TEST_REDIS_SET}
			key_prefix `+uniquePrefix(t)+`
		}
		respond "ok"
	}
}`)
	client := from("127.0.0.2")
	expect(t, "in process", site+"empty", []int{200, 200, 429}, client)
	expect(t, "on redis", site+"set", []int{200, 200, 429}, client)

	warnings := logLines(t, logFile, `"level":"warn"`, "redis expands to nothing")
	if len(warnings) != 1 || !strings.Contains(warnings[0], `"placeholder":"{env.SRL_TEST_REDIS_EMPTY}"`) || !strings.Contains(warnings[0], "each Caddy instance counts alone") {
		t.Errorf("want one warning naming {env.SRL_TEST_REDIS_EMPTY} and saying each instance counts alone, got %q", warnings)
	}
}

func TestEmptyKeyFallsBackToClientIP(t *testing.T) {
	startCaddy(t, siteBlock("http://localhost:9080", uniquePrefix(t), `
	sliding_ratelimit {
		window 1m
		max_requests 2
		key {http.request.header.X-Client}
	}
	respond "ok"`))
	// Without the header the key is the client IP, shared by every such
	// request from this machine, so leaving the header out escapes nothing.
	for i, want := range []int{200, 200, 429} {
		if res := send(t, "http://localhost:9080/"); res.status != want {
			t.Fatalf("request %d without header: status %d, want %d", i+1, res.status, want)
		}
	}
}

func TestHostileKeysStayBounded(t *testing.T) {
	prefix := uniquePrefix(t)
	startCaddy(t, siteBlock("http://localhost:9080", prefix, `
	sliding_ratelimit {
		window 1m
		max_requests 5
		key {http.request.uri.query.k}
	}
	respond "ok"`))
	hostile := []string{
		strings.Repeat("A", 10<<10),
		"evil\r\nSET x y\r\n",
		"nul\x00byte",
		"glob*?[a-z]",
		"brace}{tag}",
		"ключ-🔑-鍵",
	}
	for _, key := range hostile {
		res := send(t, "http://localhost:9080/?k="+url.QueryEscape(key))
		if res.status != http.StatusOK || res.header.Get("RateLimit") == "" {
			t.Errorf("key %.20q: status %d, RateLimit %q; want 200 with a decision", key, res.status, res.header.Get("RateLimit"))
		}
	}
	rdb := sharedRedis.Client(t)
	keys, err := rdb.Keys(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(keys), len(hostile); got != want {
		t.Errorf("%d Redis keys for %d distinct clients: %q", got, want, keys)
	}
	// prefix + "{" + at most 64 bytes + "}:default"
	maxLen := len(prefix) + 1 + 64 + len("}:default")
	for _, k := range keys {
		if len(k) > maxLen {
			t.Errorf("Redis key of %d bytes, want at most %d: %.80q", len(k), maxLen, k)
		}
	}
}

func TestFailModes(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 100 * time.Millisecond
	site := func(port, mode string) string {
		return `
http://localhost:` + port + ` {
	sliding_ratelimit {
		window 1m
		max_requests 100
		redis ` + srv.URL() + `
		timeout 100ms
		fail_mode ` + mode + `
	}
	respond "ok"
}`
	}
	startCaddy(t, site("9080", "open")+site("9081", "closed"))
	for _, port := range []string{"9080", "9081"} {
		if res := send(t, "http://localhost:"+port+"/"); res.status != http.StatusOK {
			t.Fatalf("port %s with Redis up: status %d, want 200", port, res.status)
		}
	}

	check := func(fault string) {
		for _, c := range []struct {
			port string
			want int
		}{{"9080", http.StatusOK}, {"9081", http.StatusServiceUnavailable}} {
			start := time.Now()
			res := send(t, "http://localhost:"+c.port+"/")
			took := time.Since(start)
			if res.status != c.want {
				t.Errorf("%s, port %s: status %d, want %d", fault, c.port, res.status, c.want)
			}
			if limit := timeout + 150*time.Millisecond; took > limit {
				t.Errorf("%s, port %s: answered in %s, want within %s", fault, c.port, took, limit)
			}
			if res.header.Get("RateLimit") != "" {
				t.Errorf("%s, port %s: RateLimit header without a decision", fault, c.port)
			}
		}
	}

	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	check("Redis frozen")
	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	check("Redis stopped")
}

func TestRedisRestartHealsWithoutReload(t *testing.T) {
	srv := redistest.Start(t)
	startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 2
		key {http.request.header.X-Client}
		redis `+srv.URL()+`
		fail_mode closed
	}
	respond "ok"
}`)
	if res := send(t, "http://localhost:9080/", withHeader("X-Client", "gina")); res.status != http.StatusOK {
		t.Fatalf("before restart: status %d, want 200", res.status)
	}
	// Restarted empty: the library and the script cache are gone, so FCALL
	// answers Function not found (EVALSHA NOSCRIPT) and the store must send
	// the script again, and load the library, by itself.
	srv.Restart(t)
	deadline := time.Now().Add(5 * time.Second)
	var res answer
	for {
		res = send(t, "http://localhost:9080/", withHeader("X-Client", "gina"))
		if res.status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got, want := res.status, http.StatusOK; got != want {
		t.Fatalf("after restart: status %d, want %d", got, want)
	}
	if got, want := res.header.Get("RateLimit"), `"default";r=1;t=60`; got != want {
		t.Errorf("after restart: RateLimit %q, want %q (a fresh window)", got, want)
	}
	if res := send(t, "http://localhost:9080/", withHeader("X-Client", "gina")); res.status != http.StatusOK {
		t.Fatalf("second after restart: status %d, want 200", res.status)
	}
	if res := send(t, "http://localhost:9080/", withHeader("X-Client", "gina")); res.status != http.StatusTooManyRequests {
		t.Fatalf("third after restart: status %d, want 429", res.status)
	}
}

// TestExampleCaddyfile runs Caddyfile.example as shipped, on the test ports,
// and checks that it stays a safe thing to run on a laptop: bound to this
// machine, without debug logging.
func TestExampleCaddyfile(t *testing.T) {
	example, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("REDIS_URL", sharedRedis.URL())
	// Its global options are for a developer's machine: the test Caddy
	// has its own.
	globals, sites, ok := strings.Cut(string(example), "\n}\n")
	if !ok || !strings.Contains(globals, "\n{\n") {
		t.Fatal("Caddyfile.example does not start with a global options block")
	}
	if !strings.Contains(globals, "\n\tadmin localhost:2019\n") || regexp.MustCompile(`(?m)^\s*debug\s*$`).MatchString(globals) {
		t.Errorf("global options %q: want the admin API on localhost and no debug", globals)
	}
	if !strings.Contains(sites, "\n\tbind 127.0.0.1\n") {
		t.Error("the site does not bind 127.0.0.1: it would serve every interface")
	}
	// On the test port, still a site of every host, as shipped: its zones'
	// identities are the example's.
	sites = strings.Replace(sites, ":8080 {", ":9080 {", 1)
	sites = strings.Replace(sites, "key_prefix srl:", "key_prefix "+uniquePrefix(t), 1)
	startCaddy(t, sites)

	for i := 1; i <= 10; i++ {
		res := send(t, "http://localhost:9080/api/hello")
		if res.status != http.StatusOK || res.body != `{"hello":"world"}` {
			t.Fatalf("request %d: %d %q", i, res.status, res.body)
		}
	}
	res := send(t, "http://localhost:9080/api/hello")
	if res.status != http.StatusTooManyRequests {
		t.Fatalf("11th request: status %d, want 429", res.status)
	}
	want := `{"error":"Too Many Requests","retry_after_sec":` + res.header.Get("Retry-After") + `}`
	if res.body != want || res.header.Get("Content-Type") != "application/json" {
		t.Errorf("11th request: %q (%s), want %q (application/json)", res.body, res.header.Get("Content-Type"), want)
	}
	if res := send(t, "http://localhost:9080/"); res.status != http.StatusOK {
		t.Errorf("static file: status %d, want 200", res.status)
	}

	// The login zone counts failed logins only: from another client, good
	// logins pass, five failures block it, the right password included.
	login := func(password string) (int, http.Header) {
		auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+password))
		res := send(t, "http://127.0.0.1:9080/api/login", from("127.0.0.2"), withHost("localhost"), withHeader("Authorization", auth))
		return res.status, res.header
	}
	for i, c := range []struct {
		password string
		want     int
	}{
		{"letmein", 200}, {"letmein", 200}, {"nope", 401}, {"nope", 401}, {"letmein", 200},
		{"nope", 401}, {"nope", 401}, {"nope", 401}, {"letmein", 429},
	} {
		status, h := login(c.password)
		if status != c.want {
			t.Errorf("login %d with %q: status %d, want %d", i+1, c.password, status, c.want)
		}
		if status == http.StatusTooManyRequests && !strings.HasPrefix(h.Get("RateLimit"), `"login"`) {
			t.Errorf("denied login: RateLimit %q, want the login zone", h.Get("RateLimit"))
		}
	}

	// The admin API by the zone's identity, as docs/admin.md names it: its
	// count_status is part of it.
	if s := adminState(t, "login:401,403", "127.0.0.2"); s.Zone != "login" || s.Count != 5 {
		t.Errorf("GET by identity: %+v, want zone login, count 5", s)
	}
	if status, _ := adminDo(t, http.MethodGet, "/sliding_ratelimit/zones/login:401/keys/127.0.0.2"); status != http.StatusNotFound {
		t.Errorf("GET login:401: status %d, want 404 (no zone has that identity)", status)
	}

	// The identities the command's help names as the example's are the
	// example's.
	res = send(t, adminURL+"/sliding_ratelimit/zones")
	for _, identity := range regexp.MustCompile(`"([^"\s]+[@:][^"\s]+)"`).FindAllStringSubmatch(caddycmd.Commands()["sliding-ratelimit"].Long, -1) {
		if !strings.Contains(res.body, `"identity":"`+identity[1]+`"`) {
			t.Errorf("the help names identity %s, which Caddyfile.example's zones (%s) do not have", identity[1], res.body)
		}
	}
}

func TestSpoofedForwardedForDoesNotChangeTheKey(t *testing.T) {
	site := siteBlock("http://localhost:9080", uniquePrefix(t), `
	sliding_ratelimit {
		window 1m
		max_requests 2
	}
	respond "ok"`)
	startCaddy(t, site)
	for i, want := range []int{200, 200, 429, 429} {
		res := send(t, "http://localhost:9080/", withHeader("X-Forwarded-For", "203.0.113."+string(rune('1'+i))))
		if res.status != want {
			t.Errorf("no trusted_proxies, request %d with a new X-Forwarded-For: %d, want %d", i+1, res.status, want)
		}
	}
}

func TestTrustedProxiesForwardedClientIP(t *testing.T) {
	startCaddy(t, siteBlock("http://localhost:9080", uniquePrefix(t), `
	sliding_ratelimit {
		window 1m
		max_requests 2
		key {client_ip}
	}
	respond "{client_ip}"`), withGlobals(`
servers {
	trusted_proxies static 127.0.0.1/32 ::1/128
}`))
	for i, c := range []struct {
		xff  string
		want int
	}{
		{"203.0.113.1", 200}, {"203.0.113.2", 200}, {"203.0.113.3", 200},
		{"203.0.113.1", 200}, {"203.0.113.1", 429},
	} {
		res := send(t, "http://localhost:9080/", withHeader("X-Forwarded-For", c.xff))
		if res.status != c.want {
			t.Errorf("request %d from %s through a trusted proxy: %d, want %d", i+1, c.xff, res.status, c.want)
		}
	}
}

// TestSecretsStayOutOfLogs: at the default level, neither the Redis password
// nor a client key appears in Caddy's log, through denials and Redis
// failures alike.
func TestSecretsStayOutOfLogs(t *testing.T) {
	down := redistest.Start(t)
	downURL := "redis://default:s3cretpw@" + down.Addr() + "/0"
	down.Stop()
	logFile := startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit /limited {
		window 1m
		max_requests 1
		key {http.request.header.X-Client}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	sliding_ratelimit /broken {
		window 1m
		max_requests 1
		key {http.request.header.X-Client}
		redis `+downURL+`
		timeout 50ms
	}
	respond "ok"
}`)
	secretKey := withHeader("X-Client", "secret-client-key-123")
	for i := 0; i < 3; i++ {
		send(t, "http://localhost:9080/limited", secretKey)
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		send(t, "http://localhost:9080/broken", secretKey)
		time.Sleep(20 * time.Millisecond)
	}
	logs, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logs), "rate limit store unavailable") {
		t.Errorf("the Redis failure was not logged at all; log:\n%s", logs)
	}
	failures := strings.Count(string(logs), "rate limit store unavailable")
	if failures > 3 {
		t.Errorf("%d failure lines in 1.5s, want at most one a second", failures)
	}
	for _, secret := range []string{"s3cretpw", "secret-client-key-123"} {
		if strings.Contains(string(logs), secret) {
			t.Errorf("log holds %q:\n%s", secret, logs)
		}
	}
	if res := send(t, "http://localhost:9080/broken"); res.status != http.StatusOK {
		t.Errorf("fail open: %d", res.status)
	}
}
