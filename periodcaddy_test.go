package slidingratelimit

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/adminapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
)

// periodClockEnv names, for a Caddy process the test binary runs
// (startCaddyProcess), a file whose text (RFC 3339) is its period clock, so
// that a test moves the clock of every instance at once (setPeriodClock).
const periodClockEnv = "SLIDING_RATELIMIT_TEST_PERIOD_CLOCK"

// Package variables are set before any init, so before the caddy command
// runs (command_test.go).
var _ = periodClockFromFile(os.Getenv(periodClockEnv))

// periodClockFromFile makes the file at path, when given, the period clock.
func periodClockFromFile(path string) bool {
	if path == "" {
		return false
	}
	clock := func() time.Time {
		text, err := os.ReadFile(path)
		if err != nil {
			panic("reading the test's period clock: " + err.Error())
		}
		now, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(text)))
		if err != nil {
			panic("reading the test's period clock: " + err.Error())
		}
		return now
	}
	periodClock.Store(&clock)
	return true
}

// setPeriodClock stops the period clock of this process, and of the Caddy
// processes that read file, at now; the test's end gives back time.Now.
func setPeriodClock(t *testing.T, file string, now time.Time) {
	t.Helper()
	if err := os.WriteFile(file, []byte(now.Format(time.RFC3339Nano)), 0o644); err != nil {
		t.Fatal(err)
	}
	clock := func() time.Time { return now }
	periodClock.Store(&clock)
	t.Cleanup(func() { periodClock.Store(nil) })
}

