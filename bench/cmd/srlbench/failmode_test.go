package main

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestParseFailModeBench(t *testing.T) {
	out := `goos: linux
goarch: amd64
pkg: github.com/slidingratelimit/caddy-sliding-ratelimit/limiter
cpu: Intel(R) Xeon(R) Processor
BenchmarkFallbackObserve-2   	 4955481	       239.7 ns/op	       176.1 bytes/client	       0 B/op	       0 allocs/op
BenchmarkFallbackObserve-2   	 4465519	       268.9 ns/op	       176.1 bytes/client	       0 B/op	       0 allocs/op
BenchmarkFallbackObserve-2   	 4501234	       250.0 ns/op	       180.0 bytes/client	       0 B/op	       0 allocs/op
BenchmarkFallbackObserveOther-2 	 1	 1.0 ns/op	 1.0 bytes/client
PASS
ok  	github.com/slidingratelimit/caddy-sliding-ratelimit/limiter	2.634s
`
	st, err := parseFailModeBench(out)
	if err != nil {
		t.Fatal(err)
	}
	if st.runs != 3 {
		t.Errorf("runs = %d, want 3 (another benchmark's line is not one)", st.runs)
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"ns per Observe", st.nsPerObserve, 250}, {"bytes per client", st.bytesPerClient, 176.1}, {"allocs", st.allocsPerObserve, 0}} {
		if math.Abs(c.got-c.want) > 1e-9 {
			t.Errorf("%s = %v, want the median %v", c.name, c.got, c.want)
		}
	}
	// Without GOMAXPROCS's suffix (GOMAXPROCS=1), and without -benchmem.
	if st, err := parseFailModeBench("BenchmarkFallbackObserve 100 300 ns/op 90 bytes/client\n"); err != nil || st.nsPerObserve != 300 || st.bytesPerClient != 90 || !math.IsNaN(st.allocsPerObserve) {
		t.Errorf("one line without a suffix: %+v, %v", st, err)
	}
	for name, bad := range map[string]string{
		"no result":            "PASS\nok  \tlimiter\t0.01s\n",
		"no bytes/client":      "BenchmarkFallbackObserve-2 100 300 ns/op\n",
		"a value not a number": "BenchmarkFallbackObserve-2 100 x ns/op 90 bytes/client\n",
	} {
		if _, err := parseFailModeBench(bad); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}

func TestFailModeSection(t *testing.T) {
	var b strings.Builder
	p := func(format string, args ...any) { b.WriteString(fmt.Sprintf(format, args...) + "\n") }
	r := report{failMode: failModeState{runs: 5, bytesPerClient: 176.1, nsPerObserve: 250, command: "go test"}}
	r.failModeSection(p)
	for _, want := range []string{"## Fail-mode state", "| bytes per remembered client | 176.1 |", "| ns per Observe (every decision Redis answers) | 250.0 |", "n/a (no many clients run)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("lacks %q:\n%s", want, b.String())
		}
	}
	// 50 us of Caddy CPU per limited request: 250 ns is 0.5% of it.
	many := pair{limited: wrkResult{requests: 1000, cpu: cpuUse{caddySeconds: 0.05}}}
	r.results = []scenarioResult{{sc: scenario{slug: manySlug}, runs: []pair{many}}}
	b.Reset()
	r.failModeSection(p)
	if want := "| share of a limited request's Caddy CPU (many clients) | 0.5% of 50.0 us |"; !strings.Contains(b.String(), want) {
		t.Errorf("lacks %q:\n%s", want, b.String())
	}
	b.Reset()
	(report{failMode: failModeState{notMeasured: fmt.Errorf("go: not found")}}).failModeSection(p)
	if want := "Not measured: go: not found"; !strings.Contains(b.String(), want) {
		t.Errorf("lacks %q:\n%s", want, b.String())
	}
}
