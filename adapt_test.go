package slidingratelimit

import (
	"bytes"
	"encoding/json"
	"flag"
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
