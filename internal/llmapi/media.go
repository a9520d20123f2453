package llmapi

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"image"
	_ "image/gif" // DecodeConfig reads the headers of the formats the vendors take
	_ "image/jpeg"
	_ "image/png"
	"path"
	"strings"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
)

// imageBounds are, per API, the most one image can be billed, by model
// (a pattern with '*'; the first match wins, and a model no pattern matches
// takes the API's largest, so that a name nobody wrote a rule for never
// costs less than any model listed). Each line says the vendor's rule it
// comes from; hold it against the page.
var imageBounds = map[API][]imageBound{
	// platform.openai.com/docs/guides/images-vision, "Calculating costs":
	// an image is scaled to fit 2048x2048, then its shortest side to 768,
	// so it is at most 768x2048: 2x4 tiles of 512 at "high" detail. Tile
	// models bill a base plus a price per tile; patch models bill 32-pixel
	// patches, at most 1536, times a model's multiplier.
	OpenAIChat: openAIImageBounds,
	// Responses takes the same images (input_image).
	OpenAIResponses: openAIImageBounds,
	// docs.anthropic.com/en/docs/build-with-claude/vision, "Calculate
	// image costs": tokens = width x height / 750, an image being scaled
	// down until its long edge is at most 1568 pixels and it holds at most
	// about 1.15 megapixels: "about 1,600 tokens" at most.
	AnthropicMessages: {{"*", 1600, "(w*h)/750, at most ~1.15 MP"}},
}

var openAIImageBounds = []imageBound{
	{"gpt-4o-mini*", 2833 + 8*5667, "2,833 base + 5,667 a tile, 8 tiles"},
	{"gpt-4.1-nano*", 3779, "1,536 patches x 2.46"},
	{"gpt-4.1-mini*", 2489, "1,536 patches x 1.62"},
	{"o4-mini*", 2642, "1,536 patches x 1.72"},
	{"gpt-4o*", 85 + 8*170, "85 base + 170 a tile, 8 tiles"},
	{"chatgpt-4o*", 85 + 8*170, "85 base + 170 a tile, 8 tiles"},
	{"gpt-4.1*", 85 + 8*170, "85 base + 170 a tile, 8 tiles"},
	{"gpt-4.5*", 85 + 8*170, "85 base + 170 a tile, 8 tiles"},
	{"o1*", 75 + 8*150, "75 base + 150 a tile, 8 tiles"},
	{"o3*", 75 + 8*150, "75 base + 150 a tile, 8 tiles"},
}

// imageBound is the most one image costs on the models a pattern matches.
type imageBound struct {
	model  string
	tokens int64
	rule   string
}

// imageTokens is the most one image can be billed on api's model: the
// first pattern that matches, else the largest listed; an API without
// bounds (none of its shapes counts images) bounds nothing.
func imageTokens(api API, model string) int64 {
	largest := int64(0)
	if len(imageBounds[api]) == 0 {
		return strictnum.Max
	}
	lower := strings.ToLower(model)
	for _, b := range imageBounds[api] {
		if ok, _ := path.Match(b.model, lower); ok && !strings.Contains(lower, "/") {
			return b.tokens
		}
		largest = max(largest, b.tokens)
	}
	return largest
}

// Gemini bills an image of at most 384 pixels a side as 258 tokens, and a
// larger one as 258 a tile of 768x768 (ai.google.dev/gemini-api/docs/tokens,
// "Multimodal tokens"); Gemini 3 bills an image at its media resolution,
// 1,120 tokens at "high", its default for images
// (ai.google.dev/gemini-api/docs/media-resolution). The bound is the larger.
const (
	geminiTile       = 768
	geminiTileTokens = 258
	geminiImageFloor = 1120
)

// geminiImageTokens is the most an inline image of the base64 data can be
// billed, false when its size cannot be read.
func geminiImageTokens(data []byte) (int64, bool) {
	w, h, ok := imageSize(data)
	if !ok {
		return 0, false
	}
	tiles := int64((w+geminiTile-1)/geminiTile) * int64((h+geminiTile-1)/geminiTile)
	return max(tiles*geminiTileTokens, geminiImageFloor), true
}

// imageSize reads an image's width and height from its header, the image
// being base64 (standard or URL alphabet, padded or not) of a PNG, JPEG,
// GIF or WebP.
func imageSize(b64 []byte) (w, h int, ok bool) {
	raw := make([]byte, base64.StdEncoding.DecodedLen(len(b64)))
	n, err := base64.StdEncoding.Decode(raw, b64)
	if err != nil {
		n, err = base64.RawStdEncoding.Decode(raw, bytes.TrimRight(b64, "="))
	}
	if err != nil {
		n, err = base64.RawURLEncoding.Decode(raw, bytes.TrimRight(b64, "="))
	}
	if err != nil {
		return 0, 0, false
	}
	raw = raw[:n]
	if w, h, ok := webpSize(raw); ok {
		return w, h, true
	}
	c, _, err := image.DecodeConfig(bytes.NewReader(raw))
	if err != nil || c.Width <= 0 || c.Height <= 0 {
		return 0, 0, false
	}
	return c.Width, c.Height, true
}

// webpSize reads a WebP's canvas size (developers.google.com/speed/webp/
// docs/riff_container): VP8X's 24-bit sizes, VP8L's 14-bit ones, or VP8's
// frame header.
func webpSize(b []byte) (w, h int, ok bool) {
	if len(b) < 30 || string(b[0:4]) != "RIFF" || string(b[8:12]) != "WEBP" {
		return 0, 0, false
	}
	switch string(b[12:16]) {
	case "VP8X":
		w = 1 + (int(b[24]) | int(b[25])<<8 | int(b[26])<<16)
		h = 1 + (int(b[27]) | int(b[28])<<8 | int(b[29])<<16)
	case "VP8L":
		v := binary.LittleEndian.Uint32(b[21:25])
		w, h = 1+int(v&0x3fff), 1+int(v>>14&0x3fff)
	case "VP8 ":
		w = int(binary.LittleEndian.Uint16(b[26:28]) & 0x3fff)
		h = int(binary.LittleEndian.Uint16(b[28:30]) & 0x3fff)
	default:
		return 0, 0, false
	}
	return w, h, w > 0 && h > 0
}
