package llmtest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image"
	_ "image/gif" // the formats of the images a test sends inline
	_ "image/jpeg"
	_ "image/png"
	"strings"
)

// mediaTokens is what the images of a request to api bill, as each vendor
// publishes its rule: the stand-in charges them as input beside the
// request's text, so that a test sees what a call that sends images costs.
// An image whose size the stand-in cannot read (by URL, by file id) is
// billed as the largest the vendor bills for one.
//
//   - OpenAI (platform.openai.com/docs/guides/images-vision): scaled to fit
//     2048x2048, then its shortest side to 768; "low" detail is the base,
//     else the base plus a price per 512-pixel tile. gpt-4o-mini: 2,833 +
//     5,667 a tile; others: 85 + 170.
//   - Anthropic (docs.anthropic.com/en/docs/build-with-claude/vision):
//     width x height / 750, scaled down to a long edge of 1568 and about
//     1.15 megapixels: at most 1,600.
//   - Gemini (ai.google.dev/gemini-api/docs/tokens): 258 for sides of at
//     most 384, else 258 a 768x768 tile.
func mediaTokens(api, model string, body []byte) int64 {
	var doc struct {
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Input    json.RawMessage `json:"input"`
		Contents []struct {
			Parts []json.RawMessage `json:"parts"`
		} `json:"contents"`
	}
	if json.Unmarshal(body, &doc) != nil {
		return 0
	}
	var n int64
	switch api {
	case Chat:
		for _, m := range doc.Messages {
			for _, p := range contentParts(m.Content) {
				if p.Type == "image_url" {
					n += openAIImage(model, p.ImageURL.URL, p.ImageURL.Detail)
				}
			}
		}
	case Responses:
		var items []struct {
			Content json.RawMessage `json:"content"`
		}
		_ = json.Unmarshal(doc.Input, &items)
		for _, it := range items {
			for _, p := range contentParts(it.Content) {
				if p.Type == "input_image" {
					n += openAIImage(model, string(bytes.Trim(p.ImageURLRaw, `"`)), p.Detail)
				}
			}
		}
	case Messages:
		for _, m := range doc.Messages {
			n += anthropicImages(m.Content)
		}
	case Gemini, GeminiStream:
		for _, c := range doc.Contents {
			for _, raw := range c.Parts {
				var p struct {
					InlineData *struct {
						MimeType string `json:"mimeType"`
						Data     string `json:"data"`
					} `json:"inlineData"`
				}
				if json.Unmarshal(raw, &p) == nil && p.InlineData != nil && strings.HasPrefix(p.InlineData.MimeType, "image/") {
					n += geminiImage(p.InlineData.Data)
				}
			}
		}
	}
	return n
}

// part is a content part of any of the APIs, as far as images go.
type part struct {
	Type     string `json:"type"`
	ImageURL struct {
		URL    string `json:"url"`
		Detail string `json:"detail"`
	} `json:"-"`
	ImageURLRaw json.RawMessage `json:"image_url"`
	Detail      string          `json:"detail"`
	Source      struct {
		Type string `json:"type"`
		Data string `json:"data"`
	} `json:"source"`
	Content json.RawMessage `json:"content"`
}

// contentParts reads a content that is a list of parts (a string is none).
func contentParts(raw json.RawMessage) []part {
	var ps []part
	if json.Unmarshal(raw, &ps) != nil {
		return nil
	}
	for i := range ps {
		_ = json.Unmarshal(ps[i].ImageURLRaw, &ps[i].ImageURL)
	}
	return ps
}

func openAIImage(model, url, detail string) int64 {
	base, tile := int64(85), int64(170)
	if strings.HasPrefix(model, "gpt-4o-mini") {
		base, tile = 2833, 5667
	}
	if detail == "low" {
		return base
	}
	w, h, ok := dataURLSize(url)
	if !ok {
		return base + 8*tile
	}
	fit := func(w, h, box float64) (float64, float64) {
		if s := box / max(w, h); s < 1 {
			return w * s, h * s
		}
		return w, h
	}
	fw, fh := fit(float64(w), float64(h), 2048)
	if s := 768 / min(fw, fh); s < 1 {
		fw, fh = fw*s, fh*s
	}
	tiles := int64((fw+511)/512) * int64((fh+511)/512)
	return base + tiles*tile
}

func anthropicImages(content json.RawMessage) int64 {
	var n int64
	for _, p := range contentParts(content) {
		switch p.Type {
		case "image":
			if w, h, ok := imageSize(p.Source.Data); ok && p.Source.Type == "base64" {
				n += min(int64(w)*int64(h)/750+1, 1600)
			} else {
				n += 1600
			}
		case "tool_result":
			n += anthropicImages(p.Content)
		}
	}
	return n
}

func geminiImage(data string) int64 {
	w, h, ok := imageSize(data)
	if !ok || w <= 384 && h <= 384 {
		return 258
	}
	return int64((w+767)/768) * int64((h+767)/768) * 258
}

// dataURLSize reads the size of a data: URL's image.
func dataURLSize(url string) (w, h int, ok bool) {
	_, data, found := strings.Cut(url, ";base64,")
	if !found || !strings.HasPrefix(url, "data:") {
		return 0, 0, false
	}
	return imageSize(data)
}

func imageSize(b64 string) (w, h int, ok bool) {
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return 0, 0, false
	}
	c, _, err := image.DecodeConfig(bytes.NewReader(raw))
	return c.Width, c.Height, err == nil
}
