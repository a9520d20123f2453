package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseRedisCPU(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.500000\r\nused_cpu_sys_children:9.000000\r\nused_cpu_user_children:9.000000\r\n"
	got, err := parseRedisCPU(info)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3.75; math.Abs(got-want) > 1e-9 {
		t.Errorf("parseRedisCPU = %v, want %v (children are not the server's own time)", got, want)
	}
	if _, err := parseRedisCPU("# CPU\r\nused_cpu_sys:1.0\r\n"); err == nil {
		t.Error("parseRedisCPU without used_cpu_user: want an error, not half the time")
	}
}

func TestParseDecisions(t *testing.T) {
	body := `# HELP caddy_sliding_ratelimit_decisions_total Decisions.
caddy_sliding_ratelimit_decisions_total{result="allowed",zone="a"} 10
caddy_sliding_ratelimit_decisions_total{result="allowed",zone="b"} 5
caddy_sliding_ratelimit_decisions_total{result="denied",zone="a"} 7
caddy_sliding_ratelimit_deny_cache_hits_total{zone="a"} 6
caddy_http_requests_total{server="srv0"} 99
`
	d := parseDecisions(body)
	for k, want := range map[string]float64{"allowed": 15, "denied": 7, "deny_cache_hits": 6} {
		if got := d[k]; got != want {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
	// Deny cache hits are among the denied decisions, not more of them.
	if got, want := (pair{decisions: d}).decided(), 22.0; got != want {
		t.Errorf("decided = %v, want %v", got, want)
	}
	if got, want := (pair{limited: wrkResult{requests: 40}}).decided(), 40.0; got != want {
		t.Errorf("decided without metrics = %v, want wrk's requests %v", got, want)
	}
}

func TestParseWrk(t *testing.T) {
	out := "Running 3s test\nSRLBENCH requests=3000 duration_us=3000000 p50_us=700 p99_us=5000 status=30 connect=0 read=1 write=0 timeout=2\n"
	r, err := parseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.rps(), 1000.0; got != want {
		t.Errorf("rps = %v, want %v", got, want)
	}
	if got, want := r.deniedShare(), 0.01; got != want {
		t.Errorf("deniedShare = %v, want %v", got, want)
	}
	if got, want := r.socketErrors(), int64(3); got != want {
		t.Errorf("socketErrors = %v, want %v", got, want)
	}
	r.cpu.caddySeconds = 0.06
	if got, want := r.caddyUsecPerRequest(), 20.0; math.Abs(got-want) > 1e-9 {
		t.Errorf("caddyUsecPerRequest = %v, want %v", got, want)
	}
	if _, err := parseWrk("SRLBENCH requests=0 duration_us=1\n"); err == nil {
		t.Error("no completed requests: want an error")
	}
}

func TestMedianSkipsNaN(t *testing.T) {
	if got := median([]float64{3, math.NaN(), 1, 2}); got != 2 {
		t.Errorf("median = %v, want 2", got)
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median = %v, want 2.5", got)
	}
	if got := median([]float64{math.NaN()}); !math.IsNaN(got) {
		t.Errorf("median of no numbers = %v, want NaN", got)
	}
}

// TestCaddyfile checks what each site limits, so that the report's setup
// text and the memory sizes say what was measured.
func TestCaddyfile(t *testing.T) {
	own, _ := extraSites()
	ports := make([]int, 5+len(memSizes)+len(own))
	for i := range ports {
		ports[i] = 2019 + i
	}
	text := caddyfile(sites{}, ports, "redis://r:1", "redis://far:2", []string{"timeout 50ms"})
	blocks := strings.Split(text, "\n# ")[1:]
	if got, want := len(blocks), 4+len(memSizes)+len(own); got != want {
		t.Fatalf("%d sites, want %d:\n%s", got, want, text)
	}
	if strings.Contains(blocks[0], "sliding_ratelimit") {
		t.Errorf("the plain site is limited:\n%s", blocks[0])
	}
	for i, redis := range []string{"redis redis://r:1", "redis redis://far:2"} {
		b := blocks[1+i]
		for _, want := range []string{"max_requests 1000", redis, "timeout 50ms"} {
			if !strings.Contains(b, want) {
				t.Errorf("limited site %d lacks %q:\n%s", i, want, b)
			}
		}
	}
	if local := blocks[3]; !strings.Contains(local, "max_requests 1000") || strings.Contains(local, "redis ") {
		t.Errorf("the in-process site is not limited without redis:\n%s", local)
	}
	for i, size := range memSizes {
		b := blocks[4+i]
		for _, want := range []string{"key_prefix " + size.prefix(), "window " + size.zoneWindow(), "redis redis://r:1"} {
			if !strings.Contains(b, want) {
				t.Errorf("memory site %d lacks %q:\n%s", size.max, want, b)
			}
		}
		if strings.Contains(b, "timeout 50ms") {
			t.Errorf("memory site %d takes the -limiter options:\n%s", size.max, b)
		}
		if size.cost > 0 && (!strings.Contains(b, fmt.Sprintf("cost %d", size.cost)) || !strings.Contains(b, fmt.Sprintf("max_requests %d", size.max*size.cost))) {
			t.Errorf("memory site %s: each of its %d requests a client sends must cost %d of a budget of %d:\n%s", size.label(), size.max, size.cost, size.max*size.cost, b)
		}
	}
}

func TestCopyTreeLeavesNodeModules(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "copy")
	writeTree(t, src, []string{"server.mjs", "lib/a.js", "node_modules/x/index.js"})
	if err := copyTree(src, dst, notNodeModules); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"server.mjs", "lib/a.js"} {
		if data, err := os.ReadFile(filepath.Join(dst, f)); err != nil || string(data) != f {
			t.Errorf("%s: %q, %v", f, data, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dst, "node_modules")); !os.IsNotExist(err) {
		t.Errorf("node_modules was copied (err %v)", err)
	}
}

// writeTree makes each of files under dir, holding its own name.
func writeTree(t *testing.T, dir string, files []string) {
	t.Helper()
	for _, f := range files {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
