package slidingratelimit

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// admissionsKept returns how many admission times a sliding-log key holds:
// the count in the header of its ring (limiter/limit.lua: a version byte,
// then cap, head and count, big-endian uint32s; version 8, a small count
// ring, holds the count in byte 9 alone); 0 when there is no key.
func admissionsKept(ctx context.Context, c redis.Cmdable, key string) (int64, error) {
	v, err := c.GetRange(ctx, key, 0, 12).Result()
	if err != nil {
		return 0, err
	}
	if v == "" {
		return 0, nil
	}
	if len(v) != 13 {
		return 0, fmt.Errorf("%s: not a ring", key)
	}
	if v[0] == 8 {
		return int64(v[9]), nil
	}
	return int64(binary.BigEndian.Uint32([]byte(v[9:]))), nil
}
