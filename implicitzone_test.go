package slidingratelimit

import (
	"net/http"
	"strings"
	"testing"
)

// TestSitesShareTheImplicitZoneWithAWarning: two sites of one config with the
// same three-line form share one limit, as before, and the log says so once,
// naming both sites and how to share on purpose or count apart. Zones named
// the same on purpose, and three-line forms with different limits, are not
// warned about.
func TestSitesShareTheImplicitZoneWithAWarning(t *testing.T) {
	prefix := uniquePrefix(t)
	threeLines := func(max string) string {
		return `
	sliding_ratelimit {
		window 1m
		max_requests ` + max + `
		redis ` + sharedRedis.URL() + `
		key_prefix ` + prefix + `
	}
	respond "ok"`
	}
	named := `
	sliding_ratelimit {
		zone api 1m 1
		redis ` + sharedRedis.URL() + `
		key_prefix ` + prefix + `
	}
	respond "ok"`
	logFile := startCaddy(t, `
http://a.localhost:9080 {`+threeLines("1")+`
}
http://b.localhost:9080 {`+threeLines("1")+`
}
http://c.localhost:9080 {`+named+`
}
http://d.localhost:9080 {`+named+`
}
http://e.localhost:9080 {`+threeLines("2")+`
}`)
	client := newFaultClient(t, 2)
	for _, c := range []struct {
		host string
		want int
	}{
		{"a.localhost", http.StatusOK}, {"b.localhost", http.StatusTooManyRequests},
		{"c.localhost", http.StatusOK}, {"d.localhost", http.StatusTooManyRequests},
		{"e.localhost", http.StatusOK},
	} {
		if a := client.get(c.host); a.err != nil || a.status != c.want {
			t.Errorf("%s: %d %v, want %d", c.host, a.status, a.err, c.want)
		}
	}

	warnings := logLines(t, logFile, `"level":"warn"`, "share one limit")
	if len(warnings) != 1 {
		t.Fatalf("%d warnings about a shared implicit zone, want 1: %q", len(warnings), warnings)
	}
	w := warnings[0]
	for _, want := range []string{
		`"handlers":["server srv0, host a.localhost","server srv0, host b.localhost"]`,
		`"zone":"default:1m:1"`,
		"give the zone the same name in each", "give each zone a name of its own",
	} {
		if !strings.Contains(w, want) {
			t.Errorf("warning without %s: %s", want, w)
		}
	}
}
