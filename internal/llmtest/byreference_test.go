package llmtest

import (
	"strings"
	"testing"
)

// TestInputByReference: the knob bills input the body does not carry, as
// used and as reported: in Anthropic's message_start, before any output,
// and in its final usage.
func TestInputByReference(t *testing.T) {
	u := Start(t)
	body := `{"model":"claude-x","max_tokens":20,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	status, _, b, err := post(t, u, "/v1/messages", "k", body, map[string]string{HeaderInputByReference: "50000"})
	events := readSSE(t, b, "\n")
	if status != 200 || err != nil || len(events) == 0 || events[0].name != "message_start" {
		t.Fatalf("%d %v %s", status, err, b)
	}
	if !strings.Contains(string(events[0].data), `"input_tokens":50002`) {
		t.Errorf("message_start %s, want 50002 input tokens (2 of the body, 50000 by reference)", events[0].data)
	}
	calls := u.Calls("Bearer k")
	if len(calls) != 1 || calls[0].InputTokens != 50002 || calls[0].Used != 50002+calls[0].OutputTokens || calls[0].Reported != calls[0].Used {
		t.Errorf("calls %+v, want 50002 input tokens used and reported", calls)
	}
}
