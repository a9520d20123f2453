package llmtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// DefaultMaxTokens is what a call generates, per choice, when its request
// names no output bound (or names one of 0 or less): more than the
// defaults a limiter is usually given, as servers that fill the context
// do.
const DefaultMaxTokens = 5000

// MaxCount is where the counts read from a request saturate (2^53, the
// largest whole number a JSON reader in every language keeps exactly).
const MaxCount = 1 << 53

// The most choices a request may ask for, as the vendors document them;
// a request asking more is refused (400), as they refuse it.
const (
	MaxN              = 128 // OpenAI's n
	MaxBestOf         = 20  // OpenAI's best_of
	MaxCandidateCount = 8   // Gemini's candidateCount
)

// The APIs the stand-in serves, as Request.API names them.
const (
	Chat           = "chat"            // POST /v1/chat/completions
	Completions    = "completions"     // POST /v1/completions
	Responses      = "responses"       // POST /v1/responses
	Messages       = "messages"        // POST /v1/messages
	Gemini         = "gemini"          // POST /v1beta/models/{model}:generateContent
	GeminiStream   = "gemini-stream"   // POST /v1beta/models/{model}:streamGenerateContent
	OllamaChat     = "ollama-chat"     // POST /api/chat
	OllamaGenerate = "ollama-generate" // POST /api/generate
	Converse       = "converse"        // POST /model/{modelId}/converse
	ConverseStream = "converse-stream" // POST /model/{modelId}/converse-stream
)

// Request is what the stand-in reads of a request: what it generates and
// how it answers.
type Request struct {
	API   string
	Model string
	// Stream is whether the answer is a stream (for Gemini and Bedrock the
	// endpoint says; for Ollama it is one unless "stream": false).
	Stream bool
	// IncludeUsage is stream_options.include_usage (chat and completions
	// streams carry their usage only when it is set).
	IncludeUsage bool
	// Bound is the output tokens one generation may use: the request's
	// bound as read leniently, or DefaultMaxTokens.
	Bound int64
	// Named is whether the request named a bound above 0.
	Named bool
	// Choices is the answers the client gets: n (times the prompts of a
	// completions request), candidateCount, or 1.
	Choices int64
	// Generations is the answers generated and billed, at least Choices:
	// best_of (times the prompts) for completions.
	Generations int64
	// Output is the output tokens generated: Generations x Bound.
	Output int64
	// Input is the input tokens counted: the bytes of the text of the
	// prompt (every message's content, the system prompt, instructions),
	// never more than the body's bytes.
	Input int64
}

// lenientInt is a whole number as a lenient server reads one: a JSON
// number without a fraction (10000, 1e4, 10000.0) or a string holding one
// ("10000"). null unsets it; a number past ±MaxCount is ±MaxCount.
type lenientInt struct {
	set bool
	n   int64
}

func (v *lenientInt) UnmarshalJSON(b []byte) error {
	s := string(bytes.TrimSpace(b))
	if s == "null" {
		*v = lenientInt{}
		return nil
	}
	if strings.HasPrefix(s, `"`) {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		s = strings.TrimSpace(s)
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		*v = lenientInt{true, max(min(n, MaxCount), -MaxCount)}
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if !decimal(s) || err != nil && !errors.Is(err, strconv.ErrRange) || f != math.Trunc(f) {
		return fmt.Errorf("%s is not a whole number", b)
	}
	*v = lenientInt{true, int64(max(min(f, MaxCount), -MaxCount))}
	return nil
}

// decimal reports whether s is written as a JSON number is: digits, with
// a sign, a fraction and an exponent, but no hexadecimal, Inf or NaN.
func decimal(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" || s[0] < '0' || s[0] > '9' {
		return false
	}
	return strings.Trim(s, "0123456789.eE+-") == ""
}

// positive is the number if it is set and above 0.
func (v lenientInt) positive() (int64, bool) { return v.n, v.set && v.n > 0 }

// lenientBool is a boolean as a lenient server reads one: true or false,
// as JSON or in a string, or 1 or 0. null unsets it.
type lenientBool struct {
	set, b bool
}

func (v *lenientBool) UnmarshalJSON(b []byte) error {
	s := string(bytes.TrimSpace(b))
	if s == "null" {
		*v = lenientBool{}
		return nil
	}
	if strings.HasPrefix(s, `"`) {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		s = strings.ToLower(strings.TrimSpace(s))
	}
	switch s {
	case "true", "1":
		*v = lenientBool{true, true}
	case "false", "0":
		*v = lenientBool{true, false}
	default:
		return fmt.Errorf("%s is not a boolean", b)
	}
	return nil
}

// or is the boolean, or def when it is not set.
func (v lenientBool) or(def bool) bool {
	if v.set {
		return v.b
	}
	return def
}

