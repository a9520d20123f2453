package llmtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// post sends body to the stand-in's path with key as a bearer token and
// the headers given, and returns the answer's status, headers and body
// (as much of it as came, and the error that ended it).
func post(t *testing.T, u *Upstream, path, key, body string, headers map[string]string) (int, http.Header, []byte, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

// sseEvent is a server-sent event.
type sseEvent struct {
	name string
	data []byte
}

// readSSE splits a text/event-stream into its events, with the line
// endings sep separates them by.
func readSSE(t *testing.T, b []byte, sep string) []sseEvent {
	t.Helper()
	var events []sseEvent
	for _, block := range strings.Split(strings.TrimSuffix(string(b), sep+sep), sep+sep) {
		var e sseEvent
		for _, line := range strings.Split(block, sep) {
			switch {
			case strings.HasPrefix(line, "event: "):
				e.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				e.data = []byte(strings.TrimPrefix(line, "data: "))
			default:
				t.Fatalf("line %q in %q", line, b)
			}
		}
		events = append(events, e)
	}
	return events
}

// decode decodes JSON, failing the test on an error.
func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return v
}

type openaiUsageJSON struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	TotalTokens         int64 `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

// TestOpenAIWire: chat completions and completions as OpenAI sends them,
// JSON and streamed.
func TestOpenAIWire(t *testing.T) {
	u := Start(t)
	t.Run("chat JSON", func(t *testing.T) {
		status, h, b, _ := post(t, u, "/v1/chat/completions", "k1", `{"model":"chat-model","messages":[{"role":"user","content":"hello"}],"max_tokens":40,"n":2}`,
			map[string]string{HeaderCacheRead: "30", HeaderReasoning: "5"})
		doc := decode[struct {
			ID, Object, Model string
			SystemFingerprint string `json:"system_fingerprint"`
			Created           int64
			Choices           []struct {
				Index   int
				Message struct{ Role, Content string }
				Finish  string `json:"finish_reason"`
			}
			Usage openaiUsageJSON
		}](t, b)
		u := doc.Usage
		if status != 200 || h.Get("Content-Type") != "application/json" || !strings.HasPrefix(doc.ID, "chatcmpl-") || doc.Object != "chat.completion" ||
			doc.Model != "chat-model" || doc.Created == 0 || !strings.HasPrefix(doc.SystemFingerprint, "fp_") || len(doc.Choices) != 2 ||
			doc.Choices[1].Index != 1 || doc.Choices[1].Message.Content != Text || doc.Choices[0].Message.Role != "assistant" || doc.Choices[0].Finish != "stop" {
			t.Errorf("%d %s", status, b)
		}
		if u.PromptTokens != 35 || u.PromptTokensDetails.CachedTokens != 30 || u.CompletionTokens != 80 || u.CompletionTokensDetails.ReasoningTokens != 5 || u.TotalTokens != 115 {
			t.Errorf("usage %+v, want 35 prompt (30 cached), 80 completion (5 reasoning), 115", u)
		}
	})
	t.Run("chat stream", func(t *testing.T) {
		for _, includeUsage := range []bool{false, true} {
			body := `{"model":"m","messages":[{"content":"hi"}],"max_tokens":10,"n":2,"stream":true,"stream_options":{"include_usage":` + map[bool]string{false: "false", true: "true"}[includeUsage] + `}}`
			status, h, b, err := post(t, u, "/v1/chat/completions", "k2", body, nil)
			events := readSSE(t, b, "\n")
			if status != 200 || err != nil || h.Get("Content-Type") != "text/event-stream; charset=utf-8" || string(events[len(events)-1].data) != "[DONE]" {
				t.Fatalf("%d %v %s", status, err, b)
			}
			texts := map[int]string{}
			var usage *openaiUsageJSON
			for i, e := range events[:len(events)-1] {
				var chunk struct {
					Object  string
					Choices []struct {
						Index int
						Delta struct{ Content string }
					}
					Usage json.RawMessage
				}
				if err := json.Unmarshal(e.data, &chunk); err != nil || chunk.Object != "chat.completion.chunk" {
					t.Fatalf("%s: %v", e.data, err)
				}
				hasUsage := bytes.Contains(e.data, []byte(`"usage":`))
				if hasUsage != includeUsage {
					t.Errorf("include_usage %v: chunk %s", includeUsage, e.data)
				}
				for _, c := range chunk.Choices {
					texts[c.Index] += c.Delta.Content
				}
				if string(chunk.Usage) != "null" && chunk.Usage != nil {
					if i != len(events)-2 || len(chunk.Choices) != 0 {
						t.Errorf("usage in chunk %d of %d: %s", i, len(events), e.data)
					}
					u := decode[openaiUsageJSON](t, chunk.Usage)
					usage = &u
				}
			}
			if texts[0] != Text || texts[1] != Text || len(texts) != 2 {
				t.Errorf("texts %v", texts)
			}
			if includeUsage && (usage == nil || usage.TotalTokens != 22) || !includeUsage && usage != nil {
				t.Errorf("include_usage %v: usage %+v, want 2 + 2 x 10 when asked", includeUsage, usage)
			}
		}
	})
	t.Run("completions", func(t *testing.T) {
		status, _, b, _ := post(t, u, "/v1/completions", "k3", `{"model":"text-model-instruct","prompt":["ab","cd"],"max_tokens":7,"n":2,"best_of":3}`, nil)
		doc := decode[struct {
			Object  string
			Choices []struct{ Text string }
			Usage   openaiUsageJSON
		}](t, b)
		if status != 200 || doc.Object != "text_completion" || len(doc.Choices) != 4 || doc.Choices[3].Text != Text || doc.Usage.CompletionTokens != 2*3*7 || doc.Usage.TotalTokens != 4+42 {
			t.Errorf("%d %s", status, b)
		}
		status, _, b, _ = post(t, u, "/v1/completions", "k3", `{"prompt":"ab","max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`, nil)
		events := readSSE(t, b, "\n")
		last := decode[struct {
			Choices []any
			Usage   openaiUsageJSON
		}](t, events[len(events)-2].data)
		if status != 200 || string(events[len(events)-1].data) != "[DONE]" || len(last.Choices) != 0 || last.Usage.TotalTokens != 9 {
			t.Errorf("%d %s", status, b)
		}
	})
}

