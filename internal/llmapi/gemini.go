package llmapi

// Google's Gemini API, POST .../models/{model}:generateContent and
// :streamGenerateContent, v1 and v1beta, and Vertex's publishers/google
// paths (ai.google.dev/api/generate-content). The REST API parses proto
// JSON, which accepts every field by its lowerCamel name and by its
// snake_case proto name: both are read, segment by segment.
//
//	model         the path's {model}
//	output bound  generationConfig.maxOutputTokens
//	multipliers   generationConfig.candidateCount
//	addend        generationConfig.thinkingConfig.thinkingBudget, when
//	              positive: Google's thinking guide prices thinking apart
//	              from the output and does not say that maxOutputTokens
//	              bounds it (users report that on Gemini 3 it does, on 2.5 it
//	              need not), so it is added; -1 (dynamic) and 0 add nothing
//	usage         top-level "usageMetadata" of each GenerateContentResponse
//	              promptTokenCount         -> Input (cached within)
//	              cachedContentTokenCount  -> Cached, PART of promptTokenCount
//	              toolUsePromptTokenCount  -> Input, apart from promptTokenCount
//	              candidatesTokenCount     -> Output
//	              thoughtsTokenCount       -> Output, apart from candidatesTokenCount
//	              totalTokenCount          -> the whole
//	cumulative    running totals: each chunk of a stream carries the usage so
//	              far, the last one wins. A stream is SSE with ?alt=sse and a
//	              JSON array of responses without it: each element is a
//	              document.
var gemini = &table{
	api:         Gemini,
	name:        "gemini",
	output:      protoPaths("generationConfig.maxOutputTokens"),
	multipliers: protoPaths("generationConfig.candidateCount"),
	addends:     protoPaths("generationConfig.thinkingConfig.thinkingBudget"),
	modelInPath: true,
	usageAt:     []usageAt{{path: "usageMetadata"}},
	usage: []usageField{
		{"promptTokenCount", input},
		{"cachedContentTokenCount", inputCached},
		{"toolUsePromptTokenCount", input},
		{"candidatesTokenCount", output},
		{"thoughtsTokenCount", output},
		{"totalTokenCount", total},
	},
}
