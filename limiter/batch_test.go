package limiter

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// isLimitCall reports whether cmd calls limit.lua: FCALL, EVALSHA or EVAL.
func isLimitCall(cmd redis.Cmder) bool {
	n := cmd.Name()
	return n == "fcall" || n == "evalsha" || n == "eval"
}

// scriptCounter is a go-redis hook that counts the limit.lua calls a client
// makes, alone or in pipelines.
type scriptCounter struct{ calls atomic.Int64 }

func (*scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isLimitCall(cmd) {
			h.calls.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if isLimitCall(c) {
				h.calls.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// TestBatchSameKey: requests for one key in one script call are decided in
// order, each seeing the ones before: exactly max admitted, remaining
// counting down, and the rest denied with the same wait.
func TestBatchSameKey(t *testing.T) {
	const max = 7
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: max}}
	key := testPrefix(t) + "{" + c.Key + "}:z"
	reqs := make([]*scriptReq, 20)
	for i := range reqs {
		reqs[i] = &scriptReq{op: opAllow, keys: []string{key}, checks: []Check{c}}
	}
	runScript(t, testClient, 0, reqs...)
	var wait time.Duration
	for i, r := range reqs {
		d := r.decisions[0]
		if i < max {
			if !d.Allowed || d.Remaining != int64(max-i-1) {
				t.Errorf("request %d: %+v, want Allowed with Remaining %d", i+1, d, max-i-1)
			}
			continue
		}
		if d.Allowed || d.RetryAfter <= 0 || (wait != 0 && d.RetryAfter != wait) {
			t.Errorf("request %d: %+v, want denied with RetryAfter %v", i+1, d, wait)
		}
		wait = d.RetryAfter
	}
}

// TestBatchConcurrentSameKey: concurrent callers of one key share script
// calls, and exactly max of them are admitted.
func TestBatchConcurrentSameKey(t *testing.T) {
	const (
		callers = 200
		max     = 50
	)
	client := redis.NewClient(&redis.Options{Addr: testRedis.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	counter := new(scriptCounter)
	client.AddHook(counter)
	s := newRedisStore(t, client, testPrefix(t))
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: max}}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range callers {
		wg.Go(func() {
			<-start
			ds := make([]Decision, 1)
			if err := s.Allow(testContext(t), []Check{c}, ds); err != nil {
				t.Error(err)
			}
			if ds[0].Allowed {
				admitted.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if got := admitted.Load(); got != max {
		t.Errorf("%d admitted of %d concurrent requests, want %d", got, callers, max)
	}
	t.Logf("%d decisions in %d script calls", callers, counter.calls.Load())
	if n := counter.calls.Load(); n >= callers {
		t.Errorf("%d script calls for %d concurrent decisions: no batching", n, callers)
	}
}

// TestBatchMixed: one script call decides requests over several zones and
// both algorithms, all or nothing each, with peeks and refunds among them.
func TestBatchMixed(t *testing.T) {
	prefix := testPrefix(t)
	key := func(client, zone string) string { return prefix + "{" + client + "}:" + zone }
	logLim := Limit{Window: time.Minute, Max: 2}
	ctrLim := Limit{Window: time.Minute, Max: 3, Algorithm: SlidingCounter}
	a, b := testKey(t), testKey(t)
	both := func(client string) *scriptReq {
		return &scriptReq{op: opAllow, keys: []string{key(client, "log"), key(client, "ctr")},
			checks: []Check{{Zone: "log", Key: client, Limit: logLim}, {Zone: "ctr", Key: client, Limit: ctrLim}}}
	}
	ctrOnly := func(client string) *scriptReq {
		return &scriptReq{op: opAllow, keys: []string{key(client, "ctr")}, checks: []Check{{Zone: "ctr", Key: client, Limit: ctrLim}}}
	}
	peek := &scriptReq{op: opPeek, keys: []string{key(a, "log"), key(a, "ctr")},
		checks: []Check{{Zone: "log", Key: a, Limit: logLim}, {Zone: "ctr", Key: a, Limit: ctrLim}}}
	reqs := []*scriptReq{both(a), ctrOnly(b), both(a), both(a), peek, ctrOnly(a), ctrOnly(a), both(b)}
	runScript(t, testClient, 0, reqs...)
	want := []struct {
		allowed   []bool
		remaining []int64
	}{
		{[]bool{true, true}, []int64{1, 2}},  // a: log 1 of 2, counter 1 of 3
		{[]bool{true}, []int64{2}},           // b: counter 1 of 3
		{[]bool{true, true}, []int64{0, 1}},  // a: log 2 of 2, counter 2 of 3
		{[]bool{false, true}, []int64{0, 1}}, // a: log full, so nothing recorded
		{[]bool{false, true}, []int64{0, 1}}, // peek of a: the same
		{[]bool{true}, []int64{0}},           // a: counter 3 of 3
		{[]bool{false}, []int64{0}},          // a: counter full
		{[]bool{true, true}, []int64{1, 1}},  // b: log 1 of 2, counter 2 of 3
	}
	for i, r := range reqs {
		for j, d := range r.decisions {
			if d.Allowed != want[i].allowed[j] || d.Remaining != want[i].remaining[j] {
				t.Errorf("request %d, zone %s: %+v, want Allowed %v, Remaining %d",
					i+1, r.checks[j].Zone, exported(d), want[i].allowed[j], want[i].remaining[j])
			}
		}
	}
	// Refunding a's first request in a later call frees one slot in each
	// of its zones.
	refund := &scriptReq{op: opSettle, keys: reqs[0].keys, checks: reqs[0].checks, decisions: reqs[0].decisions}
	again := both(a)
	runScript(t, testClient, 0, refund, again)
	if !Admitted(again.decisions) || again.decisions[0].Remaining != 0 || again.decisions[1].Remaining != 0 {
		t.Errorf("after a refund: %+v, want both zones admitting their last slot", again.decisions)
	}
}

// TestBatchScriptFlush: SCRIPT FLUSH while batches are in flight costs no
// decision: a batch that meets NOSCRIPT sends the script itself.
func TestBatchScriptFlush(t *testing.T) {
	const (
		workers  = 8
		requests = 150
		max      = 500
	)
	s := newRedisStore(t, testClient, testPrefix(t))
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: max}}
	stop := make(chan struct{})
	flushed := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				flushed <- n
				return
			default:
			}
			if err := testClient.ScriptFlush(context.Background()).Err(); err != nil {
				t.Error(err)
			}
			n++
			time.Sleep(time.Millisecond)
		}
	}()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			ds := make([]Decision, 1)
			for range requests {
				if err := s.Allow(testContext(t), []Check{c}, ds); err != nil {
					t.Error(err)
					return
				}
				if ds[0].Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	t.Logf("%d SCRIPT FLUSHes during %d decisions", <-flushed, workers*requests)
	if got := admitted.Load(); got != max {
		t.Errorf("%d admitted, want %d", got, max)
	}
}

// TestBatchFrozenRedis: while Redis is frozen, every caller answers at its
// deadline, the store's timeout or its context's if sooner, with no
// deadline of its own; the store works again once Redis is back.
func TestBatchFrozenRedis(t *testing.T) {
	const (
		timeout = 300 * time.Millisecond
		short   = 100 * time.Millisecond
		callers = 40
	)
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	s := NewRedisStore(client, RedisOptions{KeyPrefix: testPrefix(t), Timeout: timeout})
	t.Cleanup(func() { s.Close() })
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: 1000}}
	allow1(t, s, c) // load the script, open a connection

	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := srv.Thaw(); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer thaw()
	type result struct {
		deadline time.Duration
		took     time.Duration
		err      error
	}
	results := make(chan result, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			ctx, deadline := context.Background(), timeout
			if i%4 == 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, short)
				defer cancel()
				deadline = short
			}
			start := time.Now()
			err := s.Allow(ctx, []Check{c}, make([]Decision, 1))
			results <- result{deadline, time.Since(start), err}
		})
		if i%10 == 9 {
			time.Sleep(20 * time.Millisecond) // callers in several batches
		}
	}
	wg.Wait()
	close(results)
	for r := range results {
		if !errors.Is(r.err, context.DeadlineExceeded) {
			t.Errorf("caller with deadline %v: error %v, want a deadline error", r.deadline, r.err)
		}
		// Never before its deadline; the upper bound only catches a caller
		// held for the client's read timeout (3 s) or forever.
		if r.took < r.deadline || r.took > r.deadline+2*time.Second {
			t.Errorf("caller with deadline %v answered after %v", r.deadline, r.took)
		}
	}
	thaw()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ds := make([]Decision, 1)
	var err error
	// The first call after the thaw may still meet the connection the
	// frozen call abandoned; a later one must succeed.
	for range 20 {
		if err = s.Allow(ctx, []Check{c}, ds); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || !ds[0].Allowed {
		t.Errorf("after the thaw: %+v, %v", ds[0], err)
	}
}

