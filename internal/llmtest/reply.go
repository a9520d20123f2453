package llmtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The test knobs: request headers that change how the stand-in answers.
const (
	// HeaderPause is a pause between the events of a stream (a Go
	// duration: "200ms").
	HeaderPause = "X-Test-Pause"
	// HeaderDuration is how long the whole call takes (a Go duration:
	// "11s"): a stream's events are spread over it, a JSON answer comes
	// after it. It takes the place of HeaderPause.
	HeaderDuration = "X-Test-Duration"
	// HeaderCut breaks the answer off after N events of a stream, or N
	// bytes of a JSON answer: the connection is closed mid-answer, as by
	// an upstream that fails (0: right after the status and headers).
	HeaderCut = "X-Test-Cut"
	// HeaderUsage overrides the usage reported: "IN,OUT" reports IN
	// uncached input tokens and OUT output tokens, whatever the call
	// used (an upstream that under- or over-reports). The call's Used
	// stays what it used.
	HeaderUsage = "X-Test-Usage"
	// HeaderNestedUsage, set to anything, adds after the real usage a
	// nested object that holds a usage of zeros, in the vendor's own
	// field names ("debug": {"usage": {...}}; for Gemini "debug":
	// {"usageMetadata": {...}}; for Ollama "debug": {"prompt_eval_count":
	// 0, "eval_count": 0}): a reader that takes usage from anywhere but
	// where the API puts it reads zeros.
	HeaderNestedUsage = "X-Test-Nested-Usage"
	// HeaderCacheRead and HeaderCacheWrite (a count N) report N input
	// tokens read from (written to) the prompt cache, as the vendors do
	// for a cached prompt prefix (the system prompt, earlier turns),
	// besides the input counted from the body; they count as used.
	// OpenAI reports them in prompt_tokens (cached_tokens: the reads),
	// Anthropic as cache_read_input_tokens and
	// cache_creation_input_tokens, Gemini in promptTokenCount
	// (cachedContentTokenCount: the reads), Bedrock as
	// cacheReadInputTokens and cacheWriteInputTokens, Ollama in
	// prompt_eval_count.
	HeaderCacheRead  = "X-Test-Cache-Read"
	HeaderCacheWrite = "X-Test-Cache-Write"
	// HeaderReasoning (a count N) reports N of the output tokens as
	// reasoning: OpenAI's reasoning_tokens (within completion_tokens and
	// output_tokens), Anthropic's output_tokens_details.thinking_tokens
	// (within output_tokens), Gemini's thoughtsTokenCount (beside
	// candidatesTokenCount, which has N fewer). At most the output.
	HeaderReasoning = "X-Test-Reasoning"
	// HeaderStatus (an HTTP status from 400 to 599) refuses the call with
	// that status and the vendor's error body, generating nothing.
	HeaderStatus = "X-Test-Status"
	// HeaderInputByReference (a count N) bills N more uncached input
	// tokens than the body carries, as a vendor bills input named by
	// reference (a document by file id, an image URL, an earlier
	// response): they count as used and are reported as input (in
	// Anthropic's message_start too), while the body stays small.
	HeaderInputByReference = "X-Test-Input-By-Reference"
	// HeaderStop (a count N) ends the answer after N output tokens, as a
	// model that finishes (end_turn, stop) well before the max_tokens it
	// was allowed: an agent asks for 128k and writes a few thousand.
	HeaderStop = "X-Test-Stop"
)

// knobs are the test knobs of a request.
type knobs struct {
	pause, duration               time.Duration
	cut                           int // -1: none
	override                      bool
	overIn, overOut               int64
	nested                        bool
	cacheRead, cacheWrite, reason int64
	byReference                   int64
	stop                          int64 // -1: none
	status                        int
	dims                          Dims
}

