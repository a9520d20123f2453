package slidingratelimit

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("sliding_ratelimit", parseCaddyfile)
	// Before authentication, so that a flood of bad credentials is limited
	// before it costs a password hash; no `order` line needed.
	httpcaddyfile.RegisterDirectiveOrder("sliding_ratelimit", httpcaddyfile.Before, "basic_auth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	handler := new(Handler)
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return handler, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	sliding_ratelimit [<matcher>] {
//		window       <duration> | day | week | month
//		time_zone    <IANA name>
//		max_requests <n> | <placeholder> <fallback>
//		cost         <n> | <placeholder> | json <path>... <default> [+body] | llm [<default>] [ceiling <n>|model] [cap <n>]
//		settle       header <name> | bytes | json <path>... | llm
//		key          <string>
//		algorithm    log|counter
//		count_status <code|class>...
//		wait         <duration>
//		zone <name> [<window> <max_requests>] {
//			window       <duration> | day | week | month
//			time_zone    <IANA name>
//			max_requests <n> | <placeholder> <fallback>
//			cost         <n> | <placeholder> | json <path>... <default> [+body] | llm [<default>] [ceiling <n>|model] [cap <n>]
//			settle       header <name> | bytes | json <path>... | llm
//			key          <string>
//			algorithm    log|counter
//			count_status <code|class>...
//			wait         <duration>
//			price        <model> <kind> <$/M tokens>...
//			warn         <percent>%
//			mode         enforce|report
//			match {
//				<matchers>
//			}
//		}
//		zone <name> {
//			concurrent   <n>
//			lease        <duration>
//			key          <string>
//			match {
//				<matchers>
//			}
//		}
//		max_waiting  <n>
//		mode         enforce|report
//		ipv4_prefix  <bits>
//		ipv6_prefix  <bits>
//		fail_mode    open|closed|local
//		redis        [cluster|sentinel] <url>
//		key_prefix   <string>
//		timeout      <duration>
//		headers      draft|legacy|off
//		log_keys
//	}
//
// window and max_requests define the zone named "default"; give them, or
// one or more zones, or both. A zone may be given in short, with or without
// a block: zone burst 1s 10. A window of day, week (from Monday) or month
// counts by the calendar, from midnight in time_zone (UTC by default).
// key, algorithm, count_status, cost, settle, wait and time_zone at the top
// are the defaults of every zone. A zone with concurrent
// limits requests in flight instead, and has no window, max_requests, cost
// or settle. Defaults: key {client_ip}, algorithm log, cost 1, no wait,
// lease 1m, max_waiting 1000, mode
// enforce, ipv4_prefix 32, ipv6_prefix 64, fail_mode open, no redis
// (in-process store), key_prefix srl:, timeout 100ms, headers
// draft.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.Errf("sliding_ratelimit takes no arguments besides a matcher, got '%s': options go in its block", d.Val())
	}
	seen := make(map[string]bool)
	pricesLines := make(map[*Zone]int)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if seen[name] && name != "zone" {
			return d.Errf("duplicate subdirective '%s'", name)
		}
		seen[name] = true
		switch name {
		case "zone":
			z, line, err := parseZone(d)
			if err != nil {
				return err
			}
			h.Zones = append(h.Zones, z)
			if line > 0 {
				pricesLines[z] = line
			}
			if err := checkZoneNames(false, h.Zones); err != nil {
				return d.Err(err.Error())
			}
		case "log_keys":
			if args := d.RemainingArgs(); len(args) > 0 {
				return d.Errf("log_keys takes no arguments, got %d", len(args))
			}
			h.LogKeys = true
		default:
			handled, err := parseUnitsOption(d, name, unitsFields{&h.MaxRequests, &h.MaxRequestsFrom, &h.Cost, &h.Settle, &h.CostJSON, &h.CostLLM})
			if err == nil && !handled {
				handled, err = parseLimitOption(d, name, windowFields{&h.Window, &h.Period, &h.TimeZone}, &h.Key, &h.Algorithm, &h.CountStatus)
			}
			if err != nil {
				return err
			}
			if !handled {
				if err := h.parseOption(d, name); err != nil {
					return err
				}
			}
		}
	}
	if err := h.checkPricesSettled(d, pricesLines); err != nil {
		return err
	}
	return h.checkLimitsGiven(d, seen["window"], seen["max_requests"])
}

