package redistest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Direction is the way of the traffic a fault acts on.
type Direction string

const (
	// Upstream is client to Redis: commands.
	Upstream Direction = "upstream"
	// Downstream is Redis to client: replies.
	Downstream Direction = "downstream"
)

// FaultProxy is a TCP proxy (Toxiproxy, run in this process) between the code
// under test and a Redis, listening on a free loopback port. Faults added to
// it act on every connection through it, those open now and those to come,
// until removed. Its methods are safe for concurrent use.
type FaultProxy struct {
	proxy *toxiproxy.Proxy
	addr  string
	seq   atomic.Int64
}

// Fault names one fault added to a FaultProxy, for RemoveFault.
type Fault string

// StartFaultProxy starts a proxy in front of upstream (host:port) and stops it
// when tb's test ends.
func StartFaultProxy(tb testing.TB, upstream string) *FaultProxy {
	tb.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "redis", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		tb.Fatalf("starting the fault proxy: %v", err)
	}
	fp := &FaultProxy{proxy: p, addr: p.Listen}
	tb.Cleanup(p.Stop)
	return fp
}

// Addr is host:port of the proxy.
func (p *FaultProxy) Addr() string { return p.addr }

// URL is the redis:// URL of database 0 through the proxy.
func (p *FaultProxy) URL() string { return "redis://" + p.addr + "/0" }

// Latency delays every chunk of data by d (plus up to jitter either way).
func (p *FaultProxy) Latency(tb testing.TB, dir Direction, d, jitter time.Duration) Fault {
	return p.add(tb, "latency", dir, map[string]any{"latency": d.Milliseconds(), "jitter": jitter.Milliseconds()})
}

// LimitData closes each connection once n bytes have passed in dir, cutting
// a command or a reply in the middle.
func (p *FaultProxy) LimitData(tb testing.TB, dir Direction, n int64) Fault {
	return p.add(tb, "limit_data", dir, map[string]any{"bytes": n})
}

// Slicer splits data into pieces of about size bytes (give or take
// variation), each sent delay apart, so that replies arrive fragmented.
func (p *FaultProxy) Slicer(tb testing.TB, dir Direction, size, variation int, delay time.Duration) Fault {
	return p.add(tb, "slicer", dir, map[string]any{
		"average_size": size, "size_variation": variation, "delay": delay.Microseconds(),
	})
}

// ResetPeer resets each connection (TCP RST) after it has been open for
// after; zero resets at once, as soon as data flows.
func (p *FaultProxy) ResetPeer(tb testing.TB, dir Direction, after time.Duration) Fault {
	return p.add(tb, "reset_peer", dir, map[string]any{"timeout": after.Milliseconds()})
}

// Bandwidth limits the traffic of each connection to kbPerSecond KB/s.
func (p *FaultProxy) Bandwidth(tb testing.TB, dir Direction, kbPerSecond int64) Fault {
	return p.add(tb, "bandwidth", dir, map[string]any{"rate": kbPerSecond})
}

// Timeout drops all data, like a peer that stopped answering, and closes each
// connection after after (zero: never) or when the fault is removed.
func (p *FaultProxy) Timeout(tb testing.TB, dir Direction, after time.Duration) Fault {
	return p.add(tb, "timeout", dir, map[string]any{"timeout": after.Milliseconds()})
}

// RemoveFault removes one fault; data flows again as if it had never been.
func (p *FaultProxy) RemoveFault(tb testing.TB, f Fault) {
	tb.Helper()
	if err := p.proxy.Toxics.RemoveToxic(context.Background(), string(f)); err != nil {
		tb.Fatalf("removing fault %s: %v", f, err)
	}
}

// Clear removes every fault.
func (p *FaultProxy) Clear() { p.proxy.Toxics.ResetToxics(context.Background()) }

// Faults returns the names of the faults in place.
func (p *FaultProxy) Faults() []Fault {
	var names []Fault
	for _, t := range p.proxy.Toxics.GetToxicArray() {
		var w struct {
			Name string `json:"name"`
		}
		b, _ := json.Marshal(t)
		_ = json.Unmarshal(b, &w)
		names = append(names, Fault(w.Name))
	}
	return names
}

// Disable closes every connection through the proxy and stops listening:
// dials are refused until Enable.
func (p *FaultProxy) Disable() { p.proxy.Stop() }

// Enable listens again, on the same address.
func (p *FaultProxy) Enable(tb testing.TB) {
	tb.Helper()
	p.proxy.Listen = p.addr
	if err := p.proxy.Start(); err != nil {
		tb.Fatalf("restarting the fault proxy on %s: %v", p.addr, err)
	}
}

// add adds a toxic of kind on dir with attrs, under a name of its own.
func (p *FaultProxy) add(tb testing.TB, kind string, dir Direction, attrs map[string]any) Fault {
	tb.Helper()
	name := fmt.Sprintf("%s_%s_%d", kind, dir, p.seq.Add(1))
	body, err := json.Marshal(map[string]any{
		"name": name, "type": kind, "stream": string(dir), "toxicity": 1.0, "attributes": attrs,
	})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := p.proxy.Toxics.AddToxicJson(bytes.NewReader(body)); err != nil {
		tb.Fatalf("adding fault %s: %v", name, err)
	}
	return Fault(name)
}
