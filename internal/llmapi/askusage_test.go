package llmapi

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"strings"
	"testing"
)

// TestAskUsage: a streamed chat request comes out asking for its usage,
// every spelling of stream_options that a lenient server may take
// included, and with everything else as it was; a request that does not
// stream, or already asks, or is no object, comes out as it went in.
func TestAskUsage(t *testing.T) {
	const msgs = `"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "stream_options \"stream\": true"}], "max_tokens": 1e2`
	cases := []struct {
		name, body string
		asked      bool
		// options are the stream_options values wanted, by key.
		options map[string]string
	}{
		{"streams, no options", `{` + msgs + `, "stream": true}`, true, map[string]string{"stream_options": `{"include_usage":true}`}},
		{"streams, include_usage false", `{"stream":true,` + msgs + `, "stream_options" : { "include_usage" : false, "continuous_usage_stats": true } }`, true,
			map[string]string{"stream_options": `{"continuous_usage_stats":true,"include_usage":true}`}},
		{"streams, options null", `{"stream": true, "stream_options": null, ` + msgs + `}`, true, map[string]string{"stream_options": `{"include_usage":true}`}},
		{"streams, options empty", `{"stream": true, "stream_options": {}, ` + msgs + `}`, true, map[string]string{"stream_options": `{"include_usage":true}`}},
		{"streams, a spelling asks and another does not", `{"stream": true, "stream_options": {"include_usage": true}, "Stream_Options": {"include_usage": 0}, ` + msgs + `}`, true,
			map[string]string{"stream_options": `{"include_usage":true}`, "Stream_Options": `{"include_usage":true}`}},
		{"streams, include_usage in two spellings", `{"stream": true, "stream_options": {"include_usage": true, "INCLUDE_USAGE": false}, ` + msgs + `}`, true,
			map[string]string{"stream_options": `{"include_usage":true}`}},
		{"streams under another spelling", `{"STREAM": true, ` + msgs + `}`, true, map[string]string{"stream_options": `{"include_usage":true}`}},
		{"already asks", `{"stream": true, "stream_options": {"include_usage": true}, ` + msgs + `}`, false, nil},
		{"already asks, another spelling", `{"stream": true, "stream_options": {"Include_Usage": true}, ` + msgs + `}`, false, nil},
		{"does not stream", `{` + msgs + `, "stream": false}`, false, nil},
		{"stream is not the boolean", `{` + msgs + `, "stream": "true"}`, false, nil},
		{"no stream", `{` + msgs + `}`, false, nil},
		{"options of another type are left", `{"stream": true, "stream_options": "include_usage", ` + msgs + `}`, true, map[string]string{"stream_options": `"include_usage"`}},
		{"no object", `[{"stream": true}]`, false, nil},
		{"not JSON", `{"stream": true, `, false, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, asked := AskUsage([]byte(c.body))
			if asked != c.asked {
				t.Fatalf("asked %v, want %v: %s", asked, c.asked, got)
			}
			if !asked {
				if string(got) != c.body {
					t.Fatalf("changed to %s", got)
				}
				return
			}
			var before, after map[string]json.RawMessage
			if err := json.Unmarshal([]byte(c.body), &before); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(got, &after); err != nil {
				t.Fatalf("%s: %v", got, err)
			}
			for k, v := range c.options {
				if string(after[k]) != v {
					t.Errorf("%s: %s, want %s (in %s)", k, after[k], v, got)
				}
				delete(after, k)
				delete(before, k)
			}
			if len(after) != len(before) {
				t.Errorf("keys %v, want %v", after, before)
			}
			for k, v := range before {
				if !bytes.Equal(after[k], v) {
					t.Errorf("%s: %s, want %s as it was", k, after[k], v)
				}
			}
			// Outside stream_options, the body is what it was, byte for
			// byte.
			if i := strings.Index(c.body, `"messages"`); !bytes.Contains(got, []byte(c.body[i:i+len(msgs)-len(`"model": "gpt-4o-mini", `)])) {
				t.Errorf("%s lost %s", got, c.body[i:])
			}
			if again, asked := AskUsage(got); asked && c.name != "options of another type are left" {
				t.Errorf("asking again changes it: %s", again)
			}
		})
	}
}

