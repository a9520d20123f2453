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
// tool, through three sites in turn: without the limiter, with `settle
// header X-Usage` (the upstream reports usage in a trailer), and with
// `settle json usage.total_tokens` (the limiter reads the usage from the
// stream as it passes). It measures what reading the stream adds: the time
// to the first event as a client sees it, and Caddy's CPU per call. It runs
// after the other scenarios, on sites it adds through the admin API, as the
// waits scenario does; the load comes from this tool (a first byte is
// what wrk cannot time).
const (
	llmClients = 16
	// llmEvents is the events of an answer: a few hundred tokens' worth of
	// chunks of a chat completion stream, then the usage and [DONE].
	llmEvents = 60
	llmPrefix = "srlllm:"
)

// llmSites are the scenario's sites, in the order they are loaded.
var llmSites = []string{"plain", "header", "json"}

// llmRun is one run of the scenario on one site.
type llmRun struct {
	site         string
	calls, other int64
	elapsed      time.Duration
	ttfb50       time.Duration
	ttfb99       time.Duration
	total50      time.Duration
	cpu          cpuUse
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
func llmSite(site string, port int, upstream, redisURL string) ([]byte, error) {
	proxy := map[string]any{"handler": "reverse_proxy", "upstreams": []any{map[string]any{"dial": upstream}}, "flush_interval": -1}
	handle := []any{proxy}
	if site != "plain" {
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
		urls[site] = fmt.Sprintf("http://127.0.0.1:%d/", port)
		if err := getOK(ctx, urls[site], "srlbench-ready"); err != nil {
			return nil, err
		}
	}
	var runs []llmRun
	for i := 0; i < cfg.runs; i++ {
		for _, site := range llmSites {
			meter.settle(ctx, cfg.settle)
			run, err := loadLLM(ctx, cfg, meter, site, urls[site])
			if err != nil {
				return runs, err
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
	var calls, other, n atomic.Int64
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
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"model": "m", "stream": true}`))
				if err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					return
				}
				req.Header.Set("X-Client", "llm-"+strconv.FormatInt(n.Add(1)%10000, 10))
				sent := time.Now()
				res, err := client.Do(req)
				if err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					return
				}
				_, err = io.ReadAtLeast(res.Body, buf[:1], 1)
				first := time.Since(sent)
				if err == nil {
					_, err = io.CopyBuffer(io.Discard, res.Body, buf)
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
	slices.Sort(firsts)
	slices.Sort(totals)
	if len(firsts) > 0 {
		run.ttfb50, run.ttfb99, run.total50 = firsts[len(firsts)/2], firsts[len(firsts)*99/100], totals[len(totals)/2]
	}
	return run, nil
}

// llmSection reports the scenario: medians over its runs, per site, and
// what settle json adds to settle header and to no limiter.
func (r report) llmSection(p func(string, ...any)) {
	if len(r.llm) == 0 {
		return
	}
	med := func(site string, f func(llmRun) float64) float64 {
		var xs []float64
		for _, run := range r.llm {
			if run.site == site {
				xs = append(xs, f(run))
			}
		}
		return median(xs)
	}
	ttfb := func(l llmRun) float64 { return float64(l.ttfb50) }
	p("## LLM streams")
	p("")
	p("%d clients, each with one call in flight, POST to a `reverse_proxy` (`flush_interval -1`) of an upstream in", llmClients)
	p("the bench tool that streams %d server-sent events of a chat completion, each flushed, then one with the", llmEvents)
	p("usage and `[DONE]`, and the usage in an `X-Usage` trailer. Three sites in turn: no limiter; `cost 100` and")
	p("`settle header X-Usage`; `cost 100` and `settle json usage.total_tokens`, which reads the usage from the")
	p("stream as it passes. First event: from sending the call to its first body byte. Medians of %d runs of %s.", len(r.llm)/len(llmSites), r.cfg.duration)
	p("")
	p("| | no limiter | settle header | settle json |")
	p("|---|--:|--:|--:|")
	row := func(name string, f func(llmRun) float64, format func(float64) string) {
		p("| %s | %s | %s | %s |", name, format(med("plain", f)), format(med("header", f)), format(med("json", f)))
	}
	asMs := func(x float64) string { return ms(time.Duration(x)) }
	row("calls/s", func(l llmRun) float64 { return float64(l.calls) / l.elapsed.Seconds() }, thousands)
	row("first event p50", ttfb, asMs)
	row("first event p99", func(l llmRun) float64 { return float64(l.ttfb99) }, asMs)
	row("whole answer p50", func(l llmRun) float64 { return float64(l.total50) }, asMs)
	row("Caddy CPU us/call", llmRun.caddyUsecPerCall, func(x float64) string { return num(x, 1) })
	p("")
	p("settle json against settle header: first event %+.3f ms, Caddy CPU %+.1f us/call.",
		(med("json", ttfb)-med("header", ttfb))/1e6, med("json", llmRun.caddyUsecPerCall)-med("header", llmRun.caddyUsecPerCall))
	p("")
}
