package slidingratelimit

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestJSONUnknownFieldNamesTheMeantOne: a JSON config with a field the
// handler does not know is refused, as Caddy refuses it, and the error
// names the field it is a typo of, at the top and in a zone; a field that
// is no typo of any is refused with no guess.
func TestJSONUnknownFieldNamesTheMeantOne(t *testing.T) {
	for _, c := range []struct{ config, want string }{
		{`{"window": "1m", "max_request": 5}`, `json: unknown field "max_request" (did you mean max_requests?)`},
		{`{"zones": [{"name": "a", "windw": "1m", "max_requests": 5}]}`, `json: unknown field "windw" (did you mean window?)`},
		{`{"window": "1m", "max_requests": 5, "fail_mod": "open"}`, `(did you mean fail_mode?)`},
		{`{"window": "1m", "max_requests": 5, "color": "blue"}`, `json: unknown field "color"`},
	} {
		err := json.Unmarshal([]byte(c.config), new(Handler))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.config, err, c.want)
		}
		if strings.Contains(c.config, "color") && err != nil && strings.Contains(err.Error(), "did you mean") {
			t.Errorf("%s: %v, want no guess", c.config, err)
		}
	}
	var h Handler
	if err := json.Unmarshal([]byte(`{"window": "1m", "max_requests": 5, "zones": [{"name": "b", "window": "1h", "max_requests": 9}]}`), &h); err != nil || h.MaxRequests != 5 || len(h.Zones) != 1 || h.Zones[0].Name != "b" {
		t.Errorf("a good config: %+v, %v", h, err)
	}
}

// TestJSONTypoRefusedByLoad: through a running Caddy's /load, the typo's
// error names the field meant, and the running config stays.
func TestJSONTypoRefusedByLoad(t *testing.T) {
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		window 1m
		max_requests 2
	}
	respond "ok"`))
	res := loadHandler(t, `{"handler": "sliding_ratelimit", "window": "1m", "max_request": 5}`)
	if want := `unknown field \"max_request\" (did you mean max_requests?)`; res.status != http.StatusBadRequest || !strings.Contains(res.body, want) {
		t.Errorf("/load with max_request: %d %s, want 400 with %s", res.status, res.body, want)
	}
	expect(t, "after the refused load: the running limit", site, []int{200, 200, 429}, from("127.0.0.3"))
}
