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
}
