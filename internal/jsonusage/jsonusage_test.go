package jsonusage

import (
	"math/rand"
	"strings"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
)

// TestJSONUsageReader: the paths' last numbers from the top of each
// document or event, summed, whatever the pieces the body comes in.
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
		{"from the top only", total, "application/json", `{"response": {"output": [{"usage": {"total_tokens": 1}}], "usage": {"total_tokens": 77}}}`, 0, strictnum.Missing},
		{"a path that names the nesting", []string{"response.usage.total_tokens"}, "application/json", `{"response": {"output": [{"usage": {"total_tokens": 1}}], "usage": {"total_tokens": 77}}}`, 77, ""},
		{"keys of consecutive objects only", total, "application/json", `{"usage": {"x": {"total_tokens": 5}}, "total_tokens": 6}`, 0, strictnum.Missing},
		{"through an array, no", total, "application/json", `{"usage": [{"total_tokens": 5}]}`, 0, strictnum.Missing},
		{"a nested zero usage after the real one", total, "application/json", `{"usage": {"total_tokens": 42}, "choices": [{"usage": {"total_tokens": 0}}], "x": {"usage": {"total_tokens": 0}}}`, 42, ""},
		{"a nested zero usage in a later event", total, sse,
			"data: {\"usage\": {\"total_tokens\": 42}}\n\ndata: {\"choices\": [{\"delta\": {\"usage\": {\"total_tokens\": 0}}}], \"x\": {\"usage\": {\"total_tokens\": 0}}}\n\n", 42, ""},
		{"a nested usage before the real one", total, "application/json", `{"more": {"usage": {"total_tokens": 9}}, "usage": {"total_tokens": 5}}`, 5, ""},
		{"the elements of a top-level array", []string{"usageMetadata.totalTokenCount"}, "application/json",
			"[{\"usageMetadata\": {\"totalTokenCount\": 9}}\n,\r\n{\"usageMetadata\": {\"totalTokenCount\": 58}, \"candidates\": [{\"usageMetadata\": {\"totalTokenCount\": 0}}]}\n]", 58, ""},
		{"strings and nulls are no numbers", total, "application/json", `{"usage": {"total_tokens": 5}, "usage": {"total_tokens": "99"}, "usage": {"total_tokens": null}}`, 5, ""},
		{"a usage in a string is text", total, "application/json", `{"content": "{\"usage\": {\"total_tokens\": 999}}", "usage": {"total_tokens": 3}}`, 3, ""},
		{"an escaped key matches nothing", total, "application/json", `{"usage": {"total\u005ftokens": 50}}`, 0, strictnum.Missing},
		{"negative", total, "application/json", `{"usage": {"total_tokens": -5}}`, 0, strictnum.NotWhole},
		{"fraction", total, "application/json", `{"usage": {"total_tokens": 1.5}}`, 0, strictnum.NotWhole},
		{"exponent", total, "application/json", `{"usage": {"total_tokens": 1e3}}`, 0, strictnum.NotWhole},
		{"too long", total, "application/json", `{"usage": {"total_tokens": ` + strings.Repeat("9", 40) + `}}`, 0, strictnum.NotWhole},
		{"huge saturates", total, "application/json", `{"usage": {"total_tokens": 99999999999999999999}}`, strictnum.Max, ""},
		{"zero", total, "application/json", `{"usage": {"total_tokens": 0}}`, 0, ""},
		{"a document cut short", total, "application/json", `{"usage": {"total_tokens": 42}`, 0, strictnum.Missing},
		{"not JSON after the number", total, "application/json", `{"usage": {"total_tokens": 42 x}}`, 0, strictnum.Missing},
		{"too deep", total, "application/json", strings.Repeat(`{"a": `, 70) + `{"usage": {"total_tokens": 1}}` + strings.Repeat("}", 70), 0, strictnum.Missing},
		{"a long key", total, "application/json", `{"` + strings.Repeat("k", 100) + `": {"usage": {"total_tokens": 1}}, "usage": {"total_tokens": 8}}`, 8, ""},
		{"two paths", anthropic, "application/json", `{"usage": {"input_tokens": 10, "output_tokens": 32}}`, 42, ""},
		{"one path of two", anthropic, "application/json", `{"usage": {"output_tokens": 32}}`, 32, ""},
		{"newline-delimited documents", []string{"eval_count", "prompt_eval_count"}, "application/x-ndjson",
			"{\"message\": {\"content\": \"a\"}}\n{\"done\": true, \"prompt_eval_count\": 5, \"eval_count\": 7}\n", 12, ""},
		{"events", append(anthropic, "message.usage.input_tokens"), sse,
			"event: message_start\ndata: {\"type\": \"message_start\", \"message\": {\"usage\": {\"input_tokens\": 25, \"output_tokens\": 1}}}\n\n" +
				"event: content_block_delta\ndata: {\"delta\": {\"text\": \"usage\"}}\n\n" +
				": a comment\n\nevent: message_delta\r\ndata: {\"type\": \"message_delta\", \"usage\": {\"output_tokens\": 15}}\r\n\r\n" +
				"event: message_stop\rdata: {\"type\": \"message_stop\"}\r\r", 40, ""},
		{"message_start's usage is not at the top", anthropic, sse,
			"data: {\"type\": \"message_start\", \"message\": {\"usage\": {\"input_tokens\": 25, \"output_tokens\": 1}}}\n\n" +
				"data: {\"type\": \"message_delta\", \"usage\": {\"output_tokens\": 15}}\n\n", 15, ""},
		{"data over lines", total, sse, "data: {\"usage\":\ndata: {\"total_tokens\": 6}}\n\n", 6, ""},
		{"data without a space", total, sse, "data:{\"usage\":{\"total_tokens\":6}}\n\ndata: [DONE]\n\n", 6, ""},
		{"an event cut short", total, sse, "data: {\"usage\": {\"total_tokens\": 6}}\n\ndata: {\"usage\": {\"total_tokens\": 9}", 6, ""},
		{"another field is no data", total, sse, "id: {\"usage\": {\"total_tokens\": 6}}\ndatas: {\"usage\": {\"total_tokens\": 7}}\n\n", 0, strictnum.Missing},
		{"an event read whole, then a broken one", total, sse, "data: {\"usage\": {\"total_tokens\": 6}}\n\ndata: {\"usage\": {\"total_tokens\": 9}} }\n\n", 9, ""},
		{"a stream without usage", total, sse, "data: {\"choices\": [{\"delta\": {\"content\": \"hi\"}}], \"usage\": null}\n\ndata: [DONE]\n\n", 0, strictnum.Missing},
		{"an event stream typed as JSON is read as events", total, "application/json", "data: {\"usage\": {\"total_tokens\": 6}}\n\n", 6, ""},
		{"a document typed as events is read as JSON", total, sse, `{"usage": {"total_tokens": 6}}`, 6, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for seed := range int64(20) {
				got, why := readUsage(t, c.paths, c.contentType, c.body, rand.New(rand.NewSource(seed)))
				if got != c.want || why != c.why {
					t.Fatalf("seed %d: %d %q, want %d %q", seed, got, why, c.want, c.why)
				}
			}
		})
	}
	u := New([][]string{{"usage", "total_tokens"}}, "application/json", "gzip")
	u.Write([]byte(`{"usage": {"total_tokens": 6}}`))
	if got, why := u.Total(); why != Encoded {
		t.Errorf("a gzip body: %d %q, want %q", got, why, Encoded)
	}
}

