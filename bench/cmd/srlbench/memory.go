package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// memResult is the memory phase: what `keys` clients at their full quota
// cost Redis.
type memResult struct {
	keys, perKey  int
	before, after int64 // used_memory
	admitted      int   // 200 responses (should be keys*perKey)
	other         int   // any other status
	keysFound     int   // keys under srlmem: afterwards, without the warm-up key
	sampleKey     string
	keyUsage      int64 // MEMORY USAGE sampleKey
	sampleKeyType string
}

// bytesPerKey is the used_memory growth per key.
func (m memResult) bytesPerKey() float64 {
	return float64(m.after-m.before) / float64(m.keys)
}

// memPrefix is the memory site's key_prefix (see caddyfileTemplate).
const memPrefix = "srlmem:"

// measureMemory sends perKey requests for each of keys clients through the
// memory site (max_requests 60, so all are admitted and each key ends up
// holding 60 entries, a full window) and reads used_memory before and after.
// It runs right after start-up, when no other keys can expire meanwhile.
func measureMemory(ctx context.Context, rc *redis.Client, site string, keys, perKey, workers int) (memResult, error) {
	m := memResult{keys: keys, perKey: perKey}
	// Warm up before the baseline: Redis's script cache and the connections
	// of Caddy's Redis pool, whose buffers Redis counts in used_memory.
	if _, _, err := sendAll(ctx, site, []string{"mem-warmup"}, 10*workers, workers); err != nil {
		return m, err
	}
	var err error
	if m.before, err = usedMemory(ctx, rc); err != nil {
		return m, err
	}
	keyNames := make([]string, keys)
	for k := range keyNames {
		keyNames[k] = fmt.Sprintf("mem-%d", k)
	}
	if m.admitted, m.other, err = sendAll(ctx, site, keyNames, perKey, workers); err != nil {
		return m, err
	}
	if m.after, err = usedMemory(ctx, rc); err != nil {
		return m, err
	}

	// Find the keys by prefix rather than by rebuilding their names: the
	// key layout is the module's business and may change.
	iter := rc.Scan(ctx, 0, memPrefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		if strings.Contains(k, "mem-warmup") {
			continue
		}
		m.keysFound++
		if m.sampleKey == "" {
			m.sampleKey = k
		}
	}
	if err := iter.Err(); err != nil {
		return m, err
	}
	if m.sampleKey == "" {
		return m, fmt.Errorf("no Redis keys with prefix %s after the memory phase", memPrefix)
	}
	// SAMPLES 0: measure every element, not an estimate from a few.
	if m.keyUsage, err = rc.MemoryUsage(ctx, m.sampleKey, 0).Result(); err != nil {
		return m, fmt.Errorf("MEMORY USAGE: %w", err)
	}
	if m.sampleKeyType, err = rc.Type(ctx, m.sampleKey).Result(); err != nil {
		return m, err
	}
	return m, nil
}

// sendAll sends perKey GET requests with X-Client set to each of keys, from
// a few workers over keep-alive connections, and counts the 200s.
func sendAll(ctx context.Context, site string, keys []string, perKey, workers int) (ok, other int, err error) {
	client := &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: workers},
		Timeout:   10 * time.Second,
	}
	defer client.CloseIdleConnections()
	send := func(key string) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, site+"/", nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("X-Client", key)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	// One job is one request, so even a single key is spread over the workers.
	jobs := make(chan string)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for key := range jobs {
				status, e := send(key)
				mu.Lock()
				switch {
				case e != nil:
					if err == nil {
						err = e
					}
				case status == http.StatusOK:
					ok++
				default:
					other++
				}
				mu.Unlock()
			}
		})
	}
	for _, key := range keys {
		for i := 0; i < perKey && ctx.Err() == nil; i++ {
			jobs <- key
		}
	}
	close(jobs)
	wg.Wait()
	if err == nil {
		err = ctx.Err()
	}
	return ok, other, err
}
