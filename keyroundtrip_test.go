package slidingratelimit

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/adminapi"
)

// TestKeysThatAreNotUTF8RoundTrip: two clients keyed by header values that
// differ only in bytes that are not UTF-8 are listed as two keys, each of
// which GET reads and DELETE resets, through the admin API and the command,
// one at a time: the other stays blocked.
func TestKeysThatAreNotUTF8RoundTrip(t *testing.T) {
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
		key {http.request.header.X-Client}
		zone raw_bytes 1m 1
	}
	respond "ok"
}`)
	client := from("127.0.0.2")
	fe := withHeader("X-Client", "\xff\xfe")
	fd := withHeader("X-Client", "\xff\xfd")
	expect(t, `\xff\xfe`, site, []int{200, 429}, client, fe)
	expect(t, `\xff\xfd`, site, []int{200, 429}, client, fd)

	blocked := adminBlocked(t, "")
	if blocked.Count != 2 || len(blocked.Blocked) != 2 || blocked.Blocked[0].Key == blocked.Blocked[1].Key {
		t.Fatalf("blocked: %+v, want two entries with different keys", blocked)
	}
	for _, b := range blocked.Blocked {
		if !utf8.ValidString(b.Key) || strings.ContainsRune(b.Key, utf8.RuneError) {
			t.Errorf("blocked key %q: want text that JSON carries as it is", b.Key)
		}
	}
	// Which listed key is whose: the raw bytes, percent-encoded in the path,
	// name the same key as the listing.
	feKey := adminState(t, "raw_bytes", "%FF%FE").Key
	fdKey := adminState(t, "raw_bytes", "%FF%FD").Key
	if feKey == fdKey || !listed(blocked, feKey) || !listed(blocked, fdKey) {
		t.Fatalf("keys of the raw bytes: %q and %q, want two different keys, both listed in %+v", feKey, fdKey, blocked.Blocked)
	}
	for _, key := range []string{feKey, fdKey} {
		if s := adminState(t, "raw_bytes", url.PathEscape(key)); s.Key != key || s.Count != 1 || s.Remaining != 0 {
			t.Errorf("GET %s: %+v, want that key with count 1, remaining 0", key, s)
		}
	}

	// DELETE through the admin API, with the key as listed: only that client
	// is admitted again.
	if r := adminReset(t, "raw_bytes", url.PathEscape(feKey)); r.Key != feKey {
		t.Errorf("DELETE %s: %+v", feKey, r)
	}
	expect(t, `\xff\xfe after its reset`, site, []int{200}, client, fe)
	expect(t, `\xff\xfd after the other's reset`, site, []int{429}, client, fd)

	// The command: the listed key goes back to status and reset as printed,
	// in its table and in its JSON.
	b := commandJSON[adminapi.BlockedAnswer](t, "blocked")
	if len(b.Blocked) != 1 || !listed(b, fdKey) {
		t.Fatalf("command blocked --json: %+v, want only %s listed", b, fdKey)
	}
	out, err := runCommand(t, "blocked", "--address", "localhost:2999")
	if err != nil || !strings.Contains(out, " "+fdKey+" ") {
		t.Errorf("command blocked printed %q (%v), want %s in the table as it is", out, err, fdKey)
	}
	if s := commandJSON[adminapi.KeyState](t, "status", "--zone", "raw_bytes", "--key", fdKey); s.Key != fdKey || s.Count != 1 {
		t.Errorf("command status --key %s: %+v, want count 1", fdKey, s)
	}
	if s := commandJSON[adminapi.KeyState](t, "status", "--zone", "raw_bytes", "--key", "\xff\xfd"); s.Key != fdKey {
		t.Errorf(`command status --key \xff\xfd: %+v, want key %s`, s, fdKey)
	}
	if r := commandJSON[adminapi.ResetAnswer](t, "reset", "--zone", "raw_bytes", "--key", fdKey); r.Key != fdKey || !r.Reset {
		t.Errorf("command reset --key %s: %+v", fdKey, r)
	}
	expect(t, `\xff\xfd after its reset`, site, []int{200}, client, fd)
	if got := send(t, site, client, fe).status; got != http.StatusTooManyRequests {
		t.Errorf(`\xff\xfe, admitted once since its reset: status %d, want 429`, got)
	}
}

// listed reports whether key is in the blocked list.
func listed(b adminapi.BlockedAnswer, key string) bool {
	for _, c := range b.Blocked {
		if c.Key == key {
			return true
		}
	}
	return false
}
