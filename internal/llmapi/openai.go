package llmapi

// OpenAI's APIs, and the servers that copy them (vLLM, llama.cpp's server,
// Ollama's /v1, LiteLLM, ...).
//
// Chat Completions, POST .../chat/completions
// (platform.openai.com/docs/api-reference/chat/create):
//
//	output bound  max_completion_tokens, max_tokens (deprecated, still read),
//	              n_predict (llama.cpp's server reads it before max_tokens)
//	multipliers   n; best_of (vLLM accepts it on chat too)
//	usage         top-level "usage" of the chat.completion document, or of
//	              the chunk that carries it when stream_options.include_usage
//	              is set (every other chunk has "usage": null)
//	              prompt_tokens                               -> Input (cached within)
//	              prompt_tokens_details.cached_tokens         -> Cached, PART of prompt_tokens
//	              completion_tokens                           -> Output (reasoning within)
//	              completion_tokens_details.reasoning_tokens  PART of completion_tokens
//	              total_tokens                                -> the whole
//	cumulative    no: one document carries the usage; the last one wins
var openAIChat = &table{
	api:         OpenAIChat,
	name:        "openai_chat",
	output:      paths("max_completion_tokens", "max_tokens", "n_predict"),
	multipliers: paths("n", "best_of"),
	usageAt:     []usageAt{{path: "usage"}},
	usage:       openAIUsage,
}

// openAIUsage is the usage object of Chat Completions and Completions.
var openAIUsage = []usageField{
	{"prompt_tokens", input},
	{"prompt_tokens_details.cached_tokens", inputCached},
	{"completion_tokens", output},
	{"completion_tokens_details.reasoning_tokens", part},
	{"total_tokens", total},
}

// Completions (legacy), POST .../completions
// (platform.openai.com/docs/api-reference/completions/create):
//
//	output bound  max_tokens; n_predict (llama.cpp)
//	multipliers   n, best_of: the server generates best_of completions and
//	              returns the best n (best_of >= n), so the larger counts
//	usage         as Chat Completions
var openAICompletions = &table{
	api:         OpenAICompletions,
	name:        "openai_completions",
	output:      paths("max_tokens", "n_predict"),
	multipliers: paths("n", "best_of"),
	usageAt:     []usageAt{{path: "usage"}},
	usage:       openAIUsage,
}

// Responses, POST .../responses
// (platform.openai.com/docs/api-reference/responses/create):
//
//	output bound  max_output_tokens (visible output and reasoning)
//	multipliers   none
//	usage         top-level "usage" of the response document; in a stream,
//	              "response.usage" of the event whose top-level "type" is
//	              response.completed, response.incomplete or response.failed
//	              (the earlier events carry "usage": null)
//	              input_tokens                                -> Input (cached within)
//	              input_tokens_details.cached_tokens          -> Cached, PART of input_tokens
//	              output_tokens                               -> Output (reasoning within)
//	              output_tokens_details.reasoning_tokens      PART of output_tokens
//	              total_tokens                                -> the whole
//	cumulative    no: one terminal event
var openAIResponses = &table{
	api:    OpenAIResponses,
	name:   "openai_responses",
	output: paths("max_output_tokens"),
	usageAt: []usageAt{
		{path: "usage"},
		{path: "response.usage", when: []string{"response.completed", "response.incomplete", "response.failed"}},
	},
	usage: []usageField{
		{"input_tokens", input},
		{"input_tokens_details.cached_tokens", inputCached},
		{"output_tokens", output},
		{"output_tokens_details.reasoning_tokens", part},
		{"total_tokens", total},
	},
}
