package slidingratelimit

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// failingReader gives its text, then err.
type failingReader struct {
	text io.Reader
	err  error
}

func (f failingReader) Read(p []byte) (int, error) {
	n, err := f.text.Read(p)
	if err == io.EOF {
		return n, f.err
	}
	return n, err
}

// TestReadBodyUpTo: a body within the bound is read whole; one above it is
// read up to the bound; either way the next reader gets it intact, and a
// read error comes again to the next reader.
func TestReadBodyUpTo(t *testing.T) {
	lost := errors.New("client gone")
	for _, c := range []struct {
		name      string
		body      io.Reader
		whole     bool
		err       error
		nextBody  string
		nextError error
	}{
		{"empty", strings.NewReader(""), true, nil, "", nil},
		{"within", strings.NewReader("0123456789"), true, nil, "0123456789", nil},
		{"above", strings.NewReader("0123456789ab"), false, nil, "0123456789ab", nil},
		{"far above", strings.NewReader(strings.Repeat("z", 1000)), false, nil, strings.Repeat("z", 1000), nil},
		{"failing", failingReader{strings.NewReader("0123"), lost}, false, lost, "0123", lost},
	} {
		r, err := http.NewRequest(http.MethodPost, "/", io.NopCloser(c.body))
		if err != nil {
			t.Fatal(err)
		}
		whole, err := readBodyUpTo(r, 10)
		if whole != c.whole || !errors.Is(err, c.err) {
			t.Errorf("%s: whole %v, error %v; want %v, %v", c.name, whole, err, c.whole, c.err)
		}
		next, err := io.ReadAll(r.Body)
		if string(next) != c.nextBody || !errors.Is(err, c.nextError) {
			t.Errorf("%s: the next reader got %q, %v; want %q, %v", c.name, next, err, c.nextBody, c.nextError)
		}
	}
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	if whole, err := readBodyUpTo(r, 10); !whole || err != nil || r.Body != nil {
		t.Errorf("no body: whole %v, error %v, body %v; want true, nil, nil", whole, err, r.Body)
	}
}
