package llmtest

import (
	"bytes"
	"encoding/base64"
	"image"
	"image/png"
	"testing"
)

func pngOf(t *testing.T, w, h int) string {
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

// TestMediaTokens: images billed by each vendor's published rule.
func TestMediaTokens(t *testing.T) {
	tiny, wide := pngOf(t, 1, 1), pngOf(t, 2000, 1000)
	cases := []struct {
		name, api, model, body string
		want                   int64
	}{
		{"gpt-4o-mini, 1x1, high", Chat, "gpt-4o-mini", `{"messages":[{"content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + tiny + `"}}]}]}`, 2833 + 5667},
		{"gpt-4o-mini, low", Chat, "gpt-4o-mini", `{"messages":[{"content":[{"type":"image_url","image_url":{"url":"https://x/a.png","detail":"low"}}]}]}`, 2833},
		{"gpt-4o-mini, by URL: the largest", Chat, "gpt-4o-mini", `{"messages":[{"content":[{"type":"image_url","image_url":{"url":"https://x/a.png"}}]}]}`, 2833 + 8*5667},
		{"gpt-4o, 2000x1000: 1536x768, 3x2 tiles", Chat, "gpt-4o", `{"messages":[{"content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + wide + `"}}]}]}`, 85 + 6*170},
		{"Responses, by URL", Responses, "gpt-4o", `{"input":[{"role":"user","content":[{"type":"input_image","image_url":"https://x/a.png"}]}]}`, 85 + 8*170},
		{"Anthropic, 1x1 and a URL in a tool result", Messages, "claude", `{"messages":[{"content":[{"type":"image","source":{"type":"base64","data":"` + tiny + `"}},{"type":"tool_result","content":[{"type":"image","source":{"type":"url"}}]}]}]}`, 1 + 1600},
		{"Gemini, 1x1 and 2000x1000", Gemini, "g", `{"contents":[{"parts":[{"inlineData":{"mimeType":"image/png","data":"` + tiny + `"}},{"inlineData":{"mimeType":"image/png","data":"` + wide + `"}}]}]}`, 258 + 6*258},
		{"text only", Chat, "gpt-4o", `{"messages":[{"content":"hi"}]}`, 0},
	}
	for _, c := range cases {
		if got := mediaTokens(c.api, c.model, []byte(c.body)); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}
