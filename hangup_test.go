package slidingratelimit

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmtest"
)

// hangUp posts body to url as key's call, reads events of its event
// stream (blank-line ended) and hangs up after the given number of them (-1:
// reads it all). It returns the status and the events read.
func hangUp(t *testing.T, url, key, body string, headers map[string]string, events int) (int, int) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	// A connection of its own, closed with the body: a hang-up.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, 0
	}
	read := 0
	lines := bufio.NewReader(resp.Body)
	for events < 0 || read < events {
		line, err := lines.ReadString('\n')
		if strings.TrimRight(line, "\r\n") == "" && line != "" {
			read++
		}
		if err != nil {
			break
		}
	}
	return resp.StatusCode, read
}

// TestAIGatewayHangUps: through the recipe on two instances, clients that
// hang up after every event of a stream, in front of an upstream that
// bills input the body does not carry (reported from Anthropic's
// message_start and in Gemini's running totals), are each charged at least
// what the upstream used: what the stream reported so far plus the call's
// output bound, the reservation when it reported nothing. An OpenAI chat
// stream reports its usage last, so a hang-up before it pays the
// reservation, which bounds what a call whose input is in its body uses.
func TestAIGatewayHangUps(t *testing.T) {
	api := llmtest.Start(t)
	instances := startRecipe(t, api.Addr(), 9960)
	const byReference = 50000
	ref := map[string]string{llmtest.HeaderInputByReference: fmt.Sprint(byReference), llmtest.HeaderPause: "30ms"}
	paced := map[string]string{llmtest.HeaderPause: "30ms"}
	type stream struct {
		name, path, body string
		headers          map[string]string
		bound            int64
		// reportsFirst is whether the first event reports the input.
		reportsFirst bool
	}
	streams := []stream{
		{"anthropic", "/v1/messages", `{"model":"claude-x","max_tokens":300,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"Summarise the document"}]}]}`,
			ref, 300, true},
		{"gemini", "/v1beta/models/gemini-x:streamGenerateContent?alt=sse", `{"contents":[{"role":"user","parts":[{"text":"Summarise the document"}]}],"generationConfig":{"maxOutputTokens":300}}`,
			ref, 300, true},
		{"openai chat without include_usage", "/v1/chat/completions", `{"model":"chat-model-mini","max_tokens":300,"n":2,"stream":true,"messages":[{"role":"user","content":"Tell me a story"}]}`,
			paced, 600, false},
	}
	for _, s := range streams {
		// The events of the whole stream, straight from the upstream.
		_, events := hangUp(t, api.URL()+s.path, "sk-count-"+s.name, s.body, nil, -1)
		if events < 3 {
			t.Fatalf("%s: %d events", s.name, events)
		}
		for after := 1; after <= events; after++ {
			key := fmt.Sprintf("sk-hangup-%s-%d", strings.ReplaceAll(s.name, " ", "-"), after)
			status, read := hangUp(t, instances[after%2]+s.path, key, s.body, s.headers, after)
			if status != http.StatusOK || read != after {
				t.Fatalf("%s, after %d events: status %d, %d events read", s.name, after, status, read)
			}
			used := api.Used("Bearer " + key)
			charged := unitsUsed(t, "tokens", "Bearer "+key, used)
			if charged < used || used == 0 {
				t.Errorf("%s, hung up after %d of %d events: %d tokens charged for %d used", s.name, after, events, charged, used)
			}
			// Not far above either: the input reported, the body's bytes
			// and the output bound.
			calls := api.Calls("Bearer " + key)
			if len(calls) != 1 {
				t.Fatalf("%s: %d calls", s.name, len(calls))
			}
			if most := calls[0].InputTokens + calls[0].BodyBytes + s.bound; charged > most {
				t.Errorf("%s, hung up after %d events: %d tokens charged, more than the %d input, %d body bytes and %d output bound", s.name, after, charged, calls[0].InputTokens, calls[0].BodyBytes, s.bound)
			}
			if s.reportsFirst && charged < byReference+s.bound {
				t.Errorf("%s, hung up after %d events: %d tokens charged, want the %d input reported and the %d output bound", s.name, after, charged, byReference, s.bound)
			}
		}
	}
}

