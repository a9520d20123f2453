package llmapi

import (
	"fmt"
	"strings"
	"testing"
)

// allocSlack is how many more allocations a body 16 times larger may take:
// a reader that allocates per byte, per event or per document takes
// thousands more.
const allocSlack = 4

// chatStream is an OpenAI chat completion stream of at least size bytes, in
// the pieces a proxy passes on (one event each, as the server flushes
// them): chunks of content, then the usage chunk and [DONE].
func chatStream(size int) [][]byte {
	chunk := `data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n"
	last := `data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}` + "\n\ndata: [DONE]\n\n"
	var pieces [][]byte
	n := len(last)
	for ; n < size; n += len(chunk) {
		pieces = append(pieces, []byte(chunk))
	}
	return append(pieces, []byte(last))
}

// chatRequest is an OpenAI chat completions request of at least size
// bytes: a streamed call asking for its usage, its conversation so far in
// messages.
func chatRequest(size int) []byte {
	turn := `{"role": "user", "content": "Summarise the paragraph below in two sentences, keeping every figure: \"The quarterly report shows revenue up 12% to $4.1M, costs flat.\""}, {"role": "assistant", "content": "Revenue rose 12% to $4.1M. Costs did not change."}, `
	var b strings.Builder
	b.WriteString(`{"model": "gpt-4o-mini", "messages": [{"role": "developer", "content": "You are a helpful assistant."}, `)
	for b.Len() < size {
		b.WriteString(turn)
	}
	b.WriteString(`{"role": "user", "content": "Hello!"}], "max_completion_tokens": 1000, "stream": true, "stream_options": {"include_usage": true}}`)
	return []byte(b.String())
}

// usageReaders are the readers of a response that settle llm and settle
// json use, each reading a chat completion stream whose usage totals 11.
var usageReaders = []struct {
	name string
	read func(pieces [][]byte) int64
}{
	{"settle llm, openai_chat", func(pieces [][]byte) int64 {
		u := NewUsageReader(OpenAIChat, "text/event-stream", "")
		for _, p := range pieces {
			u.Write(p)
		}
		got, _ := u.Usage()
		return got.Total()
	}},
	{"settle llm, unknown path", func(pieces [][]byte) int64 {
		u := NewUsageReader(Unknown, "text/event-stream", "")
		for _, p := range pieces {
			u.Write(p)
		}
		got, _ := u.Usage()
		return got.Total()
	}},
	{"settle json usage.total_tokens", func(pieces [][]byte) int64 {
		p := NewPathReader([][]string{{"usage", "total_tokens"}}, "text/event-stream", "")
		for _, piece := range pieces {
			p.Write(piece)
		}
		n, _ := p.Sum()
		return n
	}},
}

// TestAllocsDoNotGrowWithBody: reading a stream of 64 KB takes no more
// allocations than reading one of 4 KB, and reading a request body of
// 64 KB no more than reading one of a few hundred bytes (allocSlack aside):
// the readers keep no part of a body and allocate nothing per byte, event
// or message.
func TestAllocsDoNotGrowWithBody(t *testing.T) {
	for _, r := range usageReaders {
		t.Run(r.name, func(t *testing.T) {
			allocs := map[int]float64{}
			for _, size := range []int{4 << 10, 64 << 10} {
				pieces := chatStream(size)
				if got := r.read(pieces); got != 11 {
					t.Fatalf("%d KB: usage %d, want 11", size>>10, got)
				}
				allocs[size] = testing.AllocsPerRun(20, func() { r.read(pieces) })
			}
			small, large := allocs[4<<10], allocs[64<<10]
			t.Logf("allocations: %v at 4 KB, %v at 64 KB", small, large)
			if large > small+allocSlack {
				t.Errorf("%v allocations reading 64 KB, %v reading 4 KB: they grow with the body", large, small)
			}
		})
	}
	t.Run("cost llm, request body", func(t *testing.T) {
		allocs := map[int]float64{}
		for _, size := range []int{0, 64 << 10} {
			body := chatRequest(size)
			r, err := ReadRequest("/v1/chat/completions", body, 4096)
			if err != nil || r.Output != 1000 || r.Input != int64(len(body)) || r.Model != "gpt-4o-mini" {
				t.Fatalf("%d bytes: %+v, %v", len(body), r, err)
			}
			allocs[size] = testing.AllocsPerRun(20, func() {
				if _, err := ReadRequest("/v1/chat/completions", body, 4096); err != nil {
					t.Fatal(err)
				}
			})
		}
		small, large := allocs[0], allocs[64<<10]
		t.Logf("allocations: %v for %d bytes, %v for %d bytes", small, len(chatRequest(0)), large, len(chatRequest(64<<10)))
		if large > small+allocSlack {
			t.Errorf("%v allocations reading 64 KB, %v reading a small body: they grow with the body", large, small)
		}
	})
}

// BenchmarkReadersPerKB is what a KB (1,024 bytes) of body costs each
// reader, at two sizes: ns/KB should not grow with the size, and allocs/op
// not at all.
func BenchmarkReadersPerKB(b *testing.B) {
	perKB := func(b *testing.B, size int) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(float64(size)/1024), "ns/KB")
	}
	for _, r := range usageReaders {
		for _, size := range []int{4 << 10, 64 << 10} {
			pieces := chatStream(size)
			n := 0
			for _, p := range pieces {
				n += len(p)
			}
			b.Run(fmt.Sprintf("%s/%dKB", r.name, size>>10), func(b *testing.B) {
				b.SetBytes(int64(n))
				b.ReportAllocs()
				for b.Loop() {
					r.read(pieces)
				}
				perKB(b, n)
			})
		}
	}
	for _, size := range []int{0, 64 << 10} {
		body := chatRequest(size)
		b.Run(fmt.Sprintf("cost llm, request body/%dB", len(body)), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ReadRequest("/v1/chat/completions", body, 4096); err != nil {
					b.Fatal(err)
				}
			}
			perKB(b, len(body))
		})
	}
}
