package llmapi

import (
	"bytes"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
)

// Request is what a request may spend, read from its URL path and body.
type Request struct {
	// API is the API the path names.
	API API
	// Model is the body's top-level "model" (for Gemini and Bedrock, the
	// path's model, unescaped); "" when none is named, or when the body
	// names different ones under keys that fold to "model" (servers differ
	// on which they take).
	Model string
	// Named is true when the body names an output bound (or the API
	// generates nothing); false when the default was taken.
	Named bool
	// Output is the output bound (named, or the default), plus its addends,
	// times the largest multiplier (at least 1) and the prompts: Bound x
	// Completions + Batch.
	Output int64
	// Bound is the output bound of one completion, with its addends;
	// Completions how many the call generates (multiplier x prompts);
	// Batch the output and media bounds of a batch's requests.
	Bound, Completions, Batch int64
	// Input is the input bound: the body's bytes.
	Input int64
	// Media is what the body's parts bill beyond their bytes: each image
	// at the most its API bills for one, and the tokens a vendor adds (a
	// tool-use system prompt).
	Media int64
	// Reserve is Output + Input + Media: the most the call can spend.
	Reserve int64
	// Unbounded says, when not "", what the body holds that no bound
	// covers: input by reference (a file, an earlier response, a cache), a
	// hosted tool, a part type, a field or a path the package does not
	// know. Reserve then counts only the parts it could bound.
	Unbounded string
	// Searches is the most searches the body's server tools may bill a
	// fee for: Anthropic's web search tool's max_uses, the Responses
	// API's max_tool_calls for its web search tools; 0 without such a
	// tool. A search tool's results are input the body does not carry, so
	// such a body is also Unbounded.
	Searches int64
	// SearchesUnbounded says, when not "", which search tool's searches
	// nothing in the body bounds (a web search tool without max_uses,
	// Gemini's grounding): Searches then counts only the bounded ones.
	SearchesUnbounded string
	// Passes bounds how many times the call reads its context, each time
	// at most the model's context window: 1, plus one after each search
	// (a server tool's round); 0 when the body holds what may read it
	// more (a server tool that runs rounds no field bounds, a batch, a
	// field or type the reader does not know).
	Passes int64
}

// ReportsSearches reports whether the API's usage says how many searches
// its server tools made (Anthropic's server_tool_use.web_search_requests);
// of the others, only the request says how many it may make.
func (a API) ReportsSearches() bool {
	for _, f := range tables[a].usage {
		if f.kind == webSearches {
			return true
		}
	}
	return false
}

// noAPI is what cannot be bounded of a body sent to a path of no API this
// package knows.
const noAPI = "the path names no API whose calls the limiter can bound"

// ReadRequest reads what the request to the URL path (escaped, see
// Detect) with the JSON body may spend, the output bound being
// defaultOutput when the body names none. An empty body names nothing and
// is no error. Every number saturates at strictnum.Max.
//
// How each value at a named place counts (so that no spelling reserves
// less than a lenient server generates):
//   - a number, or a string holding one ("1000", 1e3, 1000.0): that
//     number, a fraction rounded up, a huge one saturated; of duplicate
//     keys (any spelling that folds to the name, at any level of the path)
//     the largest;
//   - null, absent: not named;
//   - an output bound or addend of 0, negative, or not a number (a word, a
//     bool, an object, an array): not named, so the default applies (servers
//     refuse these, or read 0 and -1 as "no limit": Ollama's num_predict,
//     llama.cpp's n_predict);
//   - a multiplier of 0, negative, or not a number: 1 (servers refuse it,
//     or read 0 as unset, as proto does candidateCount).
//
// Then every part of the body is read by the API's shapes, a closed world:
// each known media part adds the most its vendor bills for one, a prompt
// list multiplies the output bound, a batch's requests add up, and what
// cannot be bounded is named in Unbounded.
func ReadRequest(path string, body []byte, defaultOutput int64) (Request, error) {
	api, model := detect(path)
	return readRequest(api, model, body, defaultOutput)
}