// TestResponsesWire: the Responses API's events, in order, each named as
// its type, numbered, the usage in response.completed.
func TestResponsesWire(t *testing.T) {
	u := Start(t)
	status, _, b, _ := post(t, u, "/v1/responses", "k", `{"model":"chat-model","input":"hello","max_output_tokens":64,"stream":true}`, map[string]string{HeaderCacheRead: "9", HeaderReasoning: "4"})
	var names []string
	var text string
	for i, e := range readSSE(t, b, "\n") {
		ev := decode[struct {
			Type           string
			SequenceNumber int `json:"sequence_number"`
			Delta          string
			Response       struct {
				Status string
				Usage  *struct {
					InputTokens        int64 `json:"input_tokens"`
					InputTokensDetails struct {
						CachedTokens int64 `json:"cached_tokens"`
					} `json:"input_tokens_details"`
					OutputTokens        int64 `json:"output_tokens"`
					OutputTokensDetails struct {
						ReasoningTokens int64 `json:"reasoning_tokens"`
					} `json:"output_tokens_details"`
					TotalTokens int64 `json:"total_tokens"`
				}
			}
		}](t, e.data)
		if ev.Type != e.name || ev.SequenceNumber != i {
			t.Errorf("event %d %q: %s", i, e.name, e.data)
		}
		names = append(names, e.name)
		text += ev.Delta
		if u := ev.Response.Usage; e.name == "response.completed" && (u == nil || u.InputTokens != 14 || u.InputTokensDetails.CachedTokens != 9 ||
			u.OutputTokens != 64 || u.OutputTokensDetails.ReasoningTokens != 4 || u.TotalTokens != 78 || ev.Response.Status != "completed") {
			t.Errorf("response.completed: %s", e.data)
		}
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.delta response.output_text.delta response.output_text.done " +
		"response.content_part.done response.output_item.done response.completed"
	if status != 200 || strings.Join(names, " ") != want || text != Text {
		t.Errorf("%d: events %s, text %q", status, names, text)
	}
	status, _, b, _ = post(t, u, "/v1/responses", "k", `{"input":"hello"}`, nil)
	doc := decode[struct {
		Object, Status string
		Output         []struct {
			Type    string
			Content []struct{ Type, Text string }
		}
		Usage struct {
			TotalTokens int64 `json:"total_tokens"`
		}
	}](t, b)
	if status != 200 || doc.Object != "response" || doc.Status != "completed" || doc.Output[0].Content[0].Text != Text || doc.Usage.TotalTokens != 5+DefaultMaxTokens {
		t.Errorf("%d %s", status, b)
	}
}

// TestAnthropicWire: the Messages API's events in order, the input usage
// in message_start, the cumulative usage in message_delta; the cache
// tokens reported beside the input.
func TestAnthropicWire(t *testing.T) {
	u := Start(t)
	headers := map[string]string{HeaderCacheRead: "100", HeaderCacheWrite: "20", HeaderReasoning: "3"}
	status, h, b, _ := post(t, u, "/v1/messages", "k", `{"model":"messages-model","system":"sys","messages":[{"role":"user","content":"hello"}],"max_tokens":50,"stream":true}`, headers)
	type usageJSON struct {
		InputTokens              *int64 `json:"input_tokens"`
		CacheCreationInputTokens int64  `json:"cache_creation_input_tokens"`
		CacheReadInputTokens     int64  `json:"cache_read_input_tokens"`
		OutputTokens             int64  `json:"output_tokens"`
		OutputTokensDetails      *struct {
			ThinkingTokens int64 `json:"thinking_tokens"`
		} `json:"output_tokens_details"`
	}
	var names []string
	var text string
	for _, e := range readSSE(t, b, "\n") {
		ev := decode[struct {
			Type    string
			Message struct {
				ID    string
				Usage usageJSON
			}
			Delta struct{ Text, StopReason string }
			Usage usageJSON
		}](t, e.data)
		names = append(names, e.name)
		text += ev.Delta.Text
		if ev.Type != e.name {
			t.Errorf("event %q: %s", e.name, e.data)
		}
		switch m := ev.Message.Usage; e.name {
		case "message_start":
			if !strings.HasPrefix(ev.Message.ID, "msg_01") || *m.InputTokens != 8 || m.CacheReadInputTokens != 100 || m.CacheCreationInputTokens != 20 || m.OutputTokens != 1 {
				t.Errorf("message_start: %s", e.data)
			}
		case "message_delta":
			if d := ev.Usage; *d.InputTokens != 8 || d.CacheReadInputTokens != 100 || d.CacheCreationInputTokens != 20 || d.OutputTokens != 50 || d.OutputTokensDetails.ThinkingTokens != 3 {
				t.Errorf("message_delta: %s", e.data)
			}
		}
	}
	want := "message_start content_block_start ping content_block_delta content_block_delta content_block_delta content_block_stop message_delta message_stop"
	if status != 200 || h.Get("Request-Id") == "" || strings.Join(names, " ") != want || text != Text {
		t.Errorf("%d: events %s, text %q", status, names, text)
	}
	if c := u.Calls("Bearer k"); c[0].Reported != 178 || c[0].Used != 178 || c[0].InputTokens != 128 {
		t.Errorf("%+v, want 8 + 100 + 20 + 50 used and reported", c[0])
	}
	status, _, b, _ = post(t, u, "/v1/messages", "k", `{"messages":[{"role":"user","content":"hello"}],"max_tokens":50}`, nil)
	doc := decode[struct {
		Type, Role, StopReason string
		Content                []struct{ Type, Text string }
		Usage                  usageJSON
	}](t, b)
	if status != 200 || doc.Type != "message" || doc.Role != "assistant" || doc.Content[0].Text != Text || *doc.Usage.InputTokens != 5 || doc.Usage.OutputTokens != 50 || doc.Usage.OutputTokensDetails != nil {
		t.Errorf("%d %s", status, b)
	}
}

type geminiChunk struct {
	Candidates []struct {
		Content struct {
			Parts []struct{ Text string }
			Role  string
		}
		FinishReason string
		Index        int
	}
	UsageMetadata struct {
		PromptTokenCount, CandidatesTokenCount, ThoughtsTokenCount, CachedContentTokenCount, TotalTokenCount int64
	}
	ModelVersion, ResponseID string
}

// TestGeminiWire: generateContent, and streamGenerateContent as SSE
// separated by CRLF pairs and as a JSON array, every chunk with the
// running totals of the usage.
func TestGeminiWire(t *testing.T) {
	u := Start(t)
	body := `{"contents":[{"role":"user","parts":[{"text":"hello"}]}],"generationConfig":{"maxOutputTokens":90,"candidateCount":2}}`
	headers := map[string]string{HeaderCacheRead: "10", HeaderReasoning: "30"}
	check := func(t *testing.T, chunks []geminiChunk) {
		t.Helper()
		var text string
		var last int64
		for i, c := range chunks {
			m := c.UsageMetadata
			if len(c.Candidates) != 2 || c.Candidates[1].Index != 1 || c.Candidates[0].Content.Role != "model" || c.ModelVersion != "gen-model-flash" || c.ResponseID == "" ||
				m.PromptTokenCount != 15 || m.CachedContentTokenCount != 10 || m.ThoughtsTokenCount != 30 ||
				m.TotalTokenCount != m.PromptTokenCount+m.CandidatesTokenCount+m.ThoughtsTokenCount || m.CandidatesTokenCount < last {
				t.Errorf("chunk %d: %+v", i, c)
			}
			last = m.CandidatesTokenCount
			text += c.Candidates[0].Content.Parts[0].Text
			if (c.Candidates[0].FinishReason == "STOP") != (i == len(chunks)-1) {
				t.Errorf("chunk %d of %d: finishReason %q", i, len(chunks), c.Candidates[0].FinishReason)
			}
		}
		if text != Text || last != 2*90-30 {
			t.Errorf("text %q, %d candidates tokens at the end, want %d", text, last, 2*90-30)
		}
	}
	t.Run("JSON", func(t *testing.T) {
		status, _, b, _ := post(t, u, "/v1beta/models/gen-model-flash:generateContent", "", body, headers)
		if status != 200 {
			t.Fatalf("%d %s", status, b)
		}
		check(t, []geminiChunk{decode[geminiChunk](t, b)})
	})
	t.Run("SSE", func(t *testing.T) {
		status, h, b, _ := post(t, u, "/v1beta/models/gen-model-flash:streamGenerateContent?alt=sse", "", body, headers)
		if status != 200 || h.Get("Content-Type") != "text/event-stream" || !bytes.HasSuffix(b, []byte("}\r\n\r\n")) {
			t.Fatalf("%d %q", status, b)
		}
		var chunks []geminiChunk
		for _, e := range readSSE(t, b, "\r\n") {
			chunks = append(chunks, decode[geminiChunk](t, e.data))
		}
		check(t, chunks)
	})
	t.Run("JSON array", func(t *testing.T) {
		status, h, b, _ := post(t, u, "/v1beta/models/gen-model-flash:streamGenerateContent", "", body, headers)
		if status != 200 || !strings.HasPrefix(h.Get("Content-Type"), "application/json") || b[0] != '[' {
			t.Fatalf("%d %q", status, b)
		}
		check(t, decode[[]geminiChunk](t, b))
	})
	if calls := u.Calls(""); len(calls) != 3 || calls[0].Reported != 15+180 || calls[1].Reported != 15+180 {
		t.Errorf("%+v", calls)
	}
}

// TestOllamaWire: NDJSON by default, the counts and durations in the last
// object; one object with "stream": false.
func TestOllamaWire(t *testing.T) {
	u := Start(t)
	type final struct {
		Model, Response string
		CreatedAt       string `json:"created_at"`
		DoneReason      string `json:"done_reason"`
		Message         struct{ Role, Content string }
		Done            bool
		Context         []int
		TotalDuration   int64 `json:"total_duration"`
		PromptEvalCount int64 `json:"prompt_eval_count"`
		EvalCount       int64 `json:"eval_count"`
	}
	status, h, b, _ := post(t, u, "/api/chat", "", `{"model":"local-model","messages":[{"role":"user","content":"hello"}],"options":{"num_predict":12}}`, nil)
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	var text string
	for i, line := range lines {
		m := decode[final](t, []byte(line))
		text += m.Message.Content
		if m.Done != (i == len(lines)-1) || m.Model != "local-model" || m.Message.Role != "assistant" {
			t.Errorf("line %d: %s", i, line)
		}
		if m.Done && (m.PromptEvalCount != 5 || m.EvalCount != 12 || m.DoneReason != "stop" || m.TotalDuration <= 0) {
			t.Errorf("last line: %s", line)
		}
	}
	if status != 200 || h.Get("Content-Type") != "application/x-ndjson" || text != Text || len(lines) != 4 {
		t.Errorf("%d %s", status, b)
	}
	status, h, b, _ = post(t, u, "/api/generate", "", `{"model":"local-model","prompt":"hello","stream":false}`, nil)
	m := decode[final](t, b)
	if status != 200 || !strings.HasPrefix(h.Get("Content-Type"), "application/json") || !m.Done || m.Response != Text || len(m.Context) == 0 || m.EvalCount != DefaultMaxTokens {
		t.Errorf("%d %s", status, b)
	}
}

// TestBedrockWire: Converse's JSON, and ConverseStream's event stream
// messages in order, the usage in metadata, with Bedrock's cache fields.
func TestBedrockWire(t *testing.T) {
	u := Start(t)
	body := `{"messages":[{"role":"user","content":[{"text":"hello"}]}],"system":[{"text":"sys"}],"inferenceConfig":{"maxTokens":70}}`
	headers := map[string]string{HeaderCacheRead: "40", HeaderCacheWrite: "4"}
	type usageJSON struct {
		InputTokens, OutputTokens, TotalTokens, CacheReadInputTokens, CacheWriteInputTokens int64
	}
	want := usageJSON{8, 70, 122, 40, 4}
	status, h, b, _ := post(t, u, "/model/vendor.text-model-v1%3A0/converse-stream", "k", body, headers)
	if status != 200 || h.Get("Content-Type") != "application/vnd.amazon.eventstream" || h.Get("X-Amzn-Requestid") == "" {
		t.Fatalf("%d %q", status, b)
	}
	r := bytes.NewReader(b)
	var names []string
	var text string
	for {
		m, err := ReadEventMessage(r)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.Headers[":message-type"] != "event" || m.Headers[":content-type"] != "application/json" {
			t.Errorf("headers %q", m.Headers)
		}
		name := m.Headers[":event-type"]
		names = append(names, name)
		p := decode[struct {
			Delta struct{ Text string }
			P     string
			Usage usageJSON
		}](t, m.Payload)
		text += p.Delta.Text
		if p.P == "" || name == "metadata" && p.Usage != want {
			t.Errorf("%s: %s", name, m.Payload)
		}
	}
	if strings.Join(names, " ") != "messageStart contentBlockDelta contentBlockDelta contentBlockDelta contentBlockStop messageStop metadata" || text != Text {
		t.Errorf("events %s, text %q", names, text)
	}
	status, _, b, _ = post(t, u, "/model/vendor.other-model-v2%3A0/converse", "k", body, headers)
	doc := decode[struct {
		Output struct {
			Message struct {
				Role    string
				Content []struct{ Text string }
			}
		}
		StopReason string
		Usage      usageJSON
		Metrics    struct{ LatencyMs int64 }
	}](t, b)
	if status != 200 || doc.Output.Message.Content[0].Text != Text || doc.StopReason != "end_turn" || doc.Usage != want || doc.Metrics.LatencyMs < 1 {
		t.Errorf("%d %s", status, b)
	}
	if calls := u.Calls("Bearer k"); calls[0].Model != "vendor.text-model-v1:0" || calls[1].Model != "vendor.other-model-v2:0" {
		t.Errorf("models %q and %q", calls[0].Model, calls[1].Model)
	}
}

// TestNestedUsage: the decoy usage comes after the real one, in the same
// object, holding zeros.
func TestNestedUsage(t *testing.T) {
	u := Start(t)
	for _, c := range []struct{ path, body, real, decoy string }{
		{"/v1/chat/completions", `{"max_tokens":5}`, `"usage":{"prompt_tokens":0,"completion_tokens":5`, `"debug":{"usage":{"prompt_tokens":0,"completion_tokens":0`},
		{"/v1/completions", `{"max_tokens":5}`, `"usage":{"prompt_tokens":0,"completion_tokens":5`, `"debug":{"usage":{"prompt_tokens":0,"completion_tokens":0`},
		{"/v1/responses", `{"max_output_tokens":5}`, `"usage":{"input_tokens":0,"input_tokens_details":{"cached_tokens":0},"output_tokens":5`, `"debug":{"usage":{"input_tokens":0,"input_tokens_details":{"cached_tokens":0},"output_tokens":0`},
		{"/v1/messages", `{"max_tokens":5}`, `"output_tokens":5`, `"debug":{"usage":{"input_tokens":0`},
		{"/v1beta/models/g:generateContent", `{"generationConfig":{"maxOutputTokens":5}}`, `"usageMetadata":{"promptTokenCount":0,"candidatesTokenCount":5`, `"debug":{"usageMetadata":{"promptTokenCount":0,"candidatesTokenCount":0`},
		{"/api/chat", `{"stream":false,"options":{"num_predict":5}}`, `"eval_count":5`, `"debug":{"prompt_eval_count":0,"eval_count":0}`},
		{"/model/m/converse", `{"inferenceConfig":{"maxTokens":5}}`, `"usage":{"inputTokens":0,"outputTokens":5`, `"debug":{"usage":{"inputTokens":0,"outputTokens":0`},
	} {
		status, _, b, _ := post(t, u, c.path, "k", c.body, map[string]string{HeaderNestedUsage: "1"})
		real, decoy := bytes.Index(b, []byte(c.real)), bytes.Index(b, []byte(c.decoy))
		if status != 200 || real < 0 || decoy < real {
			t.Errorf("%s: %d %s: want %s, then %s", c.path, status, b, c.real, c.decoy)
		}
		if _, _, plain, _ := post(t, u, c.path, "k", c.body, nil); bytes.Contains(plain, []byte(`"debug"`)) {
			t.Errorf("%s: a decoy without the knob: %s", c.path, plain)
		}
	}
}

// TestCut: a stream cut after N events, and a JSON answer after N bytes,
// end in an error; the call is not complete, and reports what it sent.
func TestCut(t *testing.T) {
	u := Start(t)
	_, _, b, err := post(t, u, "/v1/messages", "k", `{"messages":[{"content":"hello"}],"max_tokens":50,"stream":true}`, map[string]string{HeaderCut: "2"})
	events := readSSE(t, b, "\n")
	if err == nil || len(events) != 2 || events[0].name != "message_start" {
		t.Errorf("%v: %q", err, b)
	}
	_, _, b, err = post(t, u, "/v1/chat/completions", "k", `{"max_tokens":50}`, map[string]string{HeaderCut: "10"})
	if err == nil || len(b) != 10 {
		t.Errorf("%v: %q", err, b)
	}
	_, _, b, err = post(t, u, "/v1/chat/completions", "k", `{"max_tokens":50,"stream":true}`, map[string]string{HeaderCut: "0"})
	if err == nil || len(b) != 0 {
		t.Errorf("%v: %q", err, b)
	}
	time.Sleep(50 * time.Millisecond)
	calls := u.Calls("Bearer k")
	if len(calls) != 3 || calls[0].Completed || calls[0].Reported != 5+1 || calls[0].Used != 55 || calls[1].Completed || calls[1].Reported != 0 || calls[2].Completed {
		t.Errorf("%+v", calls)
	}
}

// TestPauseAndDuration: a stream pauses between its events; a duration
// spreads them over it, or holds a JSON answer back for it.
func TestPauseAndDuration(t *testing.T) {
	u := Start(t)
	stream := `{"messages":[{"content":"hi"}],"max_tokens":5,"stream":true}`
	for _, c := range []struct {
		name, path, body string
		headers          map[string]string
		least, most      time.Duration
	}{
		// 9 events, 8 pauses.
		{"pause", "/v1/messages", stream, map[string]string{HeaderPause: "50ms"}, 400 * time.Millisecond, 2 * time.Second},
		{"duration of a stream", "/v1/messages", stream, map[string]string{HeaderDuration: "600ms"}, 600 * time.Millisecond, 2 * time.Second},
		{"duration of a JSON answer", "/v1/messages", `{"max_tokens":5}`, map[string]string{HeaderDuration: "300ms"}, 300 * time.Millisecond, 2 * time.Second},
		{"no knobs", "/v1/messages", stream, nil, 0, 200 * time.Millisecond},
	} {
		key := "k-" + c.name
		start := time.Now()
		status, _, b, err := post(t, u, c.path, key, c.body, c.headers)
		took := time.Since(start)
		calls := u.Calls("Bearer " + key)
		if status != 200 || err != nil || took < c.least || took > c.most || len(calls) != 1 || calls[0].End.Sub(calls[0].Start) < c.least {
			t.Errorf("%s: %d %v in %v, want %v to %v: %s", c.name, status, err, took, c.least, c.most, b)
		}
	}
	// A duration spreads the events: the first comes at once.
	req, _ := http.NewRequest(http.MethodPost, u.URL()+"/v1/chat/completions", strings.NewReader(`{"max_tokens":5,"stream":true}`))
	req.Header.Set(HeaderDuration, "500ms")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if first := time.Since(start); err != nil || !strings.HasPrefix(line, "data: ") || first > 250*time.Millisecond {
		t.Errorf("first event %q after %v (%v)", line, first, err)
	}
}

// TestOverrideAndRefusal: the usage override changes what is reported,
// not what is used; a status knob refuses with the vendor's error and
// uses nothing; a bad knob or body is a 400, an unknown path a 404.
func TestOverrideAndRefusal(t *testing.T) {
	u := Start(t)
	_, _, b, _ := post(t, u, "/v1/chat/completions", "over", `{"messages":[{"content":"hello"}],"max_tokens":50}`, map[string]string{HeaderUsage: "3,4"})
	if !bytes.Contains(b, []byte(`"prompt_tokens":3,"completion_tokens":4,"total_tokens":7`)) {
		t.Errorf("override: %s", b)
	}
	if c := u.Calls("Bearer over")[0]; c.Used != 55 || c.Reported != 7 {
		t.Errorf("override: %+v, want 55 used and 7 reported", c)
	}
	for _, c := range []struct{ path, body, want string }{
		{"/v1/chat/completions", `{}`, `"type":"rate_limit_exceeded"`},
		{"/v1/messages", `{}`, `"type":"error","error":{"type":"rate_limit_error"`},
		{"/v1beta/models/g:generateContent", `{}`, `"status":"RESOURCE_EXHAUSTED"`},
		{"/api/chat", `{}`, `{"error":"refused with 429`},
		{"/model/m/converse", `{}`, `{"message":"refused with 429`},
	} {
		status, h, b, _ := post(t, u, c.path, "refused", c.body, map[string]string{HeaderStatus: "429"})
		if status != 429 || !bytes.Contains(b, []byte(c.want)) || c.path == "/model/m/converse" && !strings.HasPrefix(h.Get("X-Amzn-Errortype"), "ThrottlingException") {
			t.Errorf("%s: %d %s, want %s", c.path, status, b, c.want)
		}
	}
	if used := u.Used("Bearer refused"); used != 0 || u.CallCount("Bearer refused") != 5 {
		t.Errorf("refused calls used %d", used)
	}
	for _, c := range []struct {
		method, path, body string
		headers            map[string]string
		want               int
	}{
		{"POST", "/v1/chat/completions", `{}`, map[string]string{HeaderPause: "soon"}, 400},
		{"POST", "/v1/chat/completions", `{}`, map[string]string{HeaderUsage: "5"}, 400},
		{"POST", "/v1/chat/completions", `{}`, map[string]string{HeaderStatus: "99"}, 400},
		{"POST", "/v1/chat/completions", `{"max_tokens":1.5}`, nil, 400},
		{"POST", "/v1/embeddings", `{}`, nil, 404},
		{"POST", "/model/m/invoke", `{}`, nil, 404},
		{"GET", "/v1/chat/completions", ``, nil, 405},
	} {
		req, _ := http.NewRequest(c.method, u.URL()+c.path, strings.NewReader(c.body))
		for k, v := range c.headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s %s %s %q: %d, want %d", c.method, c.path, c.body, c.headers, resp.StatusCode, c.want)
		}
	}
}