// TestMonthBudgetResetsAtMidnightOfTheFirst: a month budget in Tokyo, on
// two Caddy instances (the test's and a process of its own) on one Redis,
// is shared within the month, refused just before Tokyo's midnight of the
// 1st with Retry-After the seconds to it, and whole again after it on both.
func TestMonthBudgetResetsAtMidnightOfTheFirst(t *testing.T) {
	clockFile := filepath.Join(t.TempDir(), "clock")
	tokyo := mustLoad(t, "Asia/Tokyo")
	setPeriodClock(t, clockFile, time.Date(2026, 11, 30, 23, 59, 30, 0, tokyo))
	t.Setenv(periodClockEnv, clockFile)

	prefix := uniquePrefix(t)
	body := `
	sliding_ratelimit {
		key {http.request.header.X-Api-Key}
		cost {http.request.header.X-Cost}
		zone spend month 500 {
			time_zone Asia/Tokyo
		}
	}
	respond "ok"`
	startCaddy(t, siteBlock(":9080", prefix, body))
	startCaddyProcess(t, siteBlock(":9380", prefix, body)+"\n:9381 {\n\trespond \"ok\"\n}\n", "http://127.0.0.1:9381/")
	instances := [2]string{site, "http://127.0.0.1:9380/"}
	spend := func(instance, cost int) answer {
		t.Helper()
		return send(t, instances[instance], withHeader("X-Api-Key", "finance"), withHeader("X-Cost", strconv.Itoa(cost)))
	}
	check := func(what string, a answer, status int, retryAfter, rateLimit, policy string) {
		t.Helper()
		if a.status != status || a.header.Get("Retry-After") != retryAfter || a.header.Get("RateLimit") != rateLimit || a.header.Get("RateLimit-Policy") != policy {
			t.Errorf("%s: status %d, Retry-After %q, RateLimit %q, RateLimit-Policy %q; want %d, %q, %q, %q", what,
				a.status, a.header.Get("Retry-After"), a.header.Get("RateLimit"), a.header.Get("RateLimit-Policy"), status, retryAfter, rateLimit, policy)
		}
	}
	// November has 30 days: w=2592000.
	november := `"spend";q=500;srl-qu="units";w=2592000`
	check("300 of November's 500 on the first instance", spend(0, 300), 200, "", `"spend";r=200;t=30`, november)
	check("200 on the second", spend(1, 200), 200, "", `"spend";r=0;t=30`, november)
	check("1 more on the first, 30 s before midnight in Tokyo", spend(0, 1), 429, "30", `"spend";r=0;t=30`, november)
	check("1 more on the second", spend(1, 1), 429, "30", `"spend";r=0;t=30`, november)

	setPeriodClock(t, clockFile, time.Date(2026, 11, 30, 23, 59, 59, 0, tokyo))
	state := commandJSON[adminapi.KeyState](t, "status", "--zone", "spend", "--key", "finance")
	if state.Count != 500 || state.Remaining != 0 || state.RetryAfterSeconds != 1 || state.Period == nil || state.Period.End != "2026-12-01T00:00:00+09:00" {
		t.Errorf("a second before midnight the admin API says count %d, remaining %d, retry after %v s, period %+v; want 500, 0, 1 s, ending 2026-12-01T00:00:00+09:00",
			state.Count, state.Remaining, state.RetryAfterSeconds, state.Period)
	}

	setPeriodClock(t, clockFile, time.Date(2026, 12, 1, 0, 0, 5, 0, tokyo))
	// December has 31 days; it ends 31 days less 5 s from now.
	december, left := `"spend";q=500;srl-qu="units";w=2678400`, strconv.Itoa(31*24*3600-5)
	check("500 of December's on the second instance, 5 s after midnight", spend(1, 500), 200, "", `"spend";r=0;t=`+left, december)
	check("1 more on the first: December's budget is shared", spend(0, 1), 429, left, `"spend";r=0;t=`+left, december)

	out, err := runCommand(t, "status", "--zone", "spend", "--key", "finance", "--address", "localhost:2999")
	for _, want := range []string{"500", "month", "Asia/Tokyo", "2026-12-01T00:00:00+09:00", "2027-01-01T00:00:00+09:00"} {
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("caddy sliding-ratelimit status: %v, printed\n%s\nwant %s in it", err, out, want)
		}
	}
	blocked := commandJSON[adminapi.BlockedAnswer](t, "blocked")
	// The clock stood still meanwhile: November's denial is still cached
	// too, until its 30 s pass on the deny cache's own clock.
	if b := blocked.Blocked; len(b) == 0 || b[0].Zone != "spend" || b[0].Identity != "spend:month" || b[0].RetryAfterSeconds > 31*24*3600-5 || b[0].RetryAfterSeconds < 31*24*3600-65 {
		t.Errorf("blocked: %+v; want first the client in spend (spend:month) until December ends", blocked.Blocked)
	}
	if reset := commandJSON[adminapi.ResetAnswer](t, "reset", "--zone", "spend", "--key", "finance"); !reset.Reset {
		t.Errorf("reset: %+v", reset)
	}
	check("1 on the first after a reset of December", spend(0, 1), 200, "", `"spend";r=499;t=`+left, december)

	zones := commandJSON[adminapi.ZonesAnswer](t, "zones")
	if len(zones.Zones) != 1 || zones.Zones[0].Identity != "spend:month" || zones.Zones[0].Period == nil || zones.Zones[0].WindowSeconds != 31*24*3600 {
		t.Errorf("zones: %+v; want spend:month, its period, and December's length as its window", zones.Zones)
	}
}

