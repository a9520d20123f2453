// Package llmtest is a stand-in for the LLM APIs a rate limiter sits in
// front of: OpenAI's chat completions, completions and Responses API,
// Anthropic's Messages API, Gemini's generateContent, Ollama's chat and
// generate, and Bedrock's Converse, each answering in its vendor's
// documented wire format, streamed and not, with the usage where the
// vendor puts it (see Upstream for the paths).
//
// It generates all a request allows: the output tokens it asks for at
// most, as a lenient server reads the request (ReadRequest: Go's
// encoding/json, keys matched case-insensitively with Unicode folding, so
// that "Max_Tokens" and a Kelvin-sign "max_to\u212aens" are max_tokens,
// the last of duplicate keys winning; numbers such as 1e4 and "10000"
// read as whole numbers), times the choices it asks for (n, best_of,
// candidateCount), or DefaultMaxTokens each when it names no bound. Its
// input tokens are the bytes of the prompt's text, never more than the
// body's. The text it answers is short (Text), the usage it reports is
// the whole of it.
//
// It records, per key (the credential a request comes with: KeyOf, or
// WithKey's function), each call (Call): when it started and ended, the
// tokens it used, the usage it reported, its body's bytes; and the calls
// running at once. A test can then show that a limiter in front of it
// charged at least what was used: Used, Reported, BodyBytes, MostAtOnce,
// and MostInWindow, the most used in any window of a given length.
//
// Request headers are test knobs (HeaderPause, HeaderDuration, HeaderCut,
// HeaderUsage, HeaderNestedUsage, HeaderCacheRead, HeaderCacheWrite,
// HeaderReasoning, HeaderStatus): pauses between a stream's events, a
// call as long as a given duration, an answer broken off, a usage
// over- or under-reported, a decoy usage of zeros after the real one,
// prompt-cache and reasoning tokens, a refusal.
//
// testdata/llmsdk/client.mjs drives each vendor's official SDK against a
// base URL; this package's tests run it against the stand-in.
package llmtest
