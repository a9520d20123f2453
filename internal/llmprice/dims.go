package llmprice

import (
	"math/bits"
	"slices"
)

// The dimensions a call is billed in, and how a call's usage is priced in
// them: each kind of token at its own rate, the whole call at a context
// tier's rates when its prompt is above the tier's threshold, at the rates
// of the service tier the response says served it, plus a fee per server
// tool use. What the prices cannot price is charged at the dearest rate
// they list, and said (Missed), never free.

// Dim is a kind of token a price sheet has a rate for.
type Dim uint8

const (
	// Input is fresh text input: neither audio, nor read from a cache,
	// nor written to one.
	Input Dim = iota
	// Cached is input read from a cache.
	Cached
	// CacheWrite is input written to a cache that keeps it 5 minutes
	// (Anthropic's default), or to a cache of no stated TTL.
	CacheWrite
	// CacheWrite1h is input written to a cache that keeps it an hour.
	CacheWrite1h
	// Output is text output, reasoning included.
	Output
	// AudioInput and AudioOutput are audio tokens.
	AudioInput
	AudioOutput
	// NumDims is how many there are.
	NumDims
)

// DimNames are the dimensions' names, as metrics and price lines say them.
var DimNames = [NumDims]string{"input", "cached", "cache_write", "cache_write_1h", "output", "audio_input", "audio_output"}

// Unlisted is the rate of a dimension a sheet does not list.
const Unlisted int64 = -1

// Sheet is a rate per dimension, in pico-dollars per token (a millionth of
// a dollar per million tokens), Unlisted where the prices say nothing.
type Sheet [NumDims]int64

// Blank is a sheet that lists nothing.
func Blank() Sheet {
	var s Sheet
	for i := range s {
		s[i] = Unlisted
	}
	return s
}

// Service is the service tier a response says served it.
type Service uint8

const (
	// Unreported: the response does not say; priced at the dearest of
	// the tiers listed.
	Unreported Service = iota
	// Standard is OpenAI's "default" (or "auto"), Anthropic's "standard".
	Standard
	// Priority is OpenAI's and Anthropic's "priority".
	Priority
	// Flex is OpenAI's "flex": priced at its rates where listed, else at
	// the standard ones (never less than the bill).
	Flex
	// Batch is Anthropic's "batch": priced at the standard rates.
	Batch
	// OtherService is a tier the prices do not know ("scale", a new one):
	// the dearest rates of the model.
	OtherService
)

// Tier is the rates that apply to a call of a service whose prompt is
// above Above tokens (0: any prompt).
type Tier struct {
	Service Service // Standard, Priority or Flex
	Above   int64
	Sheet
}

// Prices are everything a table or a price line says one model costs.
type Prices struct {
	// Tiers lists, for each service and threshold it prices, its sheet;
	// the Standard sheet above 0 lists at least Input and Output.
	Tiers []Tier
	// WebSearch is the fee of one web search a server tool made, in
	// pico-dollars; Unlisted where the prices do not say.
	WebSearch int64
}

// Usage is what one call used, each token in one dimension only.
type Usage struct {
	Tokens Sheet
	// Unknown are tokens of the vendor's own total that no dimension
	// holds: priced at the dearest rate, since what they are is not
	// known.
	Unknown int64
	// Prompt is the whole prompt (fresh, cached and cache-written input),
	// which picks the context tier.
	Prompt int64
	// WebSearches is how many web searches a server tool made.
	WebSearches int64
	Service     Service
}

// Missed says what of a call its prices could not price: a bit per Dim,
// and the bits MissedService and MissedWebSearch.
type Missed uint16

const (
	MissedService   Missed = 1 << NumDims
	MissedWebSearch Missed = 1 << (NumDims + 1)
)

// Names are the missed dimensions' names (a Dim's, "service_tier",
// "web_search").
func (m Missed) Names() []string {
	var names []string
	for d := range NumDims {
		if m&(1<<d) != 0 {
			names = append(names, DimNames[d])
		}
	}
	if m&MissedService != 0 {
		names = append(names, "service_tier")
	}
	if m&MissedWebSearch != 0 {
		names = append(names, "web_search")
	}
	return names
}

