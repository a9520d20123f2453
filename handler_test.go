package slidingratelimit

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// globalOptions points caddytest's Caddy at its admin port and keeps it off
// the ports a developer's own Caddy uses.
const globalOptions = `{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	https_port 9443
	grace_period 1ns
}
`

// startCaddy loads a Caddyfile (global options added) into the test Caddy.
func startCaddy(t *testing.T, sites string) *caddytest.Tester {
	t.Helper()
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+sites, "caddyfile")
	if t.Failed() {
		t.FailNow()
	}
	return tester
}

// startCaddyLogging is startCaddy with Caddy's log, at INFO and above, in a
// file of the test's, whose path it returns.
func startCaddyLogging(t *testing.T, sites string) string {
	t.Helper()
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	options := strings.TrimSuffix(globalOptions, "}\n") + `	log {
		output file ` + logFile + `
		level INFO
	}
}
`
	tester := caddytest.NewTester(t)
	tester.InitServer(options+sites, "caddyfile")
	if t.Failed() {
		t.FailNow()
	}
	return logFile
}

// logLines returns the lines of a log file that hold every one of parts.
func logLines(t *testing.T, logFile string, parts ...string) []string {
	t.Helper()
	logs, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, line := range strings.Split(string(logs), "\n") {
		matches := true
		for _, p := range parts {
			matches = matches && strings.Contains(line, p)
		}
		if matches && line != "" {
			lines = append(lines, line)
		}
	}
	return lines
}

// get sends a GET with the X-Client header set to client.
func get(t *testing.T, tester *caddytest.Tester, rawURL, client string) (*http.Response, string) {
	t.Helper()
	var headers map[string]string
	if client != "" {
		headers = map[string]string{"X-Client": client}
	}
	return send(t, tester.Client, rawURL, headers)
}

// send sends a GET with the given headers and reads the whole body.
func send(t *testing.T, client *http.Client, rawURL string, headers map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, rawURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", rawURL, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(body)
}

// uniquePrefix gives each test its own Redis keys on the shared server.
func uniquePrefix(t *testing.T) string {
	return "t" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
}

func TestLimitThroughCaddy(t *testing.T) {
	tester := startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 5
		key {http.request.header.X-Client}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
}`)
	for i := 1; i <= 5; i++ {
		res, body := get(t, tester, "http://localhost:9080/", "alice")
		if res.StatusCode != http.StatusOK || body != "ok" {
			t.Fatalf("request %d: got %d %q, want 200 ok", i, res.StatusCode, body)
		}
		if got, want := res.Header.Get("RateLimit-Policy"), `"default";q=5;w=60`; got != want {
			t.Errorf("request %d: RateLimit-Policy = %q, want %q", i, got, want)
		}
		if got, want := res.Header.Get("RateLimit"), `"default";r=`+strconv.Itoa(5-i)+`;t=60`; got != want {
			t.Errorf("request %d: RateLimit = %q, want %q", i, got, want)
		}
		if got := res.Header.Get("Retry-After"); got != "" {
			t.Errorf("request %d: admitted with Retry-After %q", i, got)
		}
	}

	res, _ := get(t, tester, "http://localhost:9080/", "alice")
	if got, want := res.StatusCode, http.StatusTooManyRequests; got != want {
		t.Fatalf("6th request: status %d, want %d", got, want)
	}
	retry, err := strconv.Atoi(res.Header.Get("Retry-After"))
	if err != nil || retry < 59 || retry > 60 {
		t.Errorf("6th request: Retry-After %q, want 59 or 60 (the first admission ages out in a minute)", res.Header.Get("Retry-After"))
	}
	if got, want := res.Header.Get("RateLimit"), `"default";r=0;t=`+strconv.Itoa(retry); got != want {
		t.Errorf("6th request: RateLimit = %q, want %q", got, want)
	}

	res, _ = get(t, tester, "http://localhost:9080/", "bob")
	if got, want := res.StatusCode, http.StatusOK; got != want {
		t.Errorf("another client: status %d, want %d", got, want)
	}
}

func TestHandleErrorsSeesPlaceholders(t *testing.T) {
	tester := startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 1
		key {http.request.header.X-Client}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
	handle_errors 429 {
		respond "zone={http.sliding_ratelimit.zone} limit={http.sliding_ratelimit.limit} remaining={http.sliding_ratelimit.remaining} retry={http.sliding_ratelimit.retry_after} reset={http.sliding_ratelimit.reset}" 429
	}
}`)
	get(t, tester, "http://localhost:9080/", "carol")
	res, body := get(t, tester, "http://localhost:9080/", "carol")
	if got, want := res.StatusCode, http.StatusTooManyRequests; got != want {
		t.Fatalf("status %d, want %d", got, want)
	}
	retry := res.Header.Get("Retry-After")
	if want := "zone=default limit=1 remaining=0 retry=" + retry + " reset=" + retry; body != want {
		t.Errorf("body %q, want %q", body, want)
	}
	if res.Header.Get("RateLimit-Policy") == "" {
		t.Error("handle_errors response lost the RateLimit-Policy header")
	}
}

