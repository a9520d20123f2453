// Command storecpu measures what a rate-limit decision costs Redis, the store
// alone, against go-redis/redis_rate on the same redis-server in the same run:
//
//   - srl: limiter/limit.lua with exactly 32 decisions per script call, two
//     calls in flight (how RedisStore batches under load);
//   - floor: a GET and a SET per key, 32 keys per script call, alike: the
//     least a decision that reads and writes a client's value can cost;
//   - redis_rate: its Allow/AllowN (GCRA, one EVALSHA per decision), from 64
//     goroutines whose calls go out in go-redis pipelines of 32.
//
// Scenarios: count limits of 60 and 1,000 a minute, every client at its limit
// (its ring full, the oldest admissions just aged out, so each decision
// admits and drops what aged out), and units: costs of 1 to 1,000 against a
// budget of 100,000 a minute. It reports medians over -runs of Redis CPU per
// decision (INFO cpu) and of script time per decision (INFO commandstats).
//
//	go run ./cmd/storecpu -runs 5
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// scenario is one limit the modes are measured at.
type scenario struct {
	name    string
	max     int64
	clients int
	// cost returns the cost of decision i; nil for a count limit.
	cost func(i int) int64
}

var scenarios = []scenario{
	{name: "max60", max: 60, clients: 10_000},
	{name: "max1000", max: 1000, clients: 10_000},
	{name: "units", max: 100_000, clients: 2_000, cost: func(i int) int64 { return 1 + int64(i*7919%1000) }},
}

const (
	window  = time.Minute
	rounds  = 3
	perCall = 32
)

func main() {
	runs := flag.Int("runs", 5, "runs of every mode; medians are reported")
	script := flag.String("script", "../limiter/limit.lua", "the rate-limit script")
	flag.Parse()
	src, err := os.ReadFile(*script)
	if err != nil {
		fail(err)
	}
	srl := asScript(src)
	ctx := context.Background()
	addr, stop, err := startRedis()
	if err != nil {
		fail(err)
	}
	defer stop()
	client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128})
	defer client.Close()

	results := map[string][]cost{}
	for r := range *runs {
		for _, sc := range scenarios {
			for _, mode := range []string{"srl", "floor", "redis_rate"} {
				if mode == "floor" && sc.cost != nil {
					continue
				}
				c, err := measure(ctx, client, srl, sc, mode)
				if err != nil {
					fail(fmt.Errorf("run %d, %s, %s: %w", r+1, sc.name, mode, err))
				}
				results[sc.name+" "+mode] = append(results[sc.name+" "+mode], c)
			}
		}
	}
	fmt.Printf("Redis CPU per decision, medians of %d runs (script time per decision in brackets)\n", *runs)
	for _, sc := range scenarios {
		med := func(mode string) cost { return median(results[sc.name+" "+mode]) }
		s, rr := med("srl"), med("redis_rate")
		line := fmt.Sprintf("%-8s srl %5.2f µs (%5.2f)   redis_rate %5.2f µs (%5.2f)   srl/redis_rate %.2f (script time %.2f)",
			sc.name, s.cpu, s.script, rr.cpu, rr.script, s.cpu/rr.cpu, s.script/rr.script)
		if f := med("floor"); f.cpu > 0 {
			line += fmt.Sprintf("   floor %5.2f µs (%5.2f)   srl/floor %.2f (%.2f)", f.cpu, f.script, s.cpu/f.cpu, s.script/f.script)
		}
		fmt.Println(line)
	}
}

// cost is what a mode's decisions cost Redis, per decision, in µs.
type cost struct{ cpu, script float64 }

func median(cs []cost) cost {
	if len(cs) == 0 {
		return cost{}
	}
	cpu, script := make([]float64, len(cs)), make([]float64, len(cs))
	for i, c := range cs {
		cpu[i], script[i] = c.cpu, c.script
	}
	slices.Sort(cpu)
	slices.Sort(script)
	return cost{cpu[len(cpu)/2], script[len(script)/2]}
}

func clientKey(mode string, i int) string {
	return "bench:{" + mode + "-198.51." + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&0xff) + "}:z"
}