// TestBatchClusterSlots: on Redis Cluster, a batch of many clients goes out
// as one call per slot, also right after SCRIPT FLUSH, and each client gets
// exactly max admissions; the store's slot of a key is the cluster's.
func TestBatchClusterSlots(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster; skipped in -short mode")
	}
	cluster := redistest.StartCluster(t, 3)
	client := cluster.Client(t)
	for _, key := range []string{"srl:{203.0.113.7}:api", "a{b}c", "{}x", "x{}{y}", "{{a}}", "no tag", "srl:{#abc}:z"} {
		want, err := client.ClusterKeySlot(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := hashSlot(key); int64(got) != want {
			t.Errorf("hashSlot(%q) = %d, CLUSTER KEYSLOT = %d", key, got, want)
		}
	}

	const (
		clients = 64
		max     = 5
		rounds  = 10
	)
	s := newRedisStore(t, client, testPrefix(t))
	// Batches of several slots go out as pipelines; with the script flushed
	// from every node, they meet NOSCRIPT and send it.
	if err := client.ForEachShard(testContext(t), func(ctx context.Context, shard *redis.Client) error {
		return shard.ScriptFlush(ctx).Err()
	}); err != nil {
		t.Fatal(err)
	}
	admitted := make([]atomic.Int64, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			checks := []Check{
				{Zone: "a", Key: "c" + strconv.Itoa(i), Limit: Limit{Window: time.Minute, Max: max}},
				{Zone: "b", Key: "c" + strconv.Itoa(i), Limit: Limit{Window: time.Minute, Max: 100, Algorithm: SlidingCounter}},
			}
			ds := make([]Decision, 2)
			for range rounds {
				if err := s.Allow(testContext(t), checks, ds); err != nil {
					t.Error(err)
					return
				}
				if Admitted(ds) {
					admitted[i].Add(1)
				}
			}
		})
	}
	wg.Wait()
	for i := range clients {
		if got := admitted[i].Load(); got != max {
			t.Errorf("client %d: %d admitted, want %d", i, got, max)
		}
	}
}

