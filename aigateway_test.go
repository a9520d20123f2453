package slidingratelimit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// modelServer is an LLM API as docs/ai-gateway.md assumes one: it reports
// the tokens a call used (the request's X-Test-Usage) in X-Usage, a header,
// or, when X-Test-Stream asks for a streamed answer, a trailer sent after
// three chunks X-Test-Stream apart. It records the most calls of one API
// key it ran at once.
type modelServer struct {
	mu      sync.Mutex
	running map[string]int
	most    map[string]int
}

func newModelServer(t *testing.T) (*modelServer, string) {
	m := &modelServer{running: make(map[string]int), most: make(map[string]int)}
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	return m, strings.TrimPrefix(srv.URL, "http://")
}

func (m *modelServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Authorization")
	m.mu.Lock()
	m.running[key]++
	m.most[key] = max(m.most[key], m.running[key])
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.running[key]--
		m.mu.Unlock()
	}()
	usage := r.Header.Get("X-Test-Usage")
	pause, err := time.ParseDuration(r.Header.Get("X-Test-Stream"))
	if err != nil {
		w.Header().Set("X-Usage", usage)
		w.Write([]byte(`{"choices": [{"message": {"content": "ok"}}]}`))
		return
	}
	w.Header().Set("Trailer", "X-Usage")
	w.Header().Set("Content-Type", "text/event-stream")
	for range 3 {
		time.Sleep(pause)
		w.Write([]byte("data: {\"delta\": \"ok\"}\n\n"))
		w.(http.Flusher).Flush()
	}
	w.Header().Set("X-Usage", usage)
}

func (m *modelServer) mostAtOnce(key string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.most[key]
}

