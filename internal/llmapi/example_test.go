package llmapi_test

import (
	"fmt"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmapi"
)

// A gateway reserves what a call may spend before it goes upstream, then
// settles on the usage the response reports as it streams past.
func Example() {
	body := []byte(`{"model": "gpt-4o", "max_tokens": 1000, "n": 2, "messages": [{"role": "user", "content": "Hi"}]}`)
	req, err := llmapi.ReadRequest("/openai/v1/chat/completions", body, 4096)
	if err != nil {
		fmt.Println("refused:", err)
		return
	}
	fmt.Println(req.API, req.Model, req.Output, req.Input, req.Reserve)

	u := llmapi.NewUsageReader(req.API, "text/event-stream", "")
	for _, chunk := range []string{
		"data: {\"choices\": [{\"delta\": {\"content\": \"Hello\"}}], \"usage\": null}\n\n",
		"data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 9, \"completion_tokens\": 2, \"total_tokens\": 11, ",
		"\"prompt_tokens_details\": {\"cached_tokens\": 4}}}\n\ndata: [DONE]\n\n",
	} {
		u.Write([]byte(chunk))
	}
	usage, why := u.Usage()
	fmt.Printf("%+v total %d %q\n", usage, usage.Total(), why)
	// Output:
	// openai_chat gpt-4o 2000 96 2096
	// {Input:5 Cached:4 CacheWrite:0 Output:2 Reported:11 AudioInput:0 AudioOutput:0 CacheWrite1h:0 WebSearches:0 Service:} total 11 ""
}
