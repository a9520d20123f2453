package slidingratelimit

import (
	"context"
	"strings"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestRedisPersistenceWarning: at start, a Redis that keeps neither an
// append-only file nor snapshots is a warning when a zone's window is an
// hour or more, naming those zones, since its restart gives their clients
// their budgets back; a Redis that keeps either, or zones of shorter
// windows, is none.
func TestRedisPersistenceWarning(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client(t)
	for _, c := range []struct {
		what, appendonly, save string
		windows                []string
		warned                 string
	}{
		{"nothing kept, a day and a month", "no", "", []string{"1d", "30d", "1m"}, "z0, z1"},
		{"nothing kept, an hour", "no", "", []string{"1h"}, "z0"},
		{"nothing kept, under an hour", "no", "", []string{"59m", "1m"}, ""},
		{"an append-only file", "yes", "", []string{"1d"}, ""},
		{"snapshots", "no", "3600 1", []string{"1d"}, ""},
	} {
		t.Run(c.what, func(t *testing.T) {
			ctx := context.Background()
			if err := rc.ConfigSet(ctx, "appendonly", c.appendonly).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rc.ConfigSet(ctx, "save", c.save).Err(); err != nil {
				t.Fatal(err)
			}
			var zones strings.Builder
			for i, w := range c.windows {
				zones.WriteString("\t\tzone z" + string(rune('0'+i)) + " " + w + " 100\n")
			}
			logFile := startCaddy(t, ":9080 {\n\tsliding_ratelimit {\n"+zones.String()+"\t\tzone inflight {\n\t\t\tconcurrent 2\n\t\t}\n\t\tredis "+srv.URL()+"\n\t}\n\trespond \"ok\"\n}\n")
			lines := logLines(t, logFile, "neither an append-only file nor snapshots")
			switch {
			case c.warned == "" && len(lines) != 0:
				t.Errorf("warnings %q, want none", lines)
			case c.warned != "" && len(lines) != 1:
				t.Errorf("%d warnings, want 1: %q", len(lines), lines)
			case c.warned != "":
				for _, want := range []string{`"level":"warn"`, `"zones":"` + c.warned + `"`, "its whole budget back", "appendonly yes", "everysec"} {
					if !strings.Contains(lines[0], want) {
						t.Errorf("warning %s, want it to say %q", lines[0], want)
					}
				}
			}
		})
	}
}
