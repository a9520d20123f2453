-- Decides a batch of rate-limit requests in one call: TIME once, then each
-- request's zones all or nothing, then one packed reply.
-- Its arguments and reply are packed binary (script.go packs and reads
-- them), so that a batch costs Redis and the store little to parse.
--
-- KEYS[i]   state of the i-th zone of the batch, requests in order:
--             log:     a ring (string) of the last max admission times, below
--             counter: hash {w = index of the current fixed window,
--                      c = admissions in it, p = admissions in the one before}
-- ARGV[1]   the requests, packed big-endian, one after another:
--             op      uint8: 0 peek (write nothing), 1 allow (record in every
--                     zone if all admit), 2 refund (take back what an allow
--                     recorded: the token of each zone)
--             zones   uint8: how many KEYS this request takes, in order
--             then per zone:
--               algo    uint8: 0 log, 1 counter
--               window  double: microseconds
--               max     double: admissions in any window
--               token   double: refund only; else ignored
-- ARGV[2]   optional, for tests: the time in microseconds, in place of TIME
--
-- Reply: one string, per zone of every request in order, packed big-endian:
--   allowed    uint8: 1 if this zone admits (recorded only if every zone of
--              the request admits); for a refund, 1 if something was taken back
--   remaining  double: admissions left now (after this one, when recorded)
--   reset      double: microseconds; denying zone: exact time until it admits
--              again; otherwise: until the count next drops (a slot frees)
--   token      double: what was recorded, for a refund: the log's admission
--              time or the counter's window index; -1 when nothing
--
-- The ring: a header of cap, head, count and base (uint32 each; base in
-- seconds), then B samples, then cap slots; every time is a uint48 offset
-- in microseconds from base (W bytes). A ring starts small and doubles as
-- it fills, up to max, so a client's state is the size of its use. Slot p
-- is physical; the logical i-th oldest kept time is in slot (head + i) %
-- cap, and times strictly increase with i. Sample b is a copy of slot b*S
-- when that slot is kept, so that a search reads the header and one bucket
-- of S slots rather than the whole ring. Rings of cap <= SMALL have no
-- samples and are read and written whole (GET, SET): cheaper than several
-- ranges, which in turn cost half of a whole GET and SET at max 1,000.

local unpack, pack, floor, ceil = struct.unpack, struct.pack, math.floor, math.ceil

local W = 6
local HEADER = 16
local SMALL = 512
local TIMEFMT = '>I6'
-- One zone's reply.
local REPLY = '>Bddd'
-- Offsets from the base stay below SPAN (8.9 years).
local SPAN = 2 ^ 48

-- One clock for every caller: Redis's own, not each server's. (ARGV[2], the
-- time in microseconds, replaces it in tests of clock steps.)
local now = tonumber(ARGV[2])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- layout returns the number of samples and the bucket size of a ring.
local function layout(cap)
  if cap <= SMALL then
    return 0, cap
  end
  local S = ceil(math.sqrt(cap))
  return ceil(cap / S), S
end

local function size(cap)
  local B = layout(cap)
  return HEADER + W * (B + cap)
end

-- A ring of one key: cap slots, n of them kept from slot h on, times as
-- offsets from base (seconds). A ring whose value is in hand (v: small
-- ones, and rings made anew) is read from it and written back whole, so
-- Redis allocates it at its size; a large one reads and writes ranges.
local Ring = {}
Ring.__index = Ring

local function new_ring(key, cap, base)
  local B, S = layout(cap)
  return setmetatable({key = key, cap = cap, h = 0, n = 0, B = B, S = S,
    base = base, base_us = base * 1000000, v = false, samples = false,
    samples_dirty = false, puts = {}}, Ring)
end

function Ring:slot_off(p)
  return HEADER + W * (self.B + p)
end

-- get returns len bytes at byte offset off (0-based).
function Ring:get(off, len)
  if self.v then
    return string.sub(self.v, off + 1, off + len)
  end
  return redis.call('GETRANGE', self.key, off, off + len - 1)
end

-- off_at returns the offset from base of the logical i-th kept time.
function Ring:off_at(i)
  local off = self:slot_off((self.h + i) % self.cap)
  if self.v then
    return (unpack(TIMEFMT, self.v, off + 1))
  end
  return (unpack(TIMEFMT, redis.call('GETRANGE', self.key, off, off + W - 1)))
end

function Ring:at(i)
  return self.base_us + self:off_at(i)
