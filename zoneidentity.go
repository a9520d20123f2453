package slidingratelimit

import (
	"strconv"
	"strings"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// zoneIdentity names a zone's state in Redis keys and deny caches: its name,
// window, max_requests (or "per-tenant" when each request's max comes from
// a placeholder), then for the counter its algorithm, what its count_status
// counts, and what it settles to, as in "default:1m:100",
// "api:1h:1000:counter", "login:10m:3:401,4xx", "tenants:1m:per-tenant" or
// "downloads:1h:1000000000:bytes"; a concurrency zone's is its name and how
// many requests may run at once, as in "reports:concurrent:2". Two handlers
// share a zone's state exactly when their zones agree on all of these (and
// on the Redis and the key prefix), so two sites that both use the
// three-line form with different limits never count each other's requests,
// while handlers that are meant to share one limit say so by giving their
// zones the same name and limit. Changing a zone's limit, algorithm or unit
// on a reload starts its clients over; a tenant's quota that changes does
// not, nor does a cost (requests priced differently still spend one budget).
func zoneIdentity(name string, limit limiter.Limit, perTenant bool, countStatus []int, settle *Settle) string {
	if limit.Algorithm == limiter.Concurrency {
		// The lease time is not part of the limit, so instances with
		// different lease times share its slots.
		return name + ":concurrent:" + strconv.FormatInt(limit.Max, 10)
	}
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte(':')
	b.WriteString(formatWindow(limit.Window))
	b.WriteByte(':')
	if perTenant {
		b.WriteString("per-tenant")
	} else {
		b.WriteString(strconv.FormatInt(limit.Max, 10))
	}
	if limit.Algorithm == limiter.SlidingCounter {
		b.WriteString(":counter")
	}
	for i, status := range countStatus {
		if i == 0 {
			b.WriteByte(':')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(status))
		if status < 10 {
			b.WriteString("xx")
		}
	}
	switch {
	case settle == nil:
	case settle.Bytes:
		b.WriteString(":bytes")
	case len(settle.JSON) > 0:
		b.WriteString(":json-" + strings.Join(settle.JSON, ","))
	default:
		b.WriteString(":header-" + strings.ToLower(settle.Header))
	}
	return b.String()
}

// formatWindow writes a window in its largest whole unit: 1h, 90s, 1500ms,
// 250us.
func formatWindow(w time.Duration) string {
	for _, u := range []struct {
		unit   time.Duration
		suffix string
	}{
		{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}, {time.Microsecond, "us"},
	} {
		if w%u.unit == 0 {
			return strconv.FormatInt(int64(w/u.unit), 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(w), 10) + "ns"
}
