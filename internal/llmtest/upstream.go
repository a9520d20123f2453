package llmtest

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Upstream is the stand-in LLM API: an HTTP server on 127.0.0.1 (HTTP/1.1,
// and HTTP/2 without TLS for clients that start with it, as the AWS SDK's
// default handler does) that serves
//
//	POST /v1/chat/completions                       OpenAI chat completions (JSON, SSE)
//	POST /v1/completions                            OpenAI completions (JSON, SSE)
//	POST /v1/responses                              OpenAI Responses API (JSON, SSE)
//	POST /v1/messages                               Anthropic Messages API (JSON, SSE)
//	POST /v1beta/models/{model}:generateContent     Gemini (JSON; /v1/models/... too)
//	POST /v1beta/models/{model}:streamGenerateContent  Gemini stream (?alt=sse: SSE; else a JSON array)
//	POST /api/chat, /api/generate                   Ollama (NDJSON stream, or JSON with "stream": false)
//	POST /model/{modelId}/converse                  Bedrock Converse (JSON)
//	POST /model/{modelId}/converse-stream           Bedrock ConverseStream (application/vnd.amazon.eventstream)
//
// and accounts for each key what it served (see Call). Its request
// headers X-Test-* are test knobs (HeaderPause ... HeaderStatus).
type Upstream struct {
	key func(*http.Request) string
	srv *httptest.Server
	seq atomic.Uint64

	mu       sync.Mutex
	accounts map[string]*account
}

// account is what the stand-in served one key.
type account struct {
	calls         []*Call
	running, most int
}

// Call is one request the stand-in served.
type Call struct {
	Key string
	// API is the API called (Chat ... ConverseStream), "" for a path the
	// stand-in does not serve.
	API, Model string
	Stream     bool
	// Status is the answer's status.
	Status int
	// Start is when the request came; End when its answer ended (zero
	// while it runs).
	Start, End time.Time
	// BodyBytes is the bytes of its request body.
	BodyBytes int64
	// InputTokens is the input tokens it used (cache reads and writes
	// included), OutputTokens those it generated, Used their sum: what
	// the call cost, whether or not the client read it all. A refused
	// call uses nothing.
	InputTokens, OutputTokens, Used int64
	// Reported is the whole usage its answer reported (OpenAI's
	// total_tokens; Anthropic's input, cache and output tokens; Gemini's
	// totalTokenCount; Ollama's prompt_eval_count and eval_count;
	// Bedrock's totalTokens), as of the last event the client was sent:
	// 0 when the answer ended before any usage (a stream without
	// include_usage, a cut); a stream cut after Anthropic's message_start
	// has reported its input tokens and 1 output token, one cut after
	// Gemini's first chunk its running totals.
	Reported int64
	// Completed is whether the whole answer was written.
	Completed bool
	// CacheRead and CacheWrite are the cache's tokens within InputTokens;
	// Dims what of them is billed apart (HeaderDimensions).
	CacheRead, CacheWrite int64
	Dims                  Dims
}

// Option configures an Upstream.
type Option func(*Upstream)

// WithKey counts requests by key(r) in place of KeyOf(r). key is called
// for every request, from the server's goroutines, at once.
func WithKey(key func(*http.Request) string) Option {
	return func(u *Upstream) { u.key = key }
}

// KeyOf is the key a request is counted under: its credential, as each
// SDK sends it.
//
//   - The Authorization header, whole ("Bearer sk-..."): what the OpenAI
//     SDK sends, the Anthropic SDK 1.x (its apiKey too), Bedrock's API
//     keys (AWS_BEARER_TOKEN_BEDROCK, the token option), and Ollama's
//     client when it is given one in its headers. A SigV4 signature
//     ("AWS4-HMAC-SHA256 Credential=AKID/...") is counted by its access
//     key ID alone ("AKID"), since the rest changes with every request.
//   - Else x-api-key (Anthropic's older header).
//   - Else x-goog-api-key (the Gemini SDK's header).
//   - Else the key query parameter (Gemini's REST examples).
//   - Else "": Ollama's client sends none of its own.
func KeyOf(r *http.Request) string {
	if a := r.Header.Get("Authorization"); a != "" {
		if rest, ok := strings.CutPrefix(a, "AWS4-HMAC-SHA256 "); ok {
			for field := range strings.SplitSeq(rest, ",") {
				if cred, ok := strings.CutPrefix(strings.TrimSpace(field), "Credential="); ok {
					akid, _, _ := strings.Cut(cred, "/")
					return akid
				}
			}
		}
		return a
	}
	for _, h := range []string{"X-Api-Key", "X-Goog-Api-Key"} {
		if v := r.Header.Get(h); v != "" {
			return v
		}
	}
	return r.URL.Query().Get("key")
}

// New starts an Upstream on a free port of 127.0.0.1; Close stops it.
func New(opts ...Option) *Upstream {
	u := &Upstream{key: KeyOf, accounts: map[string]*account{}}
	for _, opt := range opts {
		opt(u)
	}
	u.srv = httptest.NewUnstartedServer(u)
	u.srv.Config.Protocols = new(http.Protocols)
	u.srv.Config.Protocols.SetHTTP1(true)
	u.srv.Config.Protocols.SetUnencryptedHTTP2(true)
	u.srv.Start()
	return u
}

// Start starts an Upstream that stops when tb's test ends.
func Start(tb testing.TB, opts ...Option) *Upstream {
	tb.Helper()
	u := New(opts...)
	tb.Cleanup(u.Close)
	return u
}

// URL is the stand-in's base URL, http://127.0.0.1:port.
func (u *Upstream) URL() string { return u.srv.URL }

// Addr is its address, 127.0.0.1:port (a reverse proxy's upstream).
func (u *Upstream) Addr() string { return strings.TrimPrefix(u.srv.URL, "http://") }

// Close stops the server, after the calls running end.
func (u *Upstream) Close() { u.srv.Close() }

// route names the API and model a request is for.
func route(r *http.Request) (api, model string) {
	p := r.URL.EscapedPath()
	switch p {
	case "/v1/chat/completions":
		return Chat, ""
	case "/v1/completions":
		return Completions, ""
	case "/v1/responses":
		return Responses, ""
	case "/v1/messages":
		return Messages, ""
	case "/api/chat":
		return OllamaChat, ""
	case "/api/generate":
		return OllamaGenerate, ""
	}
	for _, prefix := range []string{"/v1beta/models/", "/v1/models/"} {
		if rest, ok := strings.CutPrefix(p, prefix); ok {
			name, method, _ := strings.Cut(rest, ":")
			model, err := url.PathUnescape(name)
			if err != nil || model == "" || strings.Contains(model, "/") {
				return "", ""
			}
			switch method {
			case "generateContent":
				return Gemini, model
			case "streamGenerateContent":
				return GeminiStream, model
			}
		}
	}
	if rest, ok := strings.CutPrefix(p, "/model/"); ok {
		name, method, _ := strings.Cut(rest, "/")
		model, err := url.PathUnescape(name)
		if err != nil || model == "" {
			return "", ""
		}
		switch method {
		case "converse":
			return Converse, model
		case "converse-stream":
			return ConverseStream, model
		}
	}
	return "", ""
}

// vendorError is the error answer of t's API.
func vendorError(t turn, status int, message string) reply {
	switch t.req.API {
	case Messages:
		return anthropicError(t, status, message)
	case Gemini, GeminiStream:
		return geminiError(status, message)
	case OllamaChat, OllamaGenerate:
		return ollamaError(status, message)
	case Converse, ConverseStream:
		return bedrockError(status, message)
	}
	return openaiError(status, message)
}

// answer is the answer of t's API to it.
func answer(t turn, r *http.Request) reply {
	switch t.req.API {
	case Chat:
		return chatCompletion(t)
	case Completions:
		return completion(t)
	case Responses:
		return response(t)
	case Messages:
		return message(t)
	case Gemini, GeminiStream:
		return generateContent(t, r.URL.Query().Get("alt") == "sse")
	case OllamaChat, OllamaGenerate:
		return ollama(t, t.req.API == OllamaChat)
	}
	return converse(t)
}

func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	api, model := route(r)
	body, readErr := io.ReadAll(r.Body)
	c := &Call{Key: u.key(r), API: api, Start: time.Now(), BodyBytes: int64(len(body))}
	u.mu.Lock()
	a := u.accounts[c.Key]
	if a == nil {
		a = &account{}
		u.accounts[c.Key] = a
	}
	a.calls = append(a.calls, c)
	a.running++
	a.most = max(a.most, a.running)
	u.mu.Unlock()
	var rp reply
	defer func() {
		u.mu.Lock()
		a.running--
		c.End, c.Status = time.Now(), rp.status
		u.mu.Unlock()
	}()

	t := turn{req: Request{API: api, Model: model}, seq: u.seq.Add(1), created: time.Now()}
	k, err := readKnobs(r.Header)
	var req Request
	switch {
	case api == "":
		rp = openaiError(http.StatusNotFound, fmt.Sprintf("no API at %s %s", r.Method, r.URL.Path))
	case r.Method != http.MethodPost:
		rp = vendorError(t, http.StatusMethodNotAllowed, r.Method+" is not allowed")
	case readErr != nil:
		rp = vendorError(t, http.StatusBadRequest, "reading the body: "+readErr.Error())
	case err != nil:
		rp = vendorError(t, http.StatusBadRequest, err.Error())
	default:
		if req, err = ReadRequest(api, model, body); err != nil {
			rp = vendorError(t, http.StatusBadRequest, "invalid request: "+err.Error())
			break
		}
		if k.stop >= 0 {
			req.Output = min(req.Output, k.stop)
		}
		t.req = req
		u.mu.Lock()
		c.Model, c.Stream = req.Model, req.Stream
		u.mu.Unlock()
		if k.status != 0 {
			rp = vendorError(t, k.status, fmt.Sprintf("refused with %d (%s)", k.status, HeaderStatus))
			break
		}
		used := usage{Input: req.Input + mediaTokens(api, req.Model, body) + k.byReference + k.dims.AudioInput, CacheRead: k.cacheRead,
			CacheWrite: k.cacheWrite + k.dims.CacheWrite1h, Output: req.Output, Reasoning: min(k.reason, req.Output), Dims: k.dims}
		used.AudioOutput = min(used.AudioOutput, used.Output)
		t.shown = used
		if k.override {
			t.shown.Input, t.shown.Output = k.overIn, k.overOut
			t.shown.Reasoning = min(t.shown.Reasoning, k.overOut)
			t.shown.AudioOutput = min(t.shown.AudioOutput, k.overOut)
		}
		t.nested = k.nested
		t.took = k.plan(len(parts) + 4)
		rp = answer(t, r)
		u.mu.Lock()
		c.InputTokens, c.OutputTokens, c.Used = used.prompt(), used.Output, used.total()
		c.Dims, c.CacheRead, c.CacheWrite = used.Dims, used.CacheRead, used.CacheWrite
		u.mu.Unlock()
	}
	requestID := t.id("req_", 9, 24)
	w.Header().Set("X-Request-Id", requestID)
	switch api {
	case Messages:
		w.Header().Set("Request-Id", requestID)
	case Converse, ConverseStream:
		w.Header().Set("X-Amzn-Requestid", t.id("", 10, 8)+"-"+t.id("", 11, 4)+"-"+t.id("", 12, 4)+"-"+t.id("", 13, 4)+"-"+t.id("", 14, 12))
	}
	complete := write(w, r, rp, k, func(n int64) {
		u.mu.Lock()
		c.Reported = n
		u.mu.Unlock()
	})
	u.mu.Lock()
	c.Completed = complete
	u.mu.Unlock()
}

