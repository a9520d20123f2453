package slidingratelimit

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// adminZonesPath lists the zones of the running handlers: what a path of
// adminKeyPath may name.
const adminZonesPath = "/sliding_ratelimit/zones"

// zoneInfo is one zone in the answer to GET adminZonesPath.
type zoneInfo struct {
	Name string `json:"name"`
	// Identity names the zone's state; the admin paths take it where two
	// zones share a name with different limits.
	Identity string `json:"identity"`
	// Limit is max_requests (or concurrent); where each tenant's comes from
	// a placeholder (LimitFrom), its fallback.
	Limit     int64  `json:"limit"`
	LimitFrom string `json:"limit_from,omitempty"`
	// WindowSeconds is 0 in a concurrency zone.
	WindowSeconds float64 `json:"window_seconds"`
	Algorithm     string  `json:"algorithm"`
	Unit          string  `json:"unit"`
	// Key is the zone's key template (not a client's key).
	Key string `json:"key"`
	// WaitSeconds is the zone's wait, when it has one.
	WaitSeconds float64 `json:"wait_seconds,omitempty"`
	// Handlers is how many handlers have the zone: sites that share it, or
	// the old and the new config during a reload.
	Handlers int `json:"handlers"`
}

// zonesAnswer is the answer to GET adminZonesPath.
type zonesAnswer struct {
	Zones []zoneInfo `json:"zones"`
}

// serveZones answers GET adminZonesPath.
func (a *AdminAPI) serveZones(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		return caddy.APIError{
			HTTPStatus: http.StatusMethodNotAllowed,
			Err:        fmt.Errorf("method %s not allowed: use GET", r.Method),
		}
	}
	return writeJSON(w, http.StatusOK, zonesAnswer{Zones: listZones(handlers.newestFirst())})
}

// listZones returns the zones of the handlers, one per identity, by name.
func listZones(hs []*Handler) []zoneInfo {
	zones := []zoneInfo{}
	for _, h := range hs {
		for _, z := range h.zones {
			if i := slices.IndexFunc(zones, func(info zoneInfo) bool { return info.Identity == z.identity }); i >= 0 {
				zones[i].Handlers++
				continue
			}
			info := zoneInfo{
				Name:      z.Name,
				Identity:  z.identity,
				Limit:     z.limit.Max,
				LimitFrom: z.MaxRequestsFrom,
				Algorithm: z.limit.Algorithm.String(),
				Unit:      z.unit(),
				Key:       z.key.raw,
				Handlers:  1,
			}
			if z.limit.Algorithm != limiter.Concurrency {
				info.WindowSeconds = milliseconds(z.limit.Window)
			}
			if z.wait > 0 {
				info.WaitSeconds = milliseconds(z.wait)
			}
			zones = append(zones, info)
		}
	}
	slices.SortStableFunc(zones, func(a, b zoneInfo) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Identity, b.Identity))
	})
	return zones
}

// zoneNamesHint lists the names of the running zones for an error about
// one that is not among them.
func zoneNamesHint() string {
	var names []string
	for _, info := range listZones(handlers.newestFirst()) {
		if !slices.Contains(names, info.Name) {
			names = append(names, info.Name)
		}
	}
	if len(names) == 0 {
		return "no sliding_ratelimit handler is running"
	}
	return "the zones are " + strings.Join(names, ", ")
}
