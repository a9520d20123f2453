package slidingratelimit

import (
	"fmt"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/adminapi"
)

// What a zone with a period (period.go) needs of the rest: the state a
// request is counted in, the handler's period zones for its backend, the
// rule of the handler's time_zone, and what the admin API shows.

// state names the zone's state that a request at now is counted in: its
// identity, or for a period zone the state of the period that holds now.
func (z *Zone) state(now time.Time) string {
	if z.period == nil {
		return z.identity
	}
	return z.period.at(now).zone
}

// periodsOf returns the zones with a period, by identity; nil when there
// are none.
func periodsOf(zones []*Zone) periodZones {
	var ps periodZones
	for _, z := range zones {
		if z.period == nil {
			continue
		}
		if ps == nil {
			ps = make(periodZones)
		}
		ps[z.identity] = z.period
	}
	return ps
}

// checkTimeZoneUsed is the rule of the handler's time_zone: a name that
// loads, and a period for it to start, the handler's or a zone's.
func checkTimeZoneUsed(timeZone, period string, zones []*Zone) error {
	if timeZone == "" {
		return nil
	}
	used := period != ""
	for _, z := range zones {
		used = used || z.Period != ""
	}
	if !used {
		return fmt.Errorf("time_zone %s needs a period: window day, week or month, at the top or in a zone", timeZone)
	}
	_, err := loadTimeZone(timeZone)
	return err
}

// periodInfo is what the admin API shows of a period zone's period at now:
// its name, time zone, and when the period that holds now started and
// ends (RFC 3339, in the zone's time zone); nil for a sliding zone.
func (z *Zone) periodInfo(now time.Time) *adminapi.Period {
	if z.period == nil {
		return nil
	}
	s := z.period.at(now)
	return &adminapi.Period{
		Name:     z.period.kind,
		TimeZone: z.period.loc.String(),
		Start:    s.start.In(z.period.loc).Format(time.RFC3339),
		End:      s.end.In(z.period.loc).Format(time.RFC3339),
		Seconds:  s.end.Sub(s.start).Seconds(),
	}
}