// checkPricesSettled applies checkPricesSettled (which Validate applies to
// the JSON) to each zone with prices, with the cost and settle it takes
// from the handler when it sets none, and names the line of its first
// price: a zone whose prices need a settle llm it lacks is found where
// the price is written, not only when the config loads.
func (h *Handler) checkPricesSettled(d *caddyfile.Dispenser, pricesLines map[*Zone]int) error {
	for _, z := range h.Zones {
		if !z.priced() {
			continue
		}
		settle, costLLM := z.Settle, z.CostLLM != nil
		if settle == nil {
			settle = h.Settle
		}
		if z.Cost == "" && z.CostJSON == nil && z.CostLLM == nil {
			costLLM = h.CostLLM != nil
		}
		if err := checkPricesSettled(z.priced(), costLLM, settle != nil && settle.LLM); err != nil {
			return fmt.Errorf("zone %s: %w, at %s:%d", z.Name, err, d.File(), pricesLines[z])
		}
	}
	return nil
}

// checkLimitsGiven checks, at the end of the block, that the limits that
// were given make a whole.
func (h *Handler) checkLimitsGiven(d *caddyfile.Dispenser, window, maxRequests bool) error {
	if window != maxRequests {
		if !window {
			return d.Err("window is required with max_requests")
		}
		return d.Err("max_requests is required with window")
	}
	if !window && len(h.Zones) == 0 {
		return d.Err("window and max_requests are required (or at least one zone)")
	}
	if err := checkZoneNames(window, h.Zones); err != nil {
		return d.Err(err.Error())
	}
	if err := checkPeriod(h.Period, "", time.Duration(h.Window), h.Algorithm, time.Duration(h.Wait)); err != nil {
		return d.Err(err.Error())
	}
	if err := checkTimeZoneUsed(h.TimeZone, h.Period, h.Zones); err != nil {
		return d.Err(err.Error())
	}
	if err := checkCostFits(h.Cost, h.MaxRequests, h.MaxRequestsFrom); window && err != nil {
		return d.Err(err.Error())
	}
	if err := checkCostJSONFits(h.CostJSON, h.MaxRequests, h.MaxRequestsFrom); window && err != nil {
		return d.Err(err.Error())
	}
	if err := checkCostLLM(h.CostLLM, h.Cost, h.CostJSON != nil); err != nil {
		return d.Err(err.Error())
	}
	if err := checkCostLLMFits(h.CostLLM, h.MaxRequests, h.MaxRequestsFrom); window && err != nil {
		return d.Err(err.Error())
	}
	return nil
}

