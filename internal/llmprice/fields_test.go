package llmprice

import "testing"

// TestFieldRate: LiteLLM's field names, each to its dimension, service
// tier and context threshold, or to none.
func TestFieldRate(t *testing.T) {
	type want struct {
		d     Dim
		s     Service
		above int64
		ok    bool
	}
	for field, w := range map[string]want{
		"input_cost_per_token":                                        {Input, Standard, 0, true},
		"input_cost_per_audio_token":                                  {AudioInput, Standard, 0, true},
		"output_cost_per_audio_token":                                 {AudioOutput, Standard, 0, true},
		"output_cost_per_reasoning_token":                             {Output, Standard, 0, true},
		"cache_read_input_token_cost_priority":                        {Cached, Priority, 0, true},
		"cache_creation_input_token_cost_above_1hr":                   {CacheWrite1h, Standard, 0, true},
		"cache_creation_input_token_cost_above_1hr_above_200k_tokens": {CacheWrite1h, Standard, 200_000, true},
		"input_cost_per_token_above_272k_tokens_priority":             {Input, Priority, 272_000, true},
		"output_cost_per_token_above_128k_tokens":                     {Output, Standard, 128_000, true},
		"output_cost_per_token_flex":                                  {Output, Flex, 0, true},
		"input_cost_per_token_batches":                                {},
		"cache_read_input_audio_token_cost":                           {},
		"output_cost_per_token_above_1hr":                             {},
		"input_cost_per_token_above_xk_tokens":                        {},
		"input_cost_per_image_token":                                  {},
		"input_cost_per_character":                                    {},
	} {
		d, s, above, ok := fieldRate(field)
		if got := (want{d, s, above, ok}); got != w && (ok || w.ok) {
			t.Errorf("%s: %+v, want %+v", field, got, w)
		}
	}
}
