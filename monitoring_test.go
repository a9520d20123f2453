package slidingratelimit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// monitoring/ holds the rules and the dashboard an operator loads; these
// tests run them with the tools the operator runs: promtool, and a real
// Prometheus scraping a real Caddy. scripts/ensure-prometheus.sh (make test)
// installs both.

const (
	rulesFile     = "monitoring/rules.yml"
	rulesTestFile = "monitoring/rules_test.yml"
	dashboardFile = "monitoring/grafana-dashboard.json"
)

// tool returns the path of a program the monitoring tests need.
func tool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found on PATH: run scripts/ensure-prometheus.sh (make test does)", name)
	}
	return path
}

// TestAlertRulesWithPromtool checks the rules and runs their unit tests
// (synthetic series: each alert fires when it should and stays silent when it
// should not).
func TestAlertRulesWithPromtool(t *testing.T) {
	promtool := tool(t, "promtool")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// alertNames are the alerts of rules.yml.
func alertNames(t *testing.T) []string {
	t.Helper()
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^\s*- alert: (\w+)$`).FindAllSubmatch(rules, -1) {
		names = append(names, string(m[1]))
	}
	if len(names) < 10 {
		t.Fatalf("found %d alerts in %s", len(names), rulesFile)
	}
	return names
}

// TestEveryAlertTestedAndDocumented: each alert has a promtool case where it
// fires and one where it is silent, a summary, and a runbook entry in
// docs/observability.md that its runbook_url points to.
func TestEveryAlertTestedAndDocumented(t *testing.T) {
	tests, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	rules, _ := os.ReadFile(rulesFile)
	doc, err := os.ReadFile("docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range alertNames(t) {
		fires := regexp.MustCompile(`alertname: ` + name + `\n\s+exp_alerts:\n\s+- exp_labels:`)
		silent := regexp.MustCompile(`alertname: ` + name + `\n\s+exp_alerts: \[\]`)
		if !fires.Match(tests) {
			t.Errorf("%s: no promtool case in which it fires", name)
		}
		if !silent.Match(tests) {
			t.Errorf("%s: no promtool case in which it stays silent", name)
		}
		anchor := strings.ToLower(name)
		if !strings.Contains(string(rules), "runbook_url: \""+runbookBase+"#"+anchor+"\"") {
			t.Errorf("%s: no runbook_url to %s#%s", name, runbookBase, anchor)
		}
		if !regexp.MustCompile(`(?m)^### ` + name + `$`).Match(doc) {
			t.Errorf("%s: no runbook entry (### %s) in docs/observability.md", name, name)
		}
	}
	if n := strings.Count(string(rules), "summary: "); n != len(alertNames(t)) {
		t.Errorf("%d summaries for %d alerts", n, len(alertNames(t)))
	}
}

// runbookBase is where every runbook_url links to: the runbook on the
// project's page, a link that opens from an alert (a path such as
// docs/observability.md#... opens nothing in Alertmanager or Grafana).
const runbookBase = "https://github.com/slidingratelimit/caddy-sliding-ratelimit/blob/main/docs/observability.md"

// TestRunbookURLsAreLinks: every runbook_url, of the rules and of the
// expected alerts of their tests, is an absolute https URL with the one
// base docs/observability.md tells operators how to replace, and an anchor
// of a runbook entry.
func TestRunbookURLsAreLinks(t *testing.T) {
	doc, err := os.ReadFile("docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), runbookBase) {
		t.Errorf("docs/observability.md does not name the runbook base %s, which an operator replaces", runbookBase)
	}
	for _, file := range []string{rulesFile, rulesTestFile} {
		rules, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		urls := regexp.MustCompile(`runbook_url: "([^"]*)"`).FindAllSubmatch(rules, -1)
		if len(urls) == 0 {
			t.Errorf("%s: no runbook_url", file)
		}
		for _, m := range urls {
			u, err := url.Parse(string(m[1]))
			if err != nil || u.Scheme != "https" || u.Host == "" || u.Fragment == "" {
				t.Errorf("%s: runbook_url %q is not an https link with an anchor", file, m[1])
				continue
			}
			if base, anchor, _ := strings.Cut(string(m[1]), "#"); base != runbookBase ||
				!regexp.MustCompile(`(?mi)^### `+regexp.QuoteMeta(anchor)+`$`).Match(doc) {
				t.Errorf("%s: runbook_url %q: want %s#<the anchor of a runbook entry>", file, m[1], runbookBase)
			}
		}
	}
}