// write writes rp, with the pauses and the cut of the knobs, telling
// report the usage of each event that reports one once it is written,
// and reports whether the whole answer was. A cut, or a client gone,
// panics with http.ErrAbortHandler, which closes the connection.
func write(w http.ResponseWriter, r *http.Request, rp reply, k knobs, report func(int64)) bool {
	for name, values := range rp.header {
		w.Header()[name] = values
	}
	w.Header().Set("Content-Type", rp.contentType)
	sleep := func(d time.Duration) {
		if d <= 0 {
			return
		}
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-r.Context().Done():
			panic(http.ErrAbortHandler)
		}
	}
	flush := func() { http.NewResponseController(w).Flush() }
	if !rp.stream {
		e := rp.events[0]
		if rp.status == http.StatusOK {
			sleep(k.duration)
		}
		w.WriteHeader(rp.status)
		if k.cut >= 0 && k.cut < len(e.data) {
			w.Write(e.data[:k.cut])
			flush()
			panic(http.ErrAbortHandler)
		}
		if _, err := w.Write(e.data); err != nil {
			return false
		}
		if e.reported >= 0 {
			report(e.reported)
		}
		return true
	}
	pause := k.pause
	if k.duration > 0 {
		pause = k.duration / time.Duration(max(len(rp.events)-1, 1))
	}
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(rp.status)
	flush()
	for i, e := range rp.events {
		if i == k.cut {
			panic(http.ErrAbortHandler)
		}
		if i > 0 {
			sleep(pause)
		}
		if _, err := w.Write(e.data); err != nil {
			return false
		}
		flush()
		if e.reported >= 0 {
			report(e.reported)
		}
	}
	return true
}