// TestAccounting: calls, bodies, calls at once and usage, per key.
func TestAccounting(t *testing.T) {
	u := Start(t)
	body := `{"messages":[{"content":"hello"}],"max_tokens":10}`
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			post(t, u, "/v1/chat/completions", "a", body, map[string]string{HeaderDuration: "300ms"})
		})
	}
	time.Sleep(100 * time.Millisecond)
	if n := u.Running("Bearer a"); n != 3 {
		t.Errorf("%d running, want 3", n)
	}
	wg.Wait()
	post(t, u, "/v1/chat/completions", "b", body, nil)
	if got := u.Keys(); strings.Join(got, ",") != "Bearer a,Bearer b" {
		t.Errorf("keys %q", got)
	}
	reported, calls := u.Usage("Bearer a")
	if calls != 3 || u.CallCount("Bearer a") != 3 || reported != 45 || u.Reported("Bearer a") != 45 || u.Used("Bearer a") != 45 ||
		u.BodyBytes("Bearer a") != int64(3*len(body)) || u.MostAtOnce("Bearer a") != 3 || u.Running("Bearer a") != 0 || u.MostAtOnce("Bearer b") != 1 {
		t.Errorf("%d calls, %d reported, %d used, %d body bytes, %d at most at once, %d running",
			calls, reported, u.Used("Bearer a"), u.BodyBytes("Bearer a"), u.MostAtOnce("Bearer a"), u.Running("Bearer a"))
	}
	if n := u.MostInWindow("Bearer a", time.Second); n != 45 {
		t.Errorf("%d in a window of a second, want the three calls' 45", n)
	}
	if u.CallCount("nobody") != 0 || u.Calls("nobody") != nil || u.MostInWindow("nobody", time.Second) != 0 {
		t.Error("a key that made no calls")
	}
}