// parseOption parses one handler-wide subdirective.
func (h *Handler) parseOption(d *caddyfile.Dispenser, name string) error {
	switch name {
	case "mode":
		return oneOf(d, modeEnum, &h.Mode)
	case "fail_mode":
		return oneOf(d, failModeEnum, &h.FailMode)
	case "headers":
		return oneOf(d, headersEnum, &h.Headers)
	case "ipv4_prefix":
		return prefixBits(d, name, &h.IPv4Prefix, maxIPv4Prefix)
	case "ipv6_prefix":
		return prefixBits(d, name, &h.IPv6Prefix, maxIPv6Prefix)
	case "redis":
		args := d.RemainingArgs()
		switch {
		case len(args) == 2 && (args[0] == redisconn.Cluster || args[0] == redisconn.Sentinel):
			h.RedisTopology = args[0]
			h.Redis = args[1]
		case len(args) == 1:
			h.Redis = args[0]
		default:
			return d.Err("want redis <url>, redis cluster <url> or redis sentinel <url>")
		}
		// A URL with placeholders is checked once they are known.
		if !strings.Contains(h.Redis, "{") {
			if err := redisconn.CheckURL(h.RedisTopology, h.Redis); err != nil {
				return d.Errf("redis: %v", err)
			}
		}
	case "key_prefix":
		arg, err := oneArg(d)
		if err != nil {
			return err
		}
		if err := checkKeyPrefix(arg); err != nil {
			return d.Err(err.Error())
		}
		h.KeyPrefix = arg
	case "timeout":
		return positiveDuration(d, name, &h.Timeout)
	case "wait":
		return positiveDuration(d, name, &h.Wait)
	case "max_waiting":
		arg, err := oneArg(d)
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(arg)
		if err != nil || n < 1 {
			return d.Errf("max_waiting must be a whole number of at least 1, got %q", arg)
		}
		h.MaxWaiting = n
	case "concurrent", "lease":
		return d.Errf("%s belongs in a zone, which it makes a concurrency zone: zone <name> { concurrent <n> }", name)
	case "price":
		return d.Errf("price belongs in a zone with cost llm and settle llm, whose budget it makes millionths of a dollar: zone <name> <window> <µ$> { price <model> input <$/M> output <$/M> }")
	case "autopipeline":
		return d.Errf("autopipeline was removed: the module's own batching decides each batch in one script call; delete the line")
	default:
		return d.Errf("unrecognized subdirective '%s'%s", name, didYouMean(name, handlerSubdirectives))
	}
	return nil
}

// The names each block takes, which a misspelt name is compared with: the
// cases of UnmarshalCaddyfile, parseOption and parseLimitOption (the
// handler's block), and of parseZone and parseLimitOption (a zone's).
var (
	limitSubdirectives   = []string{"window", "time_zone", "max_requests", "key", "algorithm", "count_status", "cost", "settle"}
	handlerSubdirectives = append([]string{"zone", "log_keys", "mode", "fail_mode", "headers", "ipv4_prefix", "ipv6_prefix",
		"redis", "key_prefix", "timeout", "wait", "max_waiting"}, limitSubdirectives...)
	zoneSubdirectives = append([]string{"match", "wait", "concurrent", "lease", "price", "price_table", "warn", "mode"}, limitSubdirectives...)
)

// parseLimitOption parses a subdirective that both the handler and a zone
// take, but for those of units (parseUnitsOption). It reports false for any
// other name.
func parseLimitOption(d *caddyfile.Dispenser, name string, window windowFields, key, algorithm *string, countStatus *[]int) (bool, error) {
	switch name {
	case "window":
		arg, err := oneArg(d)
		if err != nil {
			return true, err
		}
		return true, parseWindow(d, arg, window)
	case "time_zone":
		arg, err := oneArg(d)
		if err != nil {
			return true, err
		}
		if _, err := loadTimeZone(arg); err != nil {
			return true, d.Err(err.Error())
		}
		*window.timeZone = arg
	case "key":
		arg, err := oneArg(d)
		if err != nil {
			return true, err
		}
		if err := checkKeyTemplate(arg); err != nil {
			return true, d.Err(err.Error())
		}
		*key = arg
	case "algorithm":
		return true, oneOf(d, algorithmEnum, algorithm)
	case "count_status":
		args := d.RemainingArgs()
		if len(args) == 0 {
			return true, d.Err("count_status takes one or more status codes or classes (count_status 401 403, count_status 4xx)")
		}
		for _, arg := range args {
			status, err := parseStatus(arg)
			if err != nil {
				return true, d.Err(err.Error())
			}
			*countStatus = append(*countStatus, status)
		}
	default:
		return false, nil
	}
	return true, nil
}

