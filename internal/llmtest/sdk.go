package llmtest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The official SDKs run through testdata/llmsdk/client.mjs: a test gives it
// a plan of calls and reads what each got.

// SDKPackages are the SDKs client.mjs imports.
var SDKPackages = []string{"openai", "@anthropic-ai/sdk", "@google/genai", "ollama", "@aws-sdk/client-bedrock-runtime", "@smithy/node-http-handler"}

// SDKCall is one call of client.mjs's plan (its fields are documented
// there).
type SDKCall struct {
	API            string            `json:"api"`
	BaseURL        string            `json:"baseURL"`
	APIKey         string            `json:"apiKey"`
	Model          string            `json:"model,omitempty"`
	Stream         bool              `json:"stream"`
	IncludeUsage   bool              `json:"includeUsage"`
	MaxTokens      int64             `json:"maxTokens"`
	N              int64             `json:"n,omitempty"`
	BestOf         int64             `json:"bestOf,omitempty"`
	CandidateCount int64             `json:"candidateCount,omitempty"`
	Content        string            `json:"content"`
	Drop           bool              `json:"drop"`
	Headers        map[string]string `json:"headers,omitempty"`
	// ExtraBody is put at the end of the body's top-level object: an
	// object, or a JSON text, which may repeat keys.
	ExtraBody any `json:"extraBody,omitempty"`
	// Parts, when set, is the user message's content in place of Content
	// (content parts: images, files; Completions' prompt list), and Params
	// more of the SDK's parameters (previous_response_id, tools).
	Parts  any            `json:"parts,omitempty"`
	Params map[string]any `json:"params,omitempty"`
	HTTP2  bool           `json:"http2,omitempty"`
	SigV4  bool           `json:"sigv4,omitempty"`
	// DefaultRetries leaves the OpenAI and Anthropic clients at their
	// SDK's default retries, rather than none.
	DefaultRetries bool `json:"defaultRetries,omitempty"`
	// WithinMs gives the call up after that many milliseconds (status -1,
	// error "TimedOut"); 0: never.
	WithinMs int64 `json:"withinMs,omitempty"`
}

// SDKResult is what one call got, as the SDK saw it.
type SDKResult struct {
	Status          int             `json:"status"`
	RetryAfter      string          `json:"retryAfter"`
	RateLimit       string          `json:"rateLimit"`
	RateLimitPolicy string          `json:"rateLimitPolicy"`
	Tokens          int64           `json:"tokens"`
	Final           bool            `json:"final"`
	Text            string          `json:"text"`
	Choices         int             `json:"choices"`
	Usage           json.RawMessage `json:"usage"`
	// SDKHeaders are the vendors' limit and retry headers of the last
	// response, by lower-case name.
	SDKHeaders map[string]string `json:"sdkHeaders"`
	Error      string            `json:"error"`
	// ErrorType is the error's type as its body says (OpenAI's
	// "type/code", Anthropic's error.type).
	ErrorType string `json:"errorType"`
	Message   string `json:"message"`
	// Ms is how long the call took, retries and sleeps included.
	Ms int64 `json:"ms"`
}

// NeedSDKs makes sure node and the SDKs are installed in dir (the folder
// of client.mjs): it fails the test in CI (CI=true) when they are not, and
// skips it elsewhere, saying how to get them.
func NeedSDKs(t testing.TB, dir string) {
	t.Helper()
	missing := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...) + ": run scripts/ensure-node-sdks.sh (make test does)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if _, err := exec.LookPath("node"); err != nil {
		missing("node is not installed")
	}
	for _, pkg := range SDKPackages {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
			missing("the SDK %s is not installed in %s", pkg, dir)
		}
	}
}

// RunSDKs runs calls with the official SDKs through dir's client.mjs, in
// order or all at once.
func RunSDKs(t testing.TB, dir string, calls []SDKCall, parallel bool) []SDKResult {
	t.Helper()
	plan, err := json.Marshal(map[string]any{"calls": calls, "parallel": parallel})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", filepath.Join(dir, "client.mjs"), string(plan))
	cmd.Env = append(os.Environ(), "AWS_EC2_METADATA_DISABLED=true")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if e, ok := err.(*exec.ExitError); ok {
			stderr = e.Stderr
		}
		t.Fatalf("node client.mjs: %v\n%s", err, stderr)
	}
	var results []SDKResult
	if err := json.Unmarshal(out, &results); err != nil || len(results) != len(calls) {
		t.Fatalf("node client.mjs answered %q: %v", out, err)
	}
	return results
}
