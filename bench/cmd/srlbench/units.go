package main

import (
	"fmt"
	"math"
)

// The units scenario: requests that cost units against a budget, settled
// after the response. Each request reserves 1 unit and its response reports
// what it used, 1 to 50 units (an LLM upstream's token usage, here set by
// `header` from the request's X-Units), which the limiter settles with one
// more script call, batched as decisions are. 10,000 keys, each far under a
// budget of 1,000,000 units a minute, so every request is admitted: the
// scenario measures what a settled cost costs, to set beside many clients.
const unitsSlug = "units"

func init() {
	scenarios = append(scenarios, scenario{
		name: "units", slug: unitsSlug, target: math.NaN(),
		about:  "10,000 keys in turn, each request reserving 1 unit of a budget of 1,000,000 a minute and settled after the response to the 1 to 50 units its X-Usage header reports (`settle header X-Usage`): one more script call per request; no throughput target",
		keyLua: `n = n + 1; local key = "units-" .. (n % 10000); wrk.headers["X-Units"] = tostring(1 + n % 50)`,
		site: &extraSite{
			comment: "Limited in units: a budget of 1,000,000 units a minute, each request settled to its X-Usage.",
			body:    unitsSite,
		},
		extraTarget: unitsTarget,
	})
}

// unitsSite is the units scenario's site: the response reports the usage
// the request asks for, as an upstream would.
func unitsSite(redisURL string) []string {
	return []string{
		"header X-Usage {http.request.header.X-Units}",
		"sliding_ratelimit {",
		"\twindow 1m",
		fmt.Sprintf("\tmax_requests %d", unitsBudget),
		"\tkey {http.request.header.X-Client}",
		"\tsettle header X-Usage",
		"\tredis " + redisURL,
		"}",
		`respond "ok" 200`,
	}
}

// unitsBudget is the units site's max_requests.
const unitsBudget = 1_000_000

// unitsTarget: a request with a cost settled after the response costs at
// most one more (batched) Redis call than one that is only decided.
func unitsTarget(s, many stats) (string, string, bool) {
	return "units: script calls per request <= many clients' + 1",
		fmt.Sprintf("%s (many clients %s)", num(s.callsPerReq, 3), num(many.callsPerReq, 3)),
		s.callsPerReq <= many.callsPerReq+1
}
