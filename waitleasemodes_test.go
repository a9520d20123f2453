package slidingratelimit

import (
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestCommandShowsWaitsAndLeases: `caddy sliding-ratelimit status` prints
// the wait of a request now in a zone with a wait, and the leases a client
// holds in a concurrency zone, on every instance and on this one.
func TestCommandShowsWaitsAndLeases(t *testing.T) {
	upstream := newGate()
	srv := newUpstream(t, upstream)
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone paced 1m 1 {
			wait 1m
			match {
				path /paced
			}
		}
		zone jobs {
			concurrent 3
			match {
				path /jobs
			}
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	reverse_proxy /jobs `+srv+`
	respond /paced "ok"
}`)
	me := withHeader("X-Client", "cli")
	if s := send(t, site+"paced", me).status; s != http.StatusOK {
		t.Fatalf("the paced request: status %d", s)
	}
	out, err := runCommand(t, "status", "--zone", "paced", "--key", "cli", "--address", "localhost:2999")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || strings.TrimSpace(lines[3]) != "WAIT NOW" || !strings.HasSuffix(lines[4], "s") {
		t.Errorf("status of a zone with a wait printed:\n%s", out)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		send(t, site+"jobs", me, from("127.0.0.2"))
	}()
	upstream.waitInside(t, "127.0.0.2", 1)
	out, err = runCommand(t, "status", "--zone", "jobs", "--key", "cli", "--address", "localhost:2999")
	if err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || strings.Join(strings.Fields(lines[3]), " ") != "LEASES HELD ON THIS INSTANCE" ||
		strings.Join(strings.Fields(lines[4]), " ") != "1 1" || !strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), "jobs jobs:concurrent:3 =cli 1 2 ") {
		t.Errorf("status of a concurrency zone with one request running printed:\n%s", out)
	}
	upstream.release <- struct{}{}
	<-done
}

// newUpstream serves h on a loopback port for the test and returns its
// host:port.
func newUpstream(t *testing.T, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &http.Server{Handler: h}
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	return l.Addr().String()
}

// TestLeasesWithFailModeLocal: while Redis is away, fail_mode local takes,
// extends and releases leases in the in-process store, with the same
// limit.
func TestLeasesWithFailModeLocal(t *testing.T) {
	port, err := freeLoopbackPort()
	if err != nil {
		t.Fatal(err)
	}
	in := newInstance(t, `{"zones": [{"name": "local_jobs", "concurrent": 1, "lease": "300ms"}],
		"redis": "redis://127.0.0.1:`+strconv.Itoa(port)+`", "fail_mode": "local", "key_prefix": "`+uniquePrefix(t)+`"}`)
	upstream := newGate()
	done := make(chan int)
	go func() { done <- send(t, "/", from("127.0.0.2"), to(in), withNext(upstream.next())).status }()
	upstream.waitInside(t, "127.0.0.2", 1)
	// Three lease times: the lease lives only if the keeper extends it in
	// the store that took it.
	time.Sleep(900 * time.Millisecond)
	if s := send(t, "/", from("127.0.0.2"), to(in), withNext(okHandler)).status; s != http.StatusTooManyRequests {
		t.Errorf("a second request while the first runs: status %d, want 429", s)
	}
	upstream.release <- struct{}{}
	if s := <-done; s != http.StatusOK {
		t.Errorf("the first request: status %d", s)
	}
	if s := send(t, "/", from("127.0.0.2"), to(in), withNext(okHandler)).status; s != http.StatusOK {
		t.Errorf("a request after the first ended: status %d, want 200 (its lease released)", s)
	}
}

// freeLoopbackPort returns a port nothing listens on a moment ago.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// TestReportModeHoldsNothing: in mode report a request that would wait
// goes on at once; its admission is still recorded at its slot's time.
func TestReportModeHoldsNothing(t *testing.T) {
	prefix := uniquePrefix(t)
	in := newInstance(t, `{"window": "10s", "max_requests": 2, "wait": "10s", "mode": "report",
		"redis": "`+sharedRedis.URL()+`", "key_prefix": "`+prefix+`"}`)
	arrived := new(arrivals)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s := send(t, "/", from("127.0.0.2"), to(in), withNext(arrived.next())).status; s != http.StatusOK {
				t.Errorf("status %d, want 200", s)
			}
		}()
	}
	wg.Wait()
	times := admissionsOf(t, prefix+"{127.0.0.2}:default:10s:2", 4, 4)
	// Two admissions wait 10s for the window; every request went on at once.
	if last := arrived.of("127.0.0.2"); len(last) != 4 || slices.Max(last) >= times[2] {
		t.Errorf("arrivals %v, admissions %v: want all four gone on before the promised slots", last, times)
	}
}
