package slidingratelimit

import (
	"strings"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// mustLoad loads a time zone the tests name.
func mustLoad(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := loadTimeZone(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestPeriodBounds: the period that holds an instant starts at midnight in
// its time zone on its first day (a day, a Monday, the 1st) and ends where
// the next starts, through daylight-saving changes, leap years and the
// turn of a year, and is named by its start.
func TestPeriodBounds(t *testing.T) {
	for _, tc := range []struct {
		name, kind, zone, at string
		start, end, label    string
		hours                float64
	}{
		{"a day in UTC", periodDay, "UTC", "2026-12-07T15:04:05Z",
			"2026-12-07T00:00:00Z", "2026-12-08T00:00:00Z", "2026-12-07", 24},
		{"the last instant of a day", periodDay, "UTC", "2026-12-07T23:59:59.999999999Z",
			"2026-12-07T00:00:00Z", "2026-12-08T00:00:00Z", "2026-12-07", 24},
		{"a day in New York when daylight saving starts: 23 hours", periodDay, "America/New_York", "2026-03-08T12:00:00-04:00",
			"2026-03-08T00:00:00-05:00", "2026-03-09T00:00:00-04:00", "2026-03-08", 23},
		{"a day in New York when daylight saving ends: 25 hours", periodDay, "America/New_York", "2026-11-01T01:30:00-05:00",
			"2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00", "2026-11-01", 25},
		{"a day in Berlin when summer time starts", periodDay, "Europe/Berlin", "2026-03-29T03:30:00+02:00",
			"2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00", "2026-03-29", 23},
		{"a day in Berlin when summer time ends", periodDay, "Europe/Berlin", "2026-10-25T02:30:00+01:00",
			"2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00", "2026-10-25", 25},
		{"a day whose midnight does not exist starts when the clocks jump", periodDay, "America/Santiago", "2026-09-06T10:00:00-03:00",
			"2026-09-06T01:00:00-03:00", "2026-09-07T00:00:00-03:00", "2026-09-06", 23},
		{"the day before it ends at the jump", periodDay, "America/Santiago", "2026-09-05T23:59:59-04:00",
			"2026-09-05T00:00:00-04:00", "2026-09-06T01:00:00-03:00", "2026-09-05", 24},
		{"a day in Tokyo, whose midnight is 15:00 UTC", periodDay, "Asia/Tokyo", "2026-12-07T14:59:59Z",
			"2026-12-07T00:00:00+09:00", "2026-12-08T00:00:00+09:00", "2026-12-07", 24},
		{"a week from Monday", periodWeek, "UTC", "2026-12-09T08:00:00Z",
			"2026-12-07T00:00:00Z", "2026-12-14T00:00:00Z", "2026-W50", 168},
		{"a Sunday ends its week", periodWeek, "UTC", "2026-12-13T23:59:59Z",
			"2026-12-07T00:00:00Z", "2026-12-14T00:00:00Z", "2026-W50", 168},
		{"a week across the turn of the year, of the year it starts in", periodWeek, "UTC", "2027-01-02T12:00:00Z",
			"2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z", "2026-W53", 168},
		{"a week of the next ISO year starting in December", periodWeek, "UTC", "2024-12-31T12:00:00Z",
			"2024-12-30T00:00:00Z", "2025-01-06T00:00:00Z", "2025-W01", 168},
		{"a week in Berlin when summer time starts", periodWeek, "Europe/Berlin", "2026-03-29T12:00:00+02:00",
			"2026-03-23T00:00:00+01:00", "2026-03-30T00:00:00+02:00", "2026-W13", 167},
		{"a month in UTC", periodMonth, "UTC", "2026-12-07T09:00:00Z",
			"2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", "2026-12", 744},
		{"the last instant of a month", periodMonth, "UTC", "2026-11-30T23:59:59.999999999Z",
			"2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z", "2026-11", 720},
		{"February of a leap year", periodMonth, "UTC", "2028-02-29T12:00:00Z",
			"2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", "2028-02", 696},
		{"February of another year", periodMonth, "UTC", "2027-02-14T12:00:00Z",
			"2027-02-01T00:00:00Z", "2027-03-01T00:00:00Z", "2027-02", 672},
		{"a month in Tokyo starts at 15:00 UTC the day before", periodMonth, "Asia/Tokyo", "2026-11-30T15:00:00Z",
			"2026-12-01T00:00:00+09:00", "2027-01-01T00:00:00+09:00", "2026-12", 744},
		{"a month in Tokyo a second before", periodMonth, "Asia/Tokyo", "2026-11-30T14:59:59Z",
			"2026-11-01T00:00:00+09:00", "2026-12-01T00:00:00+09:00", "2026-11", 720},
		{"a month in Los Angeles, whose November has an hour more", periodMonth, "America/Los_Angeles", "2026-12-01T07:59:59Z",
			"2026-11-01T00:00:00-07:00", "2026-12-01T00:00:00-08:00", "2026-11", 721},
		{"a month in Los Angeles at midnight of the 1st", periodMonth, "America/Los_Angeles", "2026-12-01T08:00:00Z",
			"2026-12-01T00:00:00-08:00", "2027-01-01T00:00:00-08:00", "2026-12", 744},
		{"a month in New York, whose March has an hour less", periodMonth, "America/New_York", "2026-03-20T00:00:00Z",
			"2026-03-01T00:00:00-05:00", "2026-04-01T00:00:00-04:00", "2026-03", 743},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at, err := time.Parse(time.RFC3339Nano, tc.at)
			if err != nil {
				t.Fatal(err)
			}
			p := newPeriod(tc.kind, mustLoad(t, tc.zone), "spend:"+tc.kind)
			s := p.at(at)
			if got := s.start.Format(time.RFC3339); !s.start.Equal(parseTime(t, tc.start)) {
				t.Errorf("start %s, want %s", got, tc.start)
			}
			if got := s.end.Format(time.RFC3339); !s.end.Equal(parseTime(t, tc.end)) {
				t.Errorf("end %s, want %s", got, tc.end)
			}
			if got, want := s.zone, "spend:"+tc.kind+"="+tc.label; got != want {
				t.Errorf("state %q, want %q", got, want)
			}
			if got := s.end.Sub(s.start).Hours(); got != tc.hours {
				t.Errorf("%v hours long, want %v", got, tc.hours)
			}
		})
	}
}

func parseTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestPeriodsTileTime: hour by hour over two years, in zones with daylight
// saving (one whose clocks move two hours, one that jumps over midnight),
// each period holds the instant, is no longer than the engine's window for
// it, and the next one starts where it ends.
func TestPeriodsTileTime(t *testing.T) {
	for _, zone := range []string{"UTC", "America/New_York", "Europe/Berlin", "America/Santiago", "Antarctica/Troll", "Australia/Lord_Howe", "Asia/Tokyo"} {
		loc := mustLoad(t, zone)
		for _, kind := range periodEnum.values {
			p := newPeriod(kind, loc, "z")
			var prev *periodSpan
			for at := time.Date(2026, 1, 1, 0, 30, 0, 0, time.UTC); at.Year() < 2028; at = at.Add(time.Hour) {
				s := p.at(at)
				if at.Before(s.start) || !at.Before(s.end) {
					t.Fatalf("%s %s: %v is not in its period [%v, %v)", zone, kind, at, s.start, s.end)
				}
				if length := s.end.Sub(s.start); length > periodWindow(kind) || length < periodWindow(kind)/2 {
					t.Fatalf("%s %s: the period from %v is %v long, beyond the window %v", zone, kind, s.start, length, periodWindow(kind))
				}
				if prev != nil && prev != s {
					if !prev.end.Equal(s.start) || prev.zone == s.zone {
						t.Fatalf("%s %s: the period %s ends at %v, the next %s starts at %v", zone, kind, prev.zone, prev.end, s.zone, s.start)
					}
				}
				prev = s
			}
		}
	}
}

// TestPeriodClamp: a period zone's times end at its period's end; a check
// of a period that has ended has room at once; other zones keep theirs.
func TestPeriodClamp(t *testing.T) {
	p := newPeriod(periodMonth, mustLoad(t, "Asia/Tokyo"), "spend:month")
	ps := periodZones{"spend:month": p}
	now := parseTime(t, "2026-11-30T23:59:30+09:00")
	current := p.at(now).zone
	checks := []limiter.Check{{Zone: current}, {Zone: "burst"}, {Zone: "spend:month=2026-10"}, {Zone: current}}
	long := 30 * 24 * time.Hour
	decisions := []limiter.Decision{
		{Reset: long, RetryAfter: long},
		{Reset: long, RetryAfter: long},
		{Reset: long, RetryAfter: long},
		{Allowed: true, Remaining: 3, Reset: 5 * time.Second},
	}
	ps.clamp(checks, decisions, now)
	for i, want := range []limiter.Decision{
		{Reset: 30 * time.Second, RetryAfter: 30 * time.Second},
		{Reset: long, RetryAfter: long},
		{Reset: time.Nanosecond, RetryAfter: time.Nanosecond},
		{Allowed: true, Remaining: 3, Reset: 5 * time.Second},
	} {
		if got := decisions[i]; got.Reset != want.Reset || got.RetryAfter != want.RetryAfter {
			t.Errorf("check %d (%s): reset %v, retry after %v; want %v, %v", i, checks[i].Zone, got.Reset, got.RetryAfter, want.Reset, want.RetryAfter)
		}
	}
	if got := ps.base(current); got != "spend:month" {
		t.Errorf("base of %s: %q", current, got)
	}
	if got := ps.base("default@server=srv1"); got != "default@server=srv1" {
		t.Errorf("a sliding zone's base: %q", got)
	}
}

// TestLoadTimeZone: UTC by default; a name of another case gets the name
// meant; the machine's own zone and abbreviations are refused.
func TestLoadTimeZone(t *testing.T) {
	for _, tc := range []struct{ name, want, err string }{
		{"", "UTC", ""},
		{"UTC", "UTC", ""},
		{"Asia/Tokyo", "Asia/Tokyo", ""},
		{"america/new_york", "", `time_zone "america/new_york" is not a time zone name (did you mean America/New_York?)`},
		{"Local", "", `time_zone "Local" is each machine's own zone`},
		{"PST", "", `time_zone "PST" is not a time zone name: give an IANA name of a place`},
		{"Mars/Olympus_Mons", "", `time_zone "Mars/Olympus_Mons" is not a time zone name: give`},
	} {
		loc, err := loadTimeZone(tc.name)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want %q", tc.name, err, tc.err)
		case tc.err == "" && (err != nil || loc.String() != tc.want):
			t.Errorf("%q: %v, %v; want %s", tc.name, loc, err, tc.want)
		}
	}
}

