package main

import (
	"context"
	_ "embed"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"

	"github.com/redis/go-redis/v9"
)

// The floor script scenario: the many clients load on a second Caddy built
// from a copy of the module whose limit.lua is floor.lua, which does for each
// decision only a GET and a SET of a ring-sized value and admits every
// request. Redis then does next to nothing a decision needs, while Caddy's
// side is the module's own: keys, the deny cache, the batcher, go-redis,
// headers. Set beside many clients in the same run, it shows how much of the
// limited site's cost is the script's work and how much the round trip's.
const floorSlug = "floor"

//go:embed floor.lua
var floorScript []byte

func init() {
	scenarios = append(scenarios, scenario{
		name: "floor script", slug: floorSlug, target: math.NaN(), floor: true,
		about: "the many clients load (own 10,000 keys) on a second Caddy, built from a copy of the module whose limit.lua does " +
			"only a GET and a SET of a ring-sized value per decision and admits every request (bench/cmd/srlbench/floor.lua): " +
			"what the limited site costs when Redis does the least a decision can; no throughput target",
		keyLua: `n = n + 1; local key = "floor-" .. (n % 10000)`,
	})
}

// startFloorCaddy builds Caddy from a copy of repo with floor.lua in place of
// limiter/limit.lua and starts it on the same sites as the main Caddy, its
// files under dir.
func startFloorCaddy(ctx context.Context, repo, dir, redisURL, farURL string, limiterOptions []string) (*proc, sites, error) {
	src := filepath.Join(dir, "src")
	if err := copyTree(repo, src, buildInputs); err != nil {
		return nil, sites{}, fmt.Errorf("copying the module: %w", err)
	}
	if err := os.WriteFile(filepath.Join(src, "limiter", "limit.lua"), floorScript, 0o644); err != nil {
		return nil, sites{}, err
	}
	say("floor script: building Caddy from a copy of the module with floor.lua as limit.lua")
	if err := runPassthrough(ctx, "make", "-C", src, "build"); err != nil {
		return nil, sites{}, fmt.Errorf("make build: %w", err)
	}
	return startCaddy(ctx, filepath.Join(src, "caddy"), dir, redisURL, farURL, limiterOptions)
}

// buildInputs leaves out of the module's copy what building it does not
// read: .git (a file in a worktree), bench/ (a module of its own), test data
// and the built caddy.
func buildInputs(rel string, d fs.DirEntry) bool {
	return rel == ".git" || rel == "caddy" || d.IsDir() && (rel == "bench" || d.Name() == "testdata")
}

// runFloor runs the floor script scenario on a Caddy of its own, started for
// it and stopped after; meter's Redis is the one both Caddies use.
func runFloor(ctx context.Context, cfg config, rc *redis.Client, redisPid int, sc scenario, script, warm, dir, redisURL, farURL string) (scenarioResult, error) {
	cdy, site, err := startFloorCaddy(ctx, cfg.repo, dir, redisURL, farURL, limiterOptions(cfg.limiter))
	if err != nil {
		return scenarioResult{sc: sc}, err
	}
	defer cdy.stop()
	for _, url := range []string{site.plain, site.limited} {
		if _, err := runWrk(ctx, cfg, nil, cfg.warmup, warm, url+"/"); err != nil {
			return scenarioResult{sc: sc}, fmt.Errorf("warm-up: %w", err)
		}
	}
	res, err := runScenario(ctx, cfg, rc, &cpuMeter{caddyPid: cdy.cmd.Process.Pid, redisPid: redisPid}, sc, script, site, nil)
	for i, p := range res.runs {
		// A floor.lua that no longer speaks limit.lua's format fails every
		// call, and the fail mode would pass the requests on unmeasured.
		if d := p.decisions; err == nil && d["allowed"] == 0 {
			err = fmt.Errorf("run %d: %.0f requests allowed by Redis, %.0f failed open: does floor.lua still speak limit.lua's format?", i+1, d["allowed"], d["failed_open"])
		}
	}
	return res, err
}

// floorSection sets the floor script scenario beside many clients: what
// making limit.lua cheaper could win at most.
func (r report) floorSection(p func(string, ...any), all []stats) {
	many, floor := r.besideMany(all, func(sc scenario) bool { return sc.floor })
	if many == nil || floor == nil {
		return
	}
	p("## Floor script")
	p("")
	p("The many clients load on a Caddy whose limit.lua does only a GET and a SET per decision (floor.lua), beside")
	p("the same load on this module as it is. What the script's own work costs is the difference between the")
	p("columns; what is left in the floor column is the round trip's: Caddy's side of it, Redis's reading and")
	p("replying, and the CPUs they share with wrk.")
	p("")
	p("| | many clients | floor script |")
	p("|---|--:|--:|")
	p("| ratio to plain | %.2f | %.2f |", many.ratio, floor.ratio)
	p("| Redis CPU us/decision | %s | %s |", num(many.redisPerDecision, 1), num(floor.redisPerDecision, 1))
	p("| Caddy CPU per request, limited / plain | %sx | %sx |", num(many.caddyRatio, 2), num(floor.caddyRatio, 2))
	p("| script calls per request | %s | %s |", num(many.callsPerReq, 3), num(floor.callsPerReq, 3))
	p("| p50 added | %+.2f ms | %+.2f ms |", float64(many.addedP50())/1e6, float64(floor.addedP50())/1e6)
	p("")
	p("A cheaper script also makes the batches smaller (the batcher sends the next call sooner when Redis")
	p("answers sooner), so Caddy makes more calls per request.")
	p("")
}
