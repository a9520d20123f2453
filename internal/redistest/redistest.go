// Package redistest starts real redis-server processes on free loopback ports
// for tests. It never touches a Redis it did not start.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process started by this package.
type Server struct {
	Port int
	dir  string
	cmd  *exec.Cmd

	// bin, pre and extra let cluster nodes and sentinels reuse Server (and so
	// Stop/Restart/Freeze/Thaw): bin replaces redis-server, pre goes before the
	// standard flags (a config file must come first), extra after them.
	bin        string
	pre, extra []string
}

// Binary returns the path of redis-server, or an error that says how to get it.
func Binary() (string, error) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errors.New("redis-server not found in PATH: install it (Debian/Ubuntu: apt-get install redis-server) or run 'make test', which does")
	}
	return path, nil
}

// Start starts a redis-server on a free port and stops it when tb's test ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	s, err := New()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// StartWith starts a redis-server as Start does, with flags of its own
// after the standard ones (e.g. "--rename-command", "FUNCTION", "": a Redis
// without Functions, as before 7).
func StartWith(tb testing.TB, flags ...string) *Server {
	tb.Helper()
	s, err := startServer(flags)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// New starts a redis-server on a free port; Close stops it. For TestMain,
// where there is no testing.TB.
func New() (*Server, error) { return startServer(nil) }

func startServer(extra []string) (*Server, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest")
	if err != nil {
		return nil, err
	}
	s := &Server{Port: port, dir: dir, extra: extra}
	if err := s.start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) start() error {
	bin := s.bin
	if bin == "" {
		var err error
		if bin, err = Binary(); err != nil {
			return err
		}
	}
	args := append([]string{}, s.pre...)
	args = append(args,
		"--port", strconv.Itoa(s.Port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--loglevel", "warning",
	)
	cmd := exec.Command(bin, append(args, s.extra...)...)
	dieWithParent(cmd)
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", bin, err)
	}
	s.cmd = cmd
	if err := s.waitReady(5 * time.Second); err != nil {
		s.kill()
		return err
	}
	return nil
}

func (s *Server) waitReady(limit time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on port %d not ready after %s: %w", s.Port, limit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Addr is host:port of the server.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL is the redis:// URL of the server's database 0.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Client returns a client of the server, closed when tb's test ends.
func (s *Server) Client(tb testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	tb.Cleanup(func() { c.Close() })
	return c
}

// UserURL adds the ACL user name to the server, with password "pw" and
// rules (e.g. "~*", "+@all", "-function"; "on" is given), and returns the
// redis:// URL of database 0 that logs in as it.
func (s *Server) UserURL(tb testing.TB, name string, rules ...string) string {
	tb.Helper()
	c := s.Client(tb)
	args := []any{"acl", "setuser", name, "reset", "on", ">pw"}
	for _, r := range rules {
		args = append(args, r)
	}
	if err := c.Do(context.Background(), args...).Err(); err != nil {
		tb.Fatalf("adding redis user %s: %v", name, err)
	}
	return "redis://" + name + ":pw@" + s.Addr() + "/0"
}

// Stop kills the server; its data is gone. Restart brings it back empty.
func (s *Server) Stop() { s.kill() }

// Restart starts the server again, empty, on the same port.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.kill()
	if err := s.start(); err != nil {
		tb.Fatal(err)
	}
}

// Freeze stops the process (SIGSTOP): connections stay open, nothing answers.
func (s *Server) Freeze() error { return s.cmd.Process.Signal(syscall.SIGSTOP) }

// Thaw resumes a frozen server.
func (s *Server) Thaw() error { return s.cmd.Process.Signal(syscall.SIGCONT) }

func (s *Server) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Close stops the server and removes its files.
func (s *Server) Close() {
	s.kill()
	os.RemoveAll(s.dir)
}