// parseZone parses `zone <name> { ... }`, and returns the line of its first
// price (0 when it has none).
func parseZone(d *caddyfile.Dispenser) (*Zone, int, error) {
	z := new(Zone)
	if !d.NextArg() {
		return nil, 0, d.Err("zone needs a name: zone <name> { ... }")
	}
	z.Name = d.Val()
	if err := checkZoneName(z.Name); err != nil {
		return nil, 0, d.Err(err.Error())
	}
	seen, err := parseZoneShortForm(d, z)
	if err != nil {
		return nil, 0, err
	}
	pricesLine := 0
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if name == "price" {
			// A line per model pattern: the one subdirective a zone repeats.
			if pricesLine == 0 {
				pricesLine = d.Line()
			}
			if err := parsePrice(d, z); err != nil {
				return nil, 0, err
			}
			continue
		}
		if seen[name] {
			return nil, 0, d.Errf("zone %s: duplicate subdirective '%s'", z.Name, name)
		}
		seen[name] = true
		if name == "price_table" {
			if !d.NextArg() || d.CountRemainingArgs() > 0 {
				return nil, 0, d.Errf("zone %s: price_table takes the path of one price table file (price_table /etc/caddy/model_prices.json)", z.Name)
			}
			if pricesLine == 0 {
				pricesLine = d.Line()
			}
			z.PriceTable = d.Val()
			continue
		}
		if name == "match" {
			matchers, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			if err != nil {
				return nil, 0, err
			}
			z.MatchersRaw = caddyhttp.RawMatcherSets{matchers}
			continue
		}
		handled, err := parseUnitsOption(d, name, unitsFields{&z.MaxRequests, &z.MaxRequestsFrom, &z.Cost, &z.Settle, &z.CostJSON, &z.CostLLM})
		if err == nil && !handled {
			handled, err = parseLimitOption(d, name, windowFields{&z.Window, &z.Period, &z.TimeZone}, &z.Key, &z.Algorithm, &z.CountStatus)
		}
		if err == nil && !handled {
			handled, err = parseZoneTimeOption(d, name, z)
		}
		if err == nil && !handled {
			handled, err = parseZoneSoftOption(d, name, z)
		}
		if err != nil {
			return nil, 0, err
		}
		if !handled {
			hint := didYouMean(name, zoneSubdirectives)
			if hint == "" && slices.Contains(handlerSubdirectives, name) {
				hint = " (it applies to the whole handler: put it outside the zone block)"
			}
			return nil, 0, d.Errf("zone %s: unrecognized subdirective '%s'%s", z.Name, name, hint)
		}
	}
	if z.concurrency() {
		err := checkConcurrencyZone(z.Concurrent, time.Duration(z.Lease), z.countingFields(), z.Algorithm, time.Duration(z.Wait))
		if err != nil {
			return nil, 0, d.Errf("zone %s: %v", z.Name, err)
		}
		return z, pricesLine, nil
	}
	if !seen["window"] {
		return nil, 0, d.Errf("zone %s: window is required", z.Name)
	}
	if !seen["max_requests"] {
		return nil, 0, d.Errf("zone %s: max_requests is required", z.Name)
	}
	for _, err := range []error{
		checkCostFits(z.Cost, z.MaxRequests, z.MaxRequestsFrom),
		checkCostJSON(z.CostJSON, z.Cost),
		checkCostJSONFits(z.CostJSON, z.MaxRequests, z.MaxRequestsFrom),
		checkCostLLM(z.CostLLM, z.Cost, z.CostJSON != nil),
		checkCostLLMFits(z.CostLLM, z.MaxRequests, z.MaxRequestsFrom),
		checkWait(time.Duration(z.Wait), time.Duration(z.Window), z.Algorithm),
		checkPeriod(z.Period, z.TimeZone, time.Duration(z.Window), z.Algorithm, time.Duration(z.Wait)),
		checkZoneMode(z.Mode, time.Duration(z.Wait)),
	} {
		if err != nil {
			return nil, 0, d.Errf("zone %s: %v", z.Name, err)
		}
	}
	return z, pricesLine, nil
}