// TestRunbookSaysFailModeAlertsOutlastTheOutage: an alert on the rate of
// fail-mode answers fires on after Redis is back, until the last of them
// leaves its rate's range; its runbook entry says for how long, read from
// the rule (the promtool case of SlidingRatelimitFailingOpen shows it).
func TestRunbookSaysFailModeAlertsOutlastTheOutage(t *testing.T) {
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"SlidingRatelimitFailingOpen", "SlidingRatelimitFailingClosed", "SlidingRatelimitCountingLocally"} {
		m := regexp.MustCompile(`- alert: ` + name + `\n\s+expr: .*\[(\d+)m\]`).FindSubmatch(rules)
		if m == nil {
			t.Errorf("%s: no rate over a range of minutes in %s", name, rulesFile)
			continue
		}
		_, entry, _ := strings.Cut(string(doc), "### "+name+"\n")
		entry, _, _ = strings.Cut(entry, "\n### ")
		entry = strings.Join(strings.Fields(entry), " ")
		if want := "up to " + string(m[1]) + " minutes after Redis is back"; !strings.Contains(entry, want) {
			t.Errorf("%s: its runbook entry does not say it fires %q:\n%s", name, want, entry)
		}
	}
}

// dashboardQueries are the expressions of the dashboard's panels.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var exprs []string
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			exprs = append(exprs, target.Expr)
		}
	}
	if len(exprs) < 10 {
		t.Fatalf("found %d queries in %s", len(exprs), dashboardFile)
	}
	return exprs
}

// promServer is a real Prometheus the test started.
type promServer struct {
	t    *testing.T
	base string
}

