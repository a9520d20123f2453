package slidingratelimit

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// readUsage feeds body to a reader of paths in pieces of random sizes (1
// byte included) and returns its total, or why none.
func readUsage(t *testing.T, paths []string, contentType, body string, rng *rand.Rand) (int64, string) {
	t.Helper()
	s := &Settle{JSON: paths}
	s.provision()
	u := newJSONUsage(s.paths, contentType, "")
	for rest := []byte(body); len(rest) > 0; {
		n := min(len(rest), 1+rng.Intn(7))
		if rng.Intn(3) == 0 {
			n = 1
		}
		u.write(rest[:n])
		rest = rest[n:]
	}
	return u.total()
}

// TestJSONUsageReader: the paths' last numbers, summed, in documents and
// event streams, whatever the pieces the body comes in.
func TestJSONUsageReader(t *testing.T) {
	const sse = "text/event-stream; charset=utf-8"
	anthropic := []string{"usage.input_tokens", "usage.output_tokens"}
	total := []string{"usage.total_tokens"}
	cases := []struct {
		name        string
		paths       []string
		contentType string
		body        string
		want        int64
		why         string
	}{
		{"a document", total, "application/json", `{"id": "x", "usage": {"prompt_tokens": 3, "total_tokens": 42}}`, 42, ""},
		{"at any depth", total, "application/json", `{"response": {"output": [{"usage": {"total_tokens": 1}}], "usage": {"total_tokens": 77}}}`, 77, ""},
		{"keys of consecutive objects only", total, "application/json", `{"usage": {"x": {"total_tokens": 5}}, "total_tokens": 6}`, 0, valueMissing},
		{"through an array, no", total, "application/json", `{"usage": [{"total_tokens": 5}]}`, 0, valueMissing},
		{"the last number", total, "application/json", `{"usage": {"total_tokens": 5}, "more": {"usage": {"total_tokens": 9}}}`, 9, ""},
		{"strings and nulls are no numbers", total, "application/json", `{"usage": {"total_tokens": 5}, "x": {"usage": {"total_tokens": "99"}}, "y": {"usage": {"total_tokens": null}}}`, 5, ""},
		{"a usage in a string is text", total, "application/json", `{"content": "{\"usage\": {\"total_tokens\": 999}}", "usage": {"total_tokens": 3}}`, 3, ""},
		{"an escaped key matches nothing", total, "application/json", `{"usage": {"total\u005ftokens": 50}}`, 0, valueMissing},
		{"negative", total, "application/json", `{"usage": {"total_tokens": -5}}`, 0, valueNotWhole},
		{"fraction", total, "application/json", `{"usage": {"total_tokens": 1.5}}`, 0, valueNotWhole},
		{"exponent", total, "application/json", `{"usage": {"total_tokens": 1e3}}`, 0, valueNotWhole},
		{"too long", total, "application/json", `{"usage": {"total_tokens": ` + strings.Repeat("9", 40) + `}}`, 0, valueNotWhole},
		{"huge saturates", total, "application/json", `{"usage": {"total_tokens": 99999999999999999999}}`, maxCount, ""},
		{"zero", total, "application/json", `{"usage": {"total_tokens": 0}}`, 0, ""},
		{"a document cut short", total, "application/json", `{"usage": {"total_tokens": 42}`, 0, valueMissing},
		{"not JSON after the number", total, "application/json", `{"usage": {"total_tokens": 42 x}}`, 0, valueMissing},
		{"too deep", total, "application/json", strings.Repeat(`{"a": `, 70) + `{"usage": {"total_tokens": 1}}` + strings.Repeat("}", 70), 0, valueMissing},
		{"a long key", total, "application/json", `{"` + strings.Repeat("k", 100) + `": {"usage": {"total_tokens": 8}}}`, 8, ""},
		{"two paths", anthropic, "application/json", `{"usage": {"input_tokens": 10, "output_tokens": 32}}`, 42, ""},
		{"one path of two", anthropic, "application/json", `{"usage": {"output_tokens": 32}}`, 32, ""},
		{"newline-delimited documents", []string{"eval_count", "prompt_eval_count"}, "application/x-ndjson",
			"{\"message\": {\"content\": \"a\"}}\n{\"done\": true, \"prompt_eval_count\": 5, \"eval_count\": 7}\n", 12, ""},
		{"events", anthropic, sse,
			"event: message_start\ndata: {\"type\": \"message_start\", \"message\": {\"usage\": {\"input_tokens\": 25, \"output_tokens\": 1}}}\n\n" +
				"event: content_block_delta\ndata: {\"delta\": {\"text\": \"usage\"}}\n\n" +
				": a comment\n\nevent: message_delta\r\ndata: {\"type\": \"message_delta\", \"usage\": {\"output_tokens\": 15}}\r\n\r\n" +
				"event: message_stop\rdata: {\"type\": \"message_stop\"}\r\r", 40, ""},
		{"data over lines", total, sse, "data: {\"usage\":\ndata: {\"total_tokens\": 6}}\n\n", 6, ""},
		{"data without a space", total, sse, "data:{\"usage\":{\"total_tokens\":6}}\n\ndata: [DONE]\n\n", 6, ""},
		{"an event cut short", total, sse, "data: {\"usage\": {\"total_tokens\": 6}}\n\ndata: {\"usage\": {\"total_tokens\": 9}", 6, ""},
		{"another field is no data", total, sse, "id: {\"usage\": {\"total_tokens\": 6}}\ndatas: {\"usage\": {\"total_tokens\": 7}}\n\n", 0, valueMissing},
		{"an event read whole, then a broken one", total, sse, "data: {\"usage\": {\"total_tokens\": 6}}\n\ndata: {\"usage\": {\"total_tokens\": 9}} }\n\n", 9, ""},
		{"a stream without usage", total, sse, "data: {\"choices\": [{\"delta\": {\"content\": \"hi\"}}], \"usage\": null}\n\ndata: [DONE]\n\n", 0, valueMissing},
		{"an event stream read as JSON", total, "application/json", "data: {\"usage\": {\"total_tokens\": 6}}\n\n", 0, valueMissing},
	}
	for _, c := range cases {
		for seed := range int64(20) {
			got, why := readUsage(t, c.paths, c.contentType, c.body, rand.New(rand.NewSource(seed)))
			if got != c.want || why != c.why {
				t.Errorf("%s (seed %d): %d %q, want %d %q", c.name, seed, got, why, c.want, c.why)
				break
			}
		}
	}
	u := newJSONUsage([][]string{{"usage", "total_tokens"}}, "application/json", "gzip")
	u.write([]byte(`{"usage": {"total_tokens": 6}}`))
	if got, why := u.total(); why != usageEncoded {
		t.Errorf("a gzip body: %d %q, want %q", got, why, usageEncoded)
	}
}

