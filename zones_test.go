package slidingratelimit

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/adminapi"
)

func TestZonesAllOrNothing(t *testing.T) {
	prefix := uniquePrefix(t)
	startCaddy(t, siteBlock("http://localhost:9080", prefix, `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone burst 1m 3
		zone hourly 1h 5 {
			key {http.request.header.Authorization}
		}
	}
	respond "ok"`))
	request := func(client, token string) answer {
		return send(t, "http://localhost:9080/", withHeader("X-Client", client), withHeader("Authorization", token))
	}
	// Five admissions of one token spread over two clients use up hourly
	// but neither client's burst.
	for i, client := range []string{"c1", "c1", "c1", "c2", "c2"} {
		if res := request(client, "tok"); res.status != http.StatusOK {
			t.Fatalf("admission %d: status %d", i+1, res.status)
		}
	}
	res := request("c3", "tok")
	if res.status != http.StatusTooManyRequests {
		t.Fatalf("sixth request of the token: status %d, want 429", res.status)
	}
	if got, want := res.header.Get("RateLimit-Policy"), `"burst";q=3;w=60, "hourly";q=5;w=3600`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if got := res.header.Get("RateLimit"); got[:len(`"hourly";r=0;`)] != `"hourly";r=0;` {
		t.Errorf("RateLimit %q, want the denying zone hourly", got)
	}

	// The denial by hourly consumed nothing of c3's burst.
	card, err := admissionsKept(context.Background(), sharedRedis.Client(t), prefix+"{c3}:burst")
	if err != nil {
		t.Fatal(err)
	}
	if card != 0 {
		t.Errorf("c3's burst holds %d admissions after a request hourly denied, want 0", card)
	}
	res = request("c3", "other-token")
	if got, want := res.header.Get("RateLimit"), `"burst";r=2;t=60, "hourly";r=4;t=3600`; res.status != http.StatusOK || got != want {
		t.Errorf("c3 with another token: %d %q, want 200 %q", res.status, got, want)
	}
	// And burst alone denies too.
	request("c3", "other-token")
	res = request("c3", "other-token")
	if res.status != http.StatusOK {
		t.Fatalf("c3's third: status %d, want 200", res.status)
	}
	res = request("c3", "other-token")
	if got := res.header.Get("RateLimit"); res.status != http.StatusTooManyRequests || got[:len(`"burst";r=0;`)] != `"burst";r=0;` {
		t.Errorf("c3's fourth: %d %q, want 429 from burst", res.status, got)
	}
}

