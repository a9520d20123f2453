package slidingratelimit

import (
	"bytes"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestPeekBodyReadsItsLengthOnce: a body that states its length is read
// into a buffer of that size, not into one twice as large, and is handed
// on whole; a body of no stated length is read as before.
func TestPeekBodyReadsItsLengthOnce(t *testing.T) {
	for _, size := range []int{475, 4 << 10, 64 << 10} {
		body := strings.Repeat("x", size)
		for _, stated := range []bool{true, false} {
			r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
			if !stated {
				r.ContentLength = -1
			}
			peeked := peekBody(r)
			if string(peeked.data) != body || peeked.size != int64(size) {
				t.Fatalf("%d bytes, length stated %v: peeked %d bytes (size %d), want all %d", size, stated, len(peeked.data), peeked.size, size)
			}
			if p := r.Body.(*bodyPeek); stated && cap(p.buf) != size {
				t.Errorf("%d bytes, length stated: a buffer of %d bytes, want %d", size, cap(p.buf), size)
			}
			rest, err := io.ReadAll(r.Body)
			if err != nil || !bytes.Equal(rest, []byte(body)) {
				t.Errorf("%d bytes, length stated %v: the handlers after got %d bytes (%v), want the whole body", size, stated, len(rest), err)
			}
		}
	}
}
