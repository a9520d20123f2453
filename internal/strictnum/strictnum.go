// Package strictnum reads the numbers that come with a request (a cost, a
// tenant's quota) or with its response (the usage an upstream reports)
// strictly: base-10 ASCII digits and nothing else. "+5", "5.0", "1e9",
// "0x10", " 5" and "NaN" are not numbers here, so a value never means
// something other than what it shows. It also names why a value was not
// one, in the words the logs use.
package strictnum

// Max is what Parse saturates at: the largest cost the engine takes (2^53),
// above any max_requests (at most 2^48-1), so a number too large for an
// int64 is still a number above every budget.
const Max = 1 << 53

// Parse reads s as a whole number: digits only, at least one. A number
// above Max is Max.
func Parse(s string) (n int64, ok bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n < Max {
			n = n*10 + int64(c-'0')
		}
	}
	return min(n, Max), true
}

// Why a value fell back, as logs say it (never the value itself, which may
// hold anything).
const (
	Missing  = "missing"
	NotWhole = "not a whole number"
	Zero     = "zero"
	TooLarge = "too large"
)

// WhyNot says why value is no whole number of at least 1.
func WhyNot(value string) string {
	if value == "" {
		return Missing
	}
	if _, ok := Parse(value); ok {
		return Zero
	}
	return NotWhole
}
