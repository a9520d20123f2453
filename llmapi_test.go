package slidingratelimit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// llmAPI is a stand-in for an LLM API that speaks the wire formats of
// OpenAI's chat completions (/v1/chat/completions) and Responses API
// (/v1/responses) and of Anthropic's Messages API (/v1/messages), as JSON
// documents and as server-sent event streams, with usage where each puts
// it: the last chunk of a chat stream, when the client asked for it
// (stream_options.include_usage); response.usage of the response.completed
// event; input tokens in message_start and output tokens, cumulative, in
// message_delta. A call uses as input tokens the bytes of its last message
// and as output tokens its max_tokens less one (20 without), so that it
// never uses more than `cost json max_tokens <n> +body` reserves. It
// records what it reported per API key, and the most calls of a key it ran
// at once. A stream pauses between events for the request's
// X-Test-Pause, if any, and breaks off after X-Test-Cut events, if any.
type llmAPI struct {
	mu       sync.Mutex
	reported map[string]int64
	// bodies is the bytes of the request bodies of each key.
	bodies  map[string]int64
	calls   map[string]int
	running map[string]int
	most    map[string]int
}

func newLLMAPI(t *testing.T) (*llmAPI, string) {
	a := &llmAPI{reported: map[string]int64{}, bodies: map[string]int64{}, calls: map[string]int{}, running: map[string]int{}, most: map[string]int{}}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	return a, strings.TrimPrefix(srv.URL, "http://")
}

// llmRequest is what the stand-in reads of a request, in any of the three
// APIs.
type llmRequest struct {
	Model         string `json:"model"`
	MaxTokens     int64  `json:"max_tokens"`
	MaxOutput     int64  `json:"max_output_tokens"`
	Stream        bool   `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Messages []struct {
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Input json.RawMessage `json:"input"`
}

func (a *llmAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Authorization") + r.Header.Get("X-Api-Key")
	body, err := io.ReadAll(r.Body)
	var req llmRequest
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		http.Error(w, `{"error": {"message": "bad request"}}`, http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	a.running[key]++
	a.most[key] = max(a.most[key], a.running[key])
	a.calls[key]++
	a.bodies[key] += int64(len(body))
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.running[key]--
		a.mu.Unlock()
	}()
	input := int64(len(req.Input))
	if n := len(req.Messages); n > 0 {
		input = int64(len(req.Messages[n-1].Content))
	}
	output := int64(20)
	if m := max(req.MaxTokens, req.MaxOutput); m > 0 {
		output = m - 1
	}
	pause, _ := time.ParseDuration(r.Header.Get("X-Test-Pause"))
	cut, _ := strconv.Atoi(r.Header.Get("X-Test-Cut"))
	var events []string
	var doc string
	reported := input + output
	switch r.URL.Path {
	case "/v1/chat/completions":
		usage := fmt.Sprintf(`{"prompt_tokens": %d, "completion_tokens": %d, "total_tokens": %d, "prompt_tokens_details": {"cached_tokens": 0}}`, input, output, input+output)
		doc = `{"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there"}, "finish_reason": "stop"}], "usage": ` + usage + `}`
		for _, part := range []string{"Hel", "lo ", "there"} {
			events = append(events, `data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": "`+part+`"}, "finish_reason": null}], "usage": null}`)
		}
		if req.Stream && req.StreamOptions.IncludeUsage {
			events = append(events, `data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": `+usage+`}`)
		} else if req.Stream {
			reported = 0
		}
		events = append(events, "data: [DONE]")
	case "/v1/responses":
		usage := fmt.Sprintf(`{"input_tokens": %d, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": %d, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": %d}`, input, output, input+output)
		response := func(status, usage string) string {
			return `{"id": "resp_1", "object": "response", "created_at": 1, "status": "` + status + `", "model": "m", "output": [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": "Hello there", "annotations": []}]}], "usage": ` + usage + `}`
		}
		doc = response("completed", usage)
		events = append(events, "event: response.created\ndata: "+`{"type": "response.created", "sequence_number": 0, "response": `+response("in_progress", "null")+`}`)
		for i, part := range []string{"Hel", "lo ", "there"} {
			events = append(events, "event: response.output_text.delta\ndata: "+fmt.Sprintf(`{"type": "response.output_text.delta", "sequence_number": %d, "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "%s"}`, i+1, part))
		}
		events = append(events, "event: response.completed\ndata: "+`{"type": "response.completed", "sequence_number": 4, "response": `+response("completed", usage)+`}`)
	case "/v1/messages":
		doc = fmt.Sprintf(`{"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [{"type": "text", "text": "Hello there"}], "stop_reason": "end_turn", "stop_sequence": null, "usage": {"input_tokens": %d, "output_tokens": %d}}`, input, output)
		events = append(events, "event: message_start\ndata: "+fmt.Sprintf(`{"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": %d, "output_tokens": 1}}}`, input))
		events = append(events, "event: content_block_start\ndata: "+`{"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}`)
		for _, part := range []string{"Hel", "lo ", "there"} {
			events = append(events, "event: content_block_delta\ndata: "+`{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "`+part+`"}}`)
		}
		events = append(events, "event: content_block_stop\ndata: "+`{"type": "content_block_stop", "index": 0}`)
		events = append(events, "event: message_delta\ndata: "+fmt.Sprintf(`{"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": %d}}`, output))
		events = append(events, "event: message_stop\ndata: "+`{"type": "message_stop"}`)
	default:
		http.NotFound(w, r)
		return
	}
	if !req.Stream {
		a.report(key, reported)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(doc))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	for i, e := range events {
		if cut > 0 && i == cut {
			// An upstream that breaks off: the connection closes mid-stream.
			panic(http.ErrAbortHandler)
		}
		if i > 0 {
			time.Sleep(pause)
		}
		if _, err := io.WriteString(w, e+"\n\n"); err != nil {
			return
		}
		w.(http.Flusher).Flush()
	}
	a.report(key, reported)
}

func (a *llmAPI) report(key string, tokens int64) {
	a.mu.Lock()
	a.reported[key] += tokens
	a.mu.Unlock()
}

// usage returns the tokens the API reported to key, and its calls served.
func (a *llmAPI) usage(key string) (int64, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reported[key], a.calls[key]
}

// bodyBytes is the bytes of the request bodies of key's calls.
func (a *llmAPI) bodyBytes(key string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bodies[key]
}

func (a *llmAPI) mostAtOnce(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.most[key]
}