// TestJSONUsageReaderKeepsLittle: a reader of a 4 MiB document and of 10,000
// events allocates a few kilobytes, whatever the body's size.
func TestJSONUsageReaderKeepsLittle(t *testing.T) {
	doc := `{"content": "` + strings.Repeat("x", 4<<20) + `", "items": [` + strings.Repeat(`{"a": [1, 2, {"b": "c"}]}, `, 1000) + `0], "usage": {"total_tokens": 5}}`
	events := strings.Repeat("data: {\"choices\": [{\"delta\": {\"content\": \"hello\"}}]}\n\n", 10000) + "data: {\"usage\": {\"total_tokens\": 5}}\n\n"
	for _, c := range []struct{ contentType, body string }{{"application/json", doc}, {"text/event-stream", events}} {
		var u *jsonUsage
		allocs := testing.AllocsPerRun(3, func() {
			u = newJSONUsage([][]string{{"usage", "total_tokens"}}, c.contentType, "")
			for i := 0; i < len(c.body); i += 4096 {
				u.write([]byte(c.body[i:min(i+4096, len(c.body))]))
			}
		})
		if n, why := u.total(); n != 5 || why != "" {
			t.Errorf("%s: %d %q, want 5", c.contentType, n, why)
		}
		if allocs > 20 {
			t.Errorf("%s: %v allocations reading %d bytes, want a handful", c.contentType, allocs, len(c.body))
		}
	}
}

