package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The llm scenario: streamed answers shaped as an LLM API's (server-sent
// events, usage in the last one), proxied by Caddy from an upstream in this
// tool, through four sites in turn: without the limiter, with `settle
// header X-Usage` (the upstream reports usage in a trailer), with `settle
// json usage.total_tokens` (the limiter reads the usage from the stream as
// it passes), and the AI gateway recipe (gateway.go: `cost llm` reads the
// request body, `settle llm` the stream). Every site gets the same call, an
// OpenAI chat completions request, through the same reverse_proxy. It
// measures what reading the bodies adds: the time to the first event as a
// client sees it, and Caddy's CPU per call. It runs after the other
// scenarios, on sites it adds through the admin API, as the waits scenario
// does; the load comes from this tool (a first byte is what wrk cannot
// time).
const (
	llmClients = 16
	// llmEvents is the events of an answer: a few hundred tokens' worth of
	// chunks of a chat completion stream, then the usage and [DONE].
	llmEvents = 60
	llmPrefix = "srlllm:"
	// llmKeys is how many API keys (and X-Client values) the calls cycle
	// through.
	llmKeys = 10_000
	// llmPath is the path of every call: OpenAI's, which cost llm and
	// settle llm read as Chat Completions.
	llmPath = "/v1/chat/completions"
)

// llmRequest is the body of every call: a streamed OpenAI chat completion
// that asks for its usage, as the OpenAI SDKs send it.
const llmRequest = `{"model": "gpt-4o-mini", "messages": [` +
	`{"role": "developer", "content": "You are a concise assistant for a support desk. Answer in plain text, in at most three sentences, and say so when you do not know."}, ` +
	`{"role": "user", "content": "My invoice for March shows two charges for the same subscription. How do I get one of them refunded, and how long does it take?"}], ` +
	`"max_completion_tokens": 512, "temperature": 0.2, "stream": true, "stream_options": {"include_usage": true}}`

// llmSites are the scenario's sites, in the order they are loaded.
var llmSites = []string{"plain", "header", "json", gatewaySite}

// llmRun is one run of the scenario on one site.
type llmRun struct {
	site         string
	calls, other int64
	elapsed      time.Duration
	ttfb50       time.Duration
	ttfb99       time.Duration
	total50      time.Duration
	cpu          cpuUse
	// reqBytes and respBytes are the body bytes of the counted calls:
	// what the client sent and what it received.
	reqBytes, respBytes int64
	// metrics are the gateway site's counters during the run (nil on the
	// other sites).
	metrics zoneCounters
}

func (r llmRun) caddyUsecPerCall() float64 {
	if r.calls == 0 {
		return math.NaN()
	}
	return r.cpu.caddySeconds * 1e6 / float64(r.calls)
}

// llmUpstream serves every request an event stream of llmEvents chunks and
// one with usage, flushed one by one, and the usage in an X-Usage trailer.
func llmUpstream() (*http.Server, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	var chunk bytes.Buffer
	chunk.WriteString(`data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": " token"}, "finish_reason": null}], "usage": null}` + "\n\n")
	last := `data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 60, "total_tokens": 80}}` + "\n\ndata: [DONE]\n\n"
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Trailer", "X-Usage")
		f := w.(http.Flusher)
		for range llmEvents {
			w.Write(chunk.Bytes())
			f.Flush()
		}
		w.Write([]byte(last))
		w.Header().Set("X-Usage", "80")
	})}
	go srv.Serve(ln)
	return srv, ln.Addr().String(), nil
}

// llmSite is the JSON server of one of llmSites, proxying to upstream.
// Every site has the same reverse_proxy: the AI gateway recipe's (plain
// answers, no second place for a key), flushing each event.
func llmSite(site string, port int, upstream, redisURL string) ([]byte, error) {
	proxy := map[string]any{
		"handler": "reverse_proxy", "upstreams": []any{map[string]any{"dial": upstream}}, "flush_interval": -1,
		"headers": map[string]any{"request": map[string]any{"delete": []string{"Accept-Encoding", "X-Api-Key", "X-Goog-Api-Key"}}},
	}
	handle := []any{proxy}
	switch site {
	case "plain":
	case gatewaySite:
		handle = []any{gatewayLimiter(redisURL, llmPrefix+site+":"), proxy}
	default:
		settle := map[string]any{"header": "X-Usage"}
		if site == "json" {
			settle = map[string]any{"json": []string{"usage.total_tokens"}}
		}
		limiter := map[string]any{
			"handler": "sliding_ratelimit", "window": "1m", "max_requests": 1_000_000_000, "cost": "100",
			"settle": settle, "key": "{http.request.header.X-Client}", "redis": redisURL, "key_prefix": llmPrefix + site + ":",
		}
		handle = []any{limiter, proxy}
	}
	return json.Marshal(map[string]any{
		"listen": []string{"127.0.0.1:" + strconv.Itoa(port)},
		"routes": []any{map[string]any{"handle": handle}},
	})
}