func TestMatcherLimitsOnlyWhatItMatches(t *testing.T) {
	tester := startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit /api/* {
		window 1m
		max_requests 1
		key {http.request.header.X-Client}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
}`)
	for i := 0; i < 5; i++ {
		if res, _ := get(t, tester, "http://localhost:9080/static/file", "dave"); res.StatusCode != http.StatusOK {
			t.Fatalf("unmatched path: status %d, want 200", res.StatusCode)
		}
	}
	if res, _ := get(t, tester, "http://localhost:9080/api/a", "dave"); res.StatusCode != http.StatusOK {
		t.Fatalf("first /api request: status %d, want 200", res.StatusCode)
	}
	if res, _ := get(t, tester, "http://localhost:9080/api/b", "dave"); res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second /api request: status %d, want 429", res.StatusCode)
	}
	res, _ := get(t, tester, "http://localhost:9080/static/file", "dave")
	if res.StatusCode != http.StatusOK || res.Header.Get("RateLimit") != "" {
		t.Fatalf("unmatched path after a block: status %d, RateLimit %q; want 200 and no header", res.StatusCode, res.Header.Get("RateLimit"))
	}
}

func TestTwoHandlersShareOneLimit(t *testing.T) {
	limit := `
	sliding_ratelimit {
		window 1m
		max_requests 5
		key {http.request.header.X-Client}
		redis ` + sharedRedis.URL() + `
		key_prefix ` + uniquePrefix(t) + `
	}
`
	tester := startCaddy(t, `
http://localhost:9080 {`+limit+`	respond "a"
}
http://localhost:9081 {`+limit+`	respond "b"
}`)
	sites := []string{"http://localhost:9080/", "http://localhost:9081/"}
	for i := 0; i < 5; i++ {
		if res, _ := get(t, tester, sites[i%2], "erin"); res.StatusCode != http.StatusOK {
			t.Fatalf("request %d on %s: status %d, want 200", i+1, sites[i%2], res.StatusCode)
		}
	}
	for _, site := range sites {
		if res, _ := get(t, tester, site, "erin"); res.StatusCode != http.StatusTooManyRequests {
			t.Errorf("%s after 5 shared admissions: status %d, want 429", site, res.StatusCode)
		}
	}
}

func TestLegacyAndNoHeaders(t *testing.T) {
	prefix := uniquePrefix(t)
	tester := startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit {
		window 90s
		max_requests 3
		key {http.request.header.X-Client}
		redis `+sharedRedis.URL()+`
		key_prefix `+prefix+`
		headers legacy
	}
	respond "ok"
}
http://localhost:9081 {
	sliding_ratelimit {
		window 1m
		max_requests 1
		key {http.request.header.X-Client}
		redis `+sharedRedis.URL()+`
		key_prefix `+prefix+`off:
		headers off
	}
	respond "ok"
}`)
	res, _ := get(t, tester, "http://localhost:9080/", "frank")
	for header, want := range map[string]string{
		"RateLimit-Policy":      `"default";q=3;w=90`,
		"RateLimit":             `"default";r=2;t=90`,
		"X-RateLimit-Limit":     "3",
		"X-RateLimit-Remaining": "2",
		"X-RateLimit-Reset":     "90",
	} {
		if got := res.Header.Get(header); got != want {
			t.Errorf("legacy: %s = %q, want %q", header, got, want)
		}
	}

	get(t, tester, "http://localhost:9081/", "frank")
	res, _ = get(t, tester, "http://localhost:9081/", "frank")
	if res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("headers off: status %d, want 429", res.StatusCode)
	}
	if res.Header.Get("RateLimit") != "" || res.Header.Get("RateLimit-Policy") != "" {
		t.Errorf("headers off: got RateLimit headers %v", res.Header)
	}
	if res.Header.Get("Retry-After") == "" {
		t.Error("headers off: a 429 must still carry Retry-After")
	}
}

func TestInProcessStoreWithoutRedis(t *testing.T) {
	client := "inproc-" + uniquePrefix(t)
	tester := startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 2
		key {http.request.header.X-Client}
	}
	respond "ok"
}`)
	for i, want := range []int{200, 200, 429, 429} {
		if res, _ := get(t, tester, "http://localhost:9080/", client); res.StatusCode != want {
			t.Fatalf("request %d: status %d, want %d", i+1, res.StatusCode, want)
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
	logFile := startCaddyLogging(t, `
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
	client := clientAt(t, "127.0.0.2")
	expect(t, "in process", client, site+"empty", nil, 200, 200, 429)
	expect(t, "on redis", client, site+"set", nil, 200, 200, 429)

	warnings := logLines(t, logFile, `"level":"warn"`, "redis expands to nothing")
	if len(warnings) != 1 || !strings.Contains(warnings[0], `"placeholder":"{env.SRL_TEST_REDIS_EMPTY}"`) || !strings.Contains(warnings[0], "each Caddy instance counts alone") {
		t.Errorf("want one warning naming {env.SRL_TEST_REDIS_EMPTY} and saying each instance counts alone, got %q", warnings)
	}
}

func TestEmptyKeyFallsBackToClientIP(t *testing.T) {
	tester := startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 2
		key {http.request.header.X-Client}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
}`)
	// Without the header the key is the client IP, shared by every such
	// request from this machine, so leaving the header out escapes nothing.
	for i, want := range []int{200, 200, 429} {
		if res, _ := get(t, tester, "http://localhost:9080/", ""); res.StatusCode != want {
			t.Fatalf("request %d without header: status %d, want %d", i+1, res.StatusCode, want)
		}
	}
}

func TestHostileKeysStayBounded(t *testing.T) {
	prefix := uniquePrefix(t)
	tester := startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 5
		key {http.request.uri.query.k}
		redis `+sharedRedis.URL()+`
		key_prefix `+prefix+`
	}
	respond "ok"
}`)
	hostile := []string{
		strings.Repeat("A", 10<<10),
		"evil\r\nSET x y\r\n",
		"nul\x00byte",
		"glob*?[a-z]",
		"brace}{tag}",
		"ключ-🔑-鍵",
	}
	for _, key := range hostile {
		res, _ := get(t, tester, "http://localhost:9080/?k="+url.QueryEscape(key), "")
		if res.StatusCode != http.StatusOK || res.Header.Get("RateLimit") == "" {
			t.Errorf("key %.20q: status %d, RateLimit %q; want 200 with a decision", key, res.StatusCode, res.Header.Get("RateLimit"))
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
	tester := startCaddy(t, site("9080", "open")+site("9081", "closed"))
	for _, port := range []string{"9080", "9081"} {
		if res, _ := get(t, tester, "http://localhost:"+port+"/", ""); res.StatusCode != http.StatusOK {
			t.Fatalf("port %s with Redis up: status %d, want 200", port, res.StatusCode)
		}
	}

	check := func(fault string) {
		for _, c := range []struct {
			port string
			want int
		}{{"9080", http.StatusOK}, {"9081", http.StatusServiceUnavailable}} {
			start := time.Now()
			res, _ := get(t, tester, "http://localhost:"+c.port+"/", "")
			took := time.Since(start)
			if res.StatusCode != c.want {
				t.Errorf("%s, port %s: status %d, want %d", fault, c.port, res.StatusCode, c.want)
			}
			if limit := timeout + 150*time.Millisecond; took > limit {
				t.Errorf("%s, port %s: answered in %s, want within %s", fault, c.port, took, limit)
			}
			if res.Header.Get("RateLimit") != "" {
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
	tester := startCaddy(t, `
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
	if res, _ := get(t, tester, "http://localhost:9080/", "gina"); res.StatusCode != http.StatusOK {
		t.Fatalf("before restart: status %d, want 200", res.StatusCode)
	}
	// Restarted empty: the script cache is gone, so EVALSHA answers NOSCRIPT
	// and the store must load the script again by itself.
	srv.Restart(t)
	deadline := time.Now().Add(5 * time.Second)
	var res *http.Response
	for {
		res, _ = get(t, tester, "http://localhost:9080/", "gina")
		if res.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got, want := res.StatusCode, http.StatusOK; got != want {
		t.Fatalf("after restart: status %d, want %d", got, want)
	}
	if got, want := res.Header.Get("RateLimit"), `"default";r=1;t=60`; got != want {
		t.Errorf("after restart: RateLimit %q, want %q (a fresh window)", got, want)
	}
	if res, _ := get(t, tester, "http://localhost:9080/", "gina"); res.StatusCode != http.StatusOK {
		t.Fatalf("second after restart: status %d, want 200", res.StatusCode)
	}
	if res, _ := get(t, tester, "http://localhost:9080/", "gina"); res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third after restart: status %d, want 429", res.StatusCode)
	}
}

// TestExampleCaddyfile runs Caddyfile.example as shipped, on the test ports.
func TestExampleCaddyfile(t *testing.T) {
	example, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("REDIS_URL", sharedRedis.URL())
	cfg := string(example)
	cfg = strings.Replace(cfg, "admin localhost:2019", "admin localhost:2999\n\tskip_install_trust\n\thttp_port 9080\n\tgrace_period 1ns", 1)
	cfg = strings.Replace(cfg, ":8080 {", "http://localhost:9080 {", 1)
	cfg = strings.Replace(cfg, "key_prefix srl:", "key_prefix "+uniquePrefix(t), 1)
	tester := caddytest.NewTester(t)
	tester.InitServer(cfg, "caddyfile")

	for i := 1; i <= 10; i++ {
		res, body := get(t, tester, "http://localhost:9080/api/hello", "")
		if res.StatusCode != http.StatusOK || body != `{"hello":"world"}` {
			t.Fatalf("request %d: %d %q", i, res.StatusCode, body)
		}
	}
	res, body := get(t, tester, "http://localhost:9080/api/hello", "")
	if res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("11th request: status %d, want 429", res.StatusCode)
	}
	want := `{"error":"Too Many Requests","retry_after_sec":` + res.Header.Get("Retry-After") + `}`
	if body != want || res.Header.Get("Content-Type") != "application/json" {
		t.Errorf("11th request: %q (%s), want %q (application/json)", body, res.Header.Get("Content-Type"), want)
	}
	if res, _ := get(t, tester, "http://localhost:9080/", ""); res.StatusCode != http.StatusOK {
		t.Errorf("static file: status %d, want 200", res.StatusCode)
	}

	// The login zone counts failed logins only: from another client, good
	// logins pass, five failures block it, the right password included.
	login := func(password string) (int, http.Header) {
		req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:9080/api/login", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = "localhost"
		req.SetBasicAuth("alice", password)
		res, err := clientAt(t, "127.0.0.2").Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode, res.Header
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
}
