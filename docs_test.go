package slidingratelimit

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// The docs are README.md and docs/*.md. They are checked as code is: every
// Caddyfile in them adapts, every JSON handler config in them is one, every
// relative link leads to a file, and every benchmark figure in them is a
// cell of BENCHMARKS.md, which `make bench` writes.
//
// A figure is a link to BENCHMARKS.md whose title names its cell, as
//
//	[12.6 µs](BENCHMARKS.md#results "Results | many clients | Redis CPU us/decision")
//
// (section, row, column; a fourth part n takes the cell's n-th number, for a
// cell that holds several). The first number of the link's text must be
// that number of the cell; `go test -run TestDocFigures -update` (which
// `make bench` runs) rewrites it. A "µs" or "req/s" anywhere else is a
// figure copied by hand, and fails.

// docFiles returns README.md and the pages of docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	if err != nil || len(pages) == 0 {
		t.Fatalf("no pages in docs/: %v", err)
	}
	return append([]string{"README.md"}, pages...)
}

// fence is a fenced code block of a doc: its language and its text.
type fence struct {
	lang, text string
	line       int
}

// fences returns the fenced code blocks of a Markdown text.
func fences(doc string) []fence {
	var out []fence
	lines := strings.Split(doc, "\n")
	for i := 0; i < len(lines); i++ {
		opening, ok := strings.CutPrefix(lines[i], "```")
		if !ok {
			continue
		}
		f := fence{lang: strings.TrimSpace(opening), line: i + 1}
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			f.text += lines[i] + "\n"
		}
		out = append(out, f)
	}
	return out
}

// TestDocCaddyfilesAdapt: every block marked caddyfile in the docs, and
// Caddyfile.example, adapts. A block that starts with a directive is a
// site's body, and adapts inside a site. Every block says its language, so
// that no Caddyfile escapes this test unmarked.
func TestDocCaddyfilesAdapt(t *testing.T) {
	blocks := docCaddyfiles(t)
	directive := regexp.MustCompile(`^[a-z_]+(\s|$)`)
	for where, text := range blocks {
		first := ""
		for _, line := range strings.Split(text, "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				first = line
				break
			}
		}
		if directive.MatchString(first) {
			text = ":8080 {\n" + text + "}\n"
		}
		if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(text), nil); err != nil {
			t.Errorf("%s: %v", where, err)
		}
	}
}

// TestDocCaddyfilesFmtClean: every Caddyfile of the docs is as `caddy fmt`
// writes it, since `caddy run` warns about a Caddyfile that is not, and a
// reader copies what the docs show.
func TestDocCaddyfilesFmtClean(t *testing.T) {
	for where, text := range docCaddyfiles(t) {
		if formatted := string(caddyfile.Format([]byte(text))); formatted != text {
			t.Errorf("%s: not caddy fmt-clean; caddy fmt writes:\n%s", where, formatted)
		}
	}
}

// docCaddyfiles returns the blocks marked caddyfile in the docs, and
// Caddyfile.example, by where they are.
func docCaddyfiles(t *testing.T) map[string]string {
	t.Helper()
	example, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string]string{"Caddyfile.example": string(example)}
	for _, file := range docFiles(t) {
		doc, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fences(string(doc)) {
			where := fmt.Sprintf("%s:%d", file, f.line)
			switch f.lang {
			case "":
				t.Errorf("%s: a code block without a language (caddyfile, json, sh, text, ...)", where)
			case "caddyfile":
				blocks[where] = f.text
			}
		}
	}
	return blocks
}

// TestDocJSONIsAHandler: every JSON block of the docs that configures the
// handler has only fields the handler has, and passes its rules.
func TestDocJSONIsAHandler(t *testing.T) {
	for _, file := range docFiles(t) {
		doc, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fences(string(doc)) {
			if f.lang != "json" || !strings.Contains(f.text, `"handler": "sliding_ratelimit"`) {
				continue
			}
			text := strings.Replace(f.text, `"handler": "sliding_ratelimit",`, "", 1)
			h := new(Handler)
			if err := caddy.StrictUnmarshalJSON([]byte(text), h); err != nil {
				t.Errorf("%s:%d: %v", file, f.line, err)
				continue
			}
			h.setDefaults()
			if err := h.Validate(); err != nil {
				t.Errorf("%s:%d: %v", file, f.line, err)
			}
		}
	}
}

// mdLink matches a Markdown link, with its text, target and optional title.
var mdLink = regexp.MustCompile(`\[([^\]]*)\]\(([^) "]+)(?: "([^"]*)")?\)`)

