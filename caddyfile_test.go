package slidingratelimit

import (
	"bytes"
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
)

var update = flag.Bool("update", false, "rewrite the JSON of golden files from the current adapter")

// TestCaddyfileAdapt adapts each testdata/caddyfile_adapt/*.caddyfiletest:
// a Caddyfile, a line of dashes, then either the JSON it must adapt to or a
// text the adapt error must contain.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/caddyfile_adapt/*.caddyfiletest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			caddyfile, expected, ok := strings.Cut(string(data), "----------")
			if !ok {
				t.Fatalf("%s: no ---------- separator", file)
			}
			caddyfile = strings.TrimSpace(caddyfile) + "\n"
			expected = strings.TrimSpace(expected)
			if *update && (expected == "" || strings.HasPrefix(expected, "{")) {
				writeGolden(t, file, caddyfile)
				return
			}
			if strings.HasPrefix(expected, "{") {
				if !caddytest.CompareAdapt(t, file, caddyfile, "caddyfile", expected) {
					t.Errorf("%s: adapted JSON differs (diff above)", file)
				}
				return
			}
			_, _, err = caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
			if err == nil {
				t.Fatalf("%s: adapted without error, want one containing %q", file, expected)
			}
			if !strings.Contains(err.Error(), expected) {
				t.Errorf("%s: error %q does not contain %q", file, err, expected)
			}
		})
	}
}

func writeGolden(t *testing.T, file, caddyfile string) {
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, out, "", "\t"); err != nil {
		t.Fatal(err)
	}
	golden := caddyfile + "----------\n" + pretty.String() + "\n"
	if err := os.WriteFile(file, []byte(golden), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDurationWithoutUnit: `window 60` gets the duration it most likely
// means; `1mn` gets the units.
func TestDurationWithoutUnit(t *testing.T) {
	startCaddy(t, `:9080 {
	respond "ok"
}`)
	for _, c := range []struct{ lines, want string }{
		{"window 60\n\t\tmax_requests 10", `window: invalid duration \"60\": a duration needs a unit: 60s for seconds (or 1m), at Caddyfile:`},
		{"window 7200\n\t\tmax_requests 10", `7200s for seconds (or 2h)`},
		{"window 90\n\t\tmax_requests 10", `a duration needs a unit: 90s for seconds, at`},
		{"window 1mn\n\t\tmax_requests 10", `window: invalid duration \"1mn\": time: unknown unit \"mn\" in duration \"1mn\"; the units are ns, us, ms, s, m, h and d (24h), combined as in 1m30s`},
		{"zone api 60 10", `window: invalid duration \"60\": a duration needs a unit: 60s for seconds (or 1m)`},
		{"window 1m\n\t\tmax_requests 10\n\t\twait 500", `wait: invalid duration \"500\": a duration needs a unit: 500s for seconds`},
	} {
		config := globalOptions + ":9080 {\n\tsliding_ratelimit {\n\t\t" + c.lines + "\n\t}\n}\n"
		res := send(t, adminURL+"/load", withMethod(http.MethodPost), withBody("text/caddyfile", config))
		if res.status != http.StatusBadRequest || !strings.Contains(res.body, c.want) {
			t.Errorf("loading %q: %d %s, want 400 with %s", c.lines, res.status, res.body, c.want)
		}
	}
}

// TestRunningCaddyRefusesConfigMistakes: a reload of a running Caddy with a
// key whose placeholder is left open, or a misspelt subdirective, is refused
// with words that say what to change, and the running config keeps serving
// and limiting.
func TestRunningCaddyRefusesConfigMistakes(t *testing.T) {
	prefix := uniquePrefix(t)
	siteWith := func(lines string) string {
		return siteBlock(":9080", prefix, `
	sliding_ratelimit {
		window 1m
		max_requests 2
`+lines+`
	}
	respond "ok"`)
	}
	startCaddy(t, siteWith("\t\tkey {http.request.header.X-Api-Key}"))
	client := from("127.0.0.2")
	alice := map[string][]string{"X-Api-Key": {"alice"}}
	expect(t, "alice before the reloads", site, []int{200}, client, withHeaders(alice))

	for _, c := range []struct{ lines, want string }{
		{"\t\tkey {http.request.header.X-Api-Key", `key \"{http.request.header.X-Api-Key\": the placeholder \"{http.request.header.X-Api-Key\" has no closing '}', so the key would be the same text for every client: one bucket for all, at Caddyfile:15`},
		{"\t\tmax_request 10", `unrecognized subdirective 'max_request' (did you mean max_requests?), at Caddyfile:15`},
		{"\t\tfail_mode close", `fail_mode must be open, closed or local, got \"close\" (did you mean closed?), at Caddyfile:15`},
		{"\t\tzone api 1m 5 {\n\t\t\tkye {http.request.header.X-Api-Key}\n\t\t}", `zone api: unrecognized subdirective 'kye' (did you mean key?), at Caddyfile:16`},
		{"\t\tzone line 1s 5 {\n\t\t\twait 17s\n\t\t}", `zone line: wait 17s is longer than 16 windows of 1s, the most a request may wait, at Caddyfile:17`},
	} {
		res := send(t, adminURL+"/load", withMethod(http.MethodPost), withBody("text/caddyfile", globalOptions+siteWith(c.lines)))
		if res.status != http.StatusBadRequest || !strings.Contains(res.body, c.want) {
			t.Errorf("loading %q: %d %s, want 400 with %s", c.lines, res.status, res.body, c.want)
		}
	}
	// The running config still keys by the header: alice has one request
	// left, bob his own two.
	expect(t, "alice after the refused reloads", site, []int{200, 429}, client, withHeaders(alice))
	expect(t, "bob", site, []int{200, 200}, client, withHeader("X-Api-Key", "bob"))
}

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

// FuzzCaddyfile feeds arbitrary subdirective text to the parser: it may
// reject it, never panic. `make test` runs the seeds; `go test -fuzz
// FuzzCaddyfile` searches further.
func FuzzCaddyfile(f *testing.F) {
	for _, seed := range []string{
		"window 1m\nmax_requests 5",
		"zone a 1s 10\nzone b 1h 100 {\nkey {http.request.header.X}\n}",
		"window 1m\nmax_requests 5\nredis cluster redis://a:1?addr=b:2",
		"zone x {\nmatch {\npath /a\n}\nwindow 1s\nmax_requests 1\n}",
		"window -1\nmax_requests ten",
		"zone {\n}",
		"ipv6_prefix 200\nheaders legacy\nlog_keys",
		"window 1m\nmax_requests {http.request.header.X-Quota} 5\ncost {http.request.header.X-Cost}\nsettle header X-Usage",
		"zone t 1m {header.Q} 5 {\nsettle bytes\ncost 2\n}",
		"window 1m\nmax_requests {x}\ncost 0\nsettle header",
	} {
		f.Add(seed)
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	f.Fuzz(func(t *testing.T, body string) {
		caddyfile := ":8080 {\n\tsliding_ratelimit {\n" + body + "\n\t}\n}\n"
		_, _, _ = adapter.Adapt([]byte(caddyfile), nil)
	})
}
