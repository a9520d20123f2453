package llmapi

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"image"
	"image/png"
	"strings"
	"testing"
)

// pngBase64 is a w x h PNG, base64.
func pngBase64(t testing.TB, w, h int) string {
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

// repeat joins n copies of s with commas.
func repeat(s string, n int) string {
	return strings.TrimSuffix(strings.Repeat(s+",", n), ",")
}

// TestBounds: what each class of call that the body's bytes do not bound
// reserves (media, prompt lists, batches), and what cannot be bounded at
// all, as an attacker would send it.
func TestBounds(t *testing.T) {
	const def = 4096
	tiny := pngBase64(t, 1, 1)
	wide := pngBase64(t, 2000, 1000)
	chat, resp, anth, gem := "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1beta/models/gemini-2.5-flash:generateContent"
	cases := []struct {
		name   string
		path   string
		body   string
		output int64 // -1: not checked
		media  int64
		why    string // a part of Unbounded; "" for a bound
	}{
		// Honest calls: their bytes and output bound.
		{"text chat", chat, `{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":100,"stream":true,"stream_options":{"include_usage":true}}`, 100, 0, ""},
		{"function tools", chat, `{"model":"gpt-4o","messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"1","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"file_id":{"type":"string"}}}}}],"max_tokens":10}`, 10, 0, ""},
		{"anthropic text, tools add their system prompt", anth, `{"model":"claude-sonnet-4-5","max_tokens":50,"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"f","input_schema":{"type":"object"}}]}`, 50, 530, ""},
		{"anthropic computer tool", anth, `{"model":"claude-sonnet-4-5","max_tokens":50,"messages":[],"tools":[{"type":"computer_20250124","name":"computer","display_width_px":1024,"display_height_px":768}]}`, 50, 530 + 735 + 499, ""},
		{"an empty list of what cannot be bounded", "/api/chat", `{"model":"llava","messages":[{"role":"user","content":"hi","images":[]}],"images":null}`, def, 0, ""},

		// Media billed per part: 1x1 PNGs inline and images by URL.
		{"40 inline PNGs on gpt-4o-mini", chat, `{"model":"gpt-4o-mini","max_tokens":10,"messages":[{"role":"user","content":[` +
			repeat(`{"type":"image_url","image_url":{"url":"data:image/png;base64,`+tiny+`","detail":"low"}}`, 40) + `]}]}`, 10, 40 * 48169, ""},
		{"20 image URLs on gpt-4o", chat, `{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":[` +
			repeat(`{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}`, 20) + `]}]}`, 10, 20 * 1445, ""},
		{"an image on a model no rule names takes the largest", chat, `{"model":"my-vision-model","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}`, 10, 48169, ""},
		{"Responses images by URL and file id", resp, `{"model":"gpt-4.1-mini","max_output_tokens":10,"input":[{"role":"user","content":[{"type":"input_image","image_url":"https://example.com/a.png"},{"type":"input_image","file_id":"file-1"}]}]}`, 10, 2 * 2489, ""},
		{"anthropic images by base64, URL and file", anth, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + tiny + `"}},{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}},{"type":"image","source":{"type":"file","file_id":"file_1"}}]}]}`, 10, 3 * 1600, ""},
		{"anthropic image in a tool result", anth, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"1","content":[{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}]}]}]}`, 10, 1600, ""},
		{"gemini inline PNGs by their tiles", gem, `{"contents":[{"parts":[{"inlineData":{"mimeType":"image/png","data":"` + tiny + `"}},{"inline_data":{"mime_type":"image/png","data":"` + wide + `"}}]}],"generationConfig":{"maxOutputTokens":10}}`, 10, 1120 + 3*2*258, ""},

		// Multipliers: a prompt list generates n completions per prompt.
		{"1,000 prompts", "/v1/completions", `{"model":"m","max_tokens":100,"n":2,"prompt":[` + repeat(`"p"`, 1000) + `]}`, 100 * 2 * 1000, 0, ""},
		{"token arrays are a prompt each", "/v1/completions", `{"model":"m","max_tokens":100,"prompt":[[1,2],[3],[4]]}`, 300, 0, ""},
		{"one prompt of token ids", "/v1/completions", `{"model":"m","max_tokens":100,"prompt":[1,2,3,4]}`, 100, 0, ""},

		// Batches: the sum of their requests.
		{"anthropic batch of 500", "/v1/messages/batches", `{"requests":[` +
			repeat(`{"custom_id":"r","params":{"model":"claude-sonnet-4-5","max_tokens":4000,"messages":[{"role":"user","content":"hi"}]}}`, 500) + `]}`, 500 * 4000, 0, ""},
		{"anthropic batch with an image", "/v1/messages/batches", `{"requests":[{"custom_id":"r","params":{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}]}]}}]}`, 10 + 1600, 0, ""},
		{"gemini batch", "/v1beta/models/gemini-2.5-flash:batchGenerateContent", `{"batch":{"display_name":"b","input_config":{"requests":{"requests":[` +
			repeat(`{"request":{"contents":[{"parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":300}},"metadata":{"key":"k"}}`, 7) + `]}}}}`, 7 * 300, 0, ""},
		{"gemini batch without a bound takes the default each", "/v1beta/models/gemini-2.5-flash:batchGenerateContent", `{"batch":{"inputConfig":{"requests":{"requests":[{"request":{"contents":[]}},{"request":{"contents":[]}}]}}}}`, 2 * def, 0, ""},

		// What cannot be bounded.
		{"anthropic file_id document", anth, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"file","file_id":"file_1"}}]}]}`, -1, 0, "file id"},
		{"anthropic PDF inline", anth, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0="}}]}]}`, -1, 0, "PDF"},
		{"anthropic web search", anth, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, -1, 0, "the web search tool"},
		{"anthropic container", anth, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[],"container":"c1"}`, -1, 0, "container"},
		{"previous_response_id", resp, `{"model":"gpt-4o","input":"and then?","previous_response_id":"resp_1"}`, -1, 0, "previous_response_id"},
		{"previous_response_id, folded", resp, `{"model":"gpt-4o","input":"and then?","Previous_Response_ID":"resp_1"}`, -1, 0, "previous_response_id"},
		{"conversation", resp, `{"model":"gpt-4o","input":"x","conversation":"conv_1"}`, -1, 0, "conversation"},
		{"item_reference", resp, `{"model":"gpt-4o","input":[{"type":"item_reference","id":"msg_1"}]}`, -1, 0, "item_reference"},
		{"Responses web search", resp, `{"model":"gpt-4o","input":"x","tools":[{"type":"web_search"}]}`, -1, 0, "a web search tool"},
		{"Responses input_file", resp, `{"model":"gpt-4o","input":[{"role":"user","content":[{"type":"input_file","file_id":"file-1"}]}]}`, -1, 0, "input_file"},
		{"chat file part", chat, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-1"}}]}]}`, -1, 0, "file part"},
		{"chat web_search_options", chat, `{"model":"gpt-4o-search-preview","messages":[],"web_search_options":{}}`, -1, 0, "web_search_options"},
		{"a part type nobody wrote a rule for", chat, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"video_url","video_url":{"url":"https://example.com/v.mp4"}}]}]}`, -1, 0, `"video_url"`},
		{"a field nobody wrote a rule for", chat, `{"model":"gpt-4o","messages":[],"chat_template":"{% for i in range(99999) %}x{% endfor %}"}`, -1, 0, `"chat_template"`},
		{"a type given twice", chat, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"x","type":"file"}]}]}`, -1, 0, "twice"},
		{"a part without a type", chat, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"text":"x"}]}]}`, -1, 0, "without a type"},
		{"gemini cachedContent", gem, `{"contents":[],"cachedContent":"cachedContents/1"}`, -1, 0, "cachedContent"},
		{"gemini fileData", gem, `{"contents":[{"parts":[{"fileData":{"fileUri":"https://x/f","mimeType":"image/png"}}]}]}`, -1, 0, "fileData"},
		{"gemini file_data, proto spelling", gem, `{"contents":[{"parts":[{"file_data":{"file_uri":"https://x/f"}}]}]}`, -1, 0, "fileData"},
		{"gemini video inline", gem, `{"contents":[{"parts":[{"inlineData":{"mimeType":"video/mp4","data":"AAAA"}}]}]}`, -1, 0, `"video/mp4"`},
		{"gemini an image it cannot read", gem, `{"contents":[{"parts":[{"inlineData":{"mimeType":"image/heic","data":"AAAA"}}]}]}`, -1, 0, "size cannot be read"},
		{"gemini google search", gem, `{"contents":[],"tools":[{"googleSearch":{}}]}`, -1, 0, "Google Search"},
		{"openai batches", "/v1/batches", `{"input_file_id":"file-1","endpoint":"/v1/chat/completions","completion_window":"24h"}`, -1, 0, "input_file_id"},
		{"a batch's request that cannot be bounded", "/v1/messages/batches", `{"requests":[{"custom_id":"r","params":{"model":"m","max_tokens":1,"messages":[],"tools":[{"type":"web_fetch_20250910","name":"f"}]}}]}`, -1, 0, "batch's request"},
		{"gemini batch in a file", "/v1beta/models/gemini-2.5-flash:batchGenerateContent", `{"batch":{"inputConfig":{"fileName":"files/1"}}}`, -1, 0, "fileName"},
		{"ollama images", "/api/generate", `{"model":"llava","prompt":"x","images":["AAAA"]}`, -1, 0, "images"},
		{"ollama template", "/api/generate", `{"model":"m","prompt":"x","template":"{{.Prompt}}{{.Prompt}}"}`, -1, 0, "template"},
		{"bedrock image", "/model/m/converse", `{"messages":[{"role":"user","content":[{"image":{"format":"png","source":{"bytes":"AAAA"}}}]}]}`, -1, 0, `"image"`},
		{"bedrock PDF", "/model/m/converse", `{"messages":[{"role":"user","content":[{"document":{"format":"pdf","name":"d","source":{"bytes":"AAAA"}}}]}]}`, -1, 0, `"pdf"`},
		{"a path of no API", "/v1/rerank", `{"query":"x"}`, -1, 0, noAPI},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := ReadRequest(c.path, []byte(c.body), def)
			if err != nil {
				t.Fatal(err)
			}
			if c.why != "" {
				if !strings.Contains(r.Unbounded, c.why) {
					t.Errorf("Unbounded = %q, want it to name %q", r.Unbounded, c.why)
				}
				return
			}
			if r.Unbounded != "" {
				t.Fatalf("Unbounded = %q, want a bound", r.Unbounded)
			}
			if c.output >= 0 && r.Output != c.output {
				t.Errorf("Output = %d, want %d", r.Output, c.output)
			}
			if r.Media != c.media {
				t.Errorf("Media = %d, want %d", r.Media, c.media)
			}
			if want := r.Bound*r.Completions + r.Batch; r.Output != want {
				t.Errorf("Output = %d, want Bound %d x Completions %d + Batch %d", r.Output, r.Bound, r.Completions, r.Batch)
			}
			if want := r.Output + r.Input + r.Media; r.Reserve != want {
				t.Errorf("Reserve = %d, want Output + Input + Media = %d", r.Reserve, want)
			}
		})
	}
}

// TestImageBoundsListed: every pattern is matched by the model it names,
// and no listed model's image costs more than a model no rule names.
func TestImageBoundsListed(t *testing.T) {
	for api, bounds := range imageBounds {
		var largest int64
		for _, b := range bounds {
			largest = max(largest, b.tokens)
		}
		if got := imageTokens(api, "a-model-nobody-named"); got != largest {
			t.Errorf("%v: an unnamed model's image = %d, want the largest, %d", api, got, largest)
		}
		for _, b := range bounds {
			model := strings.TrimSuffix(b.model, "*") + "-2025"
			if got := imageTokens(api, model); got > largest || got <= 0 {
				t.Errorf("%v %s: %d", api, model, got)
			}
		}
	}
	if got := imageTokens(Ollama, "llava"); got != 1<<53 {
		t.Errorf("an API without image bounds bounds an image at %d", got)
	}
}

func TestImageSize(t *testing.T) {
	for _, c := range []struct{ w, h int }{{1, 1}, {384, 384}, {2000, 1000}} {
		w, h, ok := imageSize([]byte(pngBase64(t, c.w, c.h)))
		if !ok || w != c.w || h != c.h {
			t.Errorf("PNG %dx%d read as %dx%d %v", c.w, c.h, w, h, ok)
		}
	}
	// A VP8X WebP header of a 3000 x 2 canvas.
	webp := []byte("RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x00\x00\x00\x00\xb7\x0b\x00\x01\x00\x00")
	if w, h, ok := imageSize([]byte(base64.StdEncoding.EncodeToString(webp))); !ok || w != 3000 || h != 2 {
		t.Errorf("WebP read as %dx%d %v", w, h, ok)
	}
	for _, bad := range []string{"", "!!!", base64.StdEncoding.EncodeToString([]byte("not an image"))} {
		if _, _, ok := imageSize([]byte(bad)); ok {
			t.Errorf("%q read as an image", bad)
		}
	}
}

// TestBoundsMessagesSayWhere: a reason names what could not be bounded and
// keeps a client's long key short.
func TestBoundsMessagesSayWhere(t *testing.T) {
	long := strings.Repeat("k", 500)
	r, err := ReadRequest("/v1/chat/completions", []byte(fmt.Sprintf(`{"%s":1}`, long)), 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Unbounded) > 200 || !strings.Contains(r.Unbounded, "the request") {
		t.Errorf("Unbounded = %q", r.Unbounded)
	}
}