// textBytes counts the input tokens of a piece of a prompt: the bytes of
// a string's text; of an array, its elements'; of an object, its "text"
// and its "content" (a message part); of anything else, its JSON. It is
// never more than len(raw).
func textBytes(raw json.RawMessage) int64 {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return int64(len(raw))
		}
		return int64(len(s))
	case '[':
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) != nil {
			return int64(len(raw))
		}
		var n int64
		for _, item := range items {
			n += textBytes(item)
		}
		return n
	case '{':
		var part struct {
			Text    json.RawMessage `json:"text"`
			Content json.RawMessage `json:"content"`
			Parts   json.RawMessage `json:"parts"`
		}
		if json.Unmarshal(raw, &part) != nil || part.Text == nil && part.Content == nil && part.Parts == nil {
			return int64(len(raw))
		}
		return textBytes(part.Text) + textBytes(part.Content) + textBytes(part.Parts)
	case 'n':
		return 0
	}
	return int64(len(raw))
}

// promptCount is how many prompts a completions request's prompt holds:
// the strings or token arrays of an array of them, else 1.
func promptCount(raw json.RawMessage) int64 {
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil || len(items) == 0 {
		return 1
	}
	if first := bytes.TrimSpace(items[0]); len(first) > 0 && (first[0] == '"' || first[0] == '[') {
		return int64(len(items))
	}
	return 1 // an array of token ids is one prompt
}

// mul is a*b, saturating at MaxCount.
func mul(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	if a > MaxCount/b {
		return MaxCount
	}
	return min(a*b, MaxCount)
}

// bound is the largest of the bounds named above 0, or DefaultMaxTokens.
func bound(values ...lenientInt) (n int64, named bool) {
	for _, v := range values {
		if m, ok := v.positive(); ok {
			n, named = max(n, m), true
		}
	}
	if !named {
		return DefaultMaxTokens, false
	}
	return n, true
}

// count is a count of choices: the largest named above 0, or 1; above
// most it is refused.
func count(name string, most int64, values ...lenientInt) (int64, error) {
	n := int64(1)
	for _, v := range values {
		if m, ok := v.positive(); ok {
			n = max(n, m)
		}
	}
	if n > most {
		return 0, fmt.Errorf("%s must be at most %d", name, most)
	}
	return n, nil
}

type messageContent struct {
	Content json.RawMessage `json:"content"`
}

type chatBody struct {
	Model               string           `json:"model"`
	Messages            []messageContent `json:"messages"`
	MaxTokens           lenientInt       `json:"max_tokens"`
	MaxCompletionTokens lenientInt       `json:"max_completion_tokens"`
	N                   lenientInt       `json:"n"`
	Stream              lenientBool      `json:"stream"`
	StreamOptions       struct {
		IncludeUsage lenientBool `json:"include_usage"`
	} `json:"stream_options"`
}

type completionsBody struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Suffix        json.RawMessage `json:"suffix"`
	MaxTokens     lenientInt      `json:"max_tokens"`
	N             lenientInt      `json:"n"`
	BestOf        lenientInt      `json:"best_of"`
	Stream        lenientBool     `json:"stream"`
	StreamOptions struct {
		IncludeUsage lenientBool `json:"include_usage"`
	} `json:"stream_options"`
}

type responsesBody struct {
	Model           string          `json:"model"`
	Input           json.RawMessage `json:"input"`
	Instructions    json.RawMessage `json:"instructions"`
	MaxOutputTokens lenientInt      `json:"max_output_tokens"`
	Stream          lenientBool     `json:"stream"`
}

type messagesBody struct {
	Model     string           `json:"model"`
	System    json.RawMessage  `json:"system"`
	Messages  []messageContent `json:"messages"`
	MaxTokens lenientInt       `json:"max_tokens"`
	Stream    lenientBool      `json:"stream"`
}

// geminiConfig is a generationConfig. Gemini's JSON is protobuf's, which
// takes a field by its JSON name or by its proto name: both are read, and
// the larger counts.
type geminiConfig struct {
	MaxOutputTokens      lenientInt `json:"maxOutputTokens"`
	MaxOutputTokensProto lenientInt `json:"max_output_tokens"`
	CandidateCount       lenientInt `json:"candidateCount"`
	CandidateCountProto  lenientInt `json:"candidate_count"`
}

type geminiBody struct {
	Contents               []json.RawMessage `json:"contents"`
	SystemInstruction      json.RawMessage   `json:"systemInstruction"`
	SystemInstructionProto json.RawMessage   `json:"system_instruction"`
	GenerationConfig       geminiConfig      `json:"generationConfig"`
	GenerationConfigProto  geminiConfig      `json:"generation_config"`
}

type ollamaBody struct {
	Model    string           `json:"model"`
	Messages []messageContent `json:"messages"`
	Prompt   json.RawMessage  `json:"prompt"`
	System   json.RawMessage  `json:"system"`
	Suffix   json.RawMessage  `json:"suffix"`
	Stream   lenientBool      `json:"stream"`
	Options  struct {
		NumPredict lenientInt `json:"num_predict"`
	} `json:"options"`
}

