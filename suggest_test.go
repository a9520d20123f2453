package slidingratelimit

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

func TestEditDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"", "key", 3}, {"key", "", 3}, {"key", "key", 0},
		{"max_request", "max_requests", 1}, {"max_requestss", "max_requests", 1},
		{"fial_mode", "fail_mode", 1}, {"windwo", "window", 1}, {"timout", "timeout", 1},
		{"kye_prefix", "key_prefix", 1}, {"maxrequest", "max_requests", 2}, {"burst", "redis", 5},
		{"ab", "ba", 1}, {"abc", "ca", 3},
	} {
		if got := editDistance(c.a, c.b); got != c.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestDidYouMean(t *testing.T) {
	for _, c := range []struct{ typed, want string }{
		{"max_request", "max_requests"}, {"Window", "window"}, {"ipv6prefix", "ipv6_prefix"},
		{"headres", "headers"}, {"redsi", "redis"}, {"zones", "zone"}, {"count_statuses", "count_status"},
		{"burst", ""}, {"x", ""}, {"ke", "key"}, {"autopipelining", ""},
	} {
		got := didYouMean(c.typed, handlerSubdirectives)
		want := ""
		if c.want != "" {
			want = " (did you mean " + c.want + "?)"
		}
		if got != want {
			t.Errorf("didYouMean(%q) = %q, want %q", c.typed, got, want)
		}
	}
}

// TestSubdirectiveListsMatchTheParser: every name suggested is one the block
// takes; a name the parser added without adding it to the list would never
// be suggested, and one removed would be suggested in vain.
func TestSubdirectiveListsMatchTheParser(t *testing.T) {
	adapt := func(block string) string {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(":8080 {\n\tsliding_ratelimit {\n"+block+"\n\t}\n}\n"), nil)
		if err == nil {
			return ""
		}
		return err.Error()
	}
	for _, name := range handlerSubdirectives {
		if err := adapt(name); strings.Contains(err, "unrecognized subdirective") {
			t.Errorf("handler subdirective %s: %s", name, err)
		}
	}
	for _, name := range zoneSubdirectives {
		if err := adapt("zone z 1m 1 {\n" + name + "\n}"); strings.Contains(err, "unrecognized subdirective") {
			t.Errorf("zone subdirective %s: %s", name, err)
		}
	}
}