// parsePrice reads a price line of zone z:
//
//	price <model pattern> <kind> <dollars per million tokens> [<kind> <dollars>]...
//
// with kinds input, cached, cache_write and output, and the optional
// cache_write_1h, audio_input, audio_output (dollars per million tokens)
// and web_search (dollars per 1,000 searches), and checks it against the
// lines before it.
func parsePrice(d *caddyfile.Dispenser, z *Zone) error {
	args := d.RemainingArgs()
	if len(args) < 3 || len(args)%2 == 0 {
		return d.Errf("zone %s: price takes a model pattern, then kinds and dollars per million tokens: price <model> input <$/M> output <$/M> [cached <$/M>] [cache_write <$/M>] [cache_write_1h <$/M>] [audio_input <$/M>] [audio_output <$/M>] [web_search <$/1000>] (price gpt-4o* input 2.50 cached 1.25 output 10), got %q", z.Name, args)
	}
	p := &Price{Model: args[0]}
	for i := 1; i < len(args); i += 2 {
		kind, value := args[i], args[i+1]
		k := slices.IndexFunc(priceKinds, func(k priceKind) bool { return k.name == kind })
		if k < 0 {
			names := priceKindNames()
			return d.Errf("zone %s: price %s: unknown kind '%s'%s: the kinds are %s", z.Name, p.Model, kind, didYouMean(kind, names), strings.Join(names, ", "))
		}
		field := priceKinds[k].field(p)
		if *field != "" {
			return d.Errf("zone %s: price %s: %s is given twice", z.Name, p.Model, kind)
		}
		*field = json.Number(value)
	}
	z.Prices = append(z.Prices, p)
	if err := checkPrices(z.Prices); err != nil {
		return d.Errf("zone %s: %v", z.Name, err)
	}
	return nil
}

// parseZoneTimeOption parses a zone's wait, concurrent and lease. It
// reports false for any other name.
func parseZoneTimeOption(d *caddyfile.Dispenser, name string, z *Zone) (bool, error) {
	switch name {
	case "wait":
		return true, positiveDuration(d, name, &z.Wait)
	case "lease":
		return true, positiveDuration(d, name, &z.Lease)
	case "concurrent":
		arg, err := oneArg(d)
		if err != nil {
			return true, err
		}
		n, err := strconv.ParseInt(arg, 10, 64)
		if err != nil || n < 1 {
			return true, d.Errf("concurrent must be a whole number of at least 1, got %q", arg)
		}
		z.Concurrent = n
		return true, nil
	}
	return false, nil
}

// parseZoneSoftOption parses a zone's warn <percent>% and mode. It
// reports false for any other name.
func parseZoneSoftOption(d *caddyfile.Dispenser, name string, z *Zone) (bool, error) {
	switch name {
	case "warn":
		arg, err := oneArg(d)
		if err != nil {
			return true, err
		}
		digits, ok := strings.CutSuffix(arg, "%")
		n, err := strconv.Atoi(digits)
		if !ok || err != nil {
			return true, d.Errf("zone %s: warn takes a share of max_requests in percent, from 1%% to 99%% (warn 80%%), got %q", z.Name, arg)
		}
		if err := checkWarnPercent(n); err != nil || n == 0 {
			return true, d.Errf("zone %s: warn must be a share from 1%% to 99%% of max_requests, got %q", z.Name, arg)
		}
		z.WarnPercent = n
		return true, nil
	case "mode":
		return true, oneOf(d, modeEnum, &z.Mode)
	}
	return false, nil
}

// subdirectiveSyntax is the form of each subdirective that takes one
// argument, for errors that say what was expected.
var subdirectiveSyntax = map[string]string{
	"window":      "window <duration>|" + periodEnum.syntax(),
	"time_zone":   "time_zone <IANA name>",
	"key":         "key <template>",
	"algorithm":   "algorithm " + algorithmEnum.syntax(),
	"mode":        "mode " + modeEnum.syntax(),
	"fail_mode":   "fail_mode " + failModeEnum.syntax(),
	"headers":     "headers " + headersEnum.syntax(),
	"ipv4_prefix": "ipv4_prefix <bits>",
	"ipv6_prefix": "ipv6_prefix <bits>",
	"key_prefix":  "key_prefix <string>",
	"timeout":     "timeout <duration>",
	"wait":        "wait <duration>",
	"warn":        "warn <percent>%",
	"max_waiting": "max_waiting <n>",
	"concurrent":  "concurrent <n>",
	"lease":       "lease <duration>",
}

