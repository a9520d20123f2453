package main

import (
	"fmt"
	"strings"
	"testing"
)

func TestParseSettleCostBench(t *testing.T) {
	line := func(mode string, cpu float64) string {
		return fmt.Sprintf("BenchmarkRedisCPUPerDecision/units/%s-2 \t 1\t 573841708 ns/op\t %v cpu-µs/decision\t 15.94 decisions/call\t 6.949 script-µs/decision\n", mode, cpu)
	}
	// The test's redis-server logs between a name and its figures.
	split := strings.Replace(line("settle", 17.4), "\t 1\t", "\t7338:C 06 Dec 2026 08:35:12.940 # Redis is starting\n1058:M # Server initialized\n 1\t", 1)
	out := "goos: linux\n" + split + "--- BENCH: BenchmarkRedisCPUPerDecision/units/settle-2\n    cost_bench_test.go:328: units, allow then settle: Redis CPU 17.40 µs/decision\n" + line("allow", 8.1) + line("peek", 13.8) + line("empty", 11.8) +
		line("settle", 18.0) + line("allow", 8.3) + line("peek", 14.0) + line("empty", 11.5) +
		line("settle", 19.0) + line("allow", 7.9) + line("peek", 13.9) + line("empty", 11.9) +
		"BenchmarkRedisCPUPerDecision/max60/store-2 1 610044908 ns/op 8.025 cpu-µs/decision\nPASS\n"
	st, err := parseSettleCostBench(out)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"allow": 8.1, "empty": 11.8, "peek": 13.9, "settle": 18.0}
	for mode, w := range want {
		if got := st.cpuPerReq[mode]; got != w {
			t.Errorf("%s: %v, want the median %v", mode, got, w)
		}
	}
	if st.runs != 3 || len(st.cpuPerReq) != 4 {
		t.Errorf("runs %d, modes %v: want 3 runs of 4 modes (another scenario's line is not one)", st.runs, st.cpuPerReq)
	}
	for name, bad := range map[string]string{
		"no result":              "PASS\n",
		"a mode missing":         line("settle", 17.4) + line("allow", 8.1) + line("peek", 13.8),
		"a name without figures": "BenchmarkRedisCPUPerDecision/units/allow-2\n" + line("allow", 8.1) + line("peek", 13.8) + line("empty", 1) + line("settle", 2),
		"no cpu-µs/decision":     "BenchmarkRedisCPUPerDecision/units/allow-2 1 300 ns/op\n",
		"a value not a number":   "BenchmarkRedisCPUPerDecision/units/allow-2 1 300 ns/op x cpu-µs/decision\n",
	} {
		if _, err := parseSettleCostBench(bad); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}

func TestSettleCostSection(t *testing.T) {
	var b strings.Builder
	p := func(format string, args ...any) { b.WriteString(fmt.Sprintf(format, args...) + "\n") }
	r := report{settleCost: settleCostState{runs: 5, command: "go test", cpuPerReq: map[string]float64{"allow": 8, "empty": 12, "peek": 14, "settle": 18}}}
	r.settleCostSection(p)
	for _, want := range []string{"## What a settle costs Redis", "| nothing | 8.00 | 1.00x |",
		"| an empty request | 12.00 | 1.50x |", "| a peek | 14.00 | 1.75x |", "| the settle | 18.00 | 2.25x |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	(report{settleCost: settleCostState{notMeasured: fmt.Errorf("go: not found")}}).settleCostSection(p)
	if want := "Not measured: go: not found"; !strings.Contains(b.String(), want) {
		t.Errorf("lacks %q:\n%s", want, b.String())
	}
	b.Reset()
	(report{}).settleCostSection(p)
	if b.Len() != 0 {
		t.Errorf("a run without the phase reports it:\n%s", b.String())
	}
}
