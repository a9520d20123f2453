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

// memSize is one size of the memory phase: clients each admitted max times
// on a zone with max_requests max, so every client is at its limit.
type memSize struct {
	max     int
	clients int // default run; -quick divides by quickMemDivisor
	// window is the zone's window, memWindow when "". cost, when above 0,
	// is what each request costs: max_requests is then max*cost, a budget
	// in units (a spend budget's µ$), whose ring merges admissions.
	window string
	cost   int
}

// memSizes keep every size's phase to some 60,000-100,000 requests (under
// about 30 s here): fewer clients as each holds more admissions. The last
// is a month's spend budget, $10 of µ$ at $0.01 a call: what a key of a
// 30-day window holds at its limit.
var memSizes = []memSize{{max: 60, clients: 1000}, {max: 1000, clients: 100}, {max: 10000, clients: 10},
	{max: 1000, clients: 100, window: "720h", cost: 10000}}

// zoneWindow is the size's window.
func (m memSize) zoneWindow() string {
	if m.window == "" {
		return memWindow
	}
	return m.window
}

// label names the size in the report: its admissions, and its window and
// cost when it has its own.
func (m memSize) label() string {
	if m.window == "" {
		return thousands(float64(m.max))
	}
	return fmt.Sprintf("%s in %s, cost %s", thousands(float64(m.max)), m.window, thousands(float64(m.cost)))
}

// options are the sliding_ratelimit subdirectives of the size's site.
func (m memSize) options(redisURL string) []string {
	budget := m.max
	var cost []string
	if m.cost > 0 {
		budget, cost = m.max*m.cost, []string{fmt.Sprintf("cost %d", m.cost)}
	}
	options := []string{"window " + m.zoneWindow(), fmt.Sprintf("max_requests %d", budget)}
	return append(append(options, cost...), "key {http.request.header.X-Client}", "redis "+redisURL, "key_prefix "+m.prefix())
}

// quickMemDivisor shrinks the client counts for -quick (at least 2 each).
const quickMemDivisor = 5

// memWindow is the memory zones' window: long enough that no key expires
// during the phase, which would move used_memory.
const memWindow = "10m"

// prefix is the size's key_prefix, so its keys can be found and counted.
func (m memSize) prefix() string {
	if m.window != "" {
		return fmt.Sprintf("srlmem%d-%s:", m.max, m.window)
	}
	return fmt.Sprintf("srlmem%d:", m.max)
}

// memResult is one size of the memory phase: what `clients` clients at
// their full quota cost Redis.
type memResult struct {
	size          memSize
	clients       int
	before, after int64 // used_memory
	admitted      int   // 200 responses (should be clients*max)
	other         int   // any other status
	keysFound     int   // keys under the prefix afterwards, without the warm-up key
	usageSum      int64 // MEMORY USAGE of all of them
	sampleKey     string
	sampleKeyType string
	elapsed       time.Duration
}

// bytesPerClient is the used_memory growth per client.
func (m memResult) bytesPerClient() float64 {
	return float64(m.after-m.before) / float64(m.clients)
}

// usagePerClient is the mean MEMORY USAGE (SAMPLES 0) of a client's keys.
func (m memResult) usagePerClient() float64 {
	return float64(m.usageSum) / float64(m.clients)
}

// bytesPerAdmission is used_memory growth per admission held.
func (m memResult) bytesPerAdmission() float64 { return m.bytesPerClient() / float64(m.size.max) }

// memWarmupKey is the X-Client of the requests before the baseline.
const memWarmupKey = "mem-warmup"

// measureMemory sends size.max requests for each of `clients` clients
// through the size's site and reads used_memory before and after, then
// deletes the keys so that the next size starts from the same baseline.
// It runs right after start-up, when no other keys can expire meanwhile.
func measureMemory(ctx context.Context, rc *redis.Client, site string, size memSize, clients, workers int) (memResult, error) {
	m := memResult{size: size, clients: clients}
	start := time.Now()
	// Warm up before the baseline: Redis's script cache and the connections
	// of Caddy's Redis pool, whose buffers Redis counts in used_memory.
	if _, _, err := sendAll(ctx, site, []string{memWarmupKey}, 10*workers, workers); err != nil {
		return m, err
	}
	var err error
	if m.before, err = usedMemory(ctx, rc); err != nil {
		return m, err
	}
	keyNames := make([]string, clients)
	for k := range keyNames {
		keyNames[k] = fmt.Sprintf("mem-%d", k)
	}
	if m.admitted, m.other, err = sendAll(ctx, site, keyNames, size.max, workers); err != nil {
		return m, err
	}
	if m.after, err = usedMemory(ctx, rc); err != nil {
		return m, err
	}

	// Find the keys by prefix rather than by rebuilding their names: the
	// key layout is the module's business and may change.
	var keys []string
	iter := rc.Scan(ctx, 0, size.prefix()+"*", 1000).Iterator()
	for iter.Next(ctx) {
		if k := iter.Val(); !strings.Contains(k, memWarmupKey) {
			keys = append(keys, k)
		}
	}
	if err := iter.Err(); err != nil {
		return m, err
	}
	if len(keys) == 0 {
		return m, fmt.Errorf("no Redis keys with prefix %s after the memory phase", size.prefix())
	}
	m.keysFound, m.sampleKey = len(keys), keys[0]
	// SAMPLES 0: measure every element, not an estimate from a few.
	pipe := rc.Pipeline()
	usages := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		usages[i] = pipe.MemoryUsage(ctx, k, 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return m, fmt.Errorf("MEMORY USAGE: %w", err)
	}
	for _, u := range usages {
		m.usageSum += u.Val()
	}
	if m.sampleKeyType, err = rc.Type(ctx, m.sampleKey).Result(); err != nil {
		return m, err
	}
	if err := deleteKeys(ctx, rc, keys); err != nil {
		return m, err
	}
	m.elapsed = time.Since(start)
	return m, nil
}

// deleteKeys removes a size's keys, in slices small enough for one command.
func deleteKeys(ctx context.Context, rc *redis.Client, keys []string) error {
	for len(keys) > 0 {
		n := min(len(keys), 500)
		if err := rc.Del(ctx, keys[:n]...).Err(); err != nil {
			return fmt.Errorf("deleting the memory phase's keys: %w", err)
		}
		keys = keys[n:]
	}
	return nil
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