// TestSettleJSONThroughCaddy: real Caddy in front of the stand-in LLM API
// charges each call exactly the usage the API reported, in every shape, as
// a document and as a stream; a stream without usage, one the upstream
// breaks off, one the client leaves, and a compressed body keep their
// reservation and count as fallbacks.
func TestSettleJSONThroughCaddy(t *testing.T) {
	api, upstream := newLLMAPI(t)
	gz := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		zw.Write([]byte(`{"usage": {"prompt_tokens": 1, "completion_tokens": 2}}`))
		zw.Close()
	}))
	t.Cleanup(gz.Close)
	startCaddy(t, `
:9080 {
	route /gz/* {
		sliding_ratelimit {
			key {http.request.header.Authorization}
			zone gztokens 1m 100000 {
				cost 500
				settle json usage.prompt_tokens usage.completion_tokens
			}
			redis `+sharedRedis.URL()+`
			key_prefix `+uniquePrefix(t)+`
		}
		reverse_proxy `+strings.TrimPrefix(gz.URL, "http://")+`
	}
	route /v1/* {
		sliding_ratelimit {
			key {http.request.header.Authorization}
			zone sjtokens 1m 100000 {
				cost 500
				settle json usage.prompt_tokens usage.completion_tokens usage.input_tokens usage.output_tokens
			}
			redis `+sharedRedis.URL()+`
			key_prefix `+uniquePrefix(t)+`
		}
		reverse_proxy `+upstream+`
	}
}`, withGlobals(`
servers {
	metrics
}`))
	fallbacks := func() float64 {
		return scrape(t, `caddy_sliding_ratelimit_settle_fallbacks_total{zone="sjtokens"}`)
	}
	bodies := map[string]string{
		"/v1/chat/completions": `{"model": "m", "max_tokens": 30, "messages": [{"role": "user", "content": "say hello"}]%s}`,
		"/v1/responses":        `{"model": "m", "max_output_tokens": 30, "input": "say hello"%s}`,
		"/v1/messages":         `{"model": "m", "max_tokens": 30, "messages": [{"role": "user", "content": "say hello"}]%s}`,
	}
	n := 0
	for path, body := range bodies {
		for _, stream := range []string{"", `, "stream": true, "stream_options": {"include_usage": true}`} {
			n++
			key := fmt.Sprintf("Bearer sk-%d", n)
			before := fallbacks()
			a := send(t, site+strings.TrimPrefix(path, "/"), withMethod(http.MethodPost), withHeader("Authorization", key), withBody("application/json", fmt.Sprintf(body, stream)))
			reported, _ := api.usage(key)
			if a.status != http.StatusOK || reported == 0 {
				t.Fatalf("%s%s: status %d, %d tokens reported; body %s", path, stream, a.status, reported, a.body)
			}
			if got := unitsUsed(t, "sjtokens", key, reported); got != reported {
				t.Errorf("%s%s: %d tokens charged, want the %d reported", path, stream, got, reported)
			}
			if got := fallbacks() - before; got != 0 {
				t.Errorf("%s%s: %v settle fallbacks, want none", path, stream, got)
			}
		}
	}

	reserved := func(what, key string) {
		t.Helper()
		if got := unitsUsed(t, "sjtokens", key, 500); got != 500 {
			t.Errorf("%s: %d tokens charged, want the reservation 500", what, got)
		}
	}
	before := fallbacks()
	chat := site + "v1/chat/completions"
	a := send(t, chat, withMethod(http.MethodPost), withHeader("Authorization", "Bearer sk-nousage"),
		withBody("application/json", `{"model": "m", "max_tokens": 30, "messages": [{"content": "hi"}], "stream": true}`))
	if a.status != http.StatusOK || !strings.Contains(a.body, "data: [DONE]") {
		t.Fatalf("a stream without usage: status %d, body %q", a.status, a.body)
	}
	reserved("a stream without usage", "Bearer sk-nousage")

	// The upstream breaks off after message_start, which carries usage
	// (input tokens, and 1 output token): what was read is not the call's.
	req, _ := http.NewRequest(http.MethodPost, site+"v1/messages", strings.NewReader(`{"model": "m", "max_tokens": 30, "messages": [{"content": "hi"}], "stream": true}`))
	req.Header.Set("Authorization", "Bearer sk-cut")
	req.Header.Set("X-Test-Cut", "1")
	res, err := clientAt(t, "127.0.0.1").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(res.Body); err == nil || !strings.Contains(string(b), "message_start") {
		t.Errorf("a stream the upstream broke off: read %q, %v; want message_start and an error", b, err)
	}
	res.Body.Close()
	reserved("a stream the upstream broke off", "Bearer sk-cut")

	// The client reads message_start and leaves.
	req, _ = http.NewRequest(http.MethodPost, site+"v1/messages", strings.NewReader(`{"model": "m", "max_tokens": 30, "messages": [{"content": "hi"}], "stream": true}`))
	req.Header.Set("Authorization", "Bearer sk-left")
	req.Header.Set("X-Test-Pause", "300ms")
	res, err = clientAt(t, "127.0.0.2").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "event: message_start") {
		t.Fatalf("first line of the stream %q, %v", line, err)
	}
	res.Body.Close()
	reservedSoon(t, "Bearer sk-left")
	if got := fallbacks() - before; got != 3 {
		t.Errorf("%v settle fallbacks, want 3", got)
	}

	key := "Bearer sk-gz"
	send(t, site+"gz/x", withMethod(http.MethodPost), withHeader("Authorization", key), withBody("application/json", `{}`))
	if got := unitsUsed(t, "gztokens", key, 500); got != 500 {
		t.Errorf("a gzip body: %d tokens charged, want the reservation 500", got)
	}
}

