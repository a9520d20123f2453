package llmapi

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
)

// An OpenAI Chat Completions stream reports its usage only when the request
// sets stream_options.include_usage (platform.openai.com/docs/api-reference/
// chat/create#chat-create-stream_options): then a last chunk before
// "data: [DONE]" has "choices": [] and the usage, every other chunk "usage":
// null. A stream without it ends without a usage to charge, so the gateway
// asks for it whatever the client sent, and keeps from the client the chunk
// it did not ask for (a client that reads choices[0] of every chunk would
// fail on it).

// AskUsage returns the body of a Chat Completions request that streams
// with stream_options.include_usage set to true, and whether it had to be
// set: false, with body itself, when the request does not stream (no
// top-level key that folds to "stream" is true), already asks (every
// top-level key that folds to "stream_options" is an object whose keys
// that fold to "include_usage" are all true, and there is one), or is not
// a JSON object. Keys match as lenient servers match them (Unicode simple
// case folding), and every spelling of stream_options is rewritten, so that
// whichever a server takes asks. The rest of the body is kept byte for
// byte; within stream_options, the other keys are kept (their order may
// change). A stream_options that is neither an object nor null is left as
// it is: the server refuses the request.
func AskUsage(body []byte) ([]byte, bool) {
	type member struct{ start, end int }
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return body, false
	}
	streams, asks := false, true
	open := int(dec.InputOffset())
	var options []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return body, false
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return body, false
		}
		end := int(dec.InputOffset())
		switch {
		case strings.EqualFold(key, "stream"):
			streams = streams || string(v) == "true"
		case strings.EqualFold(key, "stream_options"):
			options = append(options, member{end - len(v), end})
			asks = asks && includesUsage(v)
		}
	}
	if !streams || asks && len(options) > 0 {
		return body, false
	}
	if len(options) == 0 {
		// Its first member: the object has one, "stream".
		out := make([]byte, 0, len(body)+40)
		out = append(out, body[:open]...)
		out = append(out, `"stream_options":{"include_usage":true},`...)
		return append(out, body[open:]...), true
	}
	out := make([]byte, 0, len(body)+40*len(options))
	last := 0
	for _, m := range options {
		v, ok := withUsage(body[m.start:m.end])
		if !ok {
			continue
		}
		out = append(out, body[last:m.start]...)
		out = append(out, v...)
		last = m.end
	}
	return append(out, body[last:]...), true
}

// includesUsage reports whether stream_options v is an object whose keys
// that fold to "include_usage" are all true, and there is one.
func includesUsage(v json.RawMessage) bool {
	var members map[string]json.RawMessage
	if bytes.Equal(v, []byte("null")) || json.Unmarshal(v, &members) != nil {
		return false
	}
	found := false
	for k, x := range members {
		if strings.EqualFold(k, "include_usage") {
			if string(x) != "true" {
				return false
			}
			found = true
		}
	}
	return found
}

// withUsage returns stream_options v with include_usage true and no other
// key that folds to it: an object's other keys are kept, null becomes
// {"include_usage": true}; ok is false for anything else.
func withUsage(v []byte) ([]byte, bool) {
	members := map[string]json.RawMessage{}
	if !bytes.Equal(v, []byte("null")) {
		if err := json.Unmarshal(v, &members); err != nil || members == nil {
			return nil, false
		}
	}
	for k := range members {
		if strings.EqualFold(k, "include_usage") {
			delete(members, k)
		}
	}
	members["include_usage"] = json.RawMessage("true")
	out, err := json.Marshal(members)
	return out, err == nil
}

// maxHeldEvent is the most of an event the filter holds to decide on it:
// the usage chunk is a few hundred bytes, and a larger event goes on as it
// comes.
const maxHeldEvent = 64 << 10

// UsageChunkFilter passes a Chat Completions event stream on, but for the
// chunks that carry only the usage ("choices": [] and a usage object): the
// ones that AskUsage asked for. It holds the event being read (at most
// maxHeldEvent bytes, in buffers it reuses), since what an event is shows
// only at its end; complete events go on at once.
type UsageChunkFilter struct {
	w    io.Writer
	sse  sseLines
	held []byte // the event's bytes
	data []byte // its data, lines joined with \n
	// passing is set once the event is too large to hold: its bytes go on.
	passing bool
	// skipLF is set when a usage chunk left out ended at a \r: the \n of
	// its \r\n, if it comes, is its too.
	skipLF bool
}

// NewUsageChunkFilter returns a filter that writes to w.
func NewUsageChunkFilter(w io.Writer) *UsageChunkFilter { return &UsageChunkFilter{w: w} }

// Write reads b, writing on each event that ends in it unless it is a
// usage chunk. It takes all of b unless w fails.
func (f *UsageChunkFilter) Write(b []byte) (int, error) {
	from := 0 // the bytes of b from which to write on, when passing
	for i := 0; i < len(b); i++ {
		if f.sse.state == sseValue && !f.passing && !f.skipLF {
			// The rest of a data line, at once, as far as it fits.
			j := i + min(len(b)-i, maxHeldEvent-len(f.held))
			if k := bytes.IndexAny(b[i:j], "\r\n"); k >= 0 {
				j = i + k
			}
			f.held = append(f.held, b[i:j]...)
			f.data = append(f.data, b[i:j]...)
			if i = j; i == len(b) {
				break
			}
		}
		c := b[i]
		kind := f.sse.next(c)
		if f.skipLF {
			if f.skipLF = false; c == '\n' {
				continue
			}
		}
		if !f.passing {
			if len(f.held) == maxHeldEvent {
				if _, err := f.w.Write(f.held); err != nil {
					return i, err
				}
				f.held, f.data, f.passing, from = f.held[:0], f.data[:0], true, i
			} else {
				f.held = append(f.held, c)
			}
		}
		switch kind {
		case sseData:
			if !f.passing {
				f.data = append(f.data, c)
			}
		case sseDataEnd:
			if !f.passing {
				f.data = append(f.data, '\n')
			}
		case sseDispatch:
			if f.passing {
				if _, err := f.w.Write(b[from : i+1]); err != nil {
					return i, err
				}
				f.passing = false
			} else if !usageOnly(f.data) {
				if _, err := f.w.Write(f.held); err != nil {
					return i, err
				}
			} else {
				f.skipLF = c == '\r'
			}
			f.held, f.data = f.held[:0], f.data[:0]
		}
	}
	if f.passing && from < len(b) {
		if _, err := f.w.Write(b[from:]); err != nil {
			return from, err
		}
	}
	return len(b), nil
}

// Close writes on what is held of an event that did not end.
func (f *UsageChunkFilter) Close() error {
	if len(f.held) == 0 {
		return nil
	}
	_, err := f.w.Write(f.held)
	f.held, f.data = f.held[:0], f.data[:0]
	return err
}

// usageOnly reports whether data is a chunk with "choices": [] and a usage
// object. A chunk with a "delta" key (every chunk of content: within a
// string a quote is escaped, so the bytes "delta" with their quotes are a
// key or a value) is not, nor one without "usage": only the rest is
// parsed.
func usageOnly(data []byte) bool {
	if !bytes.Contains(data, []byte(`"usage"`)) || bytes.Contains(data, []byte(`"delta"`)) {
		return false
	}
	var chunk struct {
		Choices *[]json.RawMessage          `json:"choices"`
		Usage   *map[string]json.RawMessage `json:"usage"`
	}
	if json.Unmarshal(data, &chunk) != nil {
		return false
	}
	return chunk.Choices != nil && len(*chunk.Choices) == 0 && chunk.Usage != nil && *chunk.Usage != nil
}
