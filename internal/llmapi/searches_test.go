package llmapi

import (
	"strings"
	"testing"
)

// TestSearches: a server tool that bills a fee per search is bounded by
// the field that limits its searches (Anthropic's max_uses, the Responses
// API's max_tool_calls), added up over its tools and a batch's requests;
// one that no field limits is named; its tokens are never bounded (its
// results are input the body does not carry).
func TestSearches(t *testing.T) {
	const anth, resp = "/v1/messages", "/v1/responses"
	cases := []struct {
		name, path, body string
		searches         int64
		why              string // a part of SearchesUnbounded; "" for a bound
	}{
		{"max_uses", anth, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":5}]}`, 5, ""},
		{"max_uses as a string, folded", anth, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305","name":"web_search","MAX_USES":"7"}]}`, 7, ""},
		{"max_uses twice: the larger", anth, `{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305","max_uses":2,"max_uses":9}]}`, 9, ""},
		{"two search tools add up", anth, `{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305","max_uses":2},{"type":"web_search_20260209","max_uses":3}]}`, 5, ""},
		{"a search tool after what cannot be bounded is counted", anth, `{"model":"m","max_tokens":10,"container":"c1","messages":[],"tools":[{"type":"web_fetch_20250910","name":"f"},{"type":"web_search_20250305","max_uses":4}]}`, 4, ""},
		{"without max_uses", anth, `{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, 0, "without max_uses"},
		{"max_uses 0", anth, `{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305","max_uses":0}]}`, 0, "without max_uses"},
		{"max_uses -1", anth, `{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305","max_uses":-1}]}`, 0, "without max_uses"},
		{"max_uses and a word", anth, `{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305","max_uses":3,"max_uses":"all"}]}`, 0, "without max_uses"},
		{"one tool bounded, one not", anth, `{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305","max_uses":3},{"type":"web_search_20250305"}]}`, 3, "without max_uses"},
		{"a batch adds its requests'", "/v1/messages/batches", `{"requests":[` +
			repeat(`{"custom_id":"r","params":{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305","max_uses":4}]}}`, 3) + `]}`, 12, ""},
		{"a batch's request without max_uses", "/v1/messages/batches", `{"requests":[{"custom_id":"r","params":{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305"}]}}]}`, 0, "batch's request"},
		{"Responses max_tool_calls", resp, `{"model":"gpt-4o","input":"x","max_tool_calls":3,"tools":[{"type":"web_search"},{"type":"web_search_preview"}]}`, 3, ""},
		{"Responses without max_tool_calls", resp, `{"model":"gpt-4o","input":"x","tools":[{"type":"web_search"}]}`, 0, "without max_tool_calls"},
		{"Responses max_tool_calls without a search tool", resp, `{"model":"gpt-4o","input":"x","max_tool_calls":3}`, 0, ""},
		{"chat web_search_options", "/v1/chat/completions", `{"model":"gpt-4o-search-preview","messages":[],"web_search_options":{}}`, 0, "web_search_options"},
		{"gemini grounding", "/v1beta/models/gemini-2.5-flash:generateContent", `{"contents":[],"tools":[{"google_search":{}}]}`, 0, "Google Search"},
		{"no search tool", anth, `{"model":"m","max_tokens":10,"messages":[],"tools":[{"name":"f","input_schema":{}}]}`, 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := ReadRequest(c.path, []byte(c.body), 100)
			if err != nil {
				t.Fatal(err)
			}
			if r.Searches != c.searches {
				t.Errorf("Searches = %d, want %d", r.Searches, c.searches)
			}
			if c.why == "" && r.SearchesUnbounded != "" || !strings.Contains(r.SearchesUnbounded, c.why) {
				t.Errorf("SearchesUnbounded = %q, want it to name %q", r.SearchesUnbounded, c.why)
			}
			searching := c.searches > 0 || c.why != ""
			if searching && r.Unbounded == "" {
				t.Errorf("a search tool's tokens bounded: want Unbounded")
			}
		})
	}
	if !AnthropicMessages.ReportsSearches() || OpenAIResponses.ReportsSearches() || Gemini.ReportsSearches() {
		t.Errorf("only Anthropic's usage reports its searches")
	}
}

// TestPasses: a call reads its context once, plus once after each search
// it may make; what may read it more (a server tool that runs rounds, a
// batch, what the reader does not know) has no bound (0).
func TestPasses(t *testing.T) {
	const anth, resp = "/v1/messages", "/v1/responses"
	for _, c := range []struct {
		name, path, body string
		passes           int64
	}{
		{"text", anth, `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, 1},
		{"a document by file id", anth, `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"file","file_id":"f"}}]}]}`, 1},
		{"previous_response_id", resp, `{"model":"gpt-4o","input":"x","previous_response_id":"resp_1"}`, 1},
		{"web search, max_uses 5", anth, `{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305","max_uses":5}]}`, 6},
		{"Responses web search, max_tool_calls 2", resp, `{"model":"gpt-4o","input":"x","max_tool_calls":2,"tools":[{"type":"web_search"}]}`, 3},
		{"web search without max_uses", anth, `{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305"}]}`, 0},
		{"web fetch, a tool the reader does not know", anth, `{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_fetch_20250910","max_uses":1}]}`, 0},
		{"mcp_servers", anth, `{"model":"m","max_tokens":10,"messages":[],"mcp_servers":[{"url":"https://x"}]}`, 0},
		{"a field the reader does not know", "/v1/chat/completions", `{"model":"m","messages":[],"chat_template":"x"}`, 0},
		{"a batch", "/v1/messages/batches", `{"requests":[{"custom_id":"r","params":{"model":"m","max_tokens":10,"messages":[]}}]}`, 0},
		{"a batch in a file", "/v1/batches", `{"input_file_id":"f","endpoint":"/v1/chat/completions"}`, 0},
		{"a path of no API", "/v1/rerank", `{"query":"x"}`, 0},
	} {
		r, err := ReadRequest(c.path, []byte(c.body), 100)
		if err != nil {
			t.Fatal(err)
		}
		if r.Passes != c.passes {
			t.Errorf("%s: Passes = %d, want %d", c.name, r.Passes, c.passes)
		}
	}
}