// TestAIGatewayHangUpFleet: forty Anthropic streams, from a client on each
// of two instances, each billed 20,000 input tokens the body does not
// carry and hung up on once message_start reported them: the tokens zone
// refuses the key once what they reported fills the budget (before, each
// paid its reservation, a few hundred tokens, and only calls stopped
// them), no call is charged less than it used, and the tokens used in a
// window pass the budget by at most what the calls in flight used. A
// client that hangs up sends its next call while Caddy is still ending the
// last one (its settle comes once reverse_proxy has seen the hang-up), so
// what is in flight is what the recipe's inflight zone (2) bounds, not
// what the client waits for.
func TestAIGatewayHangUpFleet(t *testing.T) {
	api := llmtest.Start(t)
	instances := startRecipe(t, api.Addr(), 9980)
	const byReference, clients, each = 20000, 2, 20
	body := `{"model":"claude-x","max_tokens":300,"stream":true,"messages":[{"role":"user","content":"Summarise the document"}]}`
	headers := map[string]string{llmtest.HeaderInputByReference: fmt.Sprint(byReference), llmtest.HeaderPause: "20ms"}
	statuses := make([]int, clients*each)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				statuses[c*each+i], _ = hangUp(t, instances[c%2]+"/v1/messages", "sk-hangup-fleet", body, headers, 1)
			}
		}()
	}
	wg.Wait()
	admitted, refused := 0, 0
	for _, s := range statuses {
		switch s {
		case http.StatusOK:
			admitted++
		case http.StatusTooManyRequests:
			refused++
		default:
			t.Errorf("status %d", s)
		}
	}
	key := "Bearer sk-hangup-fleet"
	used := api.Used(key)
	perCall := used / int64(max(admitted, 1))
	const inflight = 2
	if most := api.MostInWindow(key, time.Minute); most > 100000+inflight*perCall {
		t.Errorf("%d tokens used in one window: want at most the budget, 100,000, and the %d calls in flight (%d each)", most, inflight, perCall)
	}
	if charged := unitsUsed(t, "tokens", key, used); used <= 100000 && charged < used {
		t.Errorf("%d tokens charged for %d used", charged, used)
	}
	if admitted == 0 || admitted > 100000/byReference+inflight {
		t.Errorf("%d calls admitted of %d: want the tokens zone to stop them after about %d", admitted, clients*each, 100000/byReference)
	}
	t.Logf("%d admitted, %d refused, %d tokens used", admitted, refused, used)
}

// TestSpendHangUps: in the spend recipe, a client that hangs up on an
// Anthropic stream once message_start reported input the body does not
// carry, and cache reads, pays that usage at its prices, the output at the
// call's bound: what the upstream billed, to the µ$.
func TestSpendHangUps(t *testing.T) {
	api := llmtest.Start(t)
	instances := startSpendRecipe(t, api.Addr(), 9900)
	body := `{"model":"claude-sonnet-4","max_tokens":300,"stream":true,"messages":[{"role":"user","content":"Summarise the document"}]}`
	headers := map[string]string{llmtest.HeaderInputByReference: "50000", llmtest.HeaderCacheRead: "3000", llmtest.HeaderPause: "30ms"}
	for i := range 2 {
		key := fmt.Sprintf("sk-acme-hangup-%d", i)
		if status, read := hangUp(t, instances[i]+"/v1/messages", key, body, headers, 1+3*i); status != http.StatusOK || read != 1+3*i {
			t.Fatalf("status %d, %d events read", status, read)
		}
		served := api.Calls("Bearer " + key)
		if len(served) != 1 {
			t.Fatalf("%d calls served", len(served))
		}
		want := priced(served[0], "messages", 3000, 0)
		if got := unitsUsed(t, "spend", "Bearer "+key, want); got != want {
			t.Errorf("hung up after %d events: %d µ$ charged, want the %d µ$ the call cost", 1+3*i, got, want)
		}
	}
}

// TestSettleLLMFixedCostHangUp: in a zone whose cost is fixed (no cost llm,
// so no output bound is known), a client that hangs up once message_start
// reported input the body does not carry pays that input, its output so
// far and the bytes streamed since, far above its reservation of 10.
func TestSettleLLMFixedCostHangUp(t *testing.T) {
	api := llmtest.Start(t)
	zone := uniqueZone("fixedllm")
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		zone `+zone+` 1m 1000000 {
			key {http.request.header.Authorization}
			cost 10
			settle llm
		}
	}
	reverse_proxy `+api.Addr()))
	body := `{"model":"claude-x","max_tokens":300,"stream":true,"messages":[{"role":"user","content":"Summarise the document"}]}`
	headers := map[string]string{llmtest.HeaderInputByReference: "50000", llmtest.HeaderPause: "30ms"}
	if status, read := hangUp(t, site+"v1/messages", "sk-fixed", body, headers, 1); status != http.StatusOK || read != 1 {
		t.Fatalf("status %d, %d events read", status, read)
	}
	calls := api.Calls("Bearer sk-fixed")
	if len(calls) != 1 {
		t.Fatalf("%d calls", len(calls))
	}
	reported := calls[0].InputTokens + 1
	if got := unitsUsed(t, zone, "Bearer sk-fixed", reported); got <= reported || got > reported+64<<10 {
		t.Errorf("%d units charged, want the %d message_start reported and the bytes since (a few hundred)", got, reported)
	}
}
