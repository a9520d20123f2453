package llmapi

// Amazon Bedrock's Converse API, POST /model/{modelId}/converse and
// /model/{modelId}/converse-stream
// (docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html).
// The model id is escaped in the path (an ARN's ':' and '/' as %3A, %2F).
// The AWS JSON protocol matches member names without regard to case, which
// the case folding of every key covers.
//
//	model         the path's {modelId}, unescaped
//	output bound  inferenceConfig.maxTokens;
//	              additionalModelRequestFields.max_tokens, which Bedrock hands
//	              to an Anthropic model as its own bound
//	multipliers   none
//	usage         top-level "usage" of the Converse document; in
//	              ConverseStream's application/vnd.amazon.eventstream body,
//	              "usage" of the payload of the frame whose :event-type is
//	              metadata (eventstream.go reads the frames)
//	              inputTokens            -> Input: EXCLUDES the cache fields
//	                                        (Bedrock's prompt caching guide:
//	                                        total input = inputTokens +
//	                                        cacheReadInputTokens +
//	                                        cacheWriteInputTokens)
//	              cacheReadInputTokens   -> Cached, apart from inputTokens
//	              cacheWriteInputTokens  -> CacheWrite, apart from inputTokens
//	              outputTokens           -> Output
//	              totalTokens            -> the whole; TokenUsage says only
//	                                        "input and output", so when it is
//	                                        smaller than the sum of the parts
//	                                        (cache left out) the sum is charged
//	cumulative    no: one metadata event
var bedrockConverse = &table{
	api:         BedrockConverse,
	name:        "bedrock_converse",
	output:      paths("inferenceConfig.maxTokens", "additionalModelRequestFields.max_tokens"),
	modelInPath: true,
	usageAt:     []usageAt{{path: "usage"}},
	usage: []usageField{
		{"inputTokens", input},
		{"cacheReadInputTokens", cached},
		{"cacheWriteInputTokens", cacheWrite},
		{"outputTokens", output},
		{"totalTokens", total},
	},
}