// measure runs rounds decisions per client of sc in mode on a flushed Redis.
func measure(ctx context.Context, client *redis.Client, srl *redis.Script, sc scenario, mode string) (cost, error) {
	if err := client.FlushAll(ctx).Err(); err != nil {
		return cost{}, err
	}
	if mode != "redis_rate" {
		if err := fill(ctx, client, srl, sc); err != nil {
			return cost{}, fmt.Errorf("filling the rings: %w", err)
		}
	}
	if err := srl.Load(ctx, client).Err(); err != nil {
		return cost{}, err
	}
	if err := floorScript.Load(ctx, client).Err(); err != nil {
		return cost{}, err
	}
	pipes := newPipeliner(client)
	rr := redis_rate.NewLimiter(pipes)
	lim := redis_rate.Limit{Rate: int(sc.max), Burst: int(sc.max), Period: window}
	if _, err := redis_rate.NewLimiter(client).Allow(ctx, "warmup", lim); err != nil {
		return cost{}, err
	}
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		return cost{}, err
	}
	cpu0, err := redisCPU(ctx, client)
	if err != nil {
		return cost{}, err
	}
	decisions := int64(sc.clients * rounds)
	var next, denied atomic.Int64
	var firstErr error
	var once sync.Once
	failed := func(err error) { once.Do(func() { firstErr = err }) }
	var wg sync.WaitGroup
	if mode == "redis_rate" {
		// Two pipelines of 32 in flight, as two script calls are for srl.
		for range 2 * perCall {
			wg.Go(func() {
				for {
					n := next.Add(1) - 1
					if n >= decisions {
						pipes.done()
						return
					}
					cost := int64(1)
					if sc.cost != nil {
						cost = sc.cost(int(n))
					}
					res, err := rr.AllowN(ctx, strconv.Itoa(int(n%int64(sc.clients))), lim, int(cost))
					if err != nil {
						failed(err)
					} else if res.Allowed == 0 {
						denied.Add(1)
					}
				}
			})
		}
	} else {
		for range 2 {
			wg.Go(func() {
				for {
					n := next.Add(perCall) - perCall
					if n >= decisions {
						return
					}
					var keys []string
					var args []byte
					for j := n; j < n+perCall && j < decisions; j++ {
						keys = append(keys, clientKey("srl", int(j%int64(sc.clients))))
						cost := int64(1)
						if sc.cost != nil {
							cost = sc.cost(int(j))
						}
						args = appendAllow(args, sc.max, cost)
					}
					if mode == "floor" {
						if err := floorScript.Run(ctx, client, keys).Err(); err != nil {
							failed(err)
						}
						continue
					}
					reply, err := srl.Run(ctx, client, keys, args).Text()
					if err != nil {
						failed(err)
						continue
					}
					denied.Add(int64(len(keys) - admitted(reply)))
				}
			})
		}
	}
	wg.Wait()
	if firstErr != nil {
		return cost{}, firstErr
	}
	if d := denied.Load(); d != 0 {
		return cost{}, fmt.Errorf("%d of %d decisions denied: the clients were not as meant", d, decisions)
	}
	cpu1, err := redisCPU(ctx, client)
	if err != nil {
		return cost{}, err
	}
	script, err := scriptUsec(ctx, client)
	if err != nil {
		return cost{}, err
	}
	return cost{cpu: (cpu1 - cpu0) * 1e6 / float64(decisions), script: script / float64(decisions)}, nil
}

// fill gives every client of sc a ring at its limit, through the script at
// past times: admissions spread over the window (for units, as many as the
// budget holds), the oldest of them just aged out, enough that the rounds to
// come are admitted. One client's ring is made so, and copied to the others.
func fill(ctx context.Context, client *redis.Client, srl *redis.Script, sc scenario) error {
	now, err := client.Time(ctx).Result()
	if err != nil {
		return err
	}
	n, costs := int(sc.max), []int64(nil)
	if sc.cost != nil {
		n = 0
		for sum := int64(0); ; n++ {
			c := sc.cost(n)
			if sum+c > sc.max {
				break
			}
			sum += c
			costs = append(costs, c)
		}
	}
	aged := rounds + 1
	if costs != nil {
		aged = 0
		for sum := int64(0); sum < rounds*1000; aged++ {
			sum += costs[aged]
		}
	}
	step := window.Microseconds() / int64(n)
	first := now.UnixMicro() - window.Microseconds() - int64(aged)*step
	template := clientKey("srl", 0)
	for k := range n {
		c := int64(1)
		if costs != nil {
			c = costs[k]
		}
		if err := srl.Run(ctx, client, []string{template}, appendAllow(nil, sc.max, c), first+int64(k)*step).Err(); err != nil {
			return err
		}
	}
	pipe := client.Pipeline()
	for i := 1; i < sc.clients; i++ {
		pipe.Copy(ctx, template, clientKey("srl", i), 0, true)
		if i%1000 == 0 {
			if _, err := pipe.Exec(ctx); err != nil {
				return err
			}
		}
	}
	_, err = pipe.Exec(ctx)
	return err
}

