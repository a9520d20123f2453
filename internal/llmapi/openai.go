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
//	              prompt_tokens_details.audio_tokens          -> AudioInput, PART of prompt_tokens
//	              completion_tokens_details.audio_tokens      -> AudioOutput, PART of completion_tokens
//	              total_tokens                                -> the whole
//	              the document's "service_tier", beside usage -> Service (default, flex, priority)
//	cumulative    no: one document carries the usage; the last one wins
var openAIChat = &table{
	api:         OpenAIChat,
	name:        "openai_chat",
	output:      paths("max_completion_tokens", "max_tokens", "n_predict"),
	multipliers: paths("n", "best_of"),
	usageAt:     []usageAt{{path: "usage"}},
	usage:       openAIUsage,
	body:        openAIChatBody,
}

// openAIUsage is the usage object of Chat Completions and Completions.
var openAIUsage = []usageField{
	{"prompt_tokens", input},
	{"prompt_tokens_details.cached_tokens", inputCached},
	{"completion_tokens", output},
	{"completion_tokens_details.reasoning_tokens", part},
	{"prompt_tokens_details.audio_tokens", audioIn},
	{"completion_tokens_details.audio_tokens", audioOut},
	{"total_tokens", total},
	{"../service_tier", serviceTier},
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
	body:        openAICompletionsBody,
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
//	              the response's "service_tier"               -> Service
//	cumulative    no: one terminal event
var openAIResponses = &table{
	api:       OpenAIResponses,
	name:      "openai_responses",
	output:    paths("max_output_tokens"),
	toolCalls: "max_tool_calls",
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
		{"../service_tier", serviceTier},
	},
	body: openAIResponsesBody,
}

// Embeddings, POST .../embeddings
// (platform.openai.com/docs/api-reference/embeddings/create): it generates
// nothing; its usage is prompt_tokens and total_tokens.
var openAIEmbeddings = &table{
	api:              OpenAIEmbeddings,
	name:             "openai_embeddings",
	generatesNothing: true,
	usageAt:          []usageAt{{path: "usage"}},
	usage:            openAIUsage,
	body:             openAIEmbeddingsBody,
}

// Batches, POST .../batches
// (platform.openai.com/docs/api-reference/batch/create): its requests are
// in an uploaded file, so it cannot be bounded; its answer carries no usage.
var openAIBatches = &table{
	api:  OpenAIBatches,
	name: "openai_batches",
	body: openAIBatchesBody,
}