// snapshot calls f with key's account, under the lock.
func (u *Upstream) snapshot(key string, f func(a *account)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if a := u.accounts[key]; a != nil {
		f(a)
	} else {
		f(&account{})
	}
}

// Keys are the keys that made calls, sorted.
func (u *Upstream) Keys() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var keys []string
	for k := range u.accounts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Calls are key's calls, in the order they came (copies).
func (u *Upstream) Calls(key string) []Call {
	var calls []Call
	u.snapshot(key, func(a *account) {
		for _, c := range a.calls {
			calls = append(calls, *c)
		}
	})
	return calls
}

// CallCount is how many calls key made.
func (u *Upstream) CallCount(key string) (n int) {
	u.snapshot(key, func(a *account) { n = len(a.calls) })
	return n
}

// Used is the tokens key's calls used.
func (u *Upstream) Used(key string) (n int64) {
	u.snapshot(key, func(a *account) {
		for _, c := range a.calls {
			n += c.Used
		}
	})
	return n
}

// Reported is the usage the answers to key reported.
func (u *Upstream) Reported(key string) (n int64) {
	u.snapshot(key, func(a *account) {
		for _, c := range a.calls {
			n += c.Reported
		}
	})
	return n
}

// Usage is the usage reported to key and its calls, together.
func (u *Upstream) Usage(key string) (reported int64, calls int) {
	return u.Reported(key), u.CallCount(key)
}

