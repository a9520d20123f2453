package llmtest

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// HeaderDimensions reports usage that vendors bill apart from plain
// tokens, as a comma-separated list of name=value: audio_input=N and
// audio_output=N (OpenAI's audio_tokens, within the prompt's and the
// completion's tokens, which grow by N), cache_write_1h=N (Anthropic's
// cache_creation.ephemeral_1h_input_tokens: N more cache writes, of an
// hour's TTL), web_searches=N (Anthropic's
// server_tool_use.web_search_requests) and service_tier=NAME (the tier
// the answer says served it: OpenAI's "service_tier", Anthropic's
// usage.service_tier). They count as used, and the Call records them.
const HeaderDimensions = "X-Test-Dimensions"

// Dims are a call's usage beyond its plain tokens (HeaderDimensions).
type Dims struct {
	AudioInput, AudioOutput, CacheWrite1h, WebSearches int64
	// Service is the service tier reported; "" for the vendor's default.
	Service string
}

// readDims reads HeaderDimensions of h.
func readDims(h http.Header) (Dims, error) {
	var d Dims
	v := h.Get(HeaderDimensions)
	if v == "" {
		return d, nil
	}
	for _, item := range strings.Split(v, ",") {
		name, value, _ := strings.Cut(strings.TrimSpace(item), "=")
		if name == "service_tier" {
			d.Service = value
			continue
		}
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n < 0 || n > MaxCount {
			return d, fmt.Errorf("%s: %q is not a count", HeaderDimensions, item)
		}
		switch name {
		case "audio_input":
			d.AudioInput = n
		case "audio_output":
			d.AudioOutput = n
		case "cache_write_1h":
			d.CacheWrite1h = n
		case "web_searches":
			d.WebSearches = n
		default:
			return d, fmt.Errorf("%s: %q names no dimension", HeaderDimensions, item)
		}
	}
	return d, nil
}

// service is the tier an answer reports: the knob's, else def.
func (d Dims) service(def string) string {
	if d.Service != "" {
		return d.Service
	}
	return def
}