// runLLM adds the scenario's sites to Caddy and loads each cfg.runs times,
// the sites in turn.
func runLLM(ctx context.Context, cfg config, meter *cpuMeter, admin, redisURL string) ([]llmRun, error) {
	up, upstream, err := llmUpstream()
	if err != nil {
		return nil, err
	}
	defer up.Close()
	urls := map[string]string{}
	for _, site := range llmSites {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		body, err := llmSite(site, port, upstream, redisURL)
		if err != nil {
			return nil, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, admin+"/config/apps/http/servers/srlllm"+site, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, fmt.Errorf("adding the llm site %s: %w", site, err)
		}
		answer, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("adding the llm site %s: %s %s", site, res.Status, answer)
		}
		urls[site] = fmt.Sprintf("http://127.0.0.1:%d%s", port, llmPath)
		if err := getOK(ctx, urls[site], "srlbench-ready"); err != nil {
			return nil, err
		}
	}
	var runs []llmRun
	for i := 0; i < cfg.runs; i++ {
		for _, site := range llmSites {
			meter.settle(ctx, cfg.settle)
			var before zoneCounters
			if site == gatewaySite {
				if before, err = readZoneCounters(ctx, admin, gatewayZone); err != nil {
					return runs, err
				}
			}
			run, err := loadLLM(ctx, cfg, meter, site, urls[site])
			if err != nil {
				return runs, err
			}
			if site == gatewaySite {
				// Settling follows the end of each answer: give the last
				// calls' a moment to be counted.
				time.Sleep(250 * time.Millisecond)
				after, err := readZoneCounters(ctx, admin, gatewayZone)
				if err != nil {
					return runs, err
				}
				run.metrics = after.sub(before)
			}
			say("%-12s run %d/%d: %-6s %6.0f calls/s, first event p50 %s p99 %s, whole answer p50 %s, Caddy CPU %.1f us/call",
				"llm", i+1, cfg.runs, site, float64(run.calls)/run.elapsed.Seconds(), ms(run.ttfb50), ms(run.ttfb99), ms(run.total50), run.caddyUsecPerCall())
			runs = append(runs, run)
		}
	}
	return runs, nil
}

// loadLLM keeps llmClients calls in flight for cfg.duration, timing the
// first event and the whole answer of each.
func loadLLM(ctx context.Context, cfg config, meter *cpuMeter, site, url string) (llmRun, error) {
	run := llmRun{site: site}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: llmClients, DisableCompression: true}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	cpuBefore := meter.snap()
	deadline := time.Now().Add(cfg.duration)
	var calls, other, n, reqBytes, respBytes atomic.Int64
	var mu sync.Mutex
	var firsts, totals []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	for range llmClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var myFirsts, myTotals []time.Duration
			buf := make([]byte, 32<<10)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				body := &countingReader{r: strings.NewReader(llmRequest)}
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
				if err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					return
				}
				req.ContentLength = int64(len(llmRequest))
				key := strconv.FormatInt(n.Add(1)%llmKeys, 10)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", llmAPIKey(key))
				req.Header.Set("X-Client", "llm-"+key)
				sent := time.Now()
				res, err := client.Do(req)
				if err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					return
				}
				got, err := io.ReadAtLeast(res.Body, buf[:1], 1)
				first := time.Since(sent)
				if err == nil {
					var rest int64
					rest, err = io.CopyBuffer(io.Discard, res.Body, buf)
					got += int(rest)
				}
				res.Body.Close()
				total := time.Since(sent)
				if err != nil || res.StatusCode != http.StatusOK {
					other.Add(1)
					continue
				}
				if time.Now().After(deadline) {
					break
				}
				reqBytes.Add(body.n)
				respBytes.Add(int64(got))
				calls.Add(1)
				myFirsts, myTotals = append(myFirsts, first), append(myTotals, total)
			}
			mu.Lock()
			firsts, totals = append(firsts, myFirsts...), append(totals, myTotals...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	run.elapsed = cfg.duration
	run.cpu = meter.use(cpuBefore, meter.snap(), 0)
	if firstErr != nil {
		return run, firstErr
	}
	run.calls, run.other = calls.Load(), other.Load()
	run.reqBytes, run.respBytes = reqBytes.Load(), respBytes.Load()
	slices.Sort(firsts)
	slices.Sort(totals)
	if len(firsts) > 0 {
		run.ttfb50, run.ttfb99, run.total50 = firsts[len(firsts)/2], firsts[len(firsts)*99/100], totals[len(totals)/2]
	}
	return run, nil
}

