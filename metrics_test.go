package slidingratelimit

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// eventRecorder is an events handler module for tests: it records the
// exceeded events it is sent.
type eventRecorder struct{}

var recordedEvents struct {
	sync.Mutex
	data []map[string]any
}

func (eventRecorder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "events.handlers.sliding_ratelimit_test_recorder",
		New: func() caddy.Module { return new(eventRecorder) },
	}
}

func (eventRecorder) Handle(_ context.Context, e caddy.Event) error {
	recordedEvents.Lock()
	defer recordedEvents.Unlock()
	recordedEvents.data = append(recordedEvents.data, e.Data)
	return nil
}

func init() { caddy.RegisterModule(eventRecorder{}) }

// observedConfig is a JSON config with one limited site, an events app that
// records exceeded events, and Caddy's metrics.
func observedConfig(zone, prefix, body string) string {
	return `{
	"admin": {"listen": "localhost:2999"},
	"apps": {
		"events": {"subscriptions": [{
			"events": ["sliding_ratelimit.exceeded"],
			"handlers": [{"handler": "sliding_ratelimit_test_recorder"}]
		}]},
		"http": {
			"http_port": 9080,
			"grace_period": 1,
			"servers": {"srv0": {
				"listen": [":9080"],
				"metrics": {},
				"routes": [{"handle": [
					{"handler": "sliding_ratelimit", "zones": [{"name": "` + zone + `", "window": "10s", "max_requests": 3}],
					 "key": "{http.request.header.X-Client}",
					 "redis": "` + sharedRedis.URL() + `", "key_prefix": "` + prefix + `"},
					{"handler": "static_response", "body": "` + body + `"}
				]}]
			}}
		}
	}
}`
}

// scrape returns the value of one series on the admin endpoint's /metrics.
func scrape(t *testing.T, series string) float64 {
	t.Helper()
	res, err := http.Get("http://localhost:2999/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	text, _ := io.ReadAll(res.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(text)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestMetricsAndEvents(t *testing.T) {
	zone := "m" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	prefix := uniquePrefix(t)
	startCaddy(t, observedConfig(zone, prefix, "v1"), asJSON())
	recordedEvents.Lock()
	recordedEvents.data = nil
	recordedEvents.Unlock()

	// 3 admitted, then 4 denied: the first denial from Redis, 3 from the
	// deny cache.
	for i := 0; i < 7; i++ {
		send(t, "http://localhost:9080/", withHeader("X-Client", "watched"))
	}
	series := func(result string) string {
		return `caddy_sliding_ratelimit_decisions_total{result="` + result + `",zone="` + zone + `"}`
	}
	hits := `caddy_sliding_ratelimit_deny_cache_hits_total{zone="` + zone + `"}`
	check := func(when string, allowed, denied, cacheHits float64) {
		t.Helper()
		if got := scrape(t, series("allowed")); got != allowed {
			t.Errorf("%s: allowed = %v, want %v", when, got, allowed)
		}
		if got := scrape(t, series("denied")); got != denied {
			t.Errorf("%s: denied = %v, want %v", when, got, denied)
		}
		if got := scrape(t, hits); got != cacheHits {
			t.Errorf("%s: deny cache hits = %v, want %v", when, got, cacheHits)
		}
	}
	check("after 7 requests", 3, 4, 3)
	if got := scrape(t, "caddy_sliding_ratelimit_redis_duration_seconds_count"); got < 4 {
		t.Errorf("redis_duration_seconds_count = %v, want at least the 4 Redis calls", got)
	}

	// Once per block: one event for the four denials.
	recordedEvents.Lock()
	events := append([]map[string]any(nil), recordedEvents.data...)
	recordedEvents.Unlock()
	if len(events) != 1 {
		t.Fatalf("%d exceeded events for one block, want 1: %v", len(events), events)
	}
	if events[0]["zone"] != zone {
		t.Errorf("event data %v, want zone %s", events[0], zone)
	}
	if retry, _ := events[0]["retry_after"].(float64); retry <= 0 || retry > 10 {
		t.Errorf("event retry_after %v, want in (0, 10] seconds", events[0]["retry_after"])
	}
	for _, e := range events {
		for k, v := range e {
			if s, ok := v.(string); ok && strings.Contains(s, "watched") {
				t.Errorf("event field %s carries the client key", k)
			}
		}
	}

	// A reload keeps the counts, and counting goes on. The new config has a
	// new, empty deny cache, so its first denial comes from Redis.
	startCaddy(t, observedConfig(zone, prefix, "v2"), asJSON())
	check("after a reload", 3, 4, 3)
	send(t, "http://localhost:9080/", withHeader("X-Client", "watched"))
	send(t, "http://localhost:9080/", withHeader("X-Client", "watched"))
	check("after a reload and two more denials", 3, 6, 4)
}

// otlpReceiver is an OTLP/HTTP trace receiver (protobuf), the protocol
// Caddy's tracing exports with when OTEL_EXPORTER_OTLP_PROTOCOL is
// http/protobuf: it keeps the spans it is sent, by name.
type otlpReceiver struct {
	url   string
	mu    sync.Mutex
	spans map[string]*tracepb.Span
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &otlpReceiver{url: "http://" + ln.Addr().String(), spans: map[string]*tracepb.Span{}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &req)
		}
		if r.URL.Path != "/v1/traces" || err != nil {
			t.Errorf("OTLP receiver: %s %s: %v", r.Method, r.URL.Path, err)
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		rec.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					rec.spans[s.Name] = s
				}
			}
		}
		rec.mu.Unlock()
		answer, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(answer)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return rec
}

