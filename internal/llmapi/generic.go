package llmapi

import "strings"

// The generic reading, for a path no table claims (Unknown): every table's
// output bounds, multipliers and addends at once (the largest found, the
// default when none is), and every table's usage places, each usage field
// taking its last value (the most any of the APIs could mean). It never
// reserves less than the table of the API the path really is.
var generic = union(openAIChat, openAICompletions, openAIResponses, anthropicMessages, gemini, ollama, bedrockConverse)

// tables holds every API's table, by API.
var tables = [...]*table{
	Unknown:              generic,
	OpenAIChat:           openAIChat,
	OpenAICompletions:    openAICompletions,
	OpenAIResponses:      openAIResponses,
	AnthropicMessages:    anthropicMessages,
	AnthropicCountTokens: anthropicCountTokens,
	Gemini:               gemini,
	Ollama:               ollama,
	BedrockConverse:      bedrockConverse,
	OpenAIEmbeddings:     openAIEmbeddings,
	OpenAIBatches:        openAIBatches,
	AnthropicBatches:     anthropicBatches,
	GeminiBatch:          geminiBatch,
}

// union returns the table that reads every field of ts.
func union(ts ...*table) *table {
	u := &table{api: Unknown, name: "unknown", parts: ts, perField: true}
	for _, t := range ts {
		u.output = appendNew(u.output, t.output)
		u.multipliers = appendNew(u.multipliers, t.multipliers)
		u.addends = appendNew(u.addends, t.addends)
	}
	return u
}

func appendNew(to, from []reqPath) []reqPath {
	for _, p := range from {
		seen := false
		for _, q := range to {
			seen = seen || q.String() == p.String()
		}
		if !seen {
			to = append(to, p)
		}
	}
	return to
}

// String is the path as its first spellings, dotted.
func (p reqPath) String() string {
	segs := make([]string, len(p))
	for i, s := range p {
		segs[i] = strings.Join(s, "|")
	}
	return strings.Join(segs, ".")
}
