package slidingratelimit

import (
	"strings"
	"testing"
)

// TestJSONRulesNameTheField: a JSON config breaks the same rules as a
// Caddyfile, in the same words, naming the field (and the zone).
func TestJSONRulesNameTheField(t *testing.T) {
	for _, c := range []struct{ config, want string }{
		{`{}`, "no limit: set window and max_requests, or at least one zone"},
		{`{"window": "1m"}`, "max_requests must be at least 1, got 0"},
		{`{"max_requests": 5}`, "window must be greater than zero"},
		{`{"window": "-1s", "max_requests": 5}`, "window must be greater than zero, got -1s"},
		{`{"window": "1m", "max_requests": 5, "timeout": "-1s"}`, "timeout must be greater than zero"},
		{`{"window": "1m", "max_requests": 5, "ipv4_prefix": 33}`, "ipv4_prefix must be from 1 to 32, got 33"},
		{`{"window": "1m", "max_requests": 5, "ipv6_prefix": 129}`, "ipv6_prefix must be from 1 to 128, got 129"},
		{`{"window": "1m", "max_requests": 5, "key_prefix": "a{b"}`, "key_prefix must not contain '{' or '}'"},
		{`{"window": "1m", "max_requests": 5, "fail_mode": "shut"}`, `fail_mode must be open, closed or local, got "shut"`},
		{`{"window": "1m", "max_requests": 5, "headers": "x"}`, `headers must be draft, legacy or off, got "x"`},
		{`{"window": "1m", "max_requests": 5, "mode": "x"}`, `mode must be enforce or report, got "x"`},
		{`{"window": "1m", "max_requests": 5, "algorithm": "x"}`, `algorithm must be log or counter, got "x"`},
		{`{"window": "1m", "max_requests": 5, "redis_topology": "ring"}`, `redis_topology must be standalone, cluster or sentinel, got "ring"`},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 0}]}`, "zone a: max_requests must be at least 1, got 0"},
		{`{"zones": [{"name": "a", "max_requests": 1}]}`, "zone a: window must be greater than zero"},
		{`{"zones": [{"name": "a b", "window": "1m", "max_requests": 1}]}`, `zone name "a b": only letters`},
		{`{"zones": [{"window": "1m", "max_requests": 1}]}`, "zone name is required"},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 1, "algorithm": "gcra"}]}`, `zone a: algorithm must be log or counter, got "gcra"`},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 1}, {"name": "a", "window": "1h", "max_requests": 9}]}`, "zone a is defined twice"},
		{`{"window": "1m", "max_requests": 5, "zones": [{"name": "default", "window": "1h", "max_requests": 9}]}`, "zone default clashes with the zone that window and max_requests define"},
		{`{"window": "1m", "max_requests": 5, "count_status": [600]}`, "count_status must be status codes from 100 to 599 or classes 1 to 5 (1xx to 5xx), got 600"},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 1, "count_status": [0]}]}`, "zone a: count_status must be"},
		{`{"window": "1m", "max_requests": 5, "key": "{http.request.header.X-Api-Key"}`, `key "{http.request.header.X-Api-Key": the placeholder "{http.request.header.X-Api-Key" has no closing '}'`},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 1, "key": "}{http.vars.client_ip}"}]}`, `zone a: key "}{http.vars.client_ip}": '}' at the start closes no '{'`},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 1, "key": "{a{b}}"}]}`, `zone a: key "{a{b}}": '{' inside the placeholder "{a", which is not closed: placeholders do not nest`},
		{`{"window": "1m", "max_requests": 5, "key": "t:{}"}`, `key "t:{}": empty placeholder '{}' after "t:"`},
	} {
		err := provisionError(t, c.config)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.config, err, c.want)
		}
	}
}

func TestZoneIdentity(t *testing.T) {
	for _, c := range []struct{ config, want string }{
		{`{"window": "1m", "max_requests": 60}`, "default:1m:60"},
		{`{"window": "90s", "max_requests": 1}`, "default:90s:1"},
		{`{"window": "1500ms", "max_requests": 2, "algorithm": "counter"}`, "default:1500ms:2:counter"},
		{`{"window": "24h", "max_requests": 7}`, "default:24h:7"},
		{`{"zones": [{"name": "api", "window": 1000, "max_requests": 3}]}`, "api:1us:3"},
		{`{"zones": [{"name": "login", "window": "10m", "max_requests": 3, "count_status": [401, 4]}]}`, "login:10m:3:401,4xx"},
		{`{"window": "1m", "max_requests": 3, "count_status": [5]}`, "default:1m:3:5xx"},
	} {
		in := newInstance(t, c.config)
		if got := in.zones[0].identity; got != c.want {
			t.Errorf("%s: identity %q, want %q", c.config, got, c.want)
		}
	}
}