// reservedSoon waits for the stream the client left to end (the API's
// pauses) and checks that it paid its reservation, 500.
func reservedSoon(t *testing.T, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := adminState(t, "sjtokens", key)
		if st.Count == 500 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("a stream the client left: %d tokens charged, want the reservation 500", st.Count)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSettleJSONPassesStreamsOn: the first event of a stream reaches the
// client while the upstream still holds the next; the client's bytes are
// the upstream's.
func TestSettleJSONPassesStreamsOn(t *testing.T) {
	release := make(chan struct{})
	first := "data: {\"choices\": [{\"delta\": {\"content\": \"Hel\"}}]}\n\n"
	last := "data: {\"usage\": {\"total_tokens\": 17}}\n\ndata: [DONE]\n\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte(first))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-time.After(20 * time.Second):
		}
		w.Write([]byte(last))
	}))
	t.Cleanup(up.Close)
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		key {http.request.header.Authorization}
		zone sjpass 1m 1000 {
			settle json usage.total_tokens
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
}`)
	req, _ := http.NewRequest(http.MethodPost, site, nil)
	req.Header.Set("Authorization", "k")
	res, err := clientAt(t, "127.0.0.1").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	buf := make([]byte, len(first))
	got := make(chan string, 1)
	go func() {
		n, _ := io.ReadFull(res.Body, buf)
		got <- string(buf[:n])
	}()
	select {
	case s := <-got:
		if s != first {
			t.Fatalf("first event %q, want %q", s, first)
		}
	case <-time.After(15 * time.Second):
		close(release)
		t.Fatal("the first event did not reach the client while the upstream held the next")
	}
	close(release)
	rest, _ := io.ReadAll(res.Body)
	if string(rest) != last {
		t.Errorf("rest of the stream %q, want %q", rest, last)
	}
	if used := unitsUsed(t, "sjpass", "k", 17); used != 17 {
		t.Errorf("%d units charged, want 17", used)
	}
	// The zone's state is named by what it settles to: a zone of that name
	// that settles otherwise keeps its own.
	if s := adminState(t, "sjpass", "k"); s.Unit != "units" || s.Identity != "sjpass:1m:1000:json-usage.total_tokens" {
		t.Errorf("admin state %+v, want unit units and identity sjpass:1m:1000:json-usage.total_tokens", s)
	}
}

// FuzzJSONUsage: no body makes the reader panic, and the pieces a body comes
// in never change what it reads.
func FuzzJSONUsage(f *testing.F) {
	f.Add([]byte(`{"usage": {"total_tokens": 42}}`), true, uint8(3))
	f.Add([]byte("data: {\"usage\": {\"total_tokens\": 6}}\r\n\r\ndata: [DONE]\n\n"), true, uint8(1))
	f.Add([]byte(`{"a": [{"usage": {"total_tokens": 1e3}}], "usage": {"total_tokens": "7"}}`), false, uint8(5))
	f.Fuzz(func(t *testing.T, body []byte, sse bool, piece uint8) {
		contentType := "application/json"
		if sse {
			contentType = "text/event-stream"
		}
		paths := [][]string{{"usage", "total_tokens"}, {"n"}}
		whole := newJSONUsage(paths, contentType, "")
		whole.write(body)
		n1, why1 := whole.total()
		step := int(piece%16) + 1
		pieces := newJSONUsage(paths, contentType, "")
		for i := 0; i < len(body); i += step {
			pieces.write(body[i:min(i+step, len(body))])
		}
		if n2, why2 := pieces.total(); n1 != n2 || why1 != why2 {
			t.Errorf("%q whole: %d %q; in pieces of %d: %d %q", body, n1, why1, step, n2, why2)
		}
	})
}

// BenchmarkJSONUsage reads a chat completion stream of 60 chunks and its
// usage, as the bench's llm scenario streams it.
func BenchmarkJSONUsage(b *testing.B) {
	body := strings.Repeat(`data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": " token"}, "finish_reason": null}], "usage": null}`+"\n\n", 60) +
		`data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 60, "total_tokens": 80}}` + "\n\ndata: [DONE]\n\n"
	chunks := strings.SplitAfter(body, "\n\n")
	paths := [][]string{{"usage", "total_tokens"}}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		u := newJSONUsage(paths, "text/event-stream", "")
		for _, c := range chunks {
			u.write([]byte(c))
		}
		if n, _ := u.total(); n != 80 {
			b.Fatal(n)
		}
	}
}