end

-- ends returns the oldest and the newest kept time, in one read when their
-- slots are adjacent (a full ring).
function Ring:ends()
  local v = self.v
  if v then
    local so, h, cap = HEADER + W * self.B + 1, self.h, self.cap
    return self.base_us + unpack(TIMEFMT, v, so + W * h),
      self.base_us + unpack(TIMEFMT, v, so + W * ((h + self.n - 1) % cap))
  end
  if self.n == self.cap and self.h > 0 then
    local d = self:get(self:slot_off(self.h - 1), 2 * W)
    local newest, oldest = unpack(TIMEFMT .. 'I6', d)
    return self.base_us + oldest, self.base_us + newest
  end
  return self:at(0), self:at(self.n - 1)
end

-- raw returns the logical range [lo, hi) as one string of offsets.
function Ring:raw(lo, hi)
  if hi <= lo then
    return ''
  end
  local p = (self.h + lo) % self.cap
  local len = hi - lo
  if p + len <= self.cap then
    return self:get(self:slot_off(p), W * len)
  end
  local first = self.cap - p
  return self:get(self:slot_off(p), W * first) .. self:get(self:slot_off(0), W * (len - first))
end

-- all returns every kept time, oldest first.
function Ring:all()
  local d = self:raw(0, self.n)
  local out = {}
  for i = 0, self.n - 1 do
    out[i + 1] = self.base_us + unpack(TIMEFMT, d, W * i + 1)
  end
  return out
end