// TestMostInWindow: the most used in any window of length w, by the
// calls' ends, calls running left out.
func TestMostInWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	u := &Upstream{accounts: map[string]*account{"k": {calls: []*Call{
		{End: at(0), Used: 10},
		{End: at(30), Used: 20},
		{End: at(59.9), Used: 30},
		{End: at(60), Used: 40},
		{End: at(200), Used: 50},
		{Used: 1000}, // running
		{End: at(50), Used: 5},
	}}}}
	for w, want := range map[time.Duration]int64{
		time.Nanosecond: 50,
		time.Second:     70, // 59.9 and 60
		// 0, 30, 50 and 59.9 are 65; 30, 50, 59.9 and 60, 95.
		60 * time.Second: 95,
		// 0 to 60.
		61 * time.Second: 105,
		// 59.9 to 200.
		141 * time.Second: 120,
		201 * time.Second: 155,
	} {
		if got := u.MostInWindow("k", w); got != want {
			t.Errorf("window %v: %d, want %d", w, got, want)
		}
	}
}

// TestKeyOf: the key is the credential as each SDK sends it.
func TestKeyOf(t *testing.T) {
	for _, c := range []struct {
		header map[string]string
		target string
		want   string
	}{
		{map[string]string{"Authorization": "Bearer sk-1", "X-Api-Key": "other"}, "/", "Bearer sk-1"},
		{map[string]string{"X-Api-Key": "sk-ant"}, "/", "sk-ant"},
		{map[string]string{"X-Goog-Api-Key": "AIza"}, "/", "AIza"},
		{nil, "/v1beta/models/g:generateContent?key=AIzb", "AIzb"},
		{map[string]string{"Authorization": "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature=abc"}, "/", "AKIDEXAMPLE"},
		{nil, "/api/chat", ""},
	} {
		r := httptest.NewRequest(http.MethodPost, c.target, nil)
		for k, v := range c.header {
			r.Header.Set(k, v)
		}
		if got := KeyOf(r); got != c.want {
			t.Errorf("%q %s: %q, want %q", c.header, c.target, got, c.want)
		}
	}
}