// countingReader counts the bytes read from r: a request body as the
// transport sends it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// llmAPIKey is the Authorization header of the key'th API key: a bearer
// token as long as OpenAI's project keys, so that the limiter stores it
// hashed, as it would theirs.
func llmAPIKey(key string) string {
	return "Bearer sk-proj-srlbench" + strings.Repeat("0", 60-len(key)) + key
}

// llmMedian is the median over the runs of site of f.
func (r report) llmMedian(site string, f func(llmRun) float64) float64 {
	var xs []float64
	for _, run := range r.llm {
		if run.site == site {
			xs = append(xs, f(run))
		}
	}
	return median(xs)
}

func (l llmRun) callsPerSecond() float64 { return float64(l.calls) / l.elapsed.Seconds() }

// llmSection reports the scenario: medians over its runs, per site, and
// what settle json adds to settle header and to no limiter.
func (r report) llmSection(p func(string, ...any)) {
	if len(r.llm) == 0 {
		return
	}
	med := r.llmMedian
	ttfb := func(l llmRun) float64 { return float64(l.ttfb50) }
	p("## LLM streams")
	p("")
	p("%d clients, each with one call in flight, POST the same OpenAI chat completions request (%d bytes: `model`,", llmClients, len(llmRequest))
	p("`messages`, `max_completion_tokens`, `stream: true`, `stream_options: {\"include_usage\": true}`) to `%s`", llmPath)
	p("through the same `reverse_proxy` (`flush_interval -1`, the AI gateway recipe's `header_up` deletions) of an")
	p("upstream in the bench tool that streams %d server-sent events of a chat completion, each flushed, then one", llmEvents)
	p("with the usage and `[DONE]`, and the usage in an `X-Usage` trailer. Four sites in turn: no limiter; `cost 100`")
	p("and `settle header X-Usage`; `cost 100` and `settle json usage.total_tokens`, which reads the usage from the")
	p("stream as it passes; the AI gateway recipe (`cost llm` + `settle llm`, below). First event: from sending the")
	p("call to its first body byte. Medians of %d runs of %s.", len(r.llm)/len(llmSites), r.cfg.duration)
	p("")
	p("| | no limiter | settle header | settle json | AI gateway |")
	p("|---|--:|--:|--:|--:|")
	row := func(name string, f func(llmRun) float64, format func(float64) string) {
		p("| %s | %s | %s | %s | %s |", name, format(med("plain", f)), format(med("header", f)), format(med("json", f)), format(med(gatewaySite, f)))
	}
	asMs := func(x float64) string { return ms(time.Duration(x)) }
	row("calls/s", llmRun.callsPerSecond, thousands)
	row("first event p50", ttfb, asMs)
	row("first event p99", func(l llmRun) float64 { return float64(l.ttfb99) }, asMs)
	row("whole answer p50", func(l llmRun) float64 { return float64(l.total50) }, asMs)
	row("Caddy CPU us/call", llmRun.caddyUsecPerCall, func(x float64) string { return num(x, 1) })
	p("")
	p("settle json against settle header: first event %+.3f ms, Caddy CPU %+.1f us/call.",
		(med("json", ttfb)-med("header", ttfb))/1e6, med("json", llmRun.caddyUsecPerCall)-med("header", llmRun.caddyUsecPerCall))
	p("")
}

// llmCPUs is each site's median Caddy CPU per call, for -only llm.
func (r report) llmCPUs() string {
	var parts []string
	for _, site := range llmSites {
		parts = append(parts, fmt.Sprintf("%s %.1f (%.0f calls/s)", site, r.llmMedian(site, llmRun.caddyUsecPerCall), r.llmMedian(site, llmRun.callsPerSecond)))
	}
	return strings.Join(parts, ", ")
}
