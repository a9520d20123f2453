// Package adminapi holds what the admin API of the sliding_ratelimit handler
// and the caddy sliding-ratelimit command share: the paths, the answers'
// wire types, and the command's client.
package adminapi

// Paths of the admin API.
const (
	KeyPath     = "/sliding_ratelimit/zones/{zone}/keys/{key}"
	BlockedPath = "/sliding_ratelimit/blocked"
)

// BlockedDefaultLimit is how many entries the blocked list has without
// ?limit: enough to see an attack, small enough to read.
const BlockedDefaultLimit = 100

// KeyState is the answer to GET: a client's state in a zone now.
type KeyState struct {
	Zone string `json:"zone"`
	// Identity names the zone's state: name, window, limit (the handler's zoneIdentity).
	Identity string `json:"identity"`
	// Key is the client key after normalisation, as stored.
	Key string `json:"key"`
	// Limit is the zone's max_requests; where each request's comes from a
	// placeholder (LimitFrom), the client's own: the max its last
	// admission was decided with, which the store keeps, or else the
	// fallback (LimitSource says which).
	Limit int64 `json:"limit"`
	// LimitFrom is the placeholder of a zone whose max_requests is each
	// tenant's own: Remaining and the times are then counted against Limit.
	LimitFrom string `json:"limit_from,omitempty"`
	// LimitSource is, with LimitFrom, "last_decision" when Limit is the max
	// of the client's last admission in the zone, or "fallback" when the
	// store does not know it (no admission kept; a counter or concurrency
	// zone; state written by a version that did not keep it).
	LimitSource   string  `json:"limit_source,omitempty"`
	WindowSeconds float64 `json:"window_seconds"`
	Algorithm     string  `json:"algorithm"`
	// Unit is what Limit, Count and Remaining count: "requests",
	// "content-bytes" (settle bytes), "units" (a cost, settle header),
	// "usd-micros" (millionths of a US dollar: a zone with prices) or
	// "concurrent-requests" (a concurrency zone).
	Unit string `json:"unit"`
	// Count is the units used in the window now, past Limit included (a
	// charge above a reservation); for the counter algorithm its estimate,
	// rounded up.
	Count int64 `json:"count"`
	// Remaining is the units left now.
	Remaining int64 `json:"remaining"`
	// Tokens is true where Unit is "units" and they are the tokens of LLM
	// API calls (cost llm or settle llm, without prices).
	Tokens bool `json:"tokens,omitempty"`
	// Reserved and Spent split Count in a zone whose calls settle (a log
	// zone with settle): Reserved is what the calls running on this
	// instance hold as reservations now, until each is settled to what it
	// cost, and Spent is the rest of Count (Count - Reserved): what ended
	// calls were charged, and what the calls running on other instances
	// reserved, which this one does not know of (the store records a
	// reservation as it records a charge). Reserved is at most Count. A
	// call held for its slot (a wait) counts as spent until it goes on.
	// Absent in other zones.
	Reserved *int64 `json:"reserved,omitempty"`
	Spent    *int64 `json:"spent,omitempty"`
	// UsedUSD, ReservedUSD, SpentUSD, LeftUSD and LimitUSD are, in a zone
	// with prices (Unit usd-micros), Count, Reserved, Spent, Remaining and
	// Limit in dollars, written exactly as decimals ("12.345678", "10");
	// absent in other zones.
	UsedUSD     string `json:"used_usd,omitempty"`
	ReservedUSD string `json:"reserved_usd,omitempty"`
	SpentUSD    string `json:"spent_usd,omitempty"`
	LeftUSD     string `json:"left_usd,omitempty"`
	LimitUSD    string `json:"limit_usd,omitempty"`
	// ResetSeconds is the time until units next free; 0 with no admission
	// in the window.
	ResetSeconds float64 `json:"reset_seconds"`
	// RetryAfterSeconds is the time until a request would be admitted (of
	// the zone's fixed cost, or of 1 where requests say their own); 0 if one
	// would be admitted now (after waiting WaitSeconds, in a zone with a
	// wait).
	RetryAfterSeconds float64 `json:"retry_after_seconds"`
	// WaitSeconds is, in a zone with a wait, how long a request now would be
	// held for its slot (0: it would go on at once); absent in other zones.
	WaitSeconds *float64 `json:"wait_seconds,omitempty"`
	// LeasesHeld is, in a concurrency zone, the leases the client holds on
	// every instance (its requests in flight, as Count), and LeasesHeldHere
	// those that its requests running through this handler hold; absent in
	// other zones.
	LeasesHeld     *int64 `json:"leases_held,omitempty"`
	LeasesHeldHere *int64 `json:"leases_held_here,omitempty"`
	// Period is, in a zone with a period, the period Count and Remaining
	// are of; absent in other zones.
	Period *Period `json:"period,omitempty"`
}

