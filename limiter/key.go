package limiter

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"unicode/utf8"
)

// maxKeyLen is the longest client key BoundKey keeps as it is. Longer keys
// are replaced by a hash, so that a 10 KB header cannot make a 10 KB storage
// key.
const maxKeyLen = 64

// hashedKeyPrefix marks a key that BoundKey replaced by its hash. It holds a
// character that BoundKey never keeps, so a hashed key cannot equal a key that
// a client sent as it is.
const hashedKeyPrefix = "#"

// BoundKey returns a client key fit for Check.Key: key itself when it is at
// most 64 bytes and safe to embed in a Redis Cluster hash tag, and otherwise
// a hash of it: '#' and 43 more bytes. Keys holding '{', '}' or '#' are
// hashed too, so the hash tag of a storage key is always the whole client
// key and two distinct keys never collide. So is the empty key: Redis
// Cluster ignores an empty hash tag "{}" and hashes the whole key name, zone
// included, which would put a client's zones in different slots (CROSSSLOT
// on every decision over several zones). And so is a key that is not valid
// UTF-8: JSON, and so an admin API that lists keys, cannot carry it as it is
// (two such keys would both read "\ufffd\ufffd"), while its hash is plain
// text that names it alone.
func BoundKey(key string) string {
	if key != "" && len(key) <= maxKeyLen && !strings.ContainsAny(key, "{}"+hashedKeyPrefix) && utf8.ValidString(key) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return hashedKeyPrefix + base64.RawURLEncoding.EncodeToString(sum[:])
}
