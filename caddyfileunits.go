package slidingratelimit

import (
	"strconv"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// unitsFields are the fields, of the handler or of a zone, that say what a
// request spends and of what budget.
type unitsFields struct {
	max      *int64
	maxFrom  *string
	cost     *string
	settle   **Settle
	costJSON **CostJSON
}

// parseUnitsOption parses a subdirective of units, which both the handler
// and a zone take:
//
//	max_requests <n> | <placeholder> <fallback>
//	cost         <n> | <placeholder> | json <path>... <default> [+body]
//	settle       header <name> | bytes | json <path>...
//
// It reports false for any other name.
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
	default:
		return nil, d.Errf("settle takes header <name> (settle header X-Usage), bytes (settle bytes) or json <path>... (settle json usage.total_tokens), got %q", args)
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
	n, ok := parseCount(args[len(args)-1])
	if !ok {
		return nil, d.Errf("cost json: the default (its last argument before +body) must be a whole number, got %q", args[len(args)-1])
	}
	c.Paths, c.Default = args[:len(args)-1], n
	if err := checkCostJSON(&c, ""); err != nil {
		return nil, d.Err(err.Error())
	}
	return &c, nil
}