// span waits for the span of that name (Caddy's batcher exports every
// OTEL_BSP_SCHEDULE_DELAY).
func (rec *otlpReceiver) span(t *testing.T, name string) *tracepb.Span {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		rec.mu.Lock()
		s := rec.spans[name]
		rec.mu.Unlock()
		if s != nil {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("no span %q received", name)
		}
	}
}

// limitAttrs are a span's attributes (or an event's) of the module, without
// the prefix, as strings.
func limitAttrs(attrs []*commonpb.KeyValue) map[string]string {
	out := map[string]string{}
	for _, kv := range attrs {
		if name, ok := strings.CutPrefix(kv.Key, traceAttrPrefix); ok {
			out[name] = anyValue(kv.Value)
		}
	}
	return out
}

func anyValue(v *commonpb.AnyValue) string {
	switch v := v.Value.(type) {
	case *commonpb.AnyValue_StringValue:
		return v.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(v.IntValue, 10)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(v.DoubleValue, 'g', -1, 64)
	case *commonpb.AnyValue_BoolValue:
		if v.BoolValue {
			return "true"
		}
		return "false"
	case *commonpb.AnyValue_ArrayValue:
		var parts []string
		for _, e := range v.ArrayValue.Values {
			parts = append(parts, anyValue(e))
		}
		return "[" + strings.Join(parts, " ") + "]"
	}
	return "?"
}

