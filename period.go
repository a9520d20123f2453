package slidingratelimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
	// Zone names load on machines without a zoneinfo database (a scratch
	// container), the same on every instance.
	_ "time/tzdata"
	"unicode"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// A zone with a period counts by the calendar: a client's budget is
// max_requests per day, ISO week (from Monday) or month, all of it back at
// the period's start, midnight in the zone's time zone. The engine stays the
// sliding log: each period is a state of its own, named by the period's
// start ("spend:month=2026-12"), so every instance starts the next period in
// a fresh state at the same moment, with no reset to run, and Redis expires
// the old period's state by itself. The log's window is the longest a period
// can be, so no admission ages out within its period; what a client is told
// (Retry-After, RateLimit's t, the SDK headers, the deny cache's time) is
// clamped to the period's end. The period is read from the instance's clock
// (periodNow), not Redis's: instances switch at their own clocks' midnight.

// Periods: the words of a zone's period (periodEnum).
const (
	periodDay   = "day"
	periodWeek  = "week"
	periodMonth = "month"
)

// periodMargin is added to the longest a period's days can make it: a day
// is 23 to 25 hours where daylight saving starts or ends, and up to 26 in
// the one zone (Antarctica/Troll) whose clocks move by two hours.
const periodMargin = 2 * time.Hour

// periodWindow is the log's window of a zone of period kind: the longest
// the period can be, so that an admission stays in the window until its
// period ends.
func periodWindow(kind string) time.Duration {
	day := 24 * time.Hour
	switch kind {
	case periodWeek:
		return 7*day + periodMargin
	case periodMonth:
		return 31*day + periodMargin
	}
	return day + periodMargin
}

// period is a zone's calendar period in its time zone, and the period that
// holds the instance's clock now, cached. Safe for concurrent use.
type period struct {
	kind string
	loc  *time.Location
	// identity is the zone's identity, which each span's state name
	// extends.
	identity string
	current  atomic.Pointer[periodSpan]
}

// periodSpan is one period of a zone: when it starts and ends (the next
// one's start) and the name of its state, the zone's identity and "=" and
// the period's start in the zone's time zone ("2026-12", "2026-W49",
// "2026-12-07").
type periodSpan struct {
	start, end time.Time
	zone       string
}

// newPeriod returns the period kind of the zone whose identity is
// identity, in loc.
func newPeriod(kind string, loc *time.Location, identity string) *period {
	return &period{kind: kind, loc: loc, identity: identity}
}

// at returns the span that holds now.
func (p *period) at(now time.Time) *periodSpan {
	if s := p.current.Load(); s != nil && !now.Before(s.start) && now.Before(s.end) {
		return s
	}
	start, end := p.bounds(now)
	s := &periodSpan{start: start, end: end, zone: p.identity + "=" + p.label(start)}
	p.current.Store(s)
	return s
}

// bounds returns the start of the period that holds t and the start of the
// next one.
func (p *period) bounds(t time.Time) (start, end time.Time) {
	y, m, d := t.In(p.loc).Date()
	switch p.kind {
	case periodWeek:
		// ISO 8601: weeks start on Monday.
		back := (int(t.In(p.loc).Weekday()) + 6) % 7
		return dayStart(y, m, d-back, p.loc), dayStart(y, m, d-back+7, p.loc)
	case periodMonth:
		return dayStart(y, m, 1, p.loc), dayStart(y, m+1, 1, p.loc)
	}
	return dayStart(y, m, d, p.loc), dayStart(y, m, d+1, p.loc)
}

// label names the period that starts at start: "2026-12-07", "2026-W49"
// (the ISO week and its year), "2026-12".
func (p *period) label(start time.Time) string {
	local := start.In(p.loc)
	switch p.kind {
	case periodWeek:
		year, week := local.ISOWeek()
		return fmt.Sprintf("%04d-W%02d", year, week)
	case periodMonth:
		return local.Format("2006-01")
	}
	return local.Format("2006-01-02")
}

// dayStart returns the first instant of the calendar day y-m-d (normalized:
// d may be 0 or 32) in loc: its midnight, or where the clocks jump over
// midnight that day (Santiago, Havana, Beirut), the instant they jump.
func dayStart(y int, m time.Month, d int, loc *time.Location) time.Time {
	y, m, d = time.Date(y, m, d, 12, 0, 0, 0, time.UTC).Date()
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	if ty, tm, td := t.Date(); ty != y || tm != m || td != d {
		// Go read the missing midnight with the offset before the jump:
		// the instant is still the day before, and the day starts where
		// that offset ends.
		_, end := t.ZoneBounds()
		if !end.IsZero() {
			t = end
		}
	}
	return t
}

