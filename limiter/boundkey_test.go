package limiter

import (
	"encoding/base64"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestBoundKey(t *testing.T) {
	seen := make(map[string]string) // bound key -> name of its input
	for _, h := range hostileKeys() {
		got := BoundKey(h.key)
		if len(got) > maxKeyLen {
			t.Errorf("%s: BoundKey is %d bytes, want <= %d", h.name, len(got), maxKeyLen)
		}
		if strings.ContainsAny(got, "{}") {
			t.Errorf("%s: BoundKey = %q holds a brace", h.name, got)
		}
		if again := BoundKey(h.key); again != got {
			t.Errorf("%s: BoundKey not deterministic: %q then %q", h.name, got, again)
		}
		if other, dup := seen[got]; dup {
			t.Errorf("%s and %s: same BoundKey %q", other, h.name, got)
		}
		seen[got] = h.name

		keep := h.key != "" && len(h.key) <= maxKeyLen && !strings.ContainsAny(h.key, "{}#") && utf8.ValidString(h.key)
		if keep {
			if got != h.key {
				t.Errorf("%s: BoundKey(%q) = %q, want it unchanged", h.name, h.key, got)
			}
			continue
		}
		// Hashed: "#" and the unpadded base64url SHA-256, 1+43 bytes.
		if got, want := len(got), 44; got != want {
			t.Errorf("%s: hashed key is %d bytes, want %d", h.name, got, want)
		}
		sum, ok := strings.CutPrefix(got, "#")
		if !ok {
			t.Errorf("%s: hashed key %q does not start with #", h.name, got)
			continue
		}
		raw, err := base64.RawURLEncoding.DecodeString(sum)
		if err != nil || len(raw) != 32 {
			t.Errorf("%s: hashed key %q is not base64url of 32 bytes (%d bytes, %v)", h.name, got, len(raw), err)
		}
	}
}
