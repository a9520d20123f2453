package slidingratelimit

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// decisionsSeries is the decisions counter of zone with result.
func decisionsSeries(zone, result string) string {
	return `caddy_sliding_ratelimit_decisions_total{result="` + result + `",zone="` + zone + `"}`
}

// TestReportZoneBesideEnforcing: a zone in report mode beside one in
// force. The report zone never refuses; it counts the requests served that
// fit in it, and counts and logs those it would deny without recording
// them; the enforcing zone counts and refuses as it would alone, even the
// requests the report zone would deny, and its denials count nothing in the
// report zone. Clients see only the enforcing zone's headers.
func TestReportZoneBesideEnforcing(t *testing.T) {
	live, trial, prefix := uniqueZone("live"), uniqueZone("trial"), uniquePrefix(t)
	startCaddy(t, siteBlock(":9080", prefix, fmt.Sprintf(`
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone %s 1m 3
		zone %s 1m 2 {
			mode report
		}
	}
	respond "ok"`, live, trial)))

	// 1, 2: both count; 3: trial would deny, live counts it; 4, 5: live
	// denies, trial is not asked.
	for i, want := range []int{200, 200, 200, 429, 429} {
		res := send(t, site, withHeader("X-Client", "r1"))
		if res.status != want {
			t.Errorf("request %d: status %d, want %d", i+1, res.status, want)
		}
		if got := res.header.Get("RateLimit-Policy"); strings.Contains(got, trial) || !strings.Contains(got, live) {
			t.Errorf("request %d: RateLimit-Policy %q, want the enforcing zone's alone", i+1, got)
		}
	}
	kept := func(zone string) int64 {
		t.Helper()
		n, err := admissionsKept(context.Background(), sharedRedis.Client(t), prefix+"{=r1}:"+zone)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := kept(live); got != 3 {
		t.Errorf("%s holds %d admissions, want 3: a report zone's would-be denial takes nothing from it", live, got)
	}
	if got := kept(trial); got != 2 {
		t.Errorf("%s holds %d admissions, want 2", trial, got)
	}
	for series, want := range map[string]float64{
		decisionsSeries(live, "allowed"):        3,
		decisionsSeries(live, "denied"):         2,
		decisionsSeries(trial, "allowed"):       2,
		decisionsSeries(trial, "report_denied"): 1,
		decisionsSeries(trial, "denied"):        0,
	} {
		if got := scrape(t, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

// TestReportZoneCountsOnlyServed: the enforcing zone's denials are not
// counted in a report zone with room; a request that only report zones
// apply to is never refused, and they count what fits.
func TestReportZoneCountsOnlyServed(t *testing.T) {
	live, trial, alone, prefix := uniqueZone("live"), uniqueZone("trial"), uniqueZone("alone"), uniquePrefix(t)
	startCaddy(t, siteBlock(":9080", prefix, fmt.Sprintf(`
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone %s 1m 2 {
			match {
				path /api/*
			}
		}
		zone %s 1m 5 {
			mode report
			match {
				path /api/*
			}
		}
		zone %s 1m 2 {
			mode report
			warn 50%%
			match {
				path /new/*
			}
		}
	}
	respond "ok"`, live, trial, alone)))

	expect(t, "beside an enforcing zone", site+"api/x", []int{200, 200, 429, 429}, withHeader("X-Client", "r2"))
	n, err := admissionsKept(context.Background(), sharedRedis.Client(t), prefix+"{=r2}:"+trial)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("%s holds %d admissions, want the 2 requests served", trial, n)
	}

	expect(t, "report zone alone", site+"new/x", []int{200, 200, 200, 200}, withHeader("X-Client", "r2"))
	n, err = admissionsKept(context.Background(), sharedRedis.Client(t), prefix+"{=r2}:"+alone)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("%s holds %d admissions, want 2", alone, n)
	}
	for series, want := range map[string]float64{
		decisionsSeries(alone, "allowed"):       2,
		decisionsSeries(alone, "report_denied"): 2,
		softSeries(alone):                       1,
	} {
		if got := scrape(t, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

// TestReportZoneSettles: a report zone with settle is settled with the
// request's other zones: it ends up holding what the response cost.
func TestReportZoneSettles(t *testing.T) {
	trial, prefix := uniqueZone("trial"), uniquePrefix(t)
	upstream := usageUpstream(t)
	startCaddy(t, siteBlock(":9080", prefix, fmt.Sprintf(`
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone live 1m 100
		zone %s 1m 1000 {
			mode report
			cost 100
			settle header X-Usage
		}
	}
	reverse_proxy %s`, trial, upstream)))
	res := send(t, site, withHeader("X-Client", "r3"), withHeader("X-Test-Usage", "7"))
	if res.status != http.StatusOK {
		t.Fatalf("status %d", res.status)
	}
	if got := unitsUsed(t, trial, "r3", 7); got != 7 {
		t.Errorf("%s holds %d units after a response that cost 7 (reserved 100), want 7", trial, got)
	}
}
