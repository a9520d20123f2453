package limiter

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// slowEcho returns its key after about a millisecond of work in Redis, so
// that concurrent calls pile up behind the ones Redis is running.
var slowEcho = redis.NewScript(`
local x = 0
for i = 1, 100000 do x = x + i end
return KEYS[1]`)

// pipelineCounter is a go-redis hook that counts the pipelines of script
// calls a client sends, and the calls in them. The pipelines of a new
// connection's handshake (HELLO, CLIENT SETINFO) are not counted.
type pipelineCounter struct{ pipelines, cmds atomic.Int64 }

func (*pipelineCounter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (*pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var n int64
		for _, c := range cmds {
			if c.Name() == "evalsha" {
				n++
			}
		}
		if n > 0 {
			h.pipelines.Add(1)
			h.cmds.Add(n)
		}
		return next(ctx, cmds)
	}
}

// TestBatcherSharesPipelines: concurrent calls go out in shared pipelines,
// and each caller gets its own reply.
func TestBatcherSharesPipelines(t *testing.T) {
	const calls = 400
	ctx := testContext(t)
	client := redis.NewClient(&redis.Options{Addr: testRedis.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	if err := slowEcho.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	counter := new(pipelineCounter)
	client.AddHook(counter)
	b := NewBatcher(client)
	t.Cleanup(func() { b.Close() })

	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := range calls {
		wg.Go(func() {
			key := "echo-" + strconv.Itoa(i)
			got, err := slowEcho.Run(ctx, b, []string{key}).Text()
			switch {
			case err != nil:
				errs <- err
			case got != key:
				errs <- errors.New("call for " + key + " got the reply " + got)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	pipelines, cmds := counter.pipelines.Load(), counter.cmds.Load()
	t.Logf("%d calls in %d pipelines", cmds, pipelines)
	if cmds != calls {
		t.Errorf("%d EVALSHA sent for %d calls", cmds, calls)
	}
	// Each call takes Redis about a millisecond, so calls queue while the
	// flushers wait: without batching there would be one pipeline a call.
	if pipelines > calls/4 {
		t.Errorf("%d calls went out in %d pipelines: want at most %d", calls, pipelines, calls/4)
	}
}

// TestBatcherDeadlineOnFrozenRedis: while Redis is frozen, every call,
// queued or in flight, returns at its deadline; once Redis is back, calls
// succeed again.
func TestBatcherDeadlineOnFrozenRedis(t *testing.T) {
	const timeout = 100 * time.Millisecond
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	b := NewBatcher(client)
	t.Cleanup(func() { b.Close() })
	s := NewRedisStore(client, testPrefix(t)).Batched(b)
	check := []Check{{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: 1000}}}
	if err := s.Allow(testContext(t), check, make([]Decision, 1)); err != nil {
		t.Fatal(err)
	}

	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			srv.Thaw()
		}
	})
	var wg sync.WaitGroup
	for range 3 * maxBatch {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			start := time.Now()
			err := s.Allow(ctx, check, make([]Decision, 1))
			if took := time.Since(start); took > timeout+100*time.Millisecond {
				t.Errorf("call on a frozen Redis took %v with a %v deadline", took, timeout)
			}
			// The caller's deadline and the connection's read deadline, set
			// from the same time, race: either error is the deadline's.
			var netErr net.Error
			if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &netErr) && netErr.Timeout()) {
				t.Errorf("call on a frozen Redis: got error %v, want a timeout", err)
			}
		})
	}
	wg.Wait()

	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	thawed = true
	deadline := time.Now().Add(2 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err := s.Allow(ctx, check, make([]Decision, 1))
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing 2s after Redis came back: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBatcherClose: Close waits for the calls in flight, which end at their
// deadline even on a frozen Redis; calls after it fail at once.
func TestBatcherClose(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	b := NewBatcher(client)
	if err := slowEcho.Load(testContext(t), client).Err(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Thaw() })

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	inFlight := make(chan error, 1)
	go func() { inFlight <- slowEcho.Run(ctx, b, []string{"k"}).Err() }()
	time.Sleep(50 * time.Millisecond) // let a flusher send it
	start := time.Now()
	b.Close()
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("Close took %v with a call of a 200ms deadline in flight", took)
	}
	if err := <-inFlight; err == nil {
		t.Error("call on a frozen Redis succeeded")
	}
	if err := slowEcho.Run(testContext(t), b, []string{"k"}).Err(); !errors.Is(err, ErrBatcherClosed) {
		t.Errorf("call after Close: got %v, want ErrBatcherClosed", err)
	}
	b.Close() // a second Close is harmless
}