// readKnobs reads the test knobs of h.
func readKnobs(h http.Header) (knobs, error) {
	k := knobs{cut: -1, stop: -1, nested: h.Get(HeaderNestedUsage) != ""}
	duration := func(name string, d *time.Duration) error {
		if v := h.Get(name); v != "" {
			var err error
			if *d, err = time.ParseDuration(v); err != nil || *d < 0 {
				return fmt.Errorf("%s: %q is not a duration", name, v)
			}
		}
		return nil
	}
	number := func(name, v string, n *int64) error {
		if v == "" {
			return nil
		}
		var err error
		if *n, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64); err != nil || *n < 0 || *n > MaxCount {
			return fmt.Errorf("%s: %q is not a count", name, v)
		}
		return nil
	}
	if err := duration(HeaderPause, &k.pause); err != nil {
		return k, err
	}
	if err := duration(HeaderDuration, &k.duration); err != nil {
		return k, err
	}
	var cut, status int64 = -1, 0
	if err := number(HeaderCut, h.Get(HeaderCut), &cut); err != nil {
		return k, err
	}
	k.cut = int(min(cut, 1<<30))
	if v := h.Get(HeaderUsage); v != "" {
		in, out, ok := strings.Cut(v, ",")
		if !ok || number(HeaderUsage, in, &k.overIn) != nil || number(HeaderUsage, out, &k.overOut) != nil {
			return k, fmt.Errorf("%s: %q is not IN,OUT", HeaderUsage, v)
		}
		k.override = true
	}
	if v := h.Get(HeaderStop); v != "" {
		if err := number(HeaderStop, v, &k.stop); err != nil {
			return k, err
		}
	}
	for name, n := range map[string]*int64{HeaderCacheRead: &k.cacheRead, HeaderCacheWrite: &k.cacheWrite, HeaderReasoning: &k.reason, HeaderInputByReference: &k.byReference} {
		if err := number(name, h.Get(name), n); err != nil {
			return k, err
		}
	}
	if err := number(HeaderStatus, h.Get(HeaderStatus), &status); err != nil || status != 0 && (status < 400 || status > 599) {
		return k, fmt.Errorf("%s: %q is not a status", HeaderStatus, h.Get(HeaderStatus))
	}
	k.status = int(status)
	var err error
	k.dims, err = readDims(h)
	return k, err
}

// usage is a call's tokens: Input is the uncached input (counted from the
// body), CacheRead and CacheWrite the cached prefix, Output what it
// generated, Reasoning how many of those it reports as reasoning.
type usage struct {
	Input, CacheRead, CacheWrite, Output, Reasoning int64
	// Dims are what of them is billed apart (within Input, CacheWrite and
	// Output), and the searches and tier.
	Dims
}

// prompt is all the input tokens.
func (u usage) prompt() int64 { return u.Input + u.CacheRead + u.CacheWrite }

// total is the whole usage, as each vendor's totals add up.
func (u usage) total() int64 { return u.prompt() + u.Output }

// event is a piece of an answer: the whole document of a JSON answer, or
// one event of a stream (its bytes on the wire). reported is the whole
// usage the client has been told once it has this event, or -1 when the
// event tells none.
type event struct {
	data     []byte
	reported int64
}

// reply is an answer, ready to be written.
type reply struct {
	status      int
	contentType string
	header      http.Header
	stream      bool
	events      []event
}

// turn is what the vendors' encoders need to answer a call.
type turn struct {
	req Request
	// shown is the usage the answer reports (the used one, or the
	// override).
	shown  usage
	nested bool
	// seq numbers the call, for its ids.
	seq     uint64
	created time.Time
	// took is how long the call is planned to take, for the latencies
	// and durations the answers report.
	took time.Duration
}

// Text is the text every answer holds (each choice's): short, whatever
// the usage says.
const Text = "Hello there"

// parts is Text in the pieces a stream sends it.
var parts = []string{"Hel", "lo ", "there"}

// obj is a JSON object that keeps the order of its members.
type obj []any

// o builds an obj from alternating names and values; a member whose name
// ends in "?" is optional: left out when its value is nil.
func o(members ...any) obj { return obj(members) }

func (m obj) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	first := true
	for i := 0; i+1 < len(m); i += 2 {
		name := m[i].(string)
		if n, optional := strings.CutSuffix(name, "?"); optional {
			if v, ok := m[i+1].(obj); m[i+1] == nil || ok && v == nil {
				continue
			}
			name = n
		}
		if !first {
			b.WriteByte(',')
		}
		first = false
		k, _ := json.Marshal(name)
		v, err := json.Marshal(m[i+1])
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// when returns v when cond holds, else nil, which an optional member
// leaves out.
func when(cond bool, v any) any {
	if !cond {
		return nil
	}
	return v
}

// encode is the JSON of v.
func encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// id is an id for the call: prefix and n letters and digits, the same for
// the same call and salt.
func (t turn) id(prefix string, salt uint64, n int) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	r := rand.New(rand.NewPCG(t.seq, salt))
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return prefix + string(b)
}

// doc is a JSON answer of status 200 that reports reported.
func doc(contentType string, body []byte, reported int64) reply {
	return reply{status: http.StatusOK, contentType: contentType, events: []event{{body, reported}}}
}

// sse is a server-sent event: its name (none when "") and its data.
func sse(name string, data []byte) []byte {
	var b []byte
	if name != "" {
		b = append(b, "event: "+name+"\n"...)
	}
	b = append(b, "data: "...)
	b = append(b, data...)
	return append(b, "\n\n"...)
}

// plan is how long a call is planned to take with the knobs, streaming
// events events.
func (k knobs) plan(events int) time.Duration {
	if k.duration > 0 {
		return k.duration
	}
	return k.pause * time.Duration(max(events-1, 0))
}
