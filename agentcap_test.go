package slidingratelimit

import (
	"strings"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmtest"
)

// TestAgentCallsServedUnderACap: a coding agent asks max_tokens 128000 on
// every call and writes a few thousand. Under a budget of 40,000 tokens an
// hour, each call alone would reserve more than the budget and be refused
// at once, while nothing was spent; with `cost llm cap 16000` each reserves
// at most 16,000, is served, and settles to what it used, so the agent
// makes call after call while what it used and the cap fit in the budget,
// through the official Anthropic SDK.
func TestAgentCallsServedUnderACap(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	for _, capped := range []bool{false, true} {
		t.Run(map[bool]string{false: "no cap", true: "cap 16000"}[capped], func(t *testing.T) {
			cost := "cost llm"
			if capped {
				cost = "cost llm cap 16000"
			}
			startCaddy(t, `:9080 {
	route {
		sliding_ratelimit {
			key {http.request.header.Authorization}
			zone agent_tokens 1h 40000 {
				`+cost+`
				settle llm
			}
			redis `+sharedRedis.URL()+`
			key_prefix `+uniquePrefix(t)+`
		}
		reverse_proxy `+api.Addr()+` {
			header_up -Accept-Encoding
		}
	}
}`)
			key := "sk-agent-" + strings.ReplaceAll(t.Name(), "/", "-")
			served, refused := 0, 0
			for range 12 {
				r := runOne(t, sdkCall{API: "messages", BaseURL: strings.TrimSuffix(site, "/"), APIKey: key, Model: "claude-sonnet-4-5",
					MaxTokens: 128000, Content: "Fix the failing test", Headers: map[string]string{llmtest.HeaderStop: "3000"}})
				switch r.Status {
				case 200:
					served++
				case 429:
					refused++
				default:
					t.Fatalf("status %d (%s %s)", r.Status, r.Error, r.Message)
				}
			}
			used := api.Used("Bearer " + key)
			t.Logf("%d of 12 agent calls served, %d refused, %d tokens used of a 40,000 budget", served, refused, used)
			if !capped {
				if served != 0 {
					t.Errorf("without a cap %d calls of 128,000 were served under a budget of 40,000, want none", served)
				}
				return
			}
			// Each reserves 16,000 and uses about 3,000: a call is served
			// while what the agent used and its 16,000 fit in 40,000, so
			// 8 are, and the first refused comes once the use passed 24,000.
			if served < 7 || used <= 40000-16000 {
				t.Errorf("with the cap %d of 12 calls were served using %d tokens: want each while its use and the cap fit in 40,000 (8 of about 3,000)", served, used)
			}
			if used > 40000 {
				t.Errorf("%d tokens used, over the budget of 40,000", used)
			}
			if charged := unitsUsed(t, "agent_tokens", "Bearer "+key, used); charged < used {
				t.Errorf("%d tokens charged for %d used", charged, used)
			}
		})
	}
}