type converseBody struct {
	Messages        []messageContent `json:"messages"`
	System          json.RawMessage  `json:"system"`
	InferenceConfig struct {
		MaxTokens lenientInt `json:"maxTokens"`
	} `json:"inferenceConfig"`
}

// ReadRequest reads the body of a request to api (one of Chat ...
// ConverseStream) as the stand-in does; model is the model the path names
// (Gemini, Bedrock), "" for the others. An error is a request the
// stand-in refuses with a 400: a body that is not a JSON object of the
// API's fields, a count that is not a whole number, or too many choices.
func ReadRequest(api, model string, body []byte) (Request, error) {
	r := Request{API: api, Model: model, Choices: 1, Generations: 1}
	var err error
	switch api {
	case Chat:
		var b chatBody
		if err = json.Unmarshal(body, &b); err != nil {
			break
		}
		r.Model, r.Stream, r.IncludeUsage = b.Model, b.Stream.or(false), b.StreamOptions.IncludeUsage.or(false)
		r.Bound, r.Named = bound(b.MaxTokens, b.MaxCompletionTokens)
		r.Choices, err = count("n", MaxN, b.N)
		r.Generations = r.Choices
		for _, m := range b.Messages {
			r.Input += textBytes(m.Content)
		}
	case Completions:
		var b completionsBody
		if err = json.Unmarshal(body, &b); err != nil {
			break
		}
		r.Model, r.Stream, r.IncludeUsage = b.Model, b.Stream.or(false), b.StreamOptions.IncludeUsage.or(false)
		r.Bound, r.Named = bound(b.MaxTokens)
		var n, best int64
		if n, err = count("n", MaxN, b.N); err != nil {
			break
		}
		if best, err = count("best_of", MaxBestOf, b.BestOf); err != nil {
			break
		}
		prompts := promptCount(b.Prompt)
		r.Choices, r.Generations = mul(prompts, n), mul(prompts, max(n, best))
		r.Input = textBytes(b.Prompt) + textBytes(b.Suffix)
	case Responses:
		var b responsesBody
		if err = json.Unmarshal(body, &b); err != nil {
			break
		}
		r.Model, r.Stream = b.Model, b.Stream.or(false)
		r.Bound, r.Named = bound(b.MaxOutputTokens)
		r.Input = textBytes(b.Input) + textBytes(b.Instructions)
	case Messages:
		var b messagesBody
		if err = json.Unmarshal(body, &b); err != nil {
			break
		}
		r.Model, r.Stream = b.Model, b.Stream.or(false)
		r.Bound, r.Named = bound(b.MaxTokens)
		r.Input = textBytes(b.System)
		for _, m := range b.Messages {
			r.Input += textBytes(m.Content)
		}
	case Gemini, GeminiStream:
		var b geminiBody
		if err = json.Unmarshal(body, &b); err != nil {
			break
		}
		r.Stream = api == GeminiStream
		c, p := b.GenerationConfig, b.GenerationConfigProto
		r.Bound, r.Named = bound(c.MaxOutputTokens, c.MaxOutputTokensProto, p.MaxOutputTokens, p.MaxOutputTokensProto)
		r.Choices, err = count("candidateCount", MaxCandidateCount, c.CandidateCount, c.CandidateCountProto, p.CandidateCount, p.CandidateCountProto)
		r.Generations = r.Choices
		r.Input = textBytes(b.SystemInstruction) + textBytes(b.SystemInstructionProto)
		for _, content := range b.Contents {
			r.Input += textBytes(content)
		}
	case OllamaChat, OllamaGenerate:
		var b ollamaBody
		if err = json.Unmarshal(body, &b); err != nil {
			break
		}
		r.Model, r.Stream = b.Model, b.Stream.or(true)
		r.Bound, r.Named = bound(b.Options.NumPredict)
		r.Input = textBytes(b.System)
		if api == OllamaGenerate {
			r.Input += textBytes(b.Prompt) + textBytes(b.Suffix)
			break
		}
		for _, m := range b.Messages {
			r.Input += textBytes(m.Content)
		}
	case Converse, ConverseStream:
		var b converseBody
		if err = json.Unmarshal(body, &b); err != nil {
			break
		}
		r.Stream = api == ConverseStream
		r.Bound, r.Named = bound(b.InferenceConfig.MaxTokens)
		r.Input = textBytes(b.System)
		for _, m := range b.Messages {
			r.Input += textBytes(m.Content)
		}
	default:
		return r, fmt.Errorf("no API %q", api)
	}
	if err != nil {
		return r, err
	}
	if model != "" {
		r.Model = model
	}
	r.Output = mul(r.Generations, r.Bound)
	return r, nil
}
