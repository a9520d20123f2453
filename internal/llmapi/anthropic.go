package llmapi

// Anthropic's Messages API, POST .../messages
// (docs.anthropic.com/en/api/messages, .../messages-streaming):
//
//	output bound  max_tokens (required; extended thinking's
//	              thinking.budget_tokens must be below it, so it is within)
//	multipliers   none
//	usage         top-level "usage" of the Message document and of each
//	              message_delta event; "message.usage" of the message_start
//	              event, a partial one: input and cache so far, output 1
//	              (the final usage has not come until message_delta's)
//	              input_tokens                 -> Input: EXCLUDES the cache fields
//	              cache_creation_input_tokens  -> CacheWrite, apart from input_tokens
//	              cache_read_input_tokens      -> Cached, apart from input_tokens
//	              output_tokens                -> Output
//	              cache_creation.ephemeral_1h_input_tokens -> CacheWrite1h,
//	                                           PART of cache_creation_input_tokens
//	                                           (ephemeral_5m_input_tokens the rest)
//	              server_tool_use.web_search_requests -> WebSearches, a fee each
//	              service_tier                 -> Service (standard, priority, batch)
//	              no total: the whole is the sum of the four
//	cumulative    yes, field by field: message_delta's usage fields are
//	              running totals, and newer API versions send input_tokens and
//	              the cache fields there too (null when not sent); each field
//	              takes the last value seen, across message_start and
//	              message_delta
var anthropicMessages = &table{
	api:    AnthropicMessages,
	name:   "anthropic_messages",
	output: paths("max_tokens"),
	usageAt: []usageAt{
		{path: "usage"},
		{path: "message.usage", when: []string{"message_start"}, partial: true},
	},
	usage: []usageField{
		{"input_tokens", input},
		{"cache_creation_input_tokens", cacheWrite},
		{"cache_read_input_tokens", cached},
		{"output_tokens", output},
		{"cache_creation.ephemeral_1h_input_tokens", cacheWrite1h},
		{"cache_creation.ephemeral_5m_input_tokens", part},
		{"server_tool_use.web_search_requests", webSearches},
		{"service_tier", serviceTier},
	},
	perField: true,
	body:     anthropicBody,
}

// Message Batches, POST .../messages/batches: each request's bound, added
// up; the answer is the batch, with no usage, so a batch pays its
// reservation.
var anthropicBatches = &table{
	api:              AnthropicBatches,
	name:             "anthropic_batches",
	generatesNothing: true,
	body:             anthropicBatchesBody,
}

// Anthropic's token counting, POST .../messages/count_tokens
// (docs.anthropic.com/en/api/messages-count-tokens): it generates nothing
// (output bound 0) and its {"input_tokens": N} is a count, not a usage to
// charge, so it reports none.
var anthropicCountTokens = &table{
	api:              AnthropicCountTokens,
	name:             "anthropic_count_tokens",
	generatesNothing: true,
	body:             free,
}

// The Messages request body (docs.anthropic.com/en/api/messages), every
// field; a field, block type or tool type not listed cannot be bounded.
//
//	text, tool_use, tool_result, thinking,  their bytes
//	search_result, document of text
//	image                                   an image each (media.go), by
//	                                        base64, URL or file id alike
//	document of a PDF, by URL or file id    cannot: its pages are billed as
//	                                        text and images its bytes do
//	                                        not bound
//	container, mcp_servers, server tools    cannot: input the body does not
//	(web search, web fetch, code execution) carry
//	web_search_* tool                       its searches, a fee each: at
//	                                        most max_uses (the tool's limit
//	                                        per request); without it, not
//	                                        bounded
//	tools                                   + 530 tokens: the tool-use
//	                                        system prompt, at most 530 in
//	                                        the tool-use page's table
//	bash, text_editor, computer tools       + 245, 700, and 735 + 499
//	                                        tokens each: the definitions
//	                                        and system prompt the page gives
var (
	anthropicBody = obj("the request",
		"model", free, "messages", listOf(anthropicMessage), "max_tokens", free,
		"system", listOf(anthropicBlock), "metadata", free, "stop_sequences", free, "stream", free,
		"temperature", free, "thinking", free, "tool_choice", free,
		"tools", adding(listOf(anthropicTool), 530), "top_k", free, "top_p", free, "service_tier", free,
		"container", repeating("container: a code execution container's files are input the body does not carry"),
		"mcp_servers", repeating("mcp_servers: an MCP server's tools and results are input the body does not carry"),
	)
	anthropicMessage = obj("a message", "role", free, "content", listOf(anthropicBlock))
	anthropicBlock   = byTag("a content block", "type")
	anthropicTool    = byTag("a tool", "type",
		"", free, "custom", free,
		"bash_*", adding(free, 245),
		"text_editor_*", adding(free, 700),
		"computer_*", adding(free, 735+499),
		"web_search_*", searching("the web search tool: its results are input the body does not carry",
			"max_uses", "the web search tool without max_uses: nothing bounds how many searches it bills, a fee each"),
	)
	anthropicDocumentSource = byTag("a document's source", "type",
		"text", free,
		"content", obj("a document's content", "type", free, "content", listOf(anthropicBlock)),
		"base64", cannot("a PDF document: its pages are billed as text and images that its bytes do not bound"),
		"url", cannot("a document by URL is input the body does not carry"),
		"file", cannot("a document by file id is input the body does not carry"),
	)

	// Message Batches, POST .../messages/batches
	// (docs.anthropic.com/en/api/creating-message-batches): the sum of
	// its requests' bounds.
	anthropicBatchesBody = obj("the request",
		"requests", listOf(obj("a batch's request", "custom_id", free, "params", nested(AnthropicMessages))),
	)
)

// The blocks nest (a tool result holds blocks), so they are filled in here.
func init() {
	anthropicBlock.variants = []variant{
		{"text", free},
		{"image", counted(free, anImage)},
		{"document", obj("a document block", "type", free, "source", anthropicDocumentSource,
			"title", free, "context", free, "citations", free, "cache_control", free)},
		{"tool_use", free},
		{"tool_result", obj("a tool result", "type", free, "tool_use_id", free,
			"content", listOf(anthropicBlock), "is_error", free, "cache_control", free)},
		{"thinking", free},
		{"redacted_thinking", free},
		{"search_result", free},
		{"server_tool_use", free},
		{"web_search_tool_result", free},
	}
}