// startPrometheus runs Prometheus in its own directory on a free port,
// scraping the test Caddy's admin endpoint every second and evaluating
// rules.yml every second.
func startPrometheus(t *testing.T) *promServer {
	t.Helper()
	bin := tool(t, "prometheus")
	dir := t.TempDir()
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: caddy
    static_configs:
      - targets: ["localhost:2999"]
`, rules)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logFile.Close()
		if t.Failed() {
			logs, _ := os.ReadFile(logFile.Name())
			t.Logf("Prometheus's log:\n%s", logs)
		}
	})
	p := &promServer{t: t, base: "http://" + addr}
	p.waitFor("Prometheus ready", func() bool {
		res, err := http.Get(p.base + "/-/ready")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	return p
}

// waitFor polls cond for up to a minute (a busy machine is slow).
func (p *promServer) waitFor(what string, cond func() bool) {
	p.t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(250 * time.Millisecond) {
		if time.Now().After(deadline) {
			p.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// series is one element of an instant vector.
type series struct {
	Metric map[string]string
	Value  [2]any
}

// query runs an instant query and returns its vector.
func (p *promServer) query(expr string) []series {
	p.t.Helper()
	res, err := http.Get(p.base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		p.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	var answer struct {
		Status string
		Error  string
		Data   struct {
			ResultType string
			Result     []series
		}
	}
	if err := json.Unmarshal(body, &answer); err != nil || answer.Status != "success" {
		p.t.Fatalf("query %s: %s %s", expr, answer.Error, body)
	}
	if answer.Data.ResultType != "vector" {
		p.t.Fatalf("query %s: result type %s", expr, answer.Data.ResultType)
	}
	return answer.Data.Result
}

// monitoredSite has a zone of each kind the dashboard shows: one that
// denies, one that waits, a concurrency zone and one that counts units;
// and one with a soft limit, another in report mode.
func monitoredSite(redisURL, prefix, api, soft string) string {
	return `:9080 {
	sliding_ratelimit {
		key {http.request.header.X-Client}
		redis ` + redisURL + `
		key_prefix ` + prefix + `
		fail_mode open
		zone ` + api + ` 1m 3 {
			match {
				path /api/*
			}
		}
		zone hooks 1s 1 {
			wait 3s
			match {
				path /hooks/*
			}
		}
		zone reports {
			concurrent 2
			match {
				path /reports/*
			}
		}
		zone llm {
			window 1m
			max_requests {http.vars.quota} 1000
			cost 5
			settle header X-Usage
			match {
				path /llm/*
			}
		}
		zone spend 1d 10000000 {
			cost llm 100
			settle llm
			price listed-model input 1 output 2
			match {
				path /spend/*
			}
		}
		zone ` + soft + ` 1m 10 {
			warn 80%
			match {
				path /soft/*
			}
		}
		zone trial 1m 1 {
			mode report
			match {
				path /soft/*
			}
		}
	}
	# A priced call's answer reports audio, which no line prices.
	respond /spend/* ` + "`" + `{"usage": {"prompt_tokens": 1, "completion_tokens": 2, "completion_tokens_details": {"audio_tokens": 1}}}` + "`" + `
	respond "ok"
}
`
}

// TestMonitoringAgainstPrometheus runs a real Prometheus, with rules.yml,
// against a real Caddy under traffic (admissions, denials, waits, leases,
// units, and a Redis outage), then checks that every series the rules and
// the dashboard select exists, with the labels they use, that each dashboard
// query returns data, that the rules evaluate without error and that the
// fail-open alert goes pending in the outage. No label carries a client key.
func TestMonitoringAgainstPrometheus(t *testing.T) {
	srv := redistest.Start(t)
	// The counters are the process's, kept across configs: a zone name of
	// its own starts this test's at 0.
	api, soft := uniqueZone("api"), uniqueZone("soft")
	startCaddy(t, monitoredSite(srv.URL(), uniquePrefix(t), api, soft))
	prom := startPrometheus(t)
	// A scrape before the soft limit is reached: increase() needs the 0.
	prom.waitFor("a scrape of the soft limit's counter at 0", func() bool {
		return len(prom.query(`caddy_sliding_ratelimit_soft_limit_reached_total{zone="`+soft+`"} == 0`)) == 1
	})

	const client = "client-key-of-a-watched-tenant"
	from := withHeader("X-Client", client)
	for range 5 {
		send(t, site+"api/x", from) // 3 admitted, 2 denied
	}
	send(t, site+"hooks/x", from)
	send(t, site+"hooks/x", from) // held for about a second
	send(t, site+"reports/x", from)
	send(t, site+"llm/x", from)
	// A priced call of a model no line prices: spend, an unpriced call and
	// unpriced usage.
	send(t, site+"spend/v1/chat/completions", from, withMethod(http.MethodPost), withBody("application/json", `{"model": "unlisted-model", "max_tokens": 10}`))
	prom.waitFor("a scrape with the denials", func() bool {
		return len(prom.query(`caddy_sliding_ratelimit_decisions_total{zone="`+api+`",result="denied"} == 2`)) == 1
	})
	// 8 of 10 is the soft limit's 80%; the report zone would deny 7.
	for range 8 {
		send(t, site+"soft/x", from)
	}
	prom.waitFor("the soft limit's alert firing", func() bool {
		return len(prom.query(`ALERTS{alertname="SlidingRatelimitSoftLimitReached",alertstate="firing",zone="`+soft+`"}`)) == 1
	})

	// The outage: Redis stops; the api zone fails open for a client the deny
	// cache does not hold.
	srv.Stop()
	other := withHeader("X-Client", client+"-2")
	prom.waitFor("the fail-open alert pending", func() bool {
		send(t, site+"api/x", other)
		return len(prom.query(`ALERTS{alertname="SlidingRatelimitFailingOpen",zone="`+api+`"}`)) == 1
	})
	prom.waitFor("the breaker's alert pending", func() bool {
		send(t, site+"api/x", other)
		return len(prom.query(`ALERTS{alertname="SlidingRatelimitCircuitOpen"}`)) == 1
	})

	// Every selector of the rules and the dashboard finds series: the
	// metric names, the labels they match and the values.
	rules, _ := os.ReadFile(rulesFile)
	sources := append([]string{string(rules)}, dashboardQueries(t)...)
	selector := regexp.MustCompile(`caddy_sliding_ratelimit_[a-z_]+(\{[^}]*\})?`)
	grouping := regexp.MustCompile(`by \(([a-z_, ]+)\)`)
	var selectors, labels []string
	for _, src := range sources {
		src = strings.ReplaceAll(src, `"$zone"`, `".*"`)
		for _, s := range selector.FindAllString(src, -1) {
			if !slices.Contains(selectors, s) {
				selectors = append(selectors, s)
			}
		}
		for _, m := range grouping.FindAllStringSubmatch(src, -1) {
			for _, l := range strings.Split(m[1], ",") {
				if l = strings.TrimSpace(l); !slices.Contains(labels, l) {
					labels = append(labels, l)
				}
			}
		}
	}
	for _, s := range selectors {
		if len(prom.query(s)) == 0 {
			t.Errorf("no series for %s (used by the rules or the dashboard)", s)
		}
	}
	for _, l := range labels {
		if len(prom.query(`{__name__=~"caddy_sliding_ratelimit_.+",`+l+`!=""}`)) == 0 {
			t.Errorf("no series of the module has the label %s that the rules or the dashboard group by", l)
		}
	}

	// Each dashboard query, as Grafana would send it over the last minute.
	for _, expr := range dashboardQueries(t) {
		expr = strings.NewReplacer("$__rate_interval", "1m", `"$zone"`, `".*"`).Replace(expr)
		if len(prom.query(expr)) == 0 {
			t.Errorf("dashboard query returns no data: %s", expr)
		}
	}

	// The rules evaluate without error.
	res, err := http.Get(prom.base + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	var rulesAnswer struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name, Health, LastError string
				}
			}
		}
	}
	err = json.NewDecoder(res.Body).Decode(&rulesAnswer)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	evaluated := 0
	for _, g := range rulesAnswer.Data.Groups {
		for _, r := range g.Rules {
			evaluated++
			if r.Health != "ok" {
				t.Errorf("rule %s: health %q %s", r.Name, r.Health, r.LastError)
			}
		}
	}
	if want := len(alertNames(t)) + 4; evaluated != want {
		t.Errorf("Prometheus loaded %d rules, want %d", evaluated, want)
	}

	// No label of the module's series carries the client key, and each
	// label is one of a bounded few.
	for _, s := range prom.query(`{__name__=~"caddy_sliding_ratelimit_.+"}`) {
		for name, value := range s.Metric {
			if strings.Contains(value, client) {
				t.Errorf("%v: label %s carries the client key", s.Metric, name)
			}
			if !slices.Contains([]string{"__name__", "instance", "job", "zone", "result", "redis", "le", "reason", "kind"}, name) {
				t.Errorf("%v: unexpected label %s", s.Metric, name)
			}
		}
	}
}
