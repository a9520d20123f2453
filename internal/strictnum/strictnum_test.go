package strictnum

import "testing"

func TestParseCount(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"7", 7, true},
		{"007", 7, true},
		{"9007199254740992", Max, true},
		{"9007199254740993", Max, true},
		{"99999999999999999999", Max, true},
		{"", 0, false},
		{"-5", 0, false},
		{"+5", 0, false},
		{" 5", 0, false},
		{"5 ", 0, false},
		{"1e9", 0, false},
		{"5.0", 0, false},
		{"0x10", 0, false},
		{"NaN", 0, false},
		{"5,7", 0, false},
		{"٥", 0, false},
	} {
		if n, ok := Parse(c.in); n != c.want || ok != c.ok {
			t.Errorf("Parse(%q) = %d, %v; want %d, %v", c.in, n, ok, c.want, c.ok)
		}
	}
}
