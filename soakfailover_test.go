//go:build soak

package slidingratelimit

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSoakFailover runs measureFailover a few times (a Sentinel set each,
// its primary killed under load, two instances with fail_mode local) and
// writes what each measured to SOAK.md's Failover section. `make soak` runs
// it after TestSoak.
func TestSoakFailover(t *testing.T) {
	const runs, clients = 5, 20
	var b strings.Builder
	fmt.Fprintf(&b, "%d failovers of a Sentinel set under load (go test -tags soak -run TestSoakFailover): two instances with\n", runs)
	fmt.Fprintf(&b, "`fail_mode local`, %d clients half-way through a window of 30s (limit 40), the primary killed (SIGKILL),\n", clients)
	b.WriteString("each client a request every 20ms alternating the instances until the new primary decides and 2s more; beside\n")
	b.WriteString("them a store of its own writes until the kill, and the new primary is read for what it holds of that.\n\n")
	b.WriteString("| run | kill to a decision from the new primary | most admitted to a client in the window | limit | acknowledged before the kill | lost by replication |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	worst := make([]int, 0, runs)
	for run := range runs {
		f := measureFailover(t, clients)
		worst = append(worst, f.mostAdmitted)
		fmt.Fprintf(&b, "| %d | %v | %d | %d | %d | %d |\n", run+1, f.outage.Round(10*time.Millisecond), f.mostAdmitted, f.maxRequests, f.acked, f.lost)
	}
	fmt.Fprintf(&b, "\nThe most any client got in a window spanning a failover: %d against its limit of 40.\n", slices.Max(worst))
	writeSoakSection(t, "Failover", b.String())
}

// writeSoakSection replaces the section of SOAK.md under "## heading" (to
// the next such heading or the end) with body, or appends it.
func writeSoakSection(t *testing.T, heading, body string) {
	t.Helper()
	raw, err := os.ReadFile("SOAK.md")
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	doc, mark := string(raw), "\n## "+heading+"\n"
	if i := strings.Index(doc, mark); i >= 0 {
		rest := doc[i+len(mark):]
		end := len(rest)
		if j := strings.Index(rest, "\n## "); j >= 0 {
			end = j + 1
		}
		doc = doc[:i] + rest[end:]
	}
	doc = strings.TrimRight(doc, "\n") + "\n" + mark + "\n" + body
	if err := os.WriteFile("SOAK.md", []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
}