// TestDecisionOnTheSpan runs Caddy's tracing with a real OTLP exporter to a
// receiver of the test: each request's span carries its decision, a denial
// adds an event, an outage says the fail mode; no attribute has the client
// key.
func TestDecisionOnTheSpan(t *testing.T) {
	rec := startOTLPReceiver(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rec.url)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	srv := redistest.Start(t)
	startCaddy(t, `:9080 {
	tracing {
		span {http.request.uri.path}
	}
	sliding_ratelimit {
		key {http.request.header.X-Client}
		redis `+srv.URL()+`
		key_prefix `+uniquePrefix(t)+`
		zone api 1m 2 {
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
		zone tokens 1m 100 {
			cost 7
			match {
				path /tokens/*
			}
		}
	}
	respond "ok"
}
`)
	const client = "client-key-in-no-span"
	from := withHeader("X-Client", client)
	send(t, site+"api/1", from)
	send(t, site+"api/2", from)
	send(t, site+"api/3", from)
	send(t, site+"hooks/1", from)
	send(t, site+"hooks/2", from) // held for its slot, about a second
	send(t, site+"tokens/1", from)

	check := func(name string, want map[string]string) map[string]string {
		t.Helper()
		got := limitAttrs(rec.span(t, name).Attributes)
		for k, v := range want {
			if got[k] != v {
				t.Errorf("span %s: %s%s = %q, want %q (all: %v)", name, traceAttrPrefix, k, got[k], v, got)
			}
		}
		for k, v := range got {
			if strings.Contains(v, client) {
				t.Errorf("span %s: %s%s carries the client key", name, traceAttrPrefix, k)
			}
		}
		return got
	}
	check("/api/1", map[string]string{"zone": "api", "zones": "[api]", "outcome": "allowed", "remaining": "1",
		"units": "1", "unit": "requests", "mode": "enforce", "retry_after": "", "wait": "", "fail_mode": ""})
	check("/api/2", map[string]string{"outcome": "allowed", "remaining": "0"})
	denied := check("/api/3", map[string]string{"zone": "api", "outcome": "denied", "remaining": "0"})
	if retry := parseSeconds(t, denied["retry_after"]); retry <= 0 || retry > 60 {
		t.Errorf("denied span: retry_after %v, want in (0, 60] seconds", retry)
	}
	events := rec.span(t, "/api/3").Events
	if len(events) != 1 || events[0].Name != deniedEvent {
		t.Fatalf("denied span: events %v, want one %s", events, deniedEvent)
	}
	if got := limitAttrs(events[0].Attributes); got["zone"] != "api" || parseSeconds(t, got["retry_after"]) <= 0 {
		t.Errorf("denied event: %v, want zone api and a retry_after", got)
	}
	if n := len(rec.span(t, "/api/1").Events); n != 0 {
		t.Errorf("an admitted request's span has %d events", n)
	}
	check("/hooks/1", map[string]string{"zone": "hooks", "outcome": "allowed", "wait": ""})
	held := check("/hooks/2", map[string]string{"zone": "hooks", "outcome": "allowed"})
	if wait := parseSeconds(t, held["wait"]); wait <= 0 || wait > 1 {
		t.Errorf("held request: wait %v, want in (0, 1] seconds", wait)
	}
	check("/tokens/1", map[string]string{"zone": "tokens", "outcome": "allowed", "units": "7", "remaining": "93"})

	// Redis goes away: fail_mode open, said on the span.
	srv.Stop()
	send(t, site+"api/outage", withHeader("X-Client", client+"-2"))
	check("/api/outage", map[string]string{"zone": "api", "outcome": "failed_open", "fail_mode": "open"})
}

func parseSeconds(t *testing.T, s string) float64 {
	t.Helper()
	if s == "" {
		return 0
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("seconds %q: %v", s, err)
	}
	return f
}

// TestTracingOffBuildsNothing: without a recording span the decision costs
// no allocation (BenchmarkTraceDecision shows its time).
func TestTracingOffBuildsNothing(t *testing.T) {
	r, req := tracedRequest(t)
	if n := testing.AllocsPerRun(1000, func() { traceDecision(r, req, 0, fromStore, modeEnforce) }); n != 0 {
		t.Errorf("traceDecision without tracing: %v allocations, want 0", n)
	}
}

// tracedRequest is a request with one decided zone, and no span.
func tracedRequest(tb testing.TB) (*http.Request, *request) {
	tb.Helper()
	r, err := http.NewRequest(http.MethodGet, "http://example.com/", nil)
	if err != nil {
		tb.Fatal(err)
	}
	z := &Zone{Name: "api"}
	req := &request{zones: []*Zone{z}}
	req.checks = req.checksBuf[:1]
	req.decisions = req.decisionsBuf[:1]
	req.decisions[0].Allowed = true
	return r, req
}

