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
	body: geminiBody,
}

// The request body (ai.google.dev/api/generate-content#request-body), every
// field, in proto JSON's both spellings; a field, part or tool not listed
// cannot be bounded.
//
//	text, function calls and responses,  their bytes
//	code, thoughts
//	inlineData image/*                   258 tokens a 768-pixel tile, at
//	                                     least 1,120 (media.go), its size
//	                                     read from the image's header
//	inlineData audio/*                   its bytes: 32 tokens a second,
//	                                     which no codec carries in fewer
//	inlineData text/*                    its bytes
//	inlineData of video, PDF, other      cannot: billed by the second or
//	                                     the page, not by the bytes
//	fileData, cachedContent              cannot: input the body does not
//	                                     carry
//	tools other than functions           cannot: a hosted tool's results
//	(search, code execution, URL         are input the body does not carry
//	context, maps, file search)
//	googleSearch,                        grounding, a fee per prompt or per
//	googleSearchRetrieval                search query by model: nothing in
//	                                     the request bounds the queries
var (
	geminiBody = protoFields(obj("the request",
		"model", free, "contents", listOf(geminiContent), "systemInstruction", geminiContent,
		"tools", listOf(geminiTool), "toolConfig", free, "safetySettings", free,
		"generationConfig", free, "labels", free,
		"cachedContent", cannot("cachedContent: a cache's contents are input the body does not carry"),
	))
	geminiContent = obj("a content", "role", free, "parts", listOf(geminiPart))
	geminiPart    = obj("a part",
		"text", free, "thought", free, "thoughtSignature", free, "partMetadata", free,
		"inlineData", byTag("an inline blob", "mimeType",
			"image/*", obj("an inline image", "mimeType", free, "data", &shape{kind: anyJSON, media: imageData, name: "an inline image"}, "displayName", free),
			"audio/*", free,
			"text/*", free,
		),
		"fileData", cannot("fileData: a file by URI is input the body does not carry"),
		"functionCall", free, "functionResponse", free,
		"executableCode", free, "codeExecutionResult", free,
	)
	geminiTool = obj("a tool", "functionDeclarations", free,
		"googleSearch", geminiGrounding, "googleSearchRetrieval", geminiGrounding)
	geminiGrounding = searching("grounding with Google Search: its results are input the body does not carry",
		"", "grounding with Google Search: nothing in the request bounds how many search queries it bills, a fee each")

	// Batch mode, POST .../models/{model}:batchGenerateContent
	// (ai.google.dev/gemini-api/docs/batch-mode): the sum of its inline
	// requests' bounds; requests in a file cannot be bounded.
	geminiBatchBody = protoFields(obj("the request",
		"batch", obj("the batch",
			"model", free, "displayName", free, "priority", free,
			"inputConfig", obj("the batch's input",
				"requests", obj("the batch's requests",
					"requests", listOf(obj("a batch's request", "request", nested(Gemini), "metadata", free)),
				),
				"fileName", repeating("inputConfig.fileName: a batch's requests are in a file the body does not carry"),
			),
		),
	))
)

// Batch mode: each inline request's bound, added up; its answer is an
// operation, with no usage, so a batch pays its reservation.
var geminiBatch = &table{
	api:              GeminiBatch,
	name:             "gemini_batch",
	generatesNothing: true,
	modelInPath:      true,
	body:             geminiBatchBody,
}