function Ring:put(off, bytes)
  self.puts[#self.puts + 1] = {off, bytes}
end

-- set_raw writes the string of offsets d at logical index lo on.
function Ring:set_raw(lo, d)
  local len = #d / W
  local p = (self.h + lo) % self.cap
  if p + len <= self.cap then
    self:put(self:slot_off(p), d)
  else
    local first = self.cap - p
    self:put(self:slot_off(p), string.sub(d, 1, W * first))
    self:put(self:slot_off(0), string.sub(d, W * first + 1))
  end
end

function Ring:sample(b)
  if self.v then
    return (unpack(TIMEFMT, self.v, HEADER + W * b + 1))
  end
  return (unpack(TIMEFMT, self.samples, W * b + 1))
end

-- set_sample keeps sample b equal to slot b*S.
function Ring:set_sample(b, packed)
  if self.v then
    self:put(HEADER + W * b, packed)
  else
    self.samples = string.sub(self.samples, 1, W * b) .. packed .. string.sub(self.samples, W * b + W + 1)
    self.samples_dirty = true
  end
end

-- bucket returns the logical range [lo, hi] that holds the first kept time
-- > cutoff (n if none), from the samples alone: all of the ring when it
-- has none.
function Ring:bucket(cutoff)
  local n, h, cap, S, B = self.n, self.h, self.cap, self.S, self.B
  local lo, hi = 0, n
  if B == 0 then
    return lo, hi
  end
  local c = cutoff - self.base_us
  -- Samples in logical order start at the first bucket at or after head.
  local b0 = ceil(h / S) % B
  local function L(k)
    return ((((b0 + k) % B) * S) - h) % cap
  end
  -- The largest k whose sample is kept and <= cutoff: a true prefix.
  local a, z = -1, B - 1
  while a < z do
    local m = floor((a + z + 1) / 2)
    if L(m) < n and self:sample((b0 + m) % B) <= c then
      a = m
    else
      z = m - 1
    end
  end
  if a >= 0 then
    lo = L(a) + 1
  end
  if a + 1 < B and L(a + 1) < n then
    hi = L(a + 1)
  end
  return lo, hi
end

-- first_over returns the first logical index in [a, z) of a ring held whole
-- in v (slots from byte so, head h, capacity cap) whose time offset is over
-- c, or z if none: times increase from the head, so it is a binary search.
local function first_over(v, so, h, cap, a, z, c)
  while a < z do
    local m = floor((a + z) / 2)
    if unpack(TIMEFMT, v, so + W * ((h + m) % cap)) > c then
      z = m
    else
      a = m + 1
    end
  end
  return a
end

-- first_after returns the logical index of the first kept time > cutoff
-- (n if none), and that time.
function Ring:first_after(cutoff)
  local n, h, cap, B = self.n, self.h, self.cap, self.B
  local c = cutoff - self.base_us
  local lo, hi = self:bucket(cutoff)
  local v = self.v
  if v then
    local so = HEADER + W * B + 1
    local a = first_over(v, so, h, cap, lo, hi, c)
    if a < n then
      return a, self.base_us + unpack(TIMEFMT, v, so + W * ((h + a) % cap))
    end
    return n, nil
  end
  -- Search [lo, hi] in one read of the bucket (and of slot hi, whose time
  -- the caller wants when it is the answer).
  local d = self:raw(lo, math.min(hi + 1, n))
  local a, z = 0, hi - lo
  while a < z do
    local m = floor((a + z) / 2)
    if unpack(TIMEFMT, d, W * m + 1) > c then
      z = m
    else
      a = m + 1
    end
  end
  local f = lo + a
  if f < n then
    return f, self.base_us + unpack(TIMEFMT, d, W * a + 1)
  end
  return n, nil
end

-- commit writes the ring, and makes the key expire ttl_ms from now.
function Ring:commit(ttl_ms)
  local hdr = pack('>I4I4I4I4', self.cap, self.h, self.n, self.base)
  local puts = self.puts
  if self.v then
    local v = self.v
    if #puts == 1 then
      local off, b = puts[1][1], puts[1][2]
      v = hdr .. string.sub(v, HEADER + 1, off) .. b .. string.sub(v, off + #b + 1)
    else
      for _, pb in ipairs(puts) do
        v = string.sub(v, 1, pb[1]) .. pb[2] .. string.sub(v, pb[1] + #pb[2] + 1)
      end
      v = hdr .. string.sub(v, HEADER + 1)
    end
    self.v = v
    self.puts = {}
    redis.call('SET', self.key, v, 'PX', ttl_ms)
    return
  end
  self.puts = {}
  if self.samples_dirty then
    redis.call('SETRANGE', self.key, 0, hdr .. self.samples)
    self.samples_dirty = false
  else
    redis.call('SETRANGE', self.key, 0, hdr)
  end
  for _, pb in ipairs(puts) do
    redis.call('SETRANGE', self.key, pb[1], pb[2])
  end
  redis.call('PEXPIRE', self.key, ttl_ms)
end

-- build returns a ring of cap holding times (oldest first, strictly
-- increasing, at most cap of them), in hand, to be committed whole.
local function build(key, cap, times)
  local base = floor((times[1] or now) / 1000000)
  local r = new_ring(key, cap, base)
  local parts = {}
  for i, at in ipairs(times) do
    parts[i] = pack(TIMEFMT, at - r.base_us)
  end
  r.n = #times
  local slots = table.concat(parts) .. string.rep('\0', W * (cap - r.n))
  local samples = {}
  for b = 0, r.B - 1 do
    samples[b + 1] = string.sub(slots, W * b * r.S + 1, W * b * r.S + W)
  end
  r.v = string.rep('\0', HEADER) .. table.concat(samples) .. slots
  return r
end

-- grown_cap is the size of a ring made for n times under max: rings grow
-- by doubling as they fill, so a client's state is the size of its use.
local function grown_cap(n, max)
  return math.min(max, math.max(4, 2 * n))
end

-- load returns the ring of a log zone of max. A key that holds no string
-- is converted: the sorted set of an older version (member = sequence,
-- score = admission time) becomes a ring of its admissions still in the
-- window, the last max of them, written at once, so that a denied request
-- leaves it converted; anything else (a counter's hash) starts over.
local function load(key, max, cutoff, pre)
  local B = layout(max)
  local v = pre
  if v == nil then
    if max <= SMALL then
      v = redis.pcall('GET', key)
    else
      v = redis.pcall('GETRANGE', key, 0, HEADER + W * B - 1)
    end
  end
  if type(v) == 'table' and v.err then
    if not string.find(v.err, 'WRONGTYPE', 1, true) then
      error(v)
    end
    local times = {}
    if redis.call('TYPE', key).ok == 'zset' then
      local z = redis.call('ZRANGEBYSCORE', key, '(' .. string.format('%.0f', cutoff), '+inf', 'WITHSCORES')
      for i = math.max(2, #z - 2 * max + 2), #z, 2 do
        times[#times + 1] = tonumber(z[i])
      end
    end
    redis.call('DEL', key)
    local r = build(key, grown_cap(#times, max), times)
    if #times > 0 then
      r:commit(math.max(1, ceil((times[#times] + (now - cutoff) - now) / 1000)))
    end
    return r
  end
  if not v or #v < HEADER then
    return build(key, 0, {})
  end
  local cap, h, n, base = unpack('>I4I4I4I4', v)
  local r = new_ring(key, cap, base)
  r.h, r.n = h, n
  if cap <= SMALL then
    if #v ~= size(cap) then
      v = redis.call('GET', key)
    end
    r.v = v
  else
    if #v < HEADER + W * r.B then
      v = redis.call('GETRANGE', key, 0, HEADER + W * r.B - 1)
    end
    r.samples = string.sub(v, HEADER + 1, HEADER + W * r.B)
  end
  return r
end

-- A log zone's decision, before any write: allowed iff fewer than max kept
-- times lie in the window. (A ring may hold more than max, after max was
-- lowered: so lowering max and raising it again forgets nothing.)
local function log_decide(z, pre)
  local cutoff = now - z.window
  local r = load(z.key, z.max, cutoff, pre)
  z.ring = r
  if r.n == 0 then
    z.in_window, z.first, z.allowed = 0, nil, true
    return
  end
  local oldest, newest, f
  if not r.v and r.n == r.cap and r.h > 0 then
    -- A full large ring, as at a client's limit: when the first time in
    -- the window is in the bucket that starts at the oldest, one read of
    -- the newest slot, the oldest and that bucket decides.
    local lo, hi = r:bucket(cutoff)
    local top = math.min(hi + 1, r.n)
    if lo == 0 and r.h + top <= r.cap then
      local d = r:get(r:slot_off(r.h - 1), W * (top + 1))
      local bu, c = r.base_us, cutoff - r.base_us
      newest, oldest = bu + unpack(TIMEFMT, d, 1), bu + unpack(TIMEFMT, d, W + 1)
      local a, e = 0, hi
      while a < e do
        local m = floor((a + e) / 2)
        if unpack(TIMEFMT, d, W * (m + 1) + 1) > c then
          e = m
        else
          a = m + 1
        end
      end
      f = a
      if f < r.n then
        z.first = bu + unpack(TIMEFMT, d, W * (f + 1) + 1)
      end
    end
  end
  if not f then
    oldest, newest = r:ends()
    f = 0
    if oldest > cutoff then
      z.first = oldest
    elseif newest <= cutoff then
      f, z.first = r.n, nil
    else
      f, z.first = r:first_after(cutoff)
    end
  end
  z.newest = newest
  z.in_window = r.n - f
  z.allowed = z.in_window < z.max
  if not z.allowed then
    -- The max-th newest admission must age out before one more fits.
    local i = r.n - z.max
    z.pivot = i == 0 and oldest or r:at(i)
  end
end

-- Records an admission in a log zone that log_decide admitted; returns its
-- time. Times strictly increase, even for two calls in one microsecond or a
-- Redis clock that steps back.
local function log_record(z)
  local r = z.ring
  local at = now
  if r.n > 0 and z.newest >= at then
    at = z.newest + 1
  end
  if r.n == r.cap and r.cap < z.max then
    r = build(z.key, grown_cap(r.n, z.max), r:all())
  end
  if r.n == 0 then
    r.base = floor(at / 1000000)
    r.base_us = r.base * 1000000
  elseif at - r.base_us >= SPAN then
    -- Offsets are running out: start the base again at the oldest time
    -- still in the window.
    local kept = {}
    for _, t in ipairs(r:all()) do
      if t > now - z.window then
        kept[#kept + 1] = t
      end
    end
    r = build(z.key, r.cap, kept)
  end
  local p
  if r.n < r.cap then
    p = (r.h + r.n) % r.cap
    r.n = r.n + 1
  else
    -- Full: the oldest is outside the window, or this would be denied.
    p = r.h
    r.h = (r.h + 1) % r.cap
  end
  local packed = pack(TIMEFMT, at - r.base_us)
  r:put(r:slot_off(p), packed)
  if r.B > 0 and p % r.S == 0 then
    r:set_sample(p / r.S, packed)
  end
  r:commit(math.max(1, ceil((at + z.window - now) / 1000)))
  return at
end

-- Takes back the admission at time token from a log zone: the newer kept
-- times move back one slot, so the ring stays in order with one fewer.
local function log_refund(z, token)
  local r = load(z.key, z.max, now - z.window)
  if r.n == 0 then
    return 0
  end
  local j, at = r:first_after(token - 1)
  if at ~= token then
    return 0
  end
  local newer = r:raw(j + 1, r.n)
  if #newer > 0 then
    r:set_raw(j, newer)
  end
  r.n = r.n - 1
  if r.B > 0 then
    -- Samples of the slots that moved.
    for k = 0, #newer / W - 1 do
      local p = (r.h + j + k) % r.cap
      if p % r.S == 0 then
        r:set_sample(p / r.S, string.sub(newer, W * k + 1, W * k + W))
      end
    end
  end
  local ttl = redis.call('PTTL', z.key)
  if ttl <= 0 then
    ttl = ceil(z.window / 1000)
  end
  r:commit(ttl)
  return 1
end

-- The common case on its own: a request of one log zone of max <= SMALL. The same steps as log_decide and log_record, on the value
-- in hand and in locals, which costs Redis a fraction of the general path.
-- It returns nil when the general path must decide: another layout, a ring
-- that outgrows SMALL, offsets running out.
local function small_log(key, window, max, record)
  if max > SMALL then
    return nil
  end
  local v = redis.pcall('GET', key)
  local cap, h, n, base
  if v == false then
    cap, h, n, base = 0, 0, 0, 0
    v = string.rep('\0', HEADER)
  elseif type(v) ~= 'string' or #v < HEADER then
    return nil
  else
    cap, h, n, base = unpack('>I4I4I4I4', v)
    if cap > SMALL or #v ~= HEADER + W * cap then
      return nil
    end
  end
  local bu = base * 1000000
  local c = now - window - bu
  local so = HEADER + 1
  local f, first = 0, nil
  if n > 0 then
    first = unpack(TIMEFMT, v, so + W * h)
    if first <= c then
      f = first_over(v, so, h, cap, 1, n, c)
      first = f < n and unpack(TIMEFMT, v, so + W * ((h + f) % cap)) or nil
    end
  end
  local in_window = n - f
  if in_window >= max then
    local pivot = unpack(TIMEFMT, v, so + W * ((h + n - max) % cap))
    return pack(REPLY, 0, 0, pivot + bu + window - now, -1)
  end
  local reset = 0
  if in_window > 0 then
    reset = first + bu + window - now
  end
  if not record then
    return pack(REPLY, 1, max - in_window, reset, -1)
  end
  if in_window == 0 then
    reset = window
  end
  local at = now
  if n > 0 then
    local newest = bu + unpack(TIMEFMT, v, so + W * ((h + n - 1) % cap))
    if newest >= at then
      at = newest + 1
    end
  else
    base = floor(at / 1000000)
    bu = base * 1000000
  end
  if at - bu >= SPAN then
    return nil
  end
  if n == cap and cap < max then
    -- Grow: the kept times, oldest first, from slot 0.
    local grown = grown_cap(n, max)
    if grown > SMALL then
      return nil
    end
    local slots = string.sub(v, so + W * h, HEADER + W * cap) .. string.sub(v, so, HEADER + W * h)
    v = string.rep('\0', HEADER) .. slots .. string.rep('\0', W * (grown - n))
    cap, h = grown, 0
  end
  local p
  if n < cap then
    p = (h + n) % cap
    n = n + 1
  else
    p = h
    h = (h + 1) % cap
  end
  local off = HEADER + W * p
  v = pack('>I4I4I4I4', cap, h, n, base) .. string.sub(v, HEADER + 1, off) .. pack(TIMEFMT, at - bu) .. string.sub(v, off + W + 1)
  redis.call('SET', key, v, 'PX', math.max(1, ceil((at + window - now) / 1000)))
  return pack(REPLY, 1, max - in_window - 1, reset, at)
end

-- The steady state of a large ring on its own: a request of one log zone
-- whose ring is full, as at a client's limit. The steps of log_decide and
-- log_record, in locals: one read of the header and samples, one or two of
-- the newest, the oldest and the bucket that holds the first time in the
-- window, then the writes. It returns nil and what it read when the general
-- path must decide.
local function large_log(key, window, max, record)
  if max <= SMALL then
    return nil
  end
  local B, S = layout(max)
  local v = redis.pcall('GETRANGE', key, 0, HEADER + W * B - 1)
  if type(v) ~= 'string' or #v ~= HEADER + W * B then
    return nil, v
  end
  local cap, h, n, base = unpack('>I4I4I4I4', v)
  if cap ~= max or n ~= cap or h == 0 then
    return nil, v
  end
  local bu = base * 1000000
  local c = now - window - bu
  -- The bucket: the largest k whose sample (in logical order, from the
  -- first bucket at or after head) is <= cutoff; every slot is kept.
  local b0 = ceil(h / S) % B
  local a, e = -1, B - 1
  while a < e do
    local m = floor((a + e + 1) / 2)
    if unpack(TIMEFMT, v, HEADER + W * ((b0 + m) % B) + 1) <= c then
      a = m
    else
      e = m - 1
    end
  end
  local lo, hi = 0, n
  if a >= 0 then
    lo = (((b0 + a) % B) * S - h) % cap + 1
  end
  if a + 1 < B then
    hi = (((b0 + a + 1) % B) * S - h) % cap
  end
  local top = math.min(hi + 1, n)
  -- d holds the logical range [lo, top) from byte o on; newest and oldest.
  local d, o, newest, oldest
  if lo == 0 and h + top <= cap then
    -- One read from the newest slot (h-1) through the bucket.
    local off = HEADER + W * (B + h - 1)
    d = redis.call('GETRANGE', key, off, off + W * (top + 1) - 1)
    newest, oldest, o = unpack(TIMEFMT, d, 1), unpack(TIMEFMT, d, W + 1), W + 1
  else
    local off = HEADER + W * (B + h - 1)
    local ends = redis.call('GETRANGE', key, off, off + 2 * W - 1)
    newest, oldest = unpack(TIMEFMT, ends, 1), unpack(TIMEFMT, ends, W + 1)
    local p, len = (h + lo) % cap, top - lo
    off = HEADER + W * (B + p)
    if p + len <= cap then
      d = redis.call('GETRANGE', key, off, off + W * len - 1)
    else
      local first = cap - p
      d = redis.call('GETRANGE', key, off, off + W * first - 1) ..
        redis.call('GETRANGE', key, HEADER + W * B, HEADER + W * (B + len - first) - 1)
    end
    o = 1
  end
  -- The first time > cutoff in [lo, hi]; hi when none (then it is n).
  a, e = 0, hi - lo
  while a < e do
    local m = floor((a + e) / 2)
    if unpack(TIMEFMT, d, o + W * m) > c then
      e = m
    else
      a = m + 1
    end
  end
  local f = lo + a
  local in_window = n - f
  if in_window >= max then
    return pack(REPLY, 0, 0, oldest + bu + window - now, -1)
  end
  local reset = window
  if in_window > 0 then
    reset = unpack(TIMEFMT, d, o + W * a) + bu + window - now
  elseif not record then
    reset = 0
  end
  if not record then
    return pack(REPLY, 1, max - in_window, reset, -1)
  end
  local at = now
  if newest + bu >= at then
    at = newest + bu + 1
  end
  if at - bu >= SPAN then
    return nil, v
  end
  local p = h
  h = (h + 1) % cap
  local packed = pack(TIMEFMT, at - bu)
  redis.call('SETRANGE', key, 0, pack('>I4I4I4I4', cap, h, n, base))
  redis.call('SETRANGE', key, HEADER + W * (B + p), packed)
  if p % S == 0 then
    redis.call('SETRANGE', key, HEADER + W * (p / S), packed)
  end
  redis.call('PEXPIRE', key, math.max(1, ceil((at + window - now) / 1000)))
  return pack(REPLY, 1, max - in_window - 1, reset, at)
end

-- Checks the reply of a counter zone's first command. A key that holds the
-- log's state, because the zone's algorithm changed on a config reload, is
-- dropped and the zone starts over, rather than failing with WRONGTYPE on
-- every request until that state expires.
local function started_over(reply, key)
  if type(reply) == 'table' and reply.err then
    if string.find(reply.err, 'WRONGTYPE', 1, true) then
      redis.call('DEL', key)
      return true
    end
    error(reply)
  end
  return false
end

-- Sliding-window counter: the previous fixed window's count, weighted by how
-- much of it the sliding window still covers, plus the current one's.
local function counter_decide(z)
  z.index = floor(now / z.window)
  z.elapsed = now - z.index * z.window
  local h = redis.pcall('HMGET', z.key, 'w', 'c', 'p')
  if started_over(h, z.key) then
    h = {}
  end
  local w, c, p = tonumber(h[1]), tonumber(h[2]) or 0, tonumber(h[3]) or 0
  if w == nil or w < z.index - 1 then
    c, p = 0, 0
  elseif w == z.index - 1 then
    c, p = 0, c
  end
  z.c, z.p = c, p
  z.count = p * (z.window - z.elapsed) / z.window + c
  z.allowed = z.count + 1 <= z.max
end

-- Time until a counter zone's estimate allows one more admission.
local function counter_wait(z)
  local W, e, c, p, max = z.window, z.elapsed, z.c, z.p, z.max
  if c + 1 <= max and p > 0 then
    -- Within this window the previous one's weight decays linearly.
    return ceil(W - (max - 1 - c) * W / p - e)
  end
  -- This window alone is full: wait for the next, where c becomes p.
  return ceil((W - e) + W - (max - 1) * W / c)
end

-- Time until a counter zone's estimate next falls by about one.
local function counter_reset(z, c, p)
  if p > 0 then
    return math.min(ceil(z.window / p), z.window - z.elapsed)
  elseif c > 0 then
    return ceil((z.window - z.elapsed) + z.window / c)
  end
  return 0
end

local function counter_refund(z, token)
  local w = tonumber(redis.call('HGET', z.key, 'w'))
  if w == token then
    redis.call('HINCRBY', z.key, 'c', -1)
    return 1
  elseif w == token + 1 then
    redis.call('HINCRBY', z.key, 'p', -1)
    return 1
  end
  return 0
end

local out = {}
local args = ARGV[1]
local pos = 1
local k = 0
while pos <= #args do
  local op, nz
  op, nz, pos = unpack('>BB', args, pos)
  local fast, pre = nil, nil
  if nz == 1 and op ~= 2 then
    local algo, window, max = unpack('>Bdd', args, pos)
    if algo == 0 then
      fast = small_log(KEYS[k + 1], window, max, op == 1)
      if not fast then
        fast, pre = large_log(KEYS[k + 1], window, max, op == 1)
      end
    end
  end
  local zones = {}
  if fast then
    k = k + 1
    pos = pos + 25
  else
    for i = 1, nz do
      local algo, window, max, token
      algo, window, max, token, pos = unpack('>Bddd', args, pos)
      k = k + 1
      -- Every field at once: a table that grows rehashes.
      zones[i] = {key = KEYS[k], counter = algo == 1, window = window, max = max,
        token = token, allowed = false, ring = false, in_window = 0, first = false,
        newest = false, pivot = false, index = 0, elapsed = 0, c = 0, p = 0, count = 0}
    end
  end
  if fast then
    out[#out + 1] = fast
  elseif op == 2 then
    for _, z in ipairs(zones) do
      local done = 0
      if z.token >= 0 then
        if z.counter then
          done = counter_refund(z, z.token)
        else
          done = log_refund(z, z.token)
        end
      end
      out[#out + 1] = pack(REPLY, done, 0, 0, -1)
    end
  else
    local admit = true
    for _, z in ipairs(zones) do
      if z.counter then
        counter_decide(z)
      else
        log_decide(z, pre)
      end
      if not z.allowed then
        admit = false
      end
    end
    local write = op == 1 and admit
    for _, z in ipairs(zones) do
      local reply
      if z.counter then
        if not z.allowed then
          reply = pack(REPLY, 0, 0, counter_wait(z), -1)
        elseif write then
          local c = z.c + 1
          redis.call('HSET', z.key, 'w', z.index, 'c', c, 'p', z.p)
          -- Kept while it can still weigh: to the end of the next window.
          redis.call('PEXPIRE', z.key, ceil((2 * z.window - z.elapsed) / 1000))
          reply = pack(REPLY, 1, floor(z.max - (z.count + 1)), counter_reset(z, c, z.p), z.index)
        else
          reply = pack(REPLY, 1, floor(z.max - z.count), counter_reset(z, z.c, z.p), -1)
        end
      else
        local in_window = z.in_window
        if not z.allowed then
          reply = pack(REPLY, 0, 0, z.pivot + z.window - now, -1)
        elseif write then
          local reset = z.window
          if in_window > 0 then
            reset = z.first + z.window - now
          end
          local at = log_record(z)
          reply = pack(REPLY, 1, z.max - in_window - 1, reset, at)
        else
          local reset = 0
          if in_window > 0 then
            reset = z.first + z.window - now
          end
          reply = pack(REPLY, 1, z.max - in_window, reset, -1)
        end
      end
      out[#out + 1] = reply
    end
  end
end
return table.concat(out)