func TestZoneMatchers(t *testing.T) {
	startCaddy(t, siteBlock("http://localhost:9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone all 1m 10
		zone login 1m 1 {
			match {
				method POST
				path /login
			}
		}
	}
	respond "ok"`))
	post := func() int {
		return send(t, "http://localhost:9080/login", withMethod(http.MethodPost), withHeader("X-Client", "m1")).status
	}
	if got := post(); got != http.StatusOK {
		t.Fatalf("first POST /login: %d", got)
	}
	if got := post(); got != http.StatusTooManyRequests {
		t.Fatalf("second POST /login: %d, want 429", got)
	}
	res := send(t, "http://localhost:9080/login", withHeader("X-Client", "m1"))
	if got, want := res.header.Get("RateLimit-Policy"), `"all";q=10;w=60`; res.status != http.StatusOK || got != want {
		t.Errorf("GET /login: %d, policy %q; want 200 and only zone all (%q)", res.status, got, want)
	}
	// all counted the first POST and this GET, not the denied POST.
	if got, want := res.header.Get("RateLimit"), `"all";r=8;t=60`; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
}

func TestReportModePassesAndReports(t *testing.T) {
	prefix := uniquePrefix(t)
	startCaddy(t, siteBlock("http://localhost:9080", prefix, `
	sliding_ratelimit {
		window 1m
		max_requests 2
		key {http.request.header.X-Client}
		mode report
	}
	respond "{http.sliding_ratelimit.retry_after}"`))
	for i := 1; i <= 5; i++ {
		res := send(t, "http://localhost:9080/", withHeader("X-Client", "r1"))
		retryAfter := res.body
		if res.status != http.StatusOK {
			t.Fatalf("request %d in report mode: status %d, want 200", i, res.status)
		}
		if res.header.Get("Retry-After") != "" {
			t.Errorf("request %d: Retry-After in report mode", i)
		}
		wantR := max(2-i, 0)
		if got, want := res.header.Get("RateLimit")[:len(`"default";r=0`)], `"default";r=`+strconv.Itoa(wantR); got != want {
			t.Errorf("request %d: RateLimit starts %q, want %q", i, got, want)
		}
		if wouldDeny := retryAfter != "0"; wouldDeny != (i > 2) {
			t.Errorf("request %d: retry_after placeholder %q, want 0 only while admitted", i, retryAfter)
		}
	}
	card, err := admissionsKept(context.Background(), sharedRedis.Client(t), prefix+"{=r1}:default@localhost")
	if err != nil {
		t.Fatal(err)
	}
	if card != 2 {
		t.Errorf("report mode recorded %d admissions, want 2 (would-be denials are not recorded)", card)
	}
}

func TestIPPrefixGrouping(t *testing.T) {
	startCaddy(t, siteBlock("http://localhost:9080", uniquePrefix(t), `
	sliding_ratelimit {
		window 1m
		max_requests 2
		key {http.request.header.X-IP}
		ipv4_prefix 24
	}
	respond "ok"`))
	for _, c := range []struct {
		ip   string
		want int
	}{
		{"2001:db8:1:2::1", 200},
		{"2001:db8:1:2:ffff:eeee:dddd:9", 200}, // same /64
		{"2001:db8:1:2::77", 429},
		{"2001:db8:1:3::1", 200}, // another /64
		{"192.0.2.1", 200},
		{"192.0.2.200", 200}, // same /24
		{"::ffff:192.0.2.9", 429},
		{"192.0.3.1", 200},
	} {
		res := send(t, "http://localhost:9080/", withHeader("X-IP", c.ip))
		if res.status != c.want {
			t.Errorf("%s: status %d, want %d", c.ip, res.status, c.want)
		}
	}
}

// TestManyZones: more zones than the handler keeps on the stack.
func TestManyZones(t *testing.T) {
	config := `{"redis": "` + sharedRedis.URL() + `", "key_prefix": "` + uniquePrefix(t) + `", "zones": [`
	for i := 1; i <= 6; i++ {
		if i > 1 {
			config += ","
		}
		config += `{"name": "z` + strconv.Itoa(i) + `", "window": "1m", "max_requests": ` + strconv.Itoa(10+i) + `}`
	}
	in := newInstance(t, config+`]}`)
	for i := 1; i <= 11; i++ {
		res := send(t, "/", to(in), from("192.0.2.50"))
		status, h := res.status, res.header
		if status != http.StatusOK {
			t.Fatalf("request %d: status %d", i, status)
		}
		var items []string
		for z := 1; z <= 6; z++ {
			items = append(items, `"z`+strconv.Itoa(z)+`";r=`+strconv.Itoa(10+z-i)+`;t=60`)
		}
		if got, want := h.Get("RateLimit"), strings.Join(items, ", "); got != want {
			t.Errorf("request %d: RateLimit %q, want %q (every zone, the fewest left first)", i, got, want)
		}
	}
	if res := send(t, "/", to(in), from("192.0.2.50")); res.status != http.StatusTooManyRequests || res.header.Get("Retry-After") == "" {
		t.Errorf("12th request: %d, Retry-After %q; want 429 from z1", res.status, res.header.Get("Retry-After"))
	}
}

// TestSitesShareTheImplicitZoneWithAWarning: two sites of one config with the
// three-line form count apart, whatever their limits, since each unnamed
// zone is named after its site; a site of the same hosts on two servers
// shares it, and the log says so once, naming both and how to share on
// purpose or count apart. Zones named the same on purpose are not warned
// about.
func TestSitesShareTheImplicitZoneWithAWarning(t *testing.T) {
	prefix := uniquePrefix(t)
	threeLines := func(max string) string {
		return `
	sliding_ratelimit {
		window 1m
		max_requests ` + max + `
	}
	respond "ok"`
	}
	named := `
	sliding_ratelimit {
		zone api 1m 1
	}
	respond "ok"`
	logFile := startCaddy(t, siteBlock("http://a.localhost:9080", prefix, threeLines("1"))+
		siteBlock("http://b.localhost:9080", prefix, threeLines("1"))+
		siteBlock("http://c.localhost:9080", prefix, named)+
		siteBlock("http://d.localhost:9080", prefix, named)+
		siteBlock("http://e.localhost:9080", prefix, threeLines("2"))+
		siteBlock("http://a.localhost:9081", prefix, threeLines("1")))
	client := newFaultClient(t, 2)
	for _, c := range []struct {
		host string
		want int
	}{
		{"a.localhost", http.StatusOK}, {"b.localhost", http.StatusOK},
		{"c.localhost", http.StatusOK}, {"d.localhost", http.StatusTooManyRequests},
		{"e.localhost", http.StatusOK}, {"a.localhost", http.StatusTooManyRequests},
	} {
		if a := client.get(c.host); a.err != nil || a.status != c.want {
			t.Errorf("%s: %d %v, want %d", c.host, a.status, a.err, c.want)
		}
	}
	// a.localhost on the other port is the same site: its client has had
	// its one request.
	expect(t, "a.localhost on port 9081", "http://127.0.0.1:9081/", []int{429}, from("127.0.0.2"), withHost("a.localhost"))

	warnings := logLines(t, logFile, `"level":"warn"`, "share one limit")
	if len(warnings) != 1 {
		t.Fatalf("%d warnings about a shared implicit zone, want 1: %q", len(warnings), warnings)
	}
	w := warnings[0]
	for _, want := range []string{
		`"server srv0, host a.localhost"`, `"server srv1, host a.localhost"`,
		`"zone":"default@a.localhost"`,
		"give the zone the same name in each", "give each zone a name of its own",
	} {
		if !strings.Contains(w, want) {
			t.Errorf("warning without %s: %s", want, w)
		}
	}
	if strings.Contains(w, "b.localhost") || strings.Contains(w, "e.localhost") {
		t.Errorf("warning names sites that count apart: %s", w)
	}
}

// TestImplicitZoneNamedAfterItsSite: the identity of each unnamed zone, as
// the admin API lists it, names its site: its hosts (sorted, in lower case)
// and paths, a second handler of one site apart (in a site of hosts, and in
// one whose directives are routes of their own), a catch-all site by its
// server where the config has several, and a site whose name a key should
// not hold by its hash. Loaded again with every port moved, as another
// instance of a fleet on the same machine would run it, the identities stay.
func TestImplicitZoneNamedAfterItsSite(t *testing.T) {
	prefix := uniquePrefix(t)
	threeLines := `
	sliding_ratelimit {
		window 1m
		max_requests 5
	}
	respond "ok"`
	twoHandlers := `
	sliding_ratelimit /a* {
		window 1m
		max_requests 5
	}
	sliding_ratelimit /b* {
		window 1h
		max_requests 50
	}
	respond "ok"`
	// The only site of its port that answers every host: its directives
	// are routes of their own at the top of the server.
	twoUnmatched := `
	sliding_ratelimit {
		window 1m
		max_requests 5
	}
	sliding_ratelimit {
		window 1s
		max_requests 2
	}
	respond "ok"`
	config := func(port1, port2 int) string {
		p1, p2 := strconv.Itoa(port1), strconv.Itoa(port2)
		return siteBlock("http://b.localhost:"+p1+", http://A.localhost:"+p1, prefix, threeLines) +
			siteBlock("http://c.localhost:"+p1+"/api/*", prefix, threeLines) +
			siteBlock("http://d.localhost:"+p1, prefix, twoHandlers) +
			siteBlock("http://[::1]:"+p1, prefix, threeLines) +
			siteBlock(":"+p2, prefix, twoUnmatched)
	}
	want := []string{
		"default@#", // [::1]: brackets and colons are hashed
		"default@a.localhost,b.localhost",
		"default@c.localhost/api/*",
		"default@d.localhost",
		"default@d.localhost~2",
		"default@server=srv1",
		"default@server=srv1~2",
	}
	for _, ports := range [][2]int{{9080, 9081}, {9082, 9083}} {
		startCaddy(t, config(ports[0], ports[1]))
		res := send(t, adminURL+"/sliding_ratelimit/zones")
		var answer adminapi.ZonesAnswer
		if res.status != http.StatusOK || json.Unmarshal([]byte(res.body), &answer) != nil {
			t.Fatalf("GET zones: %d %s", res.status, res.body)
		}
		var got []string
		for _, z := range answer.Zones {
			got = append(got, z.Identity)
		}
		slices.Sort(got)
		if len(got) != len(want) || !strings.HasPrefix(got[0], want[0]) || len(got[0]) != len("default@#")+16 || !slices.Equal(got[1:], want[1:]) {
			t.Errorf("ports %v: identities %q, want %q", ports, got, want)
		}
	}
	// The admin API takes an identity percent-encoded.
	expect(t, "c.localhost/api", "http://127.0.0.1:9082/api/x", []int{200}, from("127.0.0.2"), withHost("c.localhost"))
	if s := adminState(t, url.PathEscape("default@c.localhost/api/*"), "127.0.0.2"); s.Count != 1 {
		t.Errorf("GET default@c.localhost/api/*: count %d, want 1", s.Count)
	}
}

// TestReloadKeepsCounts: a reload that lowers max_requests keeps each
// client's count, so a client that made 50 of 100 is denied under 10 and
// gets the difference under 200; a reload of the same site with other
// numbers or another response keeps the unnamed zone's counts, and a log
// zone's window may change too. A counter zone's window is its state: a
// new one starts over. Each step is checked against what Redis holds.
func TestReloadKeepsCounts(t *testing.T) {
	prefix := uniquePrefix(t)
	config := func(window string, max int, counterWindow, body string) string {
		return siteBlock("http://localhost:9080", prefix, `
	sliding_ratelimit {
		window `+window+`
		max_requests `+strconv.Itoa(max)+`
		key {http.request.header.X-Client}
		zone ctr `+counterWindow+` 1000 {
			algorithm counter
			match {
				path /ctr*
			}
		}
	}
	respond "`+body+`"`)
	}
	c := withHeader("X-Client", "c")
	okTimes := func(n int) []int { return slices.Repeat([]int{200}, n) }
	// statusesCounted sends n requests and counts the 200s.
	statusesCounted := func(what, path string, n int) int {
		t.Helper()
		ok := 0
		for range n {
			if s := send(t, "http://localhost:9080"+path, c).status; s == http.StatusOK {
				ok++
			} else if s != http.StatusTooManyRequests {
				t.Fatalf("%s: status %d", what, s)
			}
		}
		return ok
	}

	startCaddy(t, config("1m", 100, "1m", "one"))
	expect(t, "50 of 100", "http://localhost:9080/", okTimes(50), c)
	expect(t, "the counter zone", "http://localhost:9080/ctr", okTimes(3), c)

	startCaddy(t, config("1m", 10, "1m", "one"))
	expect(t, "53 made, max lowered to 10", "http://localhost:9080/", []int{429}, c)
	expect(t, "another client under 10", "http://localhost:9080/", append(okTimes(10), 429), withHeader("X-Client", "d"))

	startCaddy(t, config("1m", 200, "1m", "one"))
	if got := statusesCounted("max raised to 200", "/", 160); got != 200-53 {
		t.Errorf("max raised to 200 after 53: %d admitted, want the difference, %d", got, 200-53)
	}
	// The same site, another response and a longer window: the 200 still
	// count.
	startCaddy(t, config("2m", 200, "1m", "two"))
	expect(t, "the same site reloaded with a longer window", "http://localhost:9080/", []int{429}, c)
	if s := adminState(t, "default@localhost", "=c"); s.Count != 200 || s.Identity != "default@localhost" {
		t.Errorf("admin state %+v, want the 200 counted in default@localhost", s)
	}
	// The counter's estimate of 3 may weigh them less once its fixed
	// minute turns.
	if s := adminState(t, "ctr", "=c"); s.Count < 1 || s.Identity != "ctr:counter:1m" {
		t.Errorf("counter zone %+v, want its 3 in ctr:counter:1m", s)
	}
	// A counter zone cuts its fixed windows by its window: another one is
	// another state.
	startCaddy(t, config("2m", 200, "2m", "two"))
	if s := adminState(t, "ctr", "=c"); s.Count != 0 || s.Identity != "ctr:counter:2m" {
		t.Errorf("counter zone with its window changed %+v, want ctr:counter:2m starting over", s)
	}
}

// TestJSONRulesNameTheField: a JSON config breaks the same rules as a
// Caddyfile, in the same words, naming the field (and the zone).
func TestJSONRulesNameTheField(t *testing.T) {
	for _, c := range []struct{ config, want string }{
		{`{}`, "no limit: set window and max_requests, or at least one zone"},
		{`{"window": "1m"}`, "max_requests must be at least 1, got 0"},
		{`{"max_requests": 5}`, "window must be greater than zero"},
		{`{"window": "-1s", "max_requests": 5}`, "window must be greater than zero, got -1s"},
		{`{"window": "1m", "max_requests": 5, "timeout": "-1s"}`, "timeout must be greater than zero"},
		{`{"window": "1m", "max_requests": 5, "ipv4_prefix": 33}`, "ipv4_prefix must be from 1 to 32, got 33"},
		{`{"window": "1m", "max_requests": 5, "ipv6_prefix": 129}`, "ipv6_prefix must be from 1 to 128, got 129"},
		{`{"window": "1m", "max_requests": 5, "key_prefix": "a{b"}`, "key_prefix must not contain '{' or '}'"},
		{`{"window": "1m", "max_requests": 5, "fail_mode": "shut"}`, `fail_mode must be open, closed or local, got "shut"`},
		{`{"window": "1m", "max_requests": 5, "fail_mode": "close"}`, `fail_mode must be open, closed or local, got "close" (did you mean closed?)`},
		{`{"window": "1m", "max_requests": 5, "headers": "x"}`, `headers must be draft, legacy or off, got "x"`},
		{`{"window": "1m", "max_requests": 5, "mode": "x"}`, `mode must be enforce or report, got "x"`},
		{`{"window": "1m", "max_requests": 5, "algorithm": "x"}`, `algorithm must be log or counter, got "x"`},
		{`{"window": "1m", "max_requests": 5, "redis_topology": "ring"}`, `redis_topology must be standalone, cluster or sentinel, got "ring"`},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 0}]}`, "zone a: max_requests must be at least 1, got 0"},
		{`{"zones": [{"name": "a", "max_requests": 1}]}`, "zone a: window must be greater than zero"},
		{`{"zones": [{"name": "a b", "window": "1m", "max_requests": 1}]}`, `zone name "a b": only letters`},
		{`{"zones": [{"window": "1m", "max_requests": 1}]}`, "zone name is required"},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 1, "algorithm": "gcra"}]}`, `zone a: algorithm must be log or counter, got "gcra"`},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 1}, {"name": "a", "window": "1h", "max_requests": 9}]}`, "zone a is defined twice"},
		{`{"window": "1m", "max_requests": 5, "zones": [{"name": "default", "window": "1h", "max_requests": 9}]}`, "zone default clashes with the zone that window and max_requests define"},
		{`{"window": "1m", "max_requests": 5, "count_status": [600]}`, "count_status must be status codes from 100 to 599 or classes 1 to 5 (1xx to 5xx), got 600"},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 1, "count_status": [0]}]}`, "zone a: count_status must be"},
		{`{"window": "1m", "max_requests": 5, "key": "{http.request.header.X-Api-Key"}`, `key "{http.request.header.X-Api-Key": the placeholder "{http.request.header.X-Api-Key" has no closing '}'`},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 1, "key": "}{http.vars.client_ip}"}]}`, `zone a: key "}{http.vars.client_ip}": '}' at the start closes no '{'`},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 1, "key": "{a{b}}"}]}`, `zone a: key "{a{b}}": '{' inside the placeholder "{a", which is not closed: placeholders do not nest`},
		{`{"window": "1m", "max_requests": 5, "key": "t:{}"}`, `key "t:{}": empty placeholder '{}' after "t:"`},
	} {
		err := provisionError(t, c.config)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.config, err, c.want)
		}
	}
}

// TestZoneIdentity: a zone's identity names what makes it a state, never its
// numbers (a handler provisioned alone has no site: "default").
func TestZoneIdentity(t *testing.T) {
	for _, c := range []struct{ config, want string }{
		{`{"window": "1m", "max_requests": 60}`, "default"},
		{`{"window": "1500ms", "max_requests": 20, "algorithm": "counter"}`, "default:counter:1500ms"},
		{`{"zones": [{"name": "api", "window": 1000, "max_requests": 3}]}`, "api"},
		{`{"zones": [{"name": "api", "window": "1h", "max_requests": 1000, "algorithm": "counter"}]}`, "api:counter:1h"},
		{`{"zones": [{"name": "login", "window": "10m", "max_requests": 3, "count_status": [401, 4]}]}`, "login:401,4xx"},
		{`{"window": "1m", "max_requests": 3, "count_status": [5]}`, "default:5xx"},
		{`{"zones": [{"name": "t", "window": "1h", "max_requests": 10, "max_requests_from": "{http.vars.quota}"}]}`, "t"},
		{`{"zones": [{"name": "dl", "window": "1h", "max_requests": 1000000, "settle": {"bytes": true}}]}`, "dl:bytes"},
		{`{"zones": [{"name": "reports", "concurrent": 2}]}`, "reports:concurrent"},
	} {
		in := newInstance(t, c.config)
		if got := in.zones[0].identity; got != c.want {
			t.Errorf("%s: identity %q, want %q", c.config, got, c.want)
		}
	}
}

// TestBoundSite: a site name is kept as it is while it is short and of the
// characters of hosts and paths, and hashed otherwise, to 17 bytes.
func TestBoundSite(t *testing.T) {
	long := strings.Repeat("a", maxSiteLen+1)
	for _, c := range []struct {
		site   string
		hashed bool
	}{
		{"example.com", false}, {"a.example,b.example/api/*", false}, {"server=srv1", false}, {"example.com~2", false},
		{strings.Repeat("a", maxSiteLen), false}, {long, true},
		{"[::1]", true}, {"{env.HOST}", true}, {"example.com:8080", true}, {"a b", true},
	} {
		got := boundSite(c.site)
		if c.hashed != (got != c.site) || c.hashed && (!strings.HasPrefix(got, "#") || len(got) != 17) {
			t.Errorf("boundSite(%q) = %q, want hashed %v", c.site, got, c.hashed)
		}
	}
	if boundSite(long) == boundSite(long+"b") {
		t.Error("two long sites hash alike")
	}
}

// TestPlansPerAPIKey is the recipe of README.md and docs/zones.md, with
// smaller limits: a map names each key's plan, and zone matchers give each
// plan its limit.
func TestPlansPerAPIKey(t *testing.T) {
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	map {http.request.header.X-Api-Key} {plan} {
		gold-key-1 gold
		gold-key-2 gold
		default    free
	}
	sliding_ratelimit {
		key {http.request.header.X-Api-Key}
		zone gold 1m 5 {
			match {
				vars {plan} gold
			}
		}
		zone free 1m 2 {
			match {
				not vars {plan} gold
			}
		}
	}
	respond "{plan}"`))
	client := from("127.0.0.2")
	for _, c := range []struct {
		key, zone string
		admitted  int
	}{
		{"gold-key-1", "gold", 5},
		{"gold-key-2", "gold", 5},
		{"free-key", "free", 2},
	} {
		for i := 1; i <= c.admitted+1; i++ {
			res := send(t, site, client, withHeader("X-Api-Key", c.key))
			status, h := res.status, res.header
			want := http.StatusOK
			if i > c.admitted {
				want = http.StatusTooManyRequests
			}
			if status != want {
				t.Errorf("%s, request %d: status %d, want %d", c.key, i, status, want)
			}
			if policy := h.Get("RateLimit-Policy"); !strings.HasPrefix(policy, `"`+c.zone+`"`) || strings.Contains(policy, ",") {
				t.Errorf("%s: RateLimit-Policy %q, want the %s zone alone", c.key, policy, c.zone)
			}
		}
	}
}