// parseZoneShortForm reads the arguments after a zone's name, the short form
// zone <name> <window> <max_requests> (which may be a placeholder and its
// fallback), and returns the fields it set.
func parseZoneShortForm(d *caddyfile.Dispenser, z *Zone) (map[string]bool, error) {
	seen := make(map[string]bool)
	switch args := d.RemainingArgs(); len(args) {
	case 0:
	case 2, 3:
		if err := parseWindow(d, args[0], windowFields{&z.Window, &z.Period, &z.TimeZone}); err != nil {
			return nil, err
		}
		if err := parseMaxRequestsOption(d, args[1:], &z.MaxRequests, &z.MaxRequestsFrom); err != nil {
			return nil, err
		}
		seen["window"], seen["max_requests"] = true, true
	default:
		return nil, d.Errf("zone %s: want zone <name> [<window> <max_requests>] [{ ... }]", z.Name)
	}
	return seen, nil
}

// windowFields are the fields, of the handler or of a zone, that a window
// argument sets: a duration, or a period and its time zone.
type windowFields struct {
	window   *caddy.Duration
	period   *string
	timeZone *string
}

// parseWindow reads a window's argument: a duration, or a calendar period
// (day, week or month).
func parseWindow(d *caddyfile.Dispenser, arg string, f windowFields) error {
	if slices.Contains(periodEnum.values, arg) {
		*f.period = arg
		return nil
	}
	if !strings.ContainsAny(arg, "0123456789") {
		return d.Errf("window must be a duration (1m, 24h; the units are ns, us, ms, s, m, h and d) or a period (day, week or month), got %q%s", arg, didYouMean(arg, periodEnum.values))
	}
	var err error
	*f.window, err = parseDuration(d, "window", arg)
	return err
}

// parseStatus reads one count_status argument: "401" or "4xx".
func parseStatus(arg string) (int, error) {
	if len(arg) == 3 && arg[1:] == "xx" && arg[0] >= '1' && arg[0] <= '5' {
		return int(arg[0] - '0'), nil
	}
	n, err := strconv.Atoi(arg)
	if err != nil || n < 100 || n > 599 {
		return 0, fmt.Errorf("count_status takes status codes (401) or classes (4xx), got %q", arg)
	}
	return n, nil
}

// oneArg returns the single argument of the current subdirective, or an
// error that names the subdirective and its form.
func oneArg(d *caddyfile.Dispenser) (string, error) {
	name := d.Val()
	args := d.RemainingArgs()
	if len(args) != 1 {
		return "", d.Errf("%s takes one argument (%s), got %d", name, subdirectiveSyntax[name], len(args))
	}
	return args[0], nil
}

// oneOf parses the argument of an enum's subdirective.
func oneOf(d *caddyfile.Dispenser, e enum, dst *string) error {
	arg, err := oneArg(d)
	if err != nil {
		return err
	}
	err = e.check(arg)
	if arg == "" {
		err = fmt.Errorf("%s must be %s, got %q", e.field, e.syntax(), arg)
	}
	if err != nil {
		return d.Err(err.Error())
	}
	*dst = arg
	return nil
}

// positiveDuration parses the argument of subdirective name, a duration
// greater than zero.
func positiveDuration(d *caddyfile.Dispenser, name string, dst *caddy.Duration) error {
	arg, err := oneArg(d)
	if err != nil {
		return err
	}
	*dst, err = parseDuration(d, name, arg)
	return err
}

// parseDuration reads the duration argument of subdirective name and
// applies its rule: window and lease are spans the engine keeps
// (checkWindow), a wait at most two years, the others greater than zero.
func parseDuration(d *caddyfile.Dispenser, name, arg string) (caddy.Duration, error) {
	dur, err := caddy.ParseDuration(arg)
	if err != nil {
		return 0, d.Errf("%s: invalid duration %q: %s", name, arg, durationHint(arg, err))
	}
	switch name {
	case "window", "lease":
		err = checkWindow(name, dur)
	case "wait":
		if err = checkPositive(name, dur); err == nil {
			err = checkWait(dur, 0, "")
		}
	default:
		err = checkPositive(name, dur)
	}
	if err != nil {
		return 0, d.Err(err.Error())
	}
	return caddy.Duration(dur), nil
}