// TestJSONPeriodRules: period and time_zone break the same rules in JSON as
// in the Caddyfile, in the same words.
func TestJSONPeriodRules(t *testing.T) {
	for _, c := range []struct{ config, want string }{
		{`{"zones": [{"name": "a", "period": "monthly", "max_requests": 1}]}`, `zone a: period must be day, week or month, got "monthly" (did you mean month?)`},
		{`{"zones": [{"name": "a", "period": "month", "window": "720h", "max_requests": 1}]}`, "zone a: period month and window 720h0m0s exclude each other"},
		{`{"zones": [{"name": "a", "window": "1h", "max_requests": 1, "time_zone": "Europe/Berlin"}]}`, "zone a: time_zone Europe/Berlin needs a period"},
		{`{"zones": [{"name": "a", "period": "day", "max_requests": 1, "time_zone": "Europe/Berln"}]}`, `zone a: time_zone "Europe/Berln" is not a time zone name`},
		{`{"zones": [{"name": "a", "period": "day", "max_requests": 1, "algorithm": "counter"}]}`, "zone a: a day period counts with algorithm log"},
		{`{"zones": [{"name": "a", "period": "week", "max_requests": 1, "wait": "1s"}]}`, "zone a: a week period takes no wait"},
		{`{"zones": [{"name": "a", "concurrent": 1, "period": "day"}]}`, "zone a: a concurrency zone counts requests in flight, not in a window: remove period"},
		{`{"window": "1h", "max_requests": 1, "time_zone": "Asia/Tokyo"}`, "time_zone Asia/Tokyo needs a period: window day, week or month, at the top or in a zone"},
		{`{"period": "month", "max_requests": 1, "wait": "1s"}`, "a month period takes no wait"},
		{`{"period": "fortnight", "max_requests": 1}`, `period must be day, week or month, got "fortnight"`},
	} {
		err := provisionError(t, c.config)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.config, err, c.want)
		}
	}
}