// BodyBytes is the bytes of the request bodies of key's calls.
func (u *Upstream) BodyBytes(key string) (n int64) {
	u.snapshot(key, func(a *account) {
		for _, c := range a.calls {
			n += c.BodyBytes
		}
	})
	return n
}

// Running is how many of key's calls are running.
func (u *Upstream) Running(key string) (n int) {
	u.snapshot(key, func(a *account) { n = a.running })
	return n
}

// MostAtOnce is the most calls of key that ran at once.
func (u *Upstream) MostAtOnce(key string) (n int) {
	u.snapshot(key, func(a *account) { n = a.most })
	return n
}

// MostInWindow is the most tokens key's calls used in any window of
// length w, a call counting at the time it ended (calls running do not
// count): the largest sum of Used over calls whose ends lie less than w
// apart.
func (u *Upstream) MostInWindow(key string, w time.Duration) int64 {
	type end struct {
		at   time.Time
		used int64
	}
	var ends []end
	u.snapshot(key, func(a *account) {
		for _, c := range a.calls {
			if !c.End.IsZero() {
				ends = append(ends, end{c.End, c.Used})
			}
		}
	})
	slices.SortFunc(ends, func(a, b end) int { return a.at.Compare(b.at) })
	var most, sum int64
	first := 0
	for _, e := range ends {
		sum += e.used
		for e.at.Sub(ends[first].at) >= w {
			sum -= ends[first].used
			first++
		}
		most = max(most, sum)
	}
	return most
}