// Dearest is the dearest rate per token the prices list.
func (p *Prices) Dearest() int64 {
	var d int64
	for _, t := range p.Tiers {
		d = max(d, slices.Max(t.Sheet[:]))
	}
	return d
}

// Lists reports whether any of the prices' sheets lists a rate of d.
func (p *Prices) Lists(d Dim) bool {
	return slices.ContainsFunc(p.Tiers, func(t Tier) bool { return t.Sheet[d] != Unlisted })
}

// rate is the rate of d for a call of service s whose prompt has n tokens:
// the sheet of s with the highest threshold below n that lists d; false
// when no sheet of s lists d.
func (p *Prices) rate(s Service, d Dim, n int64) (int64, bool) {
	best, above := Unlisted, int64(-1)
	for _, t := range p.Tiers {
		if t.Service == s && t.Sheet[d] != Unlisted && t.Above < max(n, 1) && t.Above > above {
			best, above = t.Sheet[d], t.Above
		}
	}
	return best, best != Unlisted
}

// hasService reports whether the prices list any rate of service s.
func (p *Prices) hasService(s Service) bool {
	return slices.ContainsFunc(p.Tiers, func(t Tier) bool { return t.Service == s })
}

// Charge is, in µ$ rounded up, what u cost at these prices, and what of it
// they could not price (charged at the dearest rate they list, or at
// searchFee per search, the dearest fee known, for an unpriced search).
func (p *Prices) Charge(u Usage, searchFee int64) (int64, Missed) {
	var sum Sum
	var missed Missed
	dearest := p.Dearest()
	service := u.Service
	if service == Priority && !p.hasService(Priority) || service == OtherService {
		missed |= MissedService
	}
	for d := range NumDims {
		n := u.Tokens[d]
		if n <= 0 {
			continue
		}
		r, ok := p.rate(Standard, d, u.Prompt)
		if !ok && (d == Cached) {
			// A cache read the prices do not list costs what fresh input
			// does: never less.
			r, ok = p.rate(Standard, Input, u.Prompt)
		}
		switch service {
		case Unreported:
			if pr, listed := p.rate(Priority, d, u.Prompt); listed {
				r = max(r, pr)
			}
		case Priority:
			pr, listed := p.rate(Priority, d, u.Prompt)
			r = max(r, pr)
			if !listed {
				r = dearest
				missed |= MissedService
			}
		case Flex:
			if fr, listed := p.rate(Flex, d, u.Prompt); listed && ok {
				r = fr
			}
		case OtherService:
			r = dearest
		}
		if !ok {
			r = dearest
			missed |= 1 << d
		}
		sum.Add(n, r)
	}
	sum.Add(u.Unknown, dearest)
	if u.WebSearches > 0 {
		fee := p.WebSearch
		if fee == Unlisted {
			fee = searchFee
			missed |= MissedWebSearch
		}
		sum.Add(u.WebSearches, fee)
	}
	return sum.Micros(), missed
}

// MaxMicros is the most a Sum says: 2^53 µ$, the largest cost the
// limiter takes.
const MaxMicros = 1 << 53

// Sum adds tokens × pico-dollars in 128 bits: tokens are at most 2^53 and
// a price at most 10^12 (a search fee 10^15), so no product nor sum of a
// few overflows.
type Sum struct{ hi, lo uint64 }

// Add adds n at rate pico each.
func (s *Sum) Add(n, pico int64) {
	if n <= 0 || pico <= 0 {
		return
	}
	hi, lo := bits.Mul64(uint64(n), uint64(pico))
	var carry uint64
	s.lo, carry = bits.Add64(s.lo, lo, 0)
	s.hi += hi + carry
}

// Micros is the sum in µ$, rounded up, at most MaxMicros.
func (s Sum) Micros() int64 {
	const perMicro = 1_000_000
	if s.hi >= perMicro {
		return MaxMicros
	}
	q, rem := bits.Div64(s.hi, s.lo, perMicro)
	if rem > 0 {
		q++
	}
	return int64(min(q, uint64(MaxMicros)))
}
