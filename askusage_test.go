package slidingratelimit

import (
	"fmt"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmtest"
)

// TestAIGatewayAsksForUsage: through the recipe on two instances, the
// official OpenAI SDK streams chat completions without include_usage and
// sees what it sees straight from the upstream (the same text and
// choices, no usage chunk), while the gateway asked for the usage and
// charged it exactly, input the body does not carry (an image by URL, say)
// included; a client that asks gets its usage chunk as before.
func TestAIGatewayAsksForUsage(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	instances := startRecipe(t, api.Addr(), 9920)
	for i, c := range []sdkCall{
		{API: "chat", Stream: true, MaxTokens: 300},
		{API: "chat", Stream: true, MaxTokens: 200, N: 3},
		{API: "chat", Stream: true, MaxTokens: 300, Headers: map[string]string{llmtest.HeaderInputByReference: "40000"}},
		{API: "chat", Stream: true, MaxTokens: 100, ExtraBody: `{"stream_options":{"include_usage":false}}`},
		{API: "chat", Stream: true, IncludeUsage: true, MaxTokens: 300},
	} {
		name := fmt.Sprintf("n=%d include_usage=%v %v %s", c.N, c.IncludeUsage, c.Headers, c.ExtraBody)
		c.Content = "Tell me a story"
		direct := c
		direct.BaseURL, direct.APIKey = api.URL(), fmt.Sprintf("sk-direct-%d", i)
		want := runOne(t, direct)
		c.BaseURL, c.APIKey = instances[i%2], fmt.Sprintf("sk-ask-%d", i)
		got := runOne(t, c)
		if got.Status != 200 || want.Status != 200 || got.Error != "" {
			t.Fatalf("%s: status %d (%s %s), %d straight", name, got.Status, got.Error, got.Message, want.Status)
		}
		if got.Text != want.Text || got.Choices != want.Choices || got.Final != want.Final || got.Tokens != want.Tokens || string(got.Usage) != string(want.Usage) {
			t.Errorf("%s: the SDK saw %q, %d choices, final usage %v %s; straight from the upstream %q, %d choices, final usage %v %s",
				name, got.Text, got.Choices, got.Final, got.Usage, want.Text, want.Choices, want.Final, want.Usage)
		}
		if got.Final != c.IncludeUsage {
			t.Errorf("%s: the SDK saw a final usage: %v", name, got.Final)
		}
		key := "Bearer " + c.APIKey
		used := api.Used(key)
		if reported := api.Reported(key); reported != used || used == 0 {
			t.Errorf("%s: the upstream reported %d of %d used: it was not asked for the usage", name, reported, used)
		}
		if charged := unitsUsed(t, "tokens", key, used); charged != used {
			t.Errorf("%s: %d tokens charged for %d used", name, charged, used)
		}
	}
}