// TestRedisStoreClose: Close returns once the script call in flight ends
// (at its callers' deadline, Redis frozen), every caller still waiting gets
// an answer, and calls after Close fail with errClosed.
func TestRedisStoreClose(t *testing.T) {
	const timeout = 200 * time.Millisecond
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	s := NewRedisStore(client, RedisOptions{KeyPrefix: testPrefix(t), Timeout: timeout})
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: 100}}
	allow1(t, s, c)
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer srv.Thaw()
	errs := make(chan error, 20)
	var wg sync.WaitGroup
	for range cap(errs) {
		wg.Go(func() { errs <- s.Allow(context.Background(), []Check{c}, make([]Decision, 1)) })
	}
	time.Sleep(20 * time.Millisecond) // the calls are queued or in flight
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The bound only catches a Close held by the client's read timeout
	// (3 s) or forever.
	if took := time.Since(start); took > timeout+2*time.Second {
		t.Errorf("Close took %v with Redis frozen", took)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, errClosed) {
			t.Errorf("a call during Close: %v, want its deadline or errClosed", err)
		}
	}
	if err := s.Allow(context.Background(), []Check{c}, make([]Decision, 1)); !errors.Is(err, errClosed) {
		t.Errorf("Allow after Close: %v, want errClosed", err)
	}
}

