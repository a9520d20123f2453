package slidingratelimit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// CostJSON reserves, per request, a cost read from the request's JSON body:
// what an LLM call may use at most, from its max_tokens and its size.
type CostJSON struct {
	// Paths are dotted paths from the body's root (max_tokens,
	// generation_config.max_output_tokens): only the client's own top
	// level, never a field nested deeper, so that no nested field can
	// lower what a request reserves. The cost is the sum of their
	// values; a key that the body repeats counts by its largest value,
	// since servers differ on which one they take (most the last, some
	// the first) and the largest bounds them all. A value counts when it
	// is a number of at least 0, however written (a fraction rounded up:
	// 1e3, 1000.0 and "1000" are 1000, as lenient servers read them);
	// null counts as missing.
	Paths []string `json:"paths,omitempty"`

	// Default is the cost of a request whose body has none of the paths,
	// or cannot be read: not JSON, larger than 1 MiB, not sent within 10
	// seconds, or a value at a path that is no number of at least 0
	// (negative, a word, an object); all but the missing value are
	// counted in cost_fallbacks_total and logged at most once a minute
	// per zone. It should be the most the upstream gives a request that
	// names none. At least 1.
	Default int64 `json:"default,omitempty"`

	// Body adds the size of the request body in bytes (+body): a text
	// prompt has no more tokens than bytes, so the sum bounds a call's
	// input and output tokens. A body that is not read whole adds its
	// Content-Length (the most its next handler can read), or, when it
	// has none, what was read of it, at least 1 MiB.
	Body bool `json:"body,omitempty"`

	paths [][]string
}

const (
	// costJSONMaxBody is the most of a request body that cost json
	// reads: a chat request with a long conversation fits; a larger one
	// reserves the default.
	costJSONMaxBody = 1 << 20
)

// costJSONReadTime is how long a body may take to arrive before the request
// reserves the default and goes on (its body follows as it comes): a slow
// client holds a reader, not the request. Tests shorten it.
var costJSONReadTime = 10 * time.Second

// Why cost json took the default.
const (
	costNotJSON  = "not JSON"
	costTooLarge = "body above 1 MiB"
	costSlow     = "body not read in time"
	costUnread   = "body not readable"
)

func (c *CostJSON) provision() {
	c.paths = make([][]string, len(c.Paths))
	for i, p := range c.Paths {
		c.paths[i] = strings.Split(p, ".")
	}
}

// source names the cost in logs.
func (c *CostJSON) source() string { return "json " + strings.Join(c.Paths, " ") }

// checkCostJSON accepts paths and a default of at least 1.
func checkCostJSON(c *CostJSON, cost string) error {
	switch {
	case c == nil:
		return nil
	case cost != "":
		return fmt.Errorf("cost and cost json are one setting: set one (cost %q)", cost)
	case len(c.Paths) == 0:
		return errors.New("cost json needs at least one path and a default (cost json max_tokens 4096)")
	case c.Default < 1 || c.Default > maxCount:
		return fmt.Errorf("cost json: the default must be a whole number of at least 1, got %d", c.Default)
	}
	for _, p := range c.Paths {
		if err := checkJSONPath(p); err != nil {
			return fmt.Errorf("cost json: %w", err)
		}
	}
	return nil
}

// checkCostJSONFits rejects a default above a fixed max_requests: no
// request without the paths would ever be admitted.
func checkCostJSONFits(c *CostJSON, maxRequests int64, maxRequestsFrom string) error {
	if c != nil && maxRequestsFrom == "" && c.Default > maxRequests {
		return fmt.Errorf("cost json: the default %d is above max_requests %d: no request without the paths would ever be admitted", c.Default, maxRequests)
	}
	return nil
}

// of returns what r reserves, at least 1, and why it took the default
// ("" when it did not, or the body has none of the paths).
func (c *CostJSON) of(r *http.Request) (int64, string) {
	body := peekBody(r)
	cost, why := c.Default, body.why
	size := body.size
	if why == "" {
		var found bool
		var n int64
		n, found, why = c.read(body.data)
		if found && why == "" {
			cost = n
		}
	}
	if why != "" {
		cost = c.Default
	}
	if c.Body {
		cost = min(cost+size, maxCount)
	}
	return max(cost, 1), why
}