// durationHint says how to write a duration that did not parse: a bare
// number (the commonest mistake, since other rate limiters take seconds)
// gets the duration it most likely means; anything else the units.
func durationHint(arg string, err error) string {
	if n, numErr := strconv.ParseUint(arg, 10, 32); numErr == nil {
		hint := fmt.Sprintf("a duration needs a unit: %ds for seconds", n)
		switch {
		case n >= 3600 && n%3600 == 0:
			hint += fmt.Sprintf(" (or %dh)", n/3600)
		case n >= 60 && n%60 == 0:
			hint += fmt.Sprintf(" (or %dm)", n/60)
		}
		return hint
	}
	return err.Error() + "; the units are ns, us, ms, s, m, h and d (24h), combined as in 1m30s"
}

// prefixBits parses a prefix length from 1 to max.
func prefixBits(d *caddyfile.Dispenser, name string, dst *int, max int) error {
	arg, err := oneArg(d)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(arg)
	if err != nil {
		return d.Errf("%s must be a whole number, got %q", name, arg)
	}
	if err := checkPrefixBits(name, n, max); err != nil {
		return d.Err(err.Error())
	}
	*dst = n
	return nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)

// unitsFields are the fields, of the handler or of a zone, that say what a
// request spends and of what budget.
type unitsFields struct {
	max      *int64
	maxFrom  *string
	cost     *string
	settle   **Settle
	costJSON **CostJSON
	costLLM  **CostLLM
}

// parseUnitsOption parses a subdirective of units, which both the handler
// and a zone take:
//
//	max_requests <n> | <placeholder> <fallback>
//	cost         <n> | <placeholder> | json <path>... <default> [+body] | llm [<default>] [ceiling <n>|model] [cap <n>]
//	settle       header <name> | bytes | json <path>... | llm
//
// It reports false for any other name. Of cost's forms, the last one given
// stands alone: a cost of each form is checked against the others.
func parseUnitsOption(d *caddyfile.Dispenser, name string, f unitsFields) (bool, error) {
	switch name {
	case "max_requests":
		return true, parseMaxRequestsOption(d, d.RemainingArgs(), f.max, f.maxFrom)
	case "cost":
		args := d.RemainingArgs()
		if len(args) > 0 && args[0] == "json" {
			c, err := parseCostJSON(d, args[1:])
			*f.costJSON = c
			return true, err
		}
		if len(args) > 0 && args[0] == "llm" {
			c, err := parseCostLLM(d, args[1:])
			*f.costLLM = c
			return true, err
		}
		if len(args) != 1 {
			return true, d.Errf("cost takes one argument (cost <n>, or cost <placeholder>), got %d", len(args))
		}
		if err := checkCost(args[0]); err != nil {
			return true, d.Err(err.Error())
		}
		*f.cost = args[0]
	case "settle":
		s, err := parseSettle(d, d.RemainingArgs())
		if err != nil {
			return true, err
		}
		*f.settle = s
	default:
		return false, nil
	}
	return true, nil
}

// parseMaxRequestsOption reads max_requests <n>, or max_requests
// <placeholder> <fallback> (also the end of the short form of a zone).
func parseMaxRequestsOption(d *caddyfile.Dispenser, args []string, max *int64, maxFrom *string) error {
	switch {
	case len(args) == 1 && isPlaceholder(args[0]):
		return d.Errf("max_requests %s needs a fallback for requests without a usable value: max_requests %s <n>", args[0], args[0])
	case len(args) == 1:
		n, err := parseMaxRequests(d, args[0])
		*max = n
		return err
	case len(args) == 2:
		if err := checkMaxRequestsFrom(args[0]); err != nil {
			return d.Errf("max_requests with two arguments takes a placeholder and a fallback (max_requests {http.request.header.X-Quota} 100), got %q", args[0])
		}
		n, err := parseMaxRequests(d, args[1])
		*max, *maxFrom = n, args[0]
		return err
	}
	return d.Errf("max_requests takes a number (max_requests 100), or a placeholder and a fallback (max_requests {http.request.header.X-Quota} 100), got %d arguments", len(args))
}