// TestUsageChunkFilter: what the client gets of a stream whose usage was
// asked for is the stream but for the usage chunk, whatever the pieces it
// comes in: the chunks of content, an Azure chunk of filter results with
// no choices and no usage, a chunk with choices and a running usage
// (vLLM's continuous_usage_stats), comments, an event larger than the
// filter holds, [DONE], and an event cut short all go on.
func TestUsageChunkFilter(t *testing.T) {
	content := func(s string) string {
		return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + s + `"},"finish_reason":null}],"usage":null}` + "\n\n"
	}
	usageChunk := "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\r\ndata: \"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\r\n\r\n"
	kept := []string{
		`data: {"choices":[],"prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}]}` + "\n\n",
		": keep-alive\n\n",
		content("Hello"),
		`data: {"choices":[{"index":0,"delta":{"content":"usage"}}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}` + "\n\n",
		content(strings.Repeat("x", maxHeldEvent+100)),
		`data: {"choices":[],"usage":null}` + "\n\n",
		content(`\"choices\":[],\"usage\":{}`),
	}
	var in, want strings.Builder
	for _, k := range kept {
		in.WriteString(k)
		want.WriteString(k)
	}
	in.WriteString(usageChunk)
	in.WriteString("data: [DONE]\n\n")
	want.WriteString("data: [DONE]\n\n")
	in.WriteString("data: {\"choices\":[],\"usage\":{\"total_tokens\":1}}\n")
	want.WriteString("data: {\"choices\":[],\"usage\":{\"total_tokens\":1}}\n")
	for seed := range int64(30) {
		rng := rand.New(rand.NewSource(seed))
		var out bytes.Buffer
		f := NewUsageChunkFilter(&out)
		for rest := []byte(in.String()); len(rest) > 0; {
			n := min(len(rest), 1+rng.Intn(300))
			if rng.Intn(4) == 0 {
				n = min(len(rest), 1+rng.Intn(3*maxHeldEvent))
			}
			if got, err := f.Write(rest[:n]); got != n || err != nil {
				t.Fatalf("seed %d: wrote %d of %d: %v", seed, got, n, err)
			}
			rest = rest[n:]
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if out.String() != want.String() {
			g, w := out.String(), want.String()
			i := 0
			for i < min(len(g), len(w)) && g[i] == w[i] {
				i++
			}
			t.Fatalf("seed %d: %d bytes, want %d; from byte %d got %.200q, want %.200q", seed, len(g), len(w), i, g[i:], w[i:])
		}
	}
}

// TestUsageChunkFilterAllocs: the filter allocates nothing per byte nor per
// chunk of content once warm.
func TestUsageChunkFilterAllocs(t *testing.T) {
	small, large := chatStream(4<<10), chatStream(64<<10)
	allocs := func(pieces [][]byte) float64 {
		return testing.AllocsPerRun(20, func() {
			f := NewUsageChunkFilter(discard{})
			for _, p := range pieces {
				f.Write(p)
			}
			f.Close()
		})
	}
	if a, b := allocs(small), allocs(large); b > a+allocSlack {
		t.Errorf("%.0f allocations for 64 KB of stream, %.0f for 4 KB", b, a)
	}
}

type discard struct{}

func (discard) Write(b []byte) (int, error) { return len(b), nil }

// FuzzAskUsage: a body that is one JSON value stays one when asked, the
// answer asks (asking again changes nothing, but for a stream_options of
// another type, which stays as it was), and the keys other than
// stream_options keep their values.
func FuzzAskUsage(f *testing.F) {
	f.Add([]byte(`{"stream": true, "messages": []}`))
	f.Add([]byte(`{"stream": true, "stream_options": {"include_usage": false, "x": [1, {"y": "\u00e9"}]}, "Stream_Options": null}`))
	f.Add([]byte(`{"STREAM": true, "stream_options": {"include_usage": true}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, asked := AskUsage(body)
		if !asked {
			if !bytes.Equal(got, body) {
				t.Fatalf("not asked, yet changed: %q to %q", body, got)
			}
			return
		}
		if !json.Valid(body) {
			return
		}
		var before, after map[string]json.RawMessage
		if json.Unmarshal(body, &before) != nil {
			return
		}
		if err := json.Unmarshal(got, &after); err != nil {
			t.Fatalf("%q asked is no JSON: %q: %v", body, got, err)
		}
		for k, v := range before {
			if !strings.EqualFold(k, "stream_options") && !bytes.Equal(after[k], v) {
				t.Fatalf("%q asked: %s is %s, was %s", body, k, after[k], v)
			}
		}
		if again, asked := AskUsage(got); asked && !bytes.Equal(again, got) {
			t.Fatalf("%q asked twice: %q, then %q", body, got, again)
		}
	})
}

// BenchmarkUsageChunkFilter passes a chat completion stream of 64 KB, in
// the pieces a proxy passes on, through the filter.
func BenchmarkUsageChunkFilter(b *testing.B) {
	pieces := chatStream(64 << 10)
	size := 0
	for _, p := range pieces {
		size += len(p)
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	f := NewUsageChunkFilter(discard{})
	for b.Loop() {
		for _, p := range pieces {
			f.Write(p)
		}
	}
}