// BenchmarkTraceDecision: off, the call is a context lookup (compare
// the empty call); on, with a recording span, what the attributes cost.
func BenchmarkTraceDecision(b *testing.B) {
	r, req := tracedRequest(b)
	b.Run("none", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = trace.SpanFromContext(r.Context())
		}
	})
	b.Run("off", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			traceDecision(r, req, 0, fromStore, modeEnforce)
		}
	})
}

// TestRedisEvictionsSeen: a Redis at its maxmemory with allkeys-lru evicts
// limit keys without a word to its clients; the connection reads its
// evicted_keys, so the evictions show on Caddy's /metrics as
// redis_evicted_keys_total of that Redis, as many as INFO stats says, and
// Caddy's log says once (at most a line a minute) what they cost and what
// to do.
func TestRedisEvictionsSeen(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client(t)
	ctx := context.Background()
	logFile := startCaddy(t, `
:9080 {
	sliding_ratelimit {
		key {http.request.header.X-Client}
		window 1m
		max_requests 3
		redis `+srv.URL()+`
	}
	respond "ok"
}`)
	series := `caddy_sliding_ratelimit_redis_evicted_keys_total{redis="` + srv.Addr() + `"}`
	if !strings.Contains(scrapeText(t), series+" 0") {
		t.Fatalf("no %s at 0 on /metrics before any eviction", series)
	}
	for i := range 200 {
		send(t, site, withHeader("X-Client", fmt.Sprintf("client-%d", i)))
	}
	used := infoNumber(t, rc, "memory", "used_memory")
	for _, kv := range [][2]string{{"maxmemory-policy", "allkeys-lru"}, {"maxmemory", strconv.FormatFloat(used+1<<20, 'f', -1, 64)}} {
		if err := rc.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Other data fills the Redis: the limit keys, used least recently,
	// go first.
	value := strings.Repeat("v", 16<<10)
	for i := range 200 {
		if err := rc.Set(ctx, fmt.Sprintf("cache:%d", i), value, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Room again: a Redis over its maxmemory goes on evicting in the
	// background after the last write.
	if err := rc.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	evicted := infoNumber(t, rc, "stats", "evicted_keys")
	if evicted < 100 {
		t.Fatalf("redis evicted %v keys, want the fill to evict", evicted)
	}
	left, err := rc.Keys(ctx, "srl:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("redis evicted %v keys; %d of the 200 clients' limit keys are left", evicted, len(left))

	// The connection reads every 5 seconds.
	deadline := time.Now().Add(15 * time.Second)
	for scrape(t, series) < evicted && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if got := scrape(t, series); got != evicted {
		t.Errorf("%s = %v, INFO stats evicted_keys %v", series, got, evicted)
	}
	lines := logLines(t, logFile, "redis evicted keys")
	if len(lines) != 1 {
		t.Fatalf("%d eviction warnings, want 1: %q", len(lines), lines)
	}
	for _, want := range []string{`"level":"warn"`, `"redis":"` + srv.Addr() + `"`, `"evicted_keys":` + strconv.FormatFloat(evicted, 'f', -1, 64),
		"restarted a client's limit", "noeviction"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("warning %s does not say %s", lines[0], want)
		}
	}
}

// scrapeText is Caddy's /metrics.
func scrapeText(t *testing.T) string {
	t.Helper()
	res, err := http.Get("http://localhost:2999/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	text, _ := io.ReadAll(res.Body)
	return string(text)
}

// infoNumber is the number of field in section of c's INFO.
func infoNumber(t *testing.T, c redis.Cmdable, section, field string) float64 {
	t.Helper()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if value, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatalf("INFO %s %s: %v", section, field, err)
			}
			return n
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return 0
}