// parseSettle reads the arguments of settle: header <name>, bytes, or json
// <path>...
func parseSettle(d *caddyfile.Dispenser, args []string) (*Settle, error) {
	var s Settle
	switch {
	case len(args) == 2 && args[0] == "header":
		s.Header = args[1]
	case len(args) == 1 && args[0] == "bytes":
		s.Bytes = true
	case len(args) >= 2 && args[0] == "json":
		s.JSON = args[1:]
	case len(args) == 1 && args[0] == "llm":
		s.LLM = true
	default:
		return nil, d.Errf("settle takes header <name> (settle header X-Usage), bytes (settle bytes), json <path>... (settle json usage.total_tokens) or llm (settle llm), got %q", args)
	}
	if err := checkSettle(&s); err != nil {
		return nil, d.Err(err.Error())
	}
	return &s, nil
}

func parseMaxRequests(d *caddyfile.Dispenser, arg string) (int64, error) {
	n, err := strconv.ParseInt(arg, 10, 64)
	if err != nil {
		return 0, d.Errf("max_requests must be a whole number, got %q", arg)
	}
	if err := checkMaxRequests(n); err != nil {
		return 0, d.Err(err.Error())
	}
	return n, nil
}

// parseCostJSON reads the arguments of cost json: <path>... <default>
// [+body].
func parseCostJSON(d *caddyfile.Dispenser, args []string) (*CostJSON, error) {
	var c CostJSON
	if len(args) > 0 && args[len(args)-1] == "+body" {
		c.Body, args = true, args[:len(args)-1]
	}
	if len(args) < 2 {
		return nil, d.Errf("cost json takes paths and a default, then +body if the body's size adds to it (cost json max_tokens 4096 +body), got %q", args)
	}
	n, ok := strictnum.Parse(args[len(args)-1])
	if !ok {
		return nil, d.Errf("cost json: the default (its last argument before +body) must be a whole number, got %q", args[len(args)-1])
	}
	c.Paths, c.Default = args[:len(args)-1], n
	if err := checkCostJSON(&c, ""); err != nil {
		return nil, d.Err(err.Error())
	}
	return &c, nil
}

// parseCostLLM reads the arguments of cost llm: [<default>] [ceiling
// <n>|model] [cap <n>].
func parseCostLLM(d *caddyfile.Dispenser, args []string) (*CostLLM, error) {
	var c CostLLM
	for len(args) >= 2 {
		name, value := args[len(args)-2], args[len(args)-1]
		var field *int64
		switch name {
		case "ceiling":
			field = &c.Ceiling
		case "cap":
			field = &c.Cap
		}
		if field == nil {
			break
		}
		if name == "ceiling" && value == "model" {
			if c.CeilingModel || c.Ceiling != 0 {
				return nil, d.Errf("cost llm: ceiling is given twice")
			}
			c.CeilingModel, args = true, args[:len(args)-2]
			continue
		}
		n, ok := strictnum.Parse(value)
		if !ok || n < 1 {
			also := ""
			if name == "ceiling" {
				also = ", or model (its context window)"
			}
			return nil, d.Errf("cost llm: the %s must be a whole number of at least 1 (cost llm 4096 %s 200000)%s, got %q", name, name, also, value)
		}
		if *field != 0 || name == "ceiling" && c.CeilingModel {
			return nil, d.Errf("cost llm: %s is given twice", name)
		}
		*field, args = n, args[:len(args)-2]
	}
	switch len(args) {
	case 0:
	case 1:
		n, ok := strictnum.Parse(args[0])
		if !ok || n < 1 {
			return nil, d.Errf("cost llm: the default output bound must be a whole number of at least 1 (cost llm 4096), got %q", args[0])
		}
		c.Default = n
	default:
		return nil, d.Errf("cost llm takes the output bound of a call that names none, a ceiling for calls it cannot bound and a cap on any call's reservation (cost llm 4096 ceiling 200000 cap 300000), got %q", args)
	}
	return &c, nil
}