// readRequest is ReadRequest of api's request, the path naming model.
func readRequest(api API, model string, body []byte, defaultOutput int64) (Request, error) {
	t := tables[api]
	r := Request{API: api, Model: model, Input: min(int64(len(body)), strictnum.Max)}
	places := requestPlaces[api]
	w := walker{data: body, places: places}
	if err := w.walk(); err != nil {
		return Request{API: api, Model: model}, err
	}
	if !t.modelInPath && !w.modelMixed {
		r.Model = w.model
	}
	var bound, multiplier int64 = 0, 1
	for i, p := range places {
		v := w.vals[i]
		switch {
		case !v.Found || v.N == 0:
		case p.role == roleOutput:
			bound, r.Named = max(bound, v.N), true
		case p.role == roleMultiplier:
			multiplier = max(multiplier, v.N)
		}
	}
	switch {
	case t.generatesNothing:
		bound, r.Named = 0, true
	case !r.Named:
		bound = min(max(defaultOutput, 0), strictnum.Max)
	}
	for i, p := range places {
		if v := w.vals[i]; p.role == roleAddend && v.Found {
			bound = addSat(bound, v.N)
		}
	}
	b := bounder{w: walker{data: body}, api: api, model: r.Model, defaultOutput: defaultOutput}
	if len(bytes.TrimSpace(body)) > 0 {
		if t.body == nil {
			r.Unbounded = noAPI
		} else if err := b.walk(t.body); err != nil {
			return Request{API: api, Model: model}, err
		} else {
			r.Unbounded = b.why
		}
	}
	r.Searches, r.SearchesUnbounded = b.searches, b.searchWhy
	repeats := b.repeats || r.Unbounded == noAPI || len(b.batch) > 0
	if b.searchToolsWithout > 0 {
		var calls []Value
		if t.toolCalls != "" {
			calls, _ = ReadPaths(body, [][]string{{t.toolCalls}})
		}
		if len(calls) == 1 && calls[0].Found && calls[0].N > 0 && !calls[0].Odd {
			// Every tool's calls count within it: the searches of
			// all the tools together are at most it.
			r.Searches = addSat(r.Searches, calls[0].N)
		} else if r.SearchesUnbounded == "" {
			r.SearchesUnbounded = "a web search tool without max_tool_calls: nothing bounds how many searches it bills"
		}
	}
	r.Bound, r.Completions = bound, mulSat(multiplier, max(b.prompts, 1))
	r.Output = mulSat(r.Bound, r.Completions)
	for _, n := range b.batch {
		one, err := readRequest(n.api, r.Model, body[n.start:n.end], defaultOutput)
		switch {
		case err != nil:
			return Request{API: api, Model: model}, err
		case one.Unbounded != "" && r.Unbounded == "":
			r.Unbounded = "a batch's request: " + one.Unbounded
		}
		if one.SearchesUnbounded != "" && r.SearchesUnbounded == "" {
			r.SearchesUnbounded = "a batch's request: " + one.SearchesUnbounded
		}
		r.Searches = addSat(r.Searches, one.Searches)
		r.Batch = addSat(r.Batch, addSat(one.Output, one.Media))
	}
	r.Output = addSat(r.Output, r.Batch)
	if !repeats && r.SearchesUnbounded == "" {
		r.Passes = addSat(r.Searches, 1)
	}
	if b.images > 0 {
		r.Media = mulSat(b.images, imageTokens(api, r.Model))
	}
	r.Media = addSat(r.Media, b.adds)
	r.Reserve = addSat(addSat(r.Output, r.Input), r.Media)
	return r, nil
}

// requestPlaces are the places each API's request is read at, by API.
var requestPlaces = func() (all [len(tables)][]place) {
	for api, t := range tables {
		add := func(ps []reqPath, r role) {
			for _, p := range ps {
				pl := place{role: r}
				for _, seg := range p {
					var spellings [][]byte
					for _, s := range seg {
						spellings = append(spellings, []byte(s))
					}
					pl.path = append(pl.path, spellings)
				}
				all[api] = append(all[api], pl)
			}
		}
		add(t.output, roleOutput)
		add(t.multipliers, roleMultiplier)
		add(t.addends, roleAddend)
		if !t.modelInPath {
			add(paths("model"), roleModel)
		}
		if len(all[api]) > 64 {
			panic("llmapi: more than 64 places in the table of " + t.name)
		}
	}
	return all
}()