// The request bodies, as the API references list their fields (every one;
// a field not listed cannot be bounded), with the sampling fields of vLLM
// and llama.cpp that generate nothing beyond the output bound.
//
//	text, tools' schemas   their bytes
//	image_url, input_image an image each, at the most the model bills for
//	                       one (media.go), by URL, file id or inline alike
//	input_audio            its bytes: about 10 tokens a second, which no
//	                       codec carries in fewer bytes
//	file, input_file       cannot: a document's pages are billed as text
//	                       and images that its bytes do not bound
//	previous_response_id,  cannot: input the body does not carry
//	conversation, prompt,
//	item_reference, a
//	message's audio by id
//	web_search_options,    cannot: a hosted tool's results are input the
//	hosted tools           body does not carry
//	web_search* tool       its calls, a fee each (Responses): at most
//	(Responses),           max_tool_calls, which bounds all built-in tool
//	web_search_options     calls of the response; web_search_options
//	(chat)                 (chat): nothing bounds them
//	prompt (Completions)   a list of strings or token arrays multiplies
//	                       the output bound, as n does
var (
	openAIChatBody = obj("the request",
		"model", free, "messages", listOf(openAIChatMessage),
		"max_completion_tokens", free, "max_tokens", free, "n", free,
		"audio", free, "modalities", free, "frequency_penalty", free, "presence_penalty", free,
		"function_call", free, "functions", free, "tools", listOf(openAIChatTool),
		"tool_choice", free, "parallel_tool_calls", free, "logit_bias", free, "logprobs", free,
		"top_logprobs", free, "metadata", free, "prediction", free, "prompt_cache_key", free,
		"prompt_cache_retention", free, "reasoning_effort", free, "response_format", free,
		"safety_identifier", free, "seed", free, "service_tier", free, "stop", free, "store", free,
		"stream", free, "stream_options", free, "temperature", free, "top_p", free, "user", free,
		"verbosity", free,
		"web_search_options", searching("web_search_options: a web search's results are input the body does not carry",
			"", "web_search_options: nothing in the request bounds how many searches it bills, a fee each"),
		// vLLM and llama.cpp.
		"best_of", free, "n_predict", free, "top_k", free, "min_p", free, "repetition_penalty", free,
		"min_tokens", free, "ignore_eos", free, "stop_token_ids", free, "skip_special_tokens", free,
	)
	openAIChatMessage = obj("a message",
		"role", free, "name", free, "content", listOf(openAIChatPart), "tool_calls", free,
		"tool_call_id", free, "function_call", free, "refusal", free,
		"audio", cannot("a message's audio: an earlier answer's audio, named by id, is input the body does not carry"),
	)
	openAIChatPart = byTag("a message's content part", "type",
		"text", free,
		"image_url", counted(free, anImage),
		"input_audio", free,
		"refusal", free,
		"file", cannot("a file part: a document's pages are billed as text and images that its bytes do not bound"),
	)
	openAIChatTool = byTag("a tool", "type", "function", free, "custom", free)

	openAICompletionsBody = obj("the request",
		"model", free, "prompt", &shape{kind: prompts}, "suffix", free,
		"max_tokens", free, "n", free, "best_of", free,
		"frequency_penalty", free, "presence_penalty", free, "logit_bias", free, "logprobs", free,
		"seed", free, "stop", free, "stream", free, "stream_options", free, "temperature", free,
		"top_p", free, "user", free,
		"n_predict", free, "top_k", free, "min_p", free, "repetition_penalty", free, "min_tokens", free,
	)

	openAIResponsesBody = obj("the request",
		"model", free, "input", listOf(openAIResponsesItem), "instructions", free,
		"max_output_tokens", free, "max_tool_calls", free, "metadata", free,
		"parallel_tool_calls", free, "prompt_cache_key", free, "prompt_cache_retention", free,
		"reasoning", free, "safety_identifier", free, "service_tier", free, "store", free,
		"stream", free, "stream_options", free, "temperature", free, "text", free,
		"tool_choice", free, "tools", listOf(openAIResponsesTool), "top_logprobs", free,
		"top_p", free, "truncation", free, "user", free, "background", free, "include", free,
		"previous_response_id", cannot("previous_response_id: an earlier response's input and output are input the body does not carry"),
		"conversation", cannot("conversation: a stored conversation's items are input the body does not carry"),
		"prompt", cannot("prompt: a stored prompt is input the body does not carry"),
	)
	openAIResponsesMessage = obj("an input message",
		"type", free, "role", free, "content", listOf(openAIResponsesPart), "id", free, "status", free,
	)
	openAIResponsesOutput = obj("a tool call's output",
		"type", free, "call_id", free, "output", listOf(openAIResponsesPart), "id", free, "status", free,
	)
	openAIResponsesItem = byTag("an input item", "type",
		"", openAIResponsesMessage,
		"message", openAIResponsesMessage,
		"function_call", free,
		"function_call_output", openAIResponsesOutput,
		"custom_tool_call", free,
		"custom_tool_call_output", openAIResponsesOutput,
		"reasoning", free,
		"item_reference", cannot("an item_reference: a stored item is input the body does not carry"),
	)
	openAIResponsesPart = byTag("a content part", "type",
		"input_text", free, "output_text", free, "refusal", free,
		"input_image", counted(free, anImage),
		"input_audio", free,
		"input_file", cannot("an input_file: a document's pages are billed as text and images that its bytes do not bound"),
	)
	openAIResponsesTool = byTag("a tool", "type", "function", free, "custom", free,
		"web_search*", searchingByToolCalls("a web search tool: its results are input the body does not carry",
			"a web search tool without max_tool_calls: nothing bounds how many searches it bills, a fee each"),
	)

	// Embeddings, POST .../embeddings: the input's bytes, nothing
	// generated.
	openAIEmbeddingsBody = obj("the request",
		"model", free, "input", free, "dimensions", free, "encoding_format", free, "user", free,
	)

	// Batches, POST .../batches: the requests are in a file.
	openAIBatchesBody = obj("the request",
		"input_file_id", repeating("input_file_id: a batch's requests are in a file the body does not carry"),
		"endpoint", free, "completion_window", free, "metadata", free, "output_expires_after", free,
	)
)