// TestPeriodAnnouncementsReachTheDenyCache: a reset or refund that another
// instance announces for a period's state drops the denial this instance
// caches for it; one for another zone's state does not.
func TestPeriodAnnouncementsReachTheDenyCache(t *testing.T) {
	setPeriodClock(t, filepath.Join(t.TempDir(), "clock"), time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	in := newInstance(t, `{"zones": [{"name": "daily", "period": "day", "max_requests": 1}],
		"redis": "`+sharedRedis.URL()+`", "key_prefix": "`+uniquePrefix(t)+`"}`)
	const ip = "203.0.113.47"
	for i, want := range []int{200, 429} {
		if got := send(t, "/", to(in), from(ip)).status; got != want {
			t.Fatalf("request %d: status %d, want %d", i+1, got, want)
		}
	}
	if n := cached(in.Handler); n != 1 {
		t.Fatalf("%d denials cached, want 1", n)
	}
	in.backend.Announced(in.backend.redis.Key("daily:day=2026-12-06", ip), redisconn.Freed)
	in.backend.Announced(in.backend.redis.Key("other:day=2026-12-07", ip), redisconn.Reset)
	if n := cached(in.Handler); n != 1 {
		t.Errorf("announcements of yesterday's state and of another zone: %d denials cached, want 1", n)
	}
	in.backend.Announced(in.backend.redis.Key("daily:day=2026-12-07", ip), redisconn.Reset)
	if n := cached(in.Handler); n != 0 {
		t.Errorf("after an announced reset of today's state, %d denials cached, want 0", n)
	}
	if err := in.backend.redis.Reset(context.Background(), "daily:day=2026-12-07", ip); err != nil {
		t.Fatal(err)
	}
	if got := send(t, "/", to(in), from(ip)).status; got != 200 {
		t.Errorf("after the reset: status %d, want 200", got)
	}
}

// monthSeconds is the length in seconds of the month that holds now in a
// time zone: RateLimit-Policy's w of a month zone.
func monthSeconds(t *testing.T, timeZone string) string {
	t.Helper()
	s := newPeriod(periodMonth, mustLoad(t, timeZone), "").at(periodNow())
	return strconv.FormatInt(int64(s.end.Sub(s.start)/time.Second), 10)
}

// TestDayPeriodAcrossDaylightSaving: a day budget in New York on the day
// the clocks spring forward is 23 hours long, refused until its midnight
// and whole after it, on an instance of its own (the in-process store).
func TestDayPeriodAcrossDaylightSaving(t *testing.T) {
	newYork := mustLoad(t, "America/New_York")
	clockFile := filepath.Join(t.TempDir(), "clock")
	setPeriodClock(t, clockFile, time.Date(2026, 3, 8, 23, 59, 50, 0, newYork))
	in := newInstance(t, `{"zones": [{"name": "daily", "period": "day", "max_requests": 2, "time_zone": "America/New_York"}]}`)
	const ip = "203.0.113.48"
	for i, want := range []struct {
		status            int
		retryAfter, limit string
	}{
		{200, "", `"daily";r=1;t=10`},
		{200, "", `"daily";r=0;t=10`},
		{429, "10", `"daily";r=0;t=10`},
	} {
		a := send(t, "/", to(in), from(ip))
		if a.status != want.status || a.header.Get("Retry-After") != want.retryAfter || a.header.Get("RateLimit") != want.limit ||
			a.header.Get("RateLimit-Policy") != `"daily";q=2;w=82800` {
			t.Errorf("request %d on the 23-hour day: status %d, Retry-After %q, RateLimit %q, RateLimit-Policy %q; want %d, %q, %q, w=82800",
				i+1, a.status, a.header.Get("Retry-After"), a.header.Get("RateLimit"), a.header.Get("RateLimit-Policy"), want.status, want.retryAfter, want.limit)
		}
	}
	setPeriodClock(t, clockFile, time.Date(2026, 3, 9, 0, 0, 0, 0, newYork))
	if a := send(t, "/", to(in), from(ip)); a.status != 200 || a.header.Get("RateLimit") != `"daily";r=1;t=86400` {
		t.Errorf("at midnight: status %d, RateLimit %q; want 200 and a whole day of 24 hours", a.status, a.header.Get("RateLimit"))
	}
}

// TestPeriodWithFailModeLocal: while Redis is away, the in-process store
// decides a period zone with the same limit, and its denials say when the
// period ends too.
func TestPeriodWithFailModeLocal(t *testing.T) {
	setPeriodClock(t, filepath.Join(t.TempDir(), "clock"), time.Date(2026, 12, 7, 23, 59, 50, 0, time.UTC))
	port, err := freeLoopbackPort()
	if err != nil {
		t.Fatal(err)
	}
	in := newInstance(t, `{"zones": [{"name": "local_daily", "period": "day", "max_requests": 1}],
		"redis": "redis://127.0.0.1:`+strconv.Itoa(port)+`", "fail_mode": "local", "key_prefix": "`+uniquePrefix(t)+`"}`)
	const ip = "203.0.113.49"
	if a := send(t, "/", to(in), from(ip)); a.status != 200 || a.header.Get("RateLimit") != `"local_daily";r=0;t=10` {
		t.Errorf("first request: status %d, RateLimit %q; want 200, t=10", a.status, a.header.Get("RateLimit"))
	}
	if a := send(t, "/", to(in), from(ip)); a.status != 429 || a.header.Get("Retry-After") != "10" {
		t.Errorf("second request: status %d, Retry-After %q; want 429, 10", a.status, a.header.Get("Retry-After"))
	}
}
