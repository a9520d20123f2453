package slidingratelimit

import (
	"bytes"
	"io"
	"net/http"
)

// readBodyUpTo reads r's body, up to limit bytes, and puts it back intact
// for the next handler: the bytes read, then whatever the client has still
// to send. It reports whether that was the whole body (the body ended
// within limit). A body that ended was read to its end, which is what
// makes Go's HTTP/1 server watch the connection from then on: a client that
// goes away then cancels the request's context.
//
// A read error (the client went away, the server's read timeout) is
// returned as is; the body is then put back with what was read, and the
// error comes again to the next reader.
func readBodyUpTo(r *http.Request, limit int64) (whole bool, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return true, nil
	}
	original := r.Body
	read, err := io.ReadAll(io.LimitReader(original, limit+1))
	whole = err == nil && int64(len(read)) <= limit
	switch {
	case whole:
		// Read to EOF: nothing is left to read from the client.
		r.Body = readBody{bytes.NewReader(read), original}
	case err != nil:
		r.Body = readBody{io.MultiReader(bytes.NewReader(read), errorReader{err}), original}
	default:
		r.Body = readBody{io.MultiReader(bytes.NewReader(read), original), original}
	}
	return whole, err
}

// readBody is a body read in part or whole (reader), still closed through
// the one the server gave.
type readBody struct {
	io.Reader
	original io.Closer
}

func (b readBody) Close() error { return b.original.Close() }

// errorReader fails each read with err.
type errorReader struct{ err error }

func (e errorReader) Read([]byte) (int, error) { return 0, e.err }
