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
	body: bedrockBody,
}

// The Converse request body (API_runtime_Converse.html), every field; a
// field or content block not listed cannot be bounded.
//
//	text, toolUse, toolResult text and    their bytes
//	json, reasoning, cache points
//	documents of txt, md, csv, html by    their bytes
//	bytes
//	images, videos, other documents, S3   cannot: what they cost depends on
//	locations                             the model, the page or the second
//	additionalModelRequestFields          only top_k, thinking,
//	                                      reasoning_config and max_tokens
//	promptVariables                       cannot: a managed prompt is input
//	                                      the body does not carry
var (
	bedrockBody = obj("the request",
		"messages", listOf(bedrockMessage), "system", listOf(bedrockBlock),
		"inferenceConfig", free, "toolConfig", free, "guardrailConfig", free,
		"additionalModelRequestFields", obj("additionalModelRequestFields",
			"top_k", free, "thinking", free, "reasoning_config", free, "max_tokens", free),
		"additionalModelResponseFieldPaths", free, "requestMetadata", free,
		"performanceConfig", free, "serviceTier", free,
		"promptVariables", cannot("promptVariables: a managed prompt is input the body does not carry"),
	)
	bedrockMessage = obj("a message", "role", free, "content", listOf(bedrockBlock))
	bedrockBlock   = obj("a content block")
)

// Blocks nest (a tool result holds blocks), so they are filled in here.
func init() {
	textDocument := obj("a text document", "format", free, "name", free,
		"source", obj("a document's source", "bytes", free, "text", free),
		"citations", free, "context", free)
	bedrockBlock.fields = obj("a content block",
		"text", free, "toolUse", free, "reasoningContent", free, "cachePoint", free,
		"guardContent", free, "citationsContent", free,
		"toolResult", obj("a tool result", "toolUseId", free, "status", free, "content", listOf(bedrockBlock)),
		"json", free,
		"document", byTag("a document", "format", "txt", textDocument, "md", textDocument,
			"csv", textDocument, "html", textDocument),
	).fields
}