// TestAIGatewayRecipe runs the recipe of docs/ai-gateway.md as written (its
// budgets too) on two Caddy instances, real Caddy under test and a second
// Caddy process, in front of a model server, on one Redis, with clients at
// real second and third addresses.
func TestAIGatewayRecipe(t *testing.T) {
	model, upstream := newModelServer(t)
	prefix := uniquePrefix(t)
	recipe := docCaddyfile(t, "docs/ai-gateway.md", "zone inflight")
	config := func(host string) string {
		return strings.NewReplacer(
			"llm.example.com", host,
			"{env.REDIS_URL}", sharedRedis.URL()+"\n\t\t\tkey_prefix "+prefix,
			"127.0.0.1:8000", upstream,
		).Replace(recipe)
	}
	startCaddy(t, config(":9080"))
	startCaddyProcess(t, config(":9180")+"\n:9181 {\n\trespond \"ok\"\n}\n", "http://127.0.0.1:9181/")
	instances := []string{site + "v1/chat", "http://127.0.0.1:9180/v1/chat"}
	const budget, usage = 100000, 30000
	call := func(i int, ip, key string, opts ...sendOption) answer {
		return send(t, instances[i%2], append(opts, from(ip), withMethod(http.MethodPost),
			withHeader("Authorization", "Bearer "+key))...)
	}

	t.Run("tokens", func(t *testing.T) {
		// One key from two addresses, through both instances, by headers and
		// streamed trailers: admitted while its window has room for the 1
		// token a call reserves, 3 x 30,000 = 90,000 after three, so the
		// fourth is admitted and pays in full: 120,000, the budget and the
		// last call's overrun of 29,999. Then both instances refuse it, for
		// as long as the tokens take to age out; another key is untouched.
		for i, on := range []int{0, 1, 1, 0} {
			ip := []string{"127.0.0.2", "127.0.0.3"}[i%2]
			opts := []sendOption{withHeader("X-Test-Usage", strconv.Itoa(usage))}
			if i >= 2 {
				opts = append(opts, withHeader("X-Test-Stream", "10ms"))
			}
			a := call(on, ip, "sk-alice", opts...)
			if a.status != http.StatusOK {
				t.Fatalf("call %d: status %d, want 200", i+1, a.status)
			}
			if got := unitsUsed(t, "tokens", "Bearer sk-alice", int64(usage*(i+1))); got != int64(usage*(i+1)) {
				t.Fatalf("after call %d: %d tokens used, want %d", i+1, got, usage*(i+1))
			}
		}
		if used := adminState(t, "tokens", "Bearer sk-alice").Count; used > budget+usage-1 {
			t.Errorf("%d tokens admitted in the window, more than the budget %d and the last call's overrun %d", used, budget, usage-1)
		}
		for i := range 2 {
			a := call(i, "127.0.0.3", "sk-alice", withHeader("X-Test-Usage", "1"))
			retry, _ := strconv.Atoi(a.header.Get("Retry-After"))
			if a.status != http.StatusTooManyRequests || !strings.Contains(a.header.Get("RateLimit"), `"tokens"`) || retry < 50 || retry > 60 {
				t.Errorf("instance %d, a call past the budget: status %d, RateLimit %q, Retry-After %q; want 429 by tokens, for about a minute",
					i+1, a.status, a.header.Get("RateLimit"), a.header.Get("Retry-After"))
			}
		}
		a := call(1, "127.0.0.2", "sk-bob", withHeader("X-Test-Usage", "5"))
		if a.status != http.StatusOK {
			t.Errorf("another key: status %d, want 200", a.status)
		}
		want := `"tokens";q=100000;w=60, "calls";q=60;w=60, "inflight";q=2;qu="concurrent-requests"`
		if got := a.header.Get("RateLimit-Policy"); got != want {
			t.Errorf("RateLimit-Policy %q, want %q", got, want)
		}
	})

	t.Run("calls", func(t *testing.T) {
		for i := range 60 {
			if s := call(i, "127.0.0.2", "sk-carol", withHeader("X-Test-Usage", "1")).status; s != http.StatusOK {
				t.Fatalf("call %d of 60: status %d, want 200", i+1, s)
			}
		}
		for i := range 2 {
			a := call(i, "127.0.0.3", "sk-carol", withHeader("X-Test-Usage", "1"))
			if a.status != http.StatusTooManyRequests || !strings.Contains(a.header.Get("RateLimit"), `"calls"`) {
				t.Errorf("instance %d, call 61: status %d, RateLimit %q; want 429 by calls", i+1, a.status, a.header.Get("RateLimit"))
			}
		}
	})

	t.Run("in flight and under load", func(t *testing.T) {
		// Six senders, three per instance, keep streaming calls of one key
		// going until the tokens zone refuses them. At most two run at once
		// anywhere, the rest told to come back in a second; a call is
		// admitted while the window holds less than the budget with the
		// calls in flight at their reservation, so the tokens end at 4 or 5
		// calls' worth (with five, the fifth was admitted while the fourth
		// streamed): within the budget and the overrun of the two calls
		// in flight. Every admitted call is paid for, none more.
		var mu sync.Mutex
		admitted, refusedInFlight := 0, 0
		var problems []string
		var wg sync.WaitGroup
		for s := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ip := []string{"127.0.0.2", "127.0.0.3"}[s%2]
				for try := 0; try < 200; try++ {
					a := call(s, ip, "sk-dave", withHeader("X-Test-Usage", strconv.Itoa(usage)), withHeader("X-Test-Stream", "30ms"))
					mu.Lock()
					switch {
					case a.status == http.StatusOK:
						admitted++
					case a.status == http.StatusTooManyRequests && strings.Contains(a.header.Get("RateLimit"), `"inflight"`):
						refusedInFlight++
						if a.header.Get("Retry-After") != "1" {
							problems = append(problems, fmt.Sprintf("refused in flight with Retry-After %q, want 1", a.header.Get("Retry-After")))
						}
					case a.status == http.StatusTooManyRequests && strings.Contains(a.header.Get("RateLimit"), `"tokens"`):
						mu.Unlock()
						return
					default:
						problems = append(problems, fmt.Sprintf("status %d, RateLimit %q", a.status, a.header.Get("RateLimit")))
					}
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		for _, p := range problems {
			t.Error(p)
		}
		if most := model.mostAtOnce("Bearer sk-dave"); most != 2 {
			t.Errorf("the model server ran %d calls of the key at once, want 2", most)
		}
		if refusedInFlight == 0 {
			t.Errorf("no call refused by inflight: six senders never overlapped")
		}
		used := unitsUsed(t, "tokens", "Bearer sk-dave", int64(admitted*usage))
		if used != int64(admitted*usage) {
			t.Errorf("%d tokens in the window, want %d for the %d calls admitted: every call pays in full", used, admitted*usage, admitted)
		}
		if admitted < 4 || admitted > 5 || used > budget+2*(usage-1) {
			t.Errorf("%d calls admitted, %d tokens: want 4 or 5, within the budget %d and two calls' overrun", admitted, used, budget)
		}
		t.Logf("%d calls admitted, %d refused while two ran, %d tokens", admitted, refusedInFlight, used)
	})
}