// TestDocLinks: every relative link of the docs leads to a file of the
// repository.
func TestDocLinks(t *testing.T) {
	for _, file := range docFiles(t) {
		doc, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(string(doc), -1) {
			target, _, _ := strings.Cut(m[2], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			if _, err := os.Stat(path.Join(path.Dir(file), target)); err != nil {
				t.Errorf("%s: link %q leads nowhere: %v", file, m[0], err)
			}
		}
	}
}

// number matches a figure: digits with thousands commas and a fraction (a
// sign is the text's, on either side).
var number = regexp.MustCompile(`\d[\d,]*(?:\.\d+)?`)

// TestDocFigures: every benchmark figure in the docs is the BENCHMARKS.md
// (or SOAK.md) cell it names; with -update, it is rewritten to be.
func TestDocFigures(t *testing.T) {
	generated := map[string]map[string]string{}
	for _, name := range []string{"BENCHMARKS.md", "SOAK.md"} {
		md, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		generated[name] = benchmarkCells(string(md))
	}
	for _, file := range docFiles(t) {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		doc := string(raw)
		figures := 0
		updated := mdLink.ReplaceAllStringFunc(doc, func(link string) string {
			m := mdLink.FindStringSubmatch(link)
			target, _, _ := strings.Cut(m[2], "#")
			cells, ok := generated[path.Base(target)]
			if !ok || m[3] == "" {
				return link
			}
			figures++
			want, err := cellNumber(cells, m[3])
			if err != nil {
				t.Errorf("%s: %s: %v", file, link, err)
				return link
			}
			at := number.FindStringIndex(m[1])
			if at == nil {
				t.Errorf("%s: %s: no number in the link's text", file, link)
				return link
			}
			if got := m[1][at[0]:at[1]]; got != want {
				if !*update {
					t.Errorf("%s: %s says %s; %s says %s (go test -run TestDocFigures -update rewrites it)", file, link, got, path.Base(target), want)
				}
				return strings.Replace(link, "["+m[1]+"]", "["+m[1][:at[0]]+want+m[1][at[1]:]+"]", 1)
			}
			return link
		})
		for _, unit := range []string{"µs", "req/s"} {
			if n := strings.Count(mdLink.ReplaceAllString(doc, ""), unit); n > 0 {
				t.Errorf("%s: %d %q outside figure links: a measured figure belongs in BENCHMARKS.md, linked", file, n, unit)
			}
		}
		if *update && updated != doc {
			if err := os.WriteFile(file, []byte(updated), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d figures, rewritten from BENCHMARKS.md and SOAK.md", file, figures)
		}
	}
}

// benchmarkCells reads the tables of BENCHMARKS.md (or SOAK.md): cells by
// "section | row | column", the row being a table line's first cell.
func benchmarkCells(md string) map[string]string {
	cells := make(map[string]string)
	var section string
	var columns []string
	for _, line := range strings.Split(md, "\n") {
		if title, ok := strings.CutPrefix(line, "## "); ok {
			section, columns = strings.TrimSpace(title), nil
			continue
		}
		if !strings.HasPrefix(line, "|") {
			columns = nil
			continue
		}
		row := strings.Split(strings.Trim(line, "|"), "|")
		for i := range row {
			row[i] = strings.TrimSpace(row[i])
		}
		switch {
		case columns == nil:
			columns = row
		case strings.HasPrefix(row[0], "---") || strings.HasPrefix(row[0], ":-"):
		default:
			for i := 1; i < len(row) && i < len(columns); i++ {
				cells[section+" | "+row[0]+" | "+columns[i]] = row[i]
			}
		}
	}
	return cells
}

// cellNumber returns the number that a figure's title names: "section | row
// | column", and "| n" for the cell's n-th number.
func cellNumber(cells map[string]string, title string) (string, error) {
	parts := strings.Split(title, " | ")
	n := 1
	if len(parts) == 4 {
		var err error
		if n, err = strconv.Atoi(parts[3]); err != nil || n < 1 {
			return "", fmt.Errorf("the fourth part of the title must be a number from 1, got %q", parts[3])
		}
		parts = parts[:3]
	}
	if len(parts) != 3 {
		return "", fmt.Errorf("the title must be \"section | row | column\" [\" | n\"], got %q", title)
	}
	cell, ok := cells[strings.Join(parts, " | ")]
	if !ok {
		return "", fmt.Errorf("no such cell: %q", title)
	}
	numbers := number.FindAllString(cell, -1)
	if len(numbers) < n {
		return "", fmt.Errorf("the cell %q holds %d numbers, not %d", cell, len(numbers), n)
	}
	return numbers[n-1], nil
}

// TestReadmeFirstExampleIsASite: the first Caddyfile a reader sees is whole,
// so that pasting it into an empty Caddyfile works (a bare directive there
// is an error); the snippets after it are site bodies, which the README says.
func TestReadmeFirstExampleIsASite(t *testing.T) {
	doc, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fences(string(doc)) {
		if f.lang != "caddyfile" {
			continue
		}
		if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(f.text), nil); err != nil {
			t.Errorf("README.md:%d: the first Caddyfile does not adapt as a whole Caddyfile: %v", f.line, err)
		}
		return
	}
	t.Fatal("README.md has no caddyfile block")
}

// TestLayoutNamesEveryFile: docs/layout.md names every file of the root
// package and every internal package, at the start of a line of its map, so
// that a file added or renamed is placed there too.
func TestLayoutNamesEveryFile(t *testing.T) {
	raw, err := os.ReadFile("docs/layout.md")
	if err != nil {
		t.Fatal(err)
	}
	named := make(map[string]bool)
	for line := range strings.SplitSeq(string(raw), "\n") {
		if fields := strings.Fields(line); len(fields) > 0 && !strings.HasPrefix(line, " ") {
			named[fields[0]] = true
		}
	}
	files, _ := filepath.Glob("*.go")
	packages, _ := filepath.Glob("internal/*")
	for _, f := range append(files, packages...) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		if !named[f] {
			t.Errorf("docs/layout.md does not name %s", f)
		}
	}
}
