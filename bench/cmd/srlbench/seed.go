package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The seed peer is the Express + ioredis limiter of the article this project
// started from (a sorted set in a MULTI, denials recorded too). It lives in
// shared/peers/seed-express, a folder next to the repository's, so it is not
// part of the module; the bench copies it, installs it with npm and runs it
// on its own redis-server, then loads it with wrk like the limited site.

// seedRelPath is where the seed is, relative to the repository root.
var seedRelPath = filepath.Join("..", "shared", "peers", "seed-express")

// seedPath is the request path the seed limits (60 a minute per X-Client).
const seedPath = "/api/data"

// seedMax is the seed's limit (its MAX environment variable).
const seedMax = 60

// seedPeer is a running seed server and its Redis.
type seedPeer struct {
	stopOnce    sync.Once
	node, redis *proc
	url         string // base URL with the path
	rc          *redis.Client
}

// seedResult is one wrk run against the seed.
type seedResult struct {
	wrk   wrkResult
	redis redisDelta
}

// startSeed copies the seed to dir, installs its dependencies and starts it
// with its own Redis. A non-nil skip (with a nil error) says why the seed
// cannot run on this machine; the report says so instead of comparing.
func startSeed(ctx context.Context, cfg config, dir string) (peer *seedPeer, skip, err error) {
	src := cfg.seed
	if src == "" {
		src = filepath.Join(cfg.repo, seedRelPath)
	}
	if _, err := os.Stat(filepath.Join(src, "server.mjs")); err != nil {
		return nil, fmt.Errorf("no seed peer at %s (the folder shared/peers/seed-express next to the repository's; -seed sets another)", seedDisplayPath(cfg)), nil
	}
	if err := ensureNode(); err != nil {
		return nil, err, nil
	}
	app := filepath.Join(dir, "seed-express")
	if err := copyTree(src, app, notNodeModules); err != nil {
		return nil, nil, fmt.Errorf("copying the seed: %w", err)
	}
	say("seed: npm install in a copy of %s", seedDisplayPath(cfg))
	installCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	npm := exec.CommandContext(installCtx, "npm", "install", "--no-audit", "--no-fund", "--loglevel=error")
	npm.Dir = app
	// Its own process group, like the servers: a signal npm or its children
	// send to their group must not reach this tool.
	npm.SysProcAttr = sysProcAttr()
	if out, err := npm.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, fmt.Errorf("npm install failed (%v): %s", err, truncate(strings.TrimSpace(string(out)), 300)), nil
	}

	rds, redisURL, err := startRedis(ctx, filepath.Join(dir, "seed-redis"))
	if err != nil {
		return nil, nil, fmt.Errorf("the seed's redis-server: %w", err)
	}
	redisPort := redisURL[strings.LastIndexByte(redisURL, ':')+1:]
	port, err := freePort()
	if err != nil {
		rds.stop()
		return nil, nil, err
	}
	env := []string{"REDIS_PORT=" + redisPort, "PORT=" + strconv.Itoa(port), "MAX=" + strconv.Itoa(seedMax), "NODE_ENV=production"}
	node, err := start("seed", filepath.Join(dir, "seed.log"), env, "node", filepath.Join(app, "server.mjs"))
	if err != nil {
		rds.stop()
		return nil, nil, err
	}
	url := fmt.Sprintf("http://127.0.0.1:%d%s", port, seedPath)
	if err := node.waitReady(ctx, func() error { return getOK(ctx, url, "srlbench-ready") }); err != nil {
		node.stop()
		rds.stop()
		return nil, nil, fmt.Errorf("the seed did not start: %w", err)
	}
	say("seed: %s (node pid %d), its own redis-server %s", url, node.cmd.Process.Pid, redisURL)
	return &seedPeer{node: node, redis: rds, url: url, rc: redisClient(redisURL)}, nil, nil
}

// stop may be called more than once: after the many clients scenario, and
// on the way out if that never came.
// ensureNode makes sure node and npm are on PATH, installing Debian's
// nodejs and npm when we are root on a machine with apt-get, as ensureTools
// does for wrk and Redis.
func ensureNode() error {
	missing := func() string {
		for _, tool := range []string{"node", "npm"} {
			if _, err := exec.LookPath(tool); err != nil {
				return tool
			}
		}
		return ""
	}
	m := missing()
	if m == "" {
		return nil
	}
	if _, err := exec.LookPath("apt-get"); err == nil && os.Geteuid() == 0 {
		say("seed: installing with apt-get: nodejs npm")
		if aptGet("install", "-y", "nodejs", "npm") != nil {
			aptGet("update")
			aptGet("install", "-y", "nodejs", "npm")
		}
		m = missing()
	}
	if m != "" {
		return fmt.Errorf("%s is not on PATH (the seed needs Node.js 18 or newer and npm: apt-get install nodejs npm, brew install node)", m)
	}
	return nil
}

func (s *seedPeer) stop() {
	s.stopOnce.Do(func() {
		s.rc.Close()
		s.node.stop()
		s.redis.stop()
	})
}

// meter attributes CPU to the seed's Node.js server (in the Caddy column)
// and its own Redis.
func (s *seedPeer) meter() *cpuMeter {
	return &cpuMeter{caddyPid: s.node.cmd.Process.Pid, redisPid: s.redis.cmd.Process.Pid}
}

// run is one measured wrk run with the many clients script.
func (s *seedPeer) run(ctx context.Context, cfg config, script string) (seedResult, error) {
	meter := s.meter()
	meter.settle(ctx, cfg.settle)
	before, err := readRedis(ctx, s.rc)
	if err != nil {
		return seedResult{}, err
	}
	w, err := runWrk(ctx, cfg, meter, cfg.duration, script, s.url)
	if err != nil {
		return seedResult{}, err
	}
	after, err := readRedis(ctx, s.rc)
	if err != nil {
		return seedResult{}, err
	}
	return seedResult{wrk: w, redis: after.sub(before)}, nil
}

// seedDisplayPath is the seed's location for messages and the report: the
// -seed flag as given, or its place relative to the repository.
func seedDisplayPath(cfg config) string {
	if cfg.seed != "" {
		return cfg.seed
	}
	return "../shared/peers/seed-express (relative to the repository root)"
}

// copyTree copies a directory of regular files and folders but those leave
// picks (by their path relative to from): a folder it picks is left out
// whole.
func copyTree(from, to string, leave func(rel string, d os.DirEntry) bool) error {
	return filepath.WalkDir(from, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, path)
		if err != nil {
			return err
		}
		if rel != "." && leave(rel, d) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(to, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case !d.Type().IsRegular():
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
}

// notNodeModules leaves out a node_modules someone installed in the seed's
// folder: npm install fills the copy's own.
func notNodeModules(_ string, d os.DirEntry) bool { return d.IsDir() && d.Name() == "node_modules" }