// TestBatchFarRedisWarmsConnections: warmAfter calls in a row that measure
// a network time of a twentieth of the timeout or more (a handshake's two
// round trips would take a tenth of it) make the next call open maxCalls
// connections ahead of need, outside any decision's deadline, so that the
// extra calls the batcher then sends find connections whose handshake is
// done. A near Redis gets no more connections than its calls use.
func TestBatchFarRedisWarmsConnections(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartFaultProxy(t, srv.Addr())
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	s := NewRedisStore(client, RedisOptions{KeyPrefix: testPrefix(t), Timeout: 200 * time.Millisecond})
	t.Cleanup(func() { s.Close() })
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: 1000}}
	for range 20 {
		allow1(t, s, c)
	}
	if n := client.PoolStats().TotalConns; n > batchTurns {
		t.Fatalf("%d connections after sequential decisions on a near Redis, want at most %d", n, batchTurns)
	}

	proxy.Latency(t, redistest.Downstream, 20*time.Millisecond, 0)
	// warmAfter far calls, then the call that warms.
	for range warmAfter + 1 {
		allow1(t, s, c)
	}
	deadline := time.Now().Add(5 * time.Second)
	for client.PoolStats().TotalConns < maxCalls {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections 5s after %d calls 20ms away, want %d", client.PoolStats().TotalConns, warmAfter+1, maxCalls)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBatchFarRedisGoesAtOnce: with Redis far away and nothing else to do,
// requests that come one after the other, each while the calls of the ones
// before are on the way, wait for their calls a small part of a round trip
// (a round trip spread over maxCalls calls), never for a reply to free a
// turn. The time a request waits before its call runs is read from Redis's
// clock (the admission time of its decision), on the same host as the
// test's.
func TestBatchFarRedisGoesAtOnce(t *testing.T) {
	const (
		far      = 100 * time.Millisecond
		requests = 6
		apart    = 250 * time.Microsecond
		// A turn frees every far/maxCalls (12.5ms); a request that waited
		// for a reply would wait 90ms or more here. The slack leaves room
		// for a loaded machine's timers and scheduling, which added 5ms
		// and more to a request's wait on two shared CPUs.
		slack = far / 2
	)
	srv := redistest.Start(t)
	proxy := redistest.StartFaultProxy(t, srv.Addr())
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	s := NewRedisStore(client, RedisOptions{KeyPrefix: testPrefix(t), Timeout: 2 * time.Second})
	t.Cleanup(func() { s.Close() })
	lim := Limit{Window: time.Minute, Max: 1000}
	proxy.Latency(t, redistest.Downstream, far, 0)
	// Open the connections the calls will use, outside the measure, and
	// let the store measure how far Redis is.
	var wg sync.WaitGroup
	for range maxCalls {
		wg.Go(func() {
			if err := client.Ping(context.Background()).Err(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for range 3 {
		allow1(t, s, Check{Zone: "z", Key: testKey(t) + "warm", Limit: lim})
	}

	start := make([]time.Time, requests)
	ds := make([][]Decision, requests)
	for i := range requests {
		ds[i] = make([]Decision, 1)
		start[i] = time.Now()
		wg.Go(func() {
			c := Check{Zone: "z", Key: testKey(t) + strconv.Itoa(i), Limit: lim}
			if err := s.Allow(context.Background(), []Check{c}, ds[i]); err != nil {
				t.Error(err)
			}
		})
		time.Sleep(apart)
	}
	wg.Wait()
	for i := range requests {
		if !ds[i][0].Allowed {
			t.Fatalf("request %d denied: %+v", i, ds[i][0])
		}
		ran := time.UnixMicro(ds[i][0].held.at)
		if waited := ran.Sub(start[i]); waited > slack {
			t.Errorf("request %d ran in Redis %v after it was made, want at once (under %v) with Redis %v away", i, waited, slack, far)
		}
	}
}

// opsCounter is a go-redis hook that records, for each limit.lua call that
// Redis ran, which ops its packed requests hold.
type opsCounter struct {
	mu    sync.Mutex
	calls []map[op]int
}

func (*opsCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *opsCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && isLimitCall(cmd) {
			args := cmd.Args()
			numKeys := *args[2].(*int)
			packed, _ := args[3+numKeys].(interface{ MarshalBinary() ([]byte, error) }).MarshalBinary()
			ops := map[op]int{}
			for pos := 0; pos < len(packed); {
				ops[op(packed[pos])]++
				pos += requestArgLen + zoneArgLen*int(packed[pos+1])
			}
			h.mu.Lock()
			h.calls = append(h.calls, ops)
			h.mu.Unlock()
		}
		return err
	}
}
func (h *opsCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestBatchSettlesRideWithDecisions: settles wait in the same queue as
// decisions, so under load a script call carries both: a settled request
// costs a part of a call, not a call of its own.
func TestBatchSettlesRideWithDecisions(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, PoolSize: 16})
	t.Cleanup(func() { client.Close() })
	ops := &opsCounter{}
	client.AddHook(ops)
	s := NewRedisStore(client, RedisOptions{KeyPrefix: testPrefix(t), Timeout: 5 * time.Second})
	t.Cleanup(func() { s.Close() })
	lim := Limit{Window: time.Minute, Max: 1 << 30}
	const callers, each = 32, 50
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for j := range each {
				c := []Check{{Zone: "z", Key: testKey(t) + strconv.Itoa(i*each+j), Limit: lim, Cost: 5}}
				ds := make([]Decision, 1)
				if err := s.Allow(context.Background(), c, ds); err != nil || !ds[0].Allowed {
					t.Errorf("allow: %v %+v", err, ds[0])
					return
				}
				c[0].Cost = 2
				if err := s.Settle(context.Background(), c, ds); err != nil {
					t.Errorf("settle: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	mixed, sent := 0, 0
	for _, c := range ops.calls {
		sent += c[opAllow] + c[opSettle]
		if c[opAllow] > 0 && c[opSettle] > 0 {
			mixed++
		}
	}
	if sent != 2*callers*each {
		t.Fatalf("%d allows and settles sent, want %d", sent, 2*callers*each)
	}
	if mixed == 0 || len(ops.calls) >= sent {
		t.Errorf("%d script calls for %d allows and settles, %d of them with both: want settles batched with decisions", len(ops.calls), sent, mixed)
	}
	t.Logf("%d script calls for %d allows and settles, %d with both", len(ops.calls), sent, mixed)
}

// TestBatchAnsweredRequestHoldsNoCallerMemory: a request, once answered,
// keeps nothing of its caller alive, though the deadline watcher holds it
// until its deadline (here a minute): not its context, which in Caddy holds
// the whole HTTP request, nor its checks and decisions. Under load, what
// answered requests held for a timeout was most of the heap, which every
// garbage collection marked.
func TestBatchAnsweredRequestHoldsNoCallerMemory(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: testRedis.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	s := newRedisStore(t, client, testPrefix(t))
	type heldKey struct{}
	collected := make(chan struct{})
	func() {
		held := new([1 << 16]byte)
		runtime.AddCleanup(held, func(ch chan struct{}) { close(ch) }, collected)
		ctx := context.WithValue(context.Background(), heldKey{}, held)
		checks := []Check{{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: 10}}}
		ds := make([]Decision, 1)
		if err := s.Allow(ctx, checks, ds); err != nil || !ds[0].Allowed {
			t.Fatalf("Allow: %+v, %v", ds[0], err)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		runtime.GC()
		select {
		case <-collected:
			return
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the context of an answered request is still alive 5s later: the store holds it until its deadline")
		}
	}
}