// TestPeriodZoneIdentity: a period zone's identity ends with its period,
// and each period's state adds the period's start; the handler's time_zone
// is its zones', and its algorithm is its sliding zones'.
func TestPeriodZoneIdentity(t *testing.T) {
	setPeriodClock(t, t.TempDir()+"/clock", time.Date(2026, 12, 31, 20, 0, 0, 0, time.UTC))
	h, err := provisioned(t, `{"period": "day", "max_requests": 5, "time_zone": "Asia/Tokyo",
		"zones": [{"name": "spend", "period": "month", "max_requests": 9, "count_status": [200], "settle": {"header": "X-Usage"}},
			{"name": "weekly", "period": "week", "max_requests": 9, "time_zone": "UTC"},
			{"name": "burst", "window": "1s", "max_requests": 9, "algorithm": "counter"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	now := periodNow()
	for i, want := range []string{"default:day=2027-01-01", "spend:200:header-x-usage:month=2027-01", "weekly:week=2026-W53", "burst:counter:1s"} {
		if got := h.zones[i].state(now); got != want {
			t.Errorf("zone %s: state %q, want %q", h.zones[i].Name, got, want)
		}
	}
	h, err = provisioned(t, `{"algorithm": "counter", "zones": [{"name": "spend", "period": "month", "max_requests": 9}]}`)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.zones[0].limit.Algorithm; got != limiter.SlidingLog {
		t.Errorf("a period zone under the handler's algorithm counter counts with %v, want log", got)
	}
}