// read sums the values at the paths in the JSON document doc; found is
// false when it has none of them.
func (c *CostJSON) read(doc []byte) (sum int64, found bool, why string) {
	if len(bytes.TrimSpace(doc)) == 0 {
		return 0, false, ""
	}
	largest := make([]int64, len(c.paths))
	seen := make([]bool, len(c.paths))
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var keys []string
	depth := 0
	var walk func() error
	walk = func() error {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		switch t := t.(type) {
		case json.Delim:
			if depth++; depth > jsonMaxDepth {
				return errors.New("too deep")
			}
			defer func() { depth-- }()
			switch t {
			case '{':
				for dec.More() {
					k, err := dec.Token()
					if err != nil {
						return err
					}
					keys = append(keys, k.(string))
					if err := walk(); err != nil {
						return err
					}
					keys = keys[:len(keys)-1]
				}
			case '[':
				// A path does not go through arrays: what is inside
				// counts for none of them.
				saved := keys
				keys = append(keys[:len(keys):len(keys)], "[")
				for dec.More() {
					if err := walk(); err != nil {
						return err
					}
				}
				keys = saved
			}
			_, err := dec.Token()
			return err
		default:
			for i, p := range c.paths {
				if !equalPath(p, keys) || t == nil {
					continue
				}
				n, ok := wholeAtLeast(t)
				if !ok {
					return errNotWhole
				}
				largest[i], seen[i] = max(largest[i], n), true
			}
		}
		return nil
	}
	err := walk()
	if err == nil {
		if _, err = dec.Token(); err == io.EOF {
			err = nil
		} else if err == nil {
			err = errors.New("more than one document")
		}
	}
	switch {
	case errors.Is(err, errNotWhole):
		return 0, false, valueNotWhole
	case err != nil:
		return 0, false, costNotJSON
	}
	for i := range c.paths {
		if seen[i] {
			found = true
			sum = min(sum+largest[i], maxCount)
		}
	}
	return sum, found, ""
}

var errNotWhole = errors.New("not a whole number")

func equalPath(p, keys []string) bool {
	if len(p) != len(keys) {
		return false
	}
	for i := range p {
		if p[i] != keys[i] {
			return false
		}
	}
	return true
}

// wholeAtLeast reads a value at a path: a number, or a string that holds
// one, of at least 0, rounded up, at most maxCount.
func wholeAtLeast(v json.Token) (int64, bool) {
	var s string
	switch v := v.(type) {
	case json.Number:
		s = string(v)
	case string:
		s = strings.TrimSpace(v)
	default:
		return 0, false
	}
	if n, ok := parseCount(s); ok {
		return n, true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) || math.IsNaN(f) || f < 0 {
		return 0, false
	}
	if f >= maxCount {
		return maxCount, true
	}
	return int64(math.Ceil(f)), true
}

// peekedBody is what cost json read of a request body: its bytes, its
// size (a bound, when it was not read whole), and why it is not usable.
type peekedBody struct {
	data []byte
	size int64
	why  string
}

// bodyPeek is a request body that was read ahead (by a goroutine, so that
// a slow client costs a wait of costJSONReadTime at most), then handed on:
// what was read, then the rest.
type bodyPeek struct {
	rest io.ReadCloser
	done chan struct{}
	buf  []byte
	err  error
	off  int
	// peeked is what the reading gave, for the zones after the first.
	peeked peekedBody
}

// peekBody reads r's body, up to costJSONMaxBody bytes and for
// costJSONReadTime at most, and puts it back, whole, for the handlers
// after; a second zone gets what the first read.
func peekBody(r *http.Request) peekedBody {
	if p, ok := r.Body.(*bodyPeek); ok {
		return p.peeked
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return peekedBody{}
	}
	p := &bodyPeek{rest: r.Body, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		var b bytes.Buffer
		if r.ContentLength > 0 {
			b.Grow(int(min(r.ContentLength, costJSONMaxBody+1)))
		}
		_, p.err = b.ReadFrom(io.LimitReader(p.rest, costJSONMaxBody+1))
		p.buf = b.Bytes()
	}()
	r.Body = p
	unread := func(why string) peekedBody {
		size := r.ContentLength
		if size < 0 {
			size = costJSONMaxBody
		}
		return peekedBody{size: size, why: why}
	}
	timer := time.NewTimer(costJSONReadTime)
	defer timer.Stop()
	select {
	case <-p.done:
		switch {
		case p.err != nil:
			p.peeked = unread(costUnread)
		case len(p.buf) > costJSONMaxBody:
			p.peeked = unread(costTooLarge)
			p.peeked.size = max(p.peeked.size, int64(len(p.buf)))
		default:
			p.peeked = peekedBody{data: p.buf, size: int64(len(p.buf))}
		}
	case <-timer.C:
		p.peeked = unread(costSlow)
	case <-r.Context().Done():
		p.peeked = unread(costUnread)
	}
	return p.peeked
}

// Read reads what was read ahead, then the rest of the body.
func (p *bodyPeek) Read(b []byte) (int, error) {
	<-p.done
	if p.off < len(p.buf) {
		n := copy(b, p.buf[p.off:])
		p.off += n
		return n, nil
	}
	if p.err != nil {
		return 0, p.err
	}
	return p.rest.Read(b)
}

// Close closes the body, once its reading ahead is over.
func (p *bodyPeek) Close() error {
	return p.rest.Close()
}
