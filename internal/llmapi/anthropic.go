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
	},
	perField: true,
}

// Anthropic's token counting, POST .../messages/count_tokens
// (docs.anthropic.com/en/api/messages-count-tokens): it generates nothing
// (output bound 0) and its {"input_tokens": N} is a count, not a usage to
// charge, so it reports none.
var anthropicCountTokens = &table{
	api:              AnthropicCountTokens,
	name:             "anthropic_count_tokens",
	generatesNothing: true,
}
