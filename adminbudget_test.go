package slidingratelimit

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/adminapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmtest"
)

// TestAdminReservedAndSpent: through Caddy, Redis and the stand-in LLM
// API, a key with an ended call and two calls running (through two
// handlers that share the zones) shows, in a zone with prices and in zones
// of tokens (a sliding day, a calendar day), what the running calls hold
// reserved apart from what the ended one spent (the count less the
// reservations), in dollars in the first; the command prints both; once
// the running calls end, nothing is reserved and all is spent. A zone that
// does not settle shows neither.
func TestAdminReservedAndSpent(t *testing.T) {
	api := llmtest.Start(t)
	spend, tokens, daily, plain := uniqueZone("spend"), uniqueZone("tokens"), uniqueZone("daily"), uniqueZone("plain")
	// Two handlers with the same zones, as two sites that share them.
	limits := `sliding_ratelimit {
			key {http.request.header.Authorization}
			cost llm 4096
			settle llm
			zone ` + spend + ` 1d 10000000 {
				price claude-* input 3.00 output 15.00
			}
			zone ` + tokens + ` 1d 10000000
			zone ` + daily + ` day 10000000
		}`
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	handle /plain {
		sliding_ratelimit {
			zone `+plain+` 1m 10
		}
		respond "ok"
	}
	handle_path /other/* {
		`+limits+`
		reverse_proxy `+api.Addr()+`
	}
	handle {
		`+limits+`
		reverse_proxy `+api.Addr()+`
	}`))
	const key, escapedKey = "Bearer sk-budget", "Bearer%20sk-budget"

	// An ended call: 1,000,000 input tokens at $3 and 100,000 output at
	// $15, $4.50.
	ended := `{"model":"claude-sonnet-4","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
	if status, _ := hangUp(t, site+"v1/messages", "sk-budget", ended, map[string]string{llmtest.HeaderUsage: "1000000,100000"}, -1); status != http.StatusOK {
		t.Fatalf("the ended call: status %d", status)
	}
	const spentUSD, spentTokens = 4_500_000, 1_100_000
	unitsUsed(t, spend, escapedKey, spentUSD)
	unitsUsed(t, tokens, escapedKey, spentTokens)

	// Two calls running, one through each handler: the answer, from one
	// of them, counts the reservations of both.
	ctx, hangUpRunning := context.WithCancel(context.Background())
	defer hangUpRunning()
	holdCall(t, ctx, site+"v1/messages", key)
	holdCall(t, ctx, site+"other/v1/messages", key)

	s := adminState(t, spend, escapedKey)
	reservedUSD := figure(t, "reserved", s.Reserved)
	if got := figure(t, "spent", s.Spent); reservedUSD <= 0 || got != spentUSD || s.Count != got+reservedUSD {
		t.Errorf("spend while a call runs: count %d, reserved %d, spent %d: want the ended call's %d spent and the rest reserved", s.Count, reservedUSD, got, spentUSD)
	}
	if s.SpentUSD != "4.5" || s.ReservedUSD != formatMicros(reservedUSD) || s.UsedUSD != formatMicros(s.Count) ||
		s.LeftUSD != formatMicros(s.Remaining) || s.LimitUSD != "10" || s.Tokens {
		t.Errorf("spend in dollars: %+v", s)
	}
	s = adminState(t, tokens, escapedKey)
	reservedTokens := figure(t, "reserved", s.Reserved)
	if got := figure(t, "spent", s.Spent); reservedTokens <= 2*1000 || got != spentTokens || s.Count != got+reservedTokens || !s.Tokens || s.UsedUSD != "" {
		t.Errorf("tokens while a call runs: %+v, reserved %d: want the ended call's %d spent and the rest (its output bound and more) reserved", s, reservedTokens, spentTokens)
	}

	// A zone of calendar days counts the running call in the day it was
	// admitted in: today's.
	if s := adminState(t, daily, escapedKey); s.Reserved == nil || *s.Reserved != reservedTokens || s.Spent == nil || *s.Spent != spentTokens {
		t.Errorf("a day's tokens while a call runs: %+v, want %d reserved and %d spent as in the sliding day", s, reservedTokens, spentTokens)
	}

	// The command says the same, in dollars and in tokens.
	if line := statusLine(t, spend, key); !strings.Contains(line, " of $10.000000: $0.") ||
		!strings.Contains(line, " reserved by calls running on this instance, $4.500000 spent; $5.") {
		t.Errorf("status of the spend zone: %q", line)
	}
	if line := statusLine(t, tokens, key); !strings.Contains(line, " of 10,000,000 tokens: ") ||
		!strings.Contains(line, " reserved by calls running on this instance, 1,100,000 spent; 8,") {
		t.Errorf("status of the tokens zone: %q", line)
	}

	// Ended by a hang-up, the call pays at least its reservation: all is
	// spent, nothing reserved.
	hangUpRunning()
	for _, zone := range []struct {
		name            string
		spent, reserved int64
	}{{spend, spentUSD, reservedUSD}, {tokens, spentTokens, reservedTokens}} {
		s := settledState(t, zone.name, escapedKey)
		if got := figure(t, "spent", s.Spent); got != s.Count || s.Count < zone.spent+zone.reserved {
			t.Errorf("%s once the call ended: count %d, spent %d: want all spent, at least %d", zone.name, s.Count, got, zone.spent+zone.reserved)
		}
		if zone.name == spend && (s.ReservedUSD != "0" || s.SpentUSD != s.UsedUSD) {
			t.Errorf("spend in dollars once the call ended: %+v", s)
		}
	}

	expect(t, "plain", site+"plain", []int{200})
	if s := adminState(t, plain, "127.0.0.1"); s.Count != 1 || s.Reserved != nil || s.Spent != nil || s.SpentUSD != "" || s.Tokens {
		t.Errorf("a zone that does not settle: %+v, want no reserved, spent or dollars", s)
	}
	if line := statusLine(t, plain, "127.0.0.1"); line != "" {
		t.Errorf("status of a zone that does not settle printed %q below its table", line)
	}
}

// holdCall starts a streaming call as key's that runs until ctx ends:
// its stream's first event is sent at once, the next one an hour later.
// It returns once the first event arrived, when the call runs.
func holdCall(t *testing.T, ctx context.Context, url, key string) {
	t.Helper()
	body := `{"model":"claude-sonnet-4","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"Write a poem"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", key)
	req.Header.Set(llmtest.HeaderPause, "1h")
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the running call through %s: status %d", url, resp.StatusCode)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
}

// figure is the value of a figure of the admin API's answer, failing the
// test when it is absent.
func figure(t *testing.T, name string, v *int64) int64 {
	t.Helper()
	if v == nil {
		t.Fatalf("the answer has no %s", name)
	}
	return *v
}

// settledState polls the admin API until the client holds no reservation
// in the zone, which happens once its running call has noticed its client
// left and settled, and returns that state.
func settledState(t *testing.T, zone, escapedKey string) adminapi.KeyState {
	t.Helper()
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		s := adminState(t, zone, escapedKey)
		if figure(t, "reserved", s.Reserved) == 0 {
			return s
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("%s still holds %d reserved a minute after its call's client left", zone, *s.Reserved)
		}
	}
}

// statusLine runs caddy sliding-ratelimit status and returns what it
// printed below its table ("" for nothing).
func statusLine(t *testing.T, zone, key string) string {
	t.Helper()
	out, err := runCommand(t, "status", "--zone", zone, "--key", key, "--address", "localhost:2999")
	if err != nil {
		t.Fatal(err)
	}
	_, below, _ := strings.Cut(strings.TrimSpace(out), "\n\n")
	return below
}

// TestBudgetFigures: the command writes dollars to the µ$ and counts with
// their thousands apart, signs included.
func TestBudgetFigures(t *testing.T) {
	for _, c := range []struct {
		n                int64
		dollars, grouped string
	}{
		{0, "$0.000000", "0"},
		{1, "$0.000001", "1"},
		{999, "$0.000999", "999"},
		{1000, "$0.001000", "1,000"},
		{4_500_000, "$4.500000", "4,500,000"},
		{-1_234_567, "-$1.234567", "-1,234,567"},
	} {
		if got := dollars(c.n); got != c.dollars {
			t.Errorf("dollars(%d) = %q, want %q", c.n, got, c.dollars)
		}
		if got := grouped(c.n); got != c.grouped {
			t.Errorf("grouped(%d) = %q, want %q", c.n, got, c.grouped)
		}
	}
}