// Period is a zone's calendar period, and the one that holds now.
type Period struct {
	// Name is "day", "week" or "month".
	Name string `json:"name"`
	// TimeZone is the IANA name of the time zone whose midnight starts
	// each period.
	TimeZone string `json:"time_zone"`
	// Start and End are when the period that holds now started and when
	// it ends, which is when the budget comes back: RFC 3339, in TimeZone.
	Start string `json:"start"`
	End   string `json:"end"`
	// Seconds is that period's length (a day is 23 or 25 hours where
	// daylight saving starts or ends).
	Seconds float64 `json:"seconds"`
}

// ResetAnswer is the answer to DELETE.
type ResetAnswer struct {
	Reset bool   `json:"reset"`
	Zone  string `json:"zone"`
	Key   string `json:"key"`
	// Unannounced says, when not "", why the other instances were not
	// told of the reset (their deny caches may refuse the client until its
	// wait ends): the reset itself was applied.
	Unannounced string `json:"unannounced,omitempty"`
}

// BlockedAnswer is the answer to GET /sliding_ratelimit/blocked.
type BlockedAnswer struct {
	// Count is how many clients are held as blocked, listed or not.
	Count int `json:"count"`
	// Blocked lists them, the longest wait first, at most limit.
	Blocked []BlockedClient `json:"blocked"`
}

// BlockedClient is one client held as blocked in one zone.
type BlockedClient struct {
	Zone string `json:"zone"`
	// Identity names the zone's state: name, window, limit (the handler's zoneIdentity).
	Identity string `json:"identity"`
	// Key is the client key as stored: normalised, hashed if long.
	Key string `json:"key"`
	// RetryAfterSeconds is the time left until the client may retry: what
	// its next request is told.
	RetryAfterSeconds float64 `json:"retry_after_seconds"`
}

// ZonesPath lists the zones of the running handlers: what a path of
// KeyPath may name.
const ZonesPath = "/sliding_ratelimit/zones"

// ZoneInfo is one zone in the answer to GET ZonesPath.
type ZoneInfo struct {
	Name string `json:"name"`
	// Identity names the zone's state; the admin paths take it where two
	// zones share a name with different limits.
	Identity string `json:"identity"`
	// Limit is max_requests (or concurrent); where each tenant's comes from
	// a placeholder (LimitFrom), its fallback.
	Limit     int64  `json:"limit"`
	LimitFrom string `json:"limit_from,omitempty"`
	// WindowSeconds is 0 in a concurrency zone; in a zone with a period,
	// the length of the period that holds now.
	WindowSeconds float64 `json:"window_seconds"`
	// Period is the zone's calendar period, when it has one.
	Period    *Period `json:"period,omitempty"`
	Algorithm string  `json:"algorithm"`
	Unit      string  `json:"unit"`
	// LimitUSD is, in a zone with prices, Limit in dollars ("10").
	LimitUSD string `json:"limit_usd,omitempty"`
	// Key is the zone's key template (not a client's key).
	Key string `json:"key"`
	// WaitSeconds is the zone's wait, when it has one.
	WaitSeconds float64 `json:"wait_seconds,omitempty"`
	// Handlers is how many handlers have the zone: sites that share it, or
	// the old and the new config during a reload.
	Handlers int `json:"handlers"`
}

// ZonesAnswer is the answer to GET ZonesPath.
type ZonesAnswer struct {
	Zones []ZoneInfo `json:"zones"`
}
