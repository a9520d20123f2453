package slidingratelimit

import (
	"io"
	"mime"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmapi"
)

// An OpenAI chat stream that a settle llm zone reads is asked for its usage
// whatever the client sent (llmapi.AskUsage): without it the stream ends
// with no usage, and the call could only be charged a bound. The usage
// chunk that the client did not ask for is kept from it, since a client
// that reads choices[0] of every chunk fails on its empty choices.

// askUsage makes r, a Chat Completions request whose response settle llm
// reads, ask for its usage when it streams and does not, and reports
// whether it did: its body, read ahead as cost llm reads it, is handed on
// rewritten, with its Content-Length. A body not read whole in time, or
// above what is read ahead, goes on as it is (the call is charged a bound).
func askUsage(r *http.Request) bool {
	body := peekBody(r)
	p, ok := r.Body.(*bodyPeek)
	if body.why != "" || len(body.data) == 0 || !ok || p.off != 0 {
		return false
	}
	asked, ok := llmapi.AskUsage(body.data)
	if !ok {
		return false
	}
	p.buf = asked
	if r.ContentLength >= 0 {
		r.ContentLength = int64(len(asked))
		r.Header.Set("Content-Length", strconv.Itoa(len(asked)))
	}
	return true
}

// usageChunkWriter keeps from the client the usage chunk of a chat stream
// that askUsage asked for. Anything but a 200 event stream goes on as it
// is.
type usageChunkWriter struct {
	*caddyhttp.ResponseWriterWrapper
	filter  *llmapi.UsageChunkFilter
	decided bool
}

func newUsageChunkWriter(w http.ResponseWriter) *usageChunkWriter {
	return &usageChunkWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
}

// decide filters the body when the response is an event stream of status
// 200 whose length is not stated (a filtered body's would be wrong).
func (u *usageChunkWriter) decide(status int) {
	if u.decided || status < 200 {
		return
	}
	u.decided = true
	h := u.Header()
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	if status == http.StatusOK && mt == "text/event-stream" && h.Get("Content-Length") == "" {
		u.filter = llmapi.NewUsageChunkFilter(u.ResponseWriterWrapper)
	}
}

func (u *usageChunkWriter) WriteHeader(status int) {
	u.decide(status)
	u.ResponseWriterWrapper.WriteHeader(status)
}

func (u *usageChunkWriter) Write(b []byte) (int, error) {
	u.decide(http.StatusOK)
	if u.filter != nil {
		return u.filter.Write(b)
	}
	return u.ResponseWriterWrapper.Write(b)
}

// ReadFrom copies through Write: the wrapper's ReadFrom would pass the
// filter by.
func (u *usageChunkWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{u}, r)
}

// finish writes on what the filter holds of an event that did not end.
func (u *usageChunkWriter) finish() {
	if u.filter != nil {
		u.filter.Close()
	}
}
