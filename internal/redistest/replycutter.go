package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// ReplyCutter is a TCP proxy between the code under test and a Redis that
// reads the Redis protocol both ways and, for the script replies it is told
// to cut, closes the client's connection instead of delivering the reply: the
// script ran in Redis, and its reply never came, as when a network drops a
// connection at that moment. Toxiproxy cuts by bytes or time, not by reply;
// this one cuts exactly the replies a test counts. Its methods are safe for
// concurrent use.
type ReplyCutter struct {
	ln       net.Listener
	upstream string
	// every is n to cut every n-th script reply, 0 to cut none.
	every   atomic.Int64
	scripts atomic.Int64
	cut     atomic.Int64

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// scriptCommands are the commands whose replies a ReplyCutter counts.
var scriptCommands = map[string]bool{"EVAL": true, "EVALSHA": true, "EVAL_RO": true, "EVALSHA_RO": true, "FCALL": true, "FCALL_RO": true}

// StartReplyCutter starts a proxy in front of upstream (host:port) on a free
// loopback port, cutting nothing until CutEvery, and stops it when tb's test
// ends.
func StartReplyCutter(tb testing.TB, upstream string) *ReplyCutter {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("starting the reply cutter: %v", err)
	}
	p := &ReplyCutter{ln: ln, upstream: upstream, conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.Close)
	return p
}

// Addr is host:port of the proxy.
func (p *ReplyCutter) Addr() string { return p.ln.Addr().String() }

// URL is the redis:// URL of database 0 through the proxy.
func (p *ReplyCutter) URL() string { return "redis://" + p.Addr() + "/0" }

// CutEvery cuts every n-th script reply from now on, counted over every
// connection; 0 cuts none.
func (p *ReplyCutter) CutEvery(n int) { p.every.Store(int64(n)) }

// Cut is how many script replies the proxy has cut.
func (p *ReplyCutter) Cut() int64 { return p.cut.Load() }

// Scripts is how many script replies came from Redis, cut or not.
func (p *ReplyCutter) Scripts() int64 { return p.scripts.Load() }

// Close stops listening, closes every connection and waits for their
// goroutines.
func (p *ReplyCutter) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

func (p *ReplyCutter) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.upstream)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client, server) {
			return
		}
		p.wg.Add(1)
		go p.serve(client, server)
	}
}

// track adds the connections to close on Close; false if closed already.
func (p *ReplyCutter) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *ReplyCutter) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		c.Close()
		delete(p.conns, c)
	}
}

// serve passes one connection's commands up and its replies down. Redis
// answers the commands of a connection in order, so the commands read from
// the client, queued as they are sent, name the replies.
func (p *ReplyCutter) serve(client, server net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client, server)
	var (
		mu      sync.Mutex
		pending []string
	)
	go func() {
		defer p.untrack(client, server)
		r := bufio.NewReader(client)
		for {
			raw, name, err := readCommand(r)
			if err != nil {
				return
			}
			mu.Lock()
			pending = append(pending, name)
			mu.Unlock()
			if _, err := server.Write(raw); err != nil {
				return
			}
		}
	}()
	r := bufio.NewReader(server)
	for {
		raw, push, err := readReply(r)
		if err != nil {
			return
		}
		if !push {
			mu.Lock()
			var name string
			if len(pending) > 0 {
				name, pending = pending[0], pending[1:]
			}
			mu.Unlock()
			if scriptCommands[name] {
				n := p.scripts.Add(1)
				if every := p.every.Load(); every > 0 && n%every == 0 {
					p.cut.Add(1)
					return // closes both connections, the reply undelivered
				}
			}
		}
		if _, err := client.Write(raw); err != nil {
			return
		}
	}
}

// readCommand reads one command, a RESP array of bulk strings or an inline
// command line, and returns its bytes and its name in upper case.
func readCommand(r *bufio.Reader) (raw []byte, name string, err error) {
	var buf bytes.Buffer
	line, err := readLine(r, &buf)
	if err != nil {
		return nil, "", err
	}
	if line[0] != '*' {
		name, _, _ = strings.Cut(strings.TrimSpace(line), " ")
		return buf.Bytes(), strings.ToUpper(name), nil
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil {
		return nil, "", fmt.Errorf("command array length %q: %w", line, err)
	}
	for i := range n {
		start := buf.Len()
		if err := readValue(r, &buf); err != nil {
			return nil, "", err
		}
		if i == 0 {
			// "$<len>\r\n<name>\r\n"
			first := buf.Bytes()[start:]
			if at := bytes.IndexByte(first, '\n'); at >= 0 {
				name = strings.ToUpper(strings.TrimSuffix(string(first[at+1:]), "\r\n"))
			}
		}
	}
	return buf.Bytes(), name, nil
}

// readReply reads one reply, RESP2 or RESP3, and reports whether it is a
// push message (which answers no command). An attribute goes with the reply
// it precedes.
func readReply(r *bufio.Reader) (raw []byte, push bool, err error) {
	var buf bytes.Buffer
	for {
		b, err := r.Peek(1)
		if err != nil {
			return nil, false, err
		}
		attribute := b[0] == '|'
		push = b[0] == '>'
		if err := readValue(r, &buf); err != nil {
			return nil, false, err
		}
		if !attribute {
			return buf.Bytes(), push, nil
		}
	}
}

// readValue copies one RESP2 or RESP3 value from r to buf.
func readValue(r *bufio.Reader, buf *bytes.Buffer) error {
	line, err := readLine(r, buf)
	if err != nil {
		return err
	}
	switch line[0] {
	case '+', '-', ':', '_', ',', '#', '(':
		return nil
	case '$', '!', '=':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return fmt.Errorf("bulk length %q: %w", line, err)
		}
		if n < 0 {
			return nil
		}
		_, err = io.CopyN(buf, r, int64(n)+2)
		return err
	case '*', '~', '>', '%', '|':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return fmt.Errorf("aggregate length %q: %w", line, err)
		}
		if line[0] == '%' || line[0] == '|' {
			n *= 2
		}
		for range n {
			if err := readValue(r, buf); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown RESP type in %q", line)
}

// readLine copies one line, CRLF included, from r to buf and returns it
// without the CRLF.
func readLine(r *bufio.Reader, buf *bytes.Buffer) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	buf.WriteString(line)
	line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
	if line == "" {
		return "", errors.New("empty RESP line")
	}
	return line, nil
}
