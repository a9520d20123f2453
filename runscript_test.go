package slidingratelimit

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestMakeRunParagraphSaysWhatRunShUses: the README's `make run` paragraph
// names what scripts/run.sh lets a user change (CADDYFILE) and the ports it
// and Caddyfile.example take, as the script and the example say them.
func TestMakeRunParagraphSaysWhatRunShUses(t *testing.T) {
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	script, example, readme := read("scripts/run.sh"), read("Caddyfile.example"), read("README.md")

	// What the script and the example take, read from them.
	for _, in := range []*regexp.Regexp{
		regexp.MustCompile(`CADDYFILE="\$\{CADDYFILE:-Caddyfile\.example\}"`),
		regexp.MustCompile(`(?m)^\s*port=6379$`),
		regexp.MustCompile(`port=\$\(\(20000 \+ RANDOM % 30000\)\)`),
	} {
		if !in.MatchString(script) {
			t.Errorf("scripts/run.sh no longer has %s: update this test and the README", in)
		}
	}
	for _, want := range []string{"admin localhost:2019", "\n:8080 {"} {
		if !strings.Contains(example, want) {
			t.Errorf("Caddyfile.example no longer has %q: update this test and the README", want)
		}
	}

	start := strings.Index(readme, "`make run` uses")
	if start < 0 {
		t.Fatal("README.md: no paragraph that starts \"`make run` uses\"")
	}
	paragraph, _, _ := strings.Cut(readme[start:], "\n\n")
	for _, want := range []string{"`CADDYFILE=", "`127.0.0.1:6379`", "from 20000 to 49999", "`localhost:8080`", "`localhost:2019`"} {
		if !strings.Contains(paragraph, want) {
			t.Errorf("README.md's make run paragraph does not say %s:\n%s", want, paragraph)
		}
	}
}
