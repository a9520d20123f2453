package slidingratelimit

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

func TestZonesAllOrNothing(t *testing.T) {
	prefix := uniquePrefix(t)
	startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit {
		redis `+sharedRedis.URL()+`
		key_prefix `+prefix+`
		key {http.request.header.X-Client}
		zone burst 1m 3
		zone hourly 1h 5 {
			key {http.request.header.Authorization}
		}
	}
	respond "ok"
}`)
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
	startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit {
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
		key {http.request.header.X-Client}
		zone all 1m 10
		zone login 1m 1 {
			match {
				method POST
				path /login
			}
		}
	}
	respond "ok"
}`)
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
	startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 2
		key {http.request.header.X-Client}
		mode report
		redis `+sharedRedis.URL()+`
		key_prefix `+prefix+`
	}
	respond "{http.sliding_ratelimit.retry_after}"
}`)
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
	card, err := admissionsKept(context.Background(), sharedRedis.Client(t), prefix+"{=r1}:default:1m:2")
	if err != nil {
		t.Fatal(err)
	}
	if card != 2 {
		t.Errorf("report mode recorded %d admissions, want 2 (would-be denials are not recorded)", card)
	}
}

func TestIPPrefixGrouping(t *testing.T) {
	startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 2
		key {http.request.header.X-IP}
		ipv4_prefix 24
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
}`)
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
