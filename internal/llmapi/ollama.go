package llmapi

// Ollama's native API, POST /api/chat and /api/generate
// (github.com/ollama/ollama/blob/main/docs/api.md); its OpenAI-compatible
// /v1 paths are read as OpenAI's.
//
//	output bound  options.num_predict; -1 (no limit) and -2 (fill the
//	              context) are negative, so they count as not named and the
//	              default applies
//	multipliers   none
//	usage         the top-level object of the final document (done: true):
//	              one JSON document with "stream": false, else NDJSON
//	              prompt_eval_count  -> Input
//	              eval_count         -> Output
//	              no total: the whole is the sum
//	cumulative    no: the final document carries it
var ollama = &table{
	api:     Ollama,
	name:    "ollama",
	output:  paths("options.num_predict"),
	usageAt: []usageAt{{path: ""}},
	usage: []usageField{
		{"prompt_eval_count", input},
		{"eval_count", output},
	},
	body: ollamaBody,
}

// The request bodies of /api/chat and /api/generate, every field of both;
// a field not listed cannot be bounded.
//
//	messages, prompt, system, suffix,    their bytes (context's token ids
//	tools, format, context               take at least 2 bytes each)
//	options                              its bytes: sampling and runtime
//	                                     settings, num_predict the bound
//	images                               cannot: a vision model's tokens
//	                                     for an image depend on the model
//	template                             cannot: a template can repeat the
//	                                     prompt any number of times
var (
	ollamaBody = obj("the request",
		"model", free, "messages", listOf(ollamaMessage), "tools", free, "format", free,
		"options", free, "stream", free, "keep_alive", free, "think", free,
		"prompt", free, "suffix", free, "system", free, "raw", free, "context", free,
		"images", ollamaImages,
		"template", cannot("template: a prompt template can repeat the prompt any number of times"),
	)
	ollamaMessage = obj("a message",
		"role", free, "content", free, "images", ollamaImages, "tool_calls", free,
		"thinking", free, "tool_name", free,
	)
	ollamaImages = cannot("images: what an image costs depends on the model Ollama runs")
)