// periodClock, when set, is the instance clock periods are read from
// instead of time.Now: tests only.
var periodClock atomic.Pointer[func() time.Time]

// periodNow is the instance clock periods are read from.
func periodNow() time.Time {
	if f := periodClock.Load(); f != nil {
		return (*f)()
	}
	return time.Now()
}

// periodZones are a handler's zones with a period, by identity: what the
// backend needs to tell a period zone's state from a sliding one and to
// clamp its decisions. Nil when the handler has none.
type periodZones map[string]*period

// of returns the period of the state a check names (its zone), nil for a
// zone without a period.
func (ps periodZones) of(zone string) *period {
	if len(ps) == 0 {
		return nil
	}
	i := strings.LastIndexByte(zone, '=')
	if i < 0 {
		return nil
	}
	return ps[zone[:i]]
}

// base returns the identity of the zone whose state zone names: zone
// itself, or for a period's state the period zone's identity.
func (ps periodZones) base(zone string) string {
	if p := ps.of(zone); p != nil {
		return p.identity
	}
	return zone
}

// clamp makes the times of the decisions of period zones end at the
// period's end at the latest: the store counts a period zone's admissions
// for the longest a period can be, while they all leave at once when it
// ends. A check of a period that has ended by now (the request came just
// before the period's end) has room at once, in the next period's state:
// its times become a nanosecond, which a client reads as one second.
func (ps periodZones) clamp(checks []limiter.Check, decisions []limiter.Decision, now time.Time) {
	if len(ps) == 0 {
		return
	}
	for i, c := range checks {
		p := ps.of(c.Zone)
		if p == nil || i >= len(decisions) {
			continue
		}
		left := time.Nanosecond
		if s := p.current.Load(); s != nil && s.zone == c.Zone && now.Before(s.end) {
			left = s.end.Sub(now)
		}
		d := &decisions[i]
		d.Reset, d.RetryAfter = min(d.Reset, left), min(d.RetryAfter, left)
	}
}

// periodStore clamps the decisions of period zones (periodZones.clamp)
// before the deny cache in front of it keeps their denials: a client denied
// until its period ends is cached that long, not for the longest a period
// can be.
type periodStore struct {
	limiter.Store
	periods periodZones
}

func (s periodStore) Allow(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision) error {
	err := s.Store.Allow(ctx, checks, decisions)
	if err == nil {
		s.periods.clamp(checks, decisions, periodNow())
	}
	return err
}

// loadTimeZone loads the location of a time_zone: "" is UTC. A name that
// does not load gets what is likely meant: the name with its words
// capitalized as IANA names are ("Europe/Berlin", "America/New_York").
func loadTimeZone(name string) (*time.Location, error) {
	switch name {
	case "", "UTC":
		return time.UTC, nil
	case "Local":
		return nil, errors.New(`time_zone "Local" is each machine's own zone, which the instances of a fleet may not share: name a zone, such as "Europe/Berlin" or "UTC"`)
	}
	loc, err := time.LoadLocation(name)
	if err == nil {
		return loc, nil
	}
	msg := fmt.Sprintf("time_zone %q is not a time zone name", name)
	if guess := capitalizeZone(name); guess != name {
		if _, err := time.LoadLocation(guess); err == nil {
			return nil, fmt.Errorf("%s (did you mean %s?)", msg, guess)
		}
	}
	return nil, fmt.Errorf("%s: give an IANA name of a place, such as \"Europe/Berlin\", \"America/New_York\", \"Asia/Tokyo\" or \"UTC\" (an abbreviation such as PST or CEST names no place)", msg)
}

// capitalizeZone writes each word of a zone name as IANA names do: the
// first letter in upper case, the rest in lower case.
func capitalizeZone(name string) string {
	b := []rune(strings.ToLower(name))
	for i := range b {
		if i == 0 || strings.ContainsRune("/_-", b[i-1]) {
			b[i] = unicode.ToUpper(b[i])
		}
	}
	return string(b)
}
