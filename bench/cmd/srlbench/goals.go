package main

import (
	"fmt"
	"time"
)

// The goals that replaced the fixed ratios to plain Caddy: on two shared
// CPUs no Redis script reaches those, so the Redis path is held to the floor
// script (the least a decision can cost Redis, with all of this module's
// Caddy side) and to the naive peer, and the settled (units) path to the
// many clients' path, each measured in the same run.
const (
	goalManyVsFloor      = 0.97 // many clients' ratio / the floor script's
	goalRedisVsFloor     = 1.2  // Redis CPU per decision, many clients / floor script
	goalUnitsVsMany      = 0.9  // units' ratio / many clients'
	goalUnitsRedisVsMany = 1.3  // Redis CPU per units request / per many clients decision
	goalUnitsCaddyVsMany = 1.05 // Caddy CPU ratio to plain, units / many clients
	goalFarAddedVsNaive  = 0.7  // p50 added, Redis 1 ms away, module / naive
	goalFarRatioVsNaive  = 1.5  // ratio, Redis 1 ms away, module / naive
)

// goalRows adds the goals' rows to the Targets table: each measured value
// beside its reference, so that a reader sees both.
func (r report) goalRows(all []stats, row func(target, measured string, ok bool)) {
	many, floor := r.besideMany(all, func(sc scenario) bool { return sc.floor })
	if many != nil && floor != nil {
		ratio := many.ratio / floor.ratio
		row(fmt.Sprintf("many clients: ratio >= %.2fx the floor script's", goalManyVsFloor),
			fmt.Sprintf("%.2fx (%.2f against %.2f)", ratio, many.ratio, floor.ratio), ratio >= goalManyVsFloor)
		cpu := many.redisPerDecision / floor.redisPerDecision
		row(fmt.Sprintf("many clients: Redis CPU per decision <= %.1fx the floor script's", goalRedisVsFloor),
			fmt.Sprintf("%.2fx (%s us against %s us)", cpu, num(many.redisPerDecision, 1), num(floor.redisPerDecision, 1)), cpu <= goalRedisVsFloor)
	}
	_, units := r.besideMany(all, func(sc scenario) bool { return sc.slug == unitsSlug })
	if many != nil && units != nil {
		ratio := units.ratio / many.ratio
		row(fmt.Sprintf("units: ratio >= %.2fx many clients'", goalUnitsVsMany),
			fmt.Sprintf("%.2fx (%.2f against %.2f)", ratio, units.ratio, many.ratio), ratio >= goalUnitsVsMany)
		cpu := units.redisPerDecision / many.redisPerDecision
		row(fmt.Sprintf("units: Redis CPU per request <= %.1fx many clients' per decision", goalUnitsRedisVsMany),
			fmt.Sprintf("%.2fx (%s us against %s us)", cpu, num(units.redisPerDecision, 1), num(many.redisPerDecision, 1)), cpu <= goalUnitsRedisVsMany)
		caddy := units.caddyRatio / many.caddyRatio
		row(fmt.Sprintf("units: Caddy CPU per request <= %.2fx many clients' (each against plain)", goalUnitsCaddyVsMany),
			fmt.Sprintf("%.2fx (%sx against %sx)", caddy, num(units.caddyRatio, 2), num(many.caddyRatio, 2)), caddy <= goalUnitsCaddyVsMany)
	}
	rows := r.naiveRows()
	if len(rows) == 4 {
		near, naiveNear, far, naiveFar := rows[0].s, rows[1].s, rows[2].s, rows[3].s
		row("p99 added <= the naive peer's (Redis on this host)",
			fmt.Sprintf("%s against %s", ms(near.addedP99()), ms(naiveNear.addedP99())), near.addedP99() <= naiveNear.addedP99())
		added := float64(far.addedP50()) / float64(max(naiveFar.addedP50(), time.Microsecond))
		row(fmt.Sprintf("p50 added <= %.1fx the naive peer's (Redis 1 ms away)", goalFarAddedVsNaive),
			fmt.Sprintf("%.2fx (%s against %s)", added, ms(far.addedP50()), ms(naiveFar.addedP50())), added <= goalFarAddedVsNaive)
		ratio := far.ratio / naiveFar.ratio
		row(fmt.Sprintf("ratio >= %.1fx the naive peer's (Redis 1 ms away)", goalFarRatioVsNaive),
			fmt.Sprintf("%.2fx (%.2f against %.2f)", ratio, far.ratio, naiveFar.ratio), ratio >= goalFarRatioVsNaive)
	}
}
