package slidingratelimit

import (
	"testing"
)

// TestKeyFallbacksCountPerZone: two zones keyed by the same missing header
// fall back together, and each counts its fallbacks (a zone that reuses an
// earlier zone's key counted none before).
func TestKeyFallbacksCountPerZone(t *testing.T) {
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		key {header.X-Api-Key}
		zone kfa 1m 100
		zone kfb 1h 1000
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
}`, withGlobals(`
servers {
	metrics
}`))
	series := func(zone string) string {
		return `caddy_sliding_ratelimit_key_fallbacks_total{zone="` + zone + `"}`
	}
	beforeA, beforeB := scrape(t, series("kfa")), scrape(t, series("kfb"))
	expect(t, "without X-Api-Key", site, []int{200, 200, 200}, from("127.0.0.2"))
	expect(t, "with X-Api-Key", site, []int{200}, from("127.0.0.2"), withHeader("X-Api-Key", "k1"))
	for zone, before := range map[string]float64{"kfa": beforeA, "kfb": beforeB} {
		if got := scrape(t, series(zone)) - before; got != 3 {
			t.Errorf("key_fallbacks_total of zone %s rose by %v, want 3", zone, got)
		}
	}
}