// TestJSONUsageReaderKeepsLittle: a reader of a 4 MiB document and of 10,000
// events allocates a few kilobytes, whatever the body's size.
func TestJSONUsageReaderKeepsLittle(t *testing.T) {
	doc := `{"content": "` + strings.Repeat("x", 4<<20) + `", "items": [` + strings.Repeat(`{"a": [1, 2, {"b": "c"}]}, `, 1000) + `0], "usage": {"total_tokens": 5}}`
	events := strings.Repeat("data: {\"choices\": [{\"delta\": {\"content\": \"hello\"}}]}\n\n", 10000) + "data: {\"usage\": {\"total_tokens\": 5}}\n\n"
	for _, c := range []struct{ contentType, body string }{{"application/json", doc}, {"text/event-stream", events}} {
		var u *Usage
		body := []byte(c.body) // converted once: the reader's allocations are counted, not the test's
		allocs := testing.AllocsPerRun(3, func() {
			u = New([][]string{{"usage", "total_tokens"}}, c.contentType, "")
			for i := 0; i < len(body); i += 4096 {
				u.Write(body[i:min(i+4096, len(body))])
			}
		})
		if n, why := u.Total(); n != 5 || why != "" {
			t.Errorf("%s: %d %q, want 5", c.contentType, n, why)
		}
		if allocs > 20 {
			t.Errorf("%s: %v allocations reading %d bytes, want a handful", c.contentType, allocs, len(c.body))
		}
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
		whole := New(paths, contentType, "")
		whole.Write(body)
		n1, why1 := whole.Total()
		step := int(piece%16) + 1
		pieces := New(paths, contentType, "")
		for i := 0; i < len(body); i += step {
			pieces.Write(body[i:min(i+step, len(body))])
		}
		if n2, why2 := pieces.Total(); n1 != n2 || why1 != why2 {
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
		u := New(paths, "text/event-stream", "")
		for _, c := range chunks {
			u.Write([]byte(c))
		}
		if n, _ := u.Total(); n != 80 {
			b.Fatal(n)
		}
	}
}

// readUsage feeds body to a reader of paths in pieces of random sizes (1
// byte included) and returns its total, or why none.
func readUsage(t *testing.T, paths []string, contentType, body string, rng *rand.Rand) (int64, string) {
	t.Helper()
	split := make([][]string, len(paths))
	for i, p := range paths {
		split[i] = strings.Split(p, ".")
	}
	u := New(split, contentType, "")
	for rest := []byte(body); len(rest) > 0; {
		n := min(len(rest), 1+rng.Intn(7))
		if rng.Intn(3) == 0 {
			n = 1
		}
		u.Write(rest[:n])
		rest = rest[n:]
	}
	return u.Total()
}