// appendAllow packs one request of one log zone for limit.lua (its header
// documents the layout): op allow, one zone, no wait; then kind log, window,
// max, cost, no token, no lease.
func appendAllow(buf []byte, max, cost int64) []byte {
	f := func(x float64) { buf = binary.BigEndian.AppendUint64(buf, math.Float64bits(x)) }
	buf = append(buf, 1, 1)
	f(0)
	buf = append(buf, 0)
	f(float64(window.Microseconds()))
	f(float64(max))
	f(float64(cost))
	f(-1)
	return binary.BigEndian.AppendUint64(buf, 0)
}

// admitted counts the admitting zones of a reply of single-zone requests:
// a delay, then flag, remaining, reset and token.
func admitted(reply string) int {
	n := 0
	for len(reply) >= 8+25 {
		if reply[8] == 1 {
			n++
		}
		reply = reply[8+25:]
	}
	return n
}

// asScript returns limit.lua's source as the script EVALSHA runs: its chunk
// returns the call, wrapped as limiter/library.go wraps it (the library,
// which saves the making of its closures at each call, is not measured).
func asScript(src []byte) *redis.Script {
	return redis.NewScript("return (function() " + string(src) + "\nend)()(KEYS, ARGV)\n")
}

// floorScript is the least a decision can cost Redis: one read and one write
// of the client's value, batched as limit.lua batches.
var floorScript = redis.NewScript(`
for _, key in ipairs(KEYS) do
  redis.call('SET', key, redis.call('GET', key), 'PX', 120000)
end
return #KEYS`)

// pipeliner is what redis_rate is given to talk to Redis: it holds each
// EvalSha until 32 are waiting (or no more will come), then sends them in one
// go-redis pipeline.
type pipeliner struct {
	*redis.Client
	mu      sync.Mutex
	waiting []*pending
	// ending is set by the first done: a call that comes after it goes at
	// once, since the callers that would fill its pipeline have stopped.
	ending bool
}

type pending struct {
	sha  string
	keys []string
	args []any
	cmd  *redis.Cmd
	done chan struct{}
}

func newPipeliner(c *redis.Client) *pipeliner { return &pipeliner{Client: c} }

func (p *pipeliner) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	w := &pending{sha: sha, keys: keys, args: args, done: make(chan struct{})}
	p.mu.Lock()
	p.waiting = append(p.waiting, w)
	var batch []*pending
	if len(p.waiting) == perCall || p.ending {
		batch, p.waiting = p.waiting, nil
	}
	p.mu.Unlock()
	if batch != nil {
		p.send(ctx, batch)
	}
	<-w.done
	return w.cmd
}

// done says a caller will send no more: what waits goes out, and from now
// on every call at once.
func (p *pipeliner) done() {
	p.mu.Lock()
	batch := p.waiting
	p.waiting, p.ending = nil, true
	p.mu.Unlock()
	if batch != nil {
		p.send(context.Background(), batch)
	}
}

func (p *pipeliner) send(ctx context.Context, batch []*pending) {
	pipe := p.Client.Pipeline()
	for _, w := range batch {
		w.cmd = pipe.EvalSha(ctx, w.sha, w.keys, w.args...)
	}
	_, _ = pipe.Exec(ctx)
	for _, w := range batch {
		close(w.done)
	}
}

func startRedis() (addr string, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "storecpu")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("starting redis-server: %w", err)
	}
	addr = "127.0.0.1:" + strconv.Itoa(port)
	stop = func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		os.RemoveAll(dir)
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	for start := time.Now(); c.Ping(context.Background()).Err() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s did not answer", addr)
		}
	}
	return addr, stop, nil
}

func redisCPU(ctx context.Context, c *redis.Client) (float64, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for line := range strings.Lines(info) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, err
			}
			total += f
		}
	}
	return total, nil
}

// scriptUsec is the time INFO commandstats counts in EVALSHA and EVAL.
func scriptUsec(ctx context.Context, c *redis.Client) (float64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for line := range strings.Lines(info) {
		name, fields, _ := strings.Cut(strings.TrimSpace(line), ":")
		if name != "cmdstat_evalsha" && name != "cmdstat_eval" {
			continue
		}
		for f := range strings.SplitSeq(fields, ",") {
			if k, v, _ := strings.Cut(f, "="); k == "usec" {
				n, _ := strconv.ParseFloat(v, 64)
				total += n
			}
		}
	}
	return total, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "storecpu:", err)
	os.Exit(1)
}
