package main

import (
	"strings"
	"testing"
)

// TestUnitsSite: the units scenario runs on a site of its own whose
// responses report the usage its requests ask for, settled against a budget
// far above what the load spends, and its wrk script asks for 1 to 50.
func TestUnitsSite(t *testing.T) {
	var sc *scenario
	for i := range scenarios {
		if scenarios[i].slug == unitsSlug {
			sc = &scenarios[i]
		}
	}
	if sc == nil || sc.site == nil {
		t.Fatal("no units scenario with a site of its own")
	}
	own, _ := extraSites()
	ports := make([]int, 5+len(memSizes)+len(own))
	text := caddyfile(sites{}, ports, "redis://r:1", "redis://far:2", []string{"timeout 50ms"})
	blocks := strings.Split(text, "\n# ")[1:]
	site := blocks[len(blocks)-1]
	for _, want := range []string{"header X-Usage {http.request.header.X-Units}", "settle header X-Usage", "max_requests 1000000", "redis redis://r:1"} {
		if !strings.Contains(site, want) {
			t.Errorf("the units site lacks %q:\n%s", want, site)
		}
	}
	if strings.Contains(site, "timeout 50ms") {
		t.Errorf("the units site takes the -limiter options:\n%s", site)
	}
	if !strings.Contains(sc.keyLua, `wrk.headers["X-Units"]`) || !strings.Contains(warmup.keyLua, `wrk.headers["X-Units"]`) {
		t.Errorf("the units and warm-up scripts do not ask for a usage: %q, %q", sc.keyLua, warmup.keyLua)
	}
	if _, _, ok := unitsTarget(stats{callsPerReq: 0.35}, stats{callsPerReq: 0.1}); !ok {
		t.Error("0.35 script calls per request against 0.1 misses the target of one more")
	}
	if _, _, ok := unitsTarget(stats{callsPerReq: 1.2}, stats{callsPerReq: 0.1}); ok {
		t.Error("1.2 script calls per request against 0.1 meets the target of one more")
	}
}
