-- Decides a batch of rate-limit requests in one call: TIME once, then each
-- request's zones all or nothing, then one packed reply.
--
-- Semantics. A log zone admits a request of cost c when the units admitted in
-- the last window, plus c, fit in max; for a count zone every cost is 1. With
-- n the newest admission kept and sum_i the units admitted up to admission i:
--   j       = the smallest kept admission with sum_j >= sum_n + c - max: the
--             newest one that must age out for c to fit (none: c fits now)
--   room    = t_j + window (none: now)
--   admit   when room - now <= wait (wait 0: room <= now); the request is
--           recorded at max(room, t_n + 1us): times strictly increase, even
--           for two requests in one microsecond or a clock that steps back
--   deny    otherwise, with reset = room - now; c > max is never admitted.
-- With several zones the admission time is the latest of their rooms, and
-- every zone records it then. A promised admission (room > now) is recorded
-- at its future time, so no later request takes its slot, and for any window
-- the units whose times lie in it never exceed max. Settling changes one
-- admission's units (and the sums after it); max may change between calls,
-- and each call is exact for its own max. A counter zone weighs units as it
-- weighs requests; a concurrency zone holds one lease per request in flight.
-- Counter and concurrency zones do not wait (the store refuses a wait there):
-- they admit now or deny, and a counter counts a request in the fixed window
-- of its decision even when its log zones delay it.
--
-- KEYS[i]   the state of the i-th zone of the batch, requests in order:
--             log:         a ring (string), below
--             counter:     hash {w = index of the current fixed window,
--                          c = its units, p = the units of the one before}
--             concurrency: sorted set, member = lease id, score = its expiry
-- ARGV[1]   the requests, packed big-endian, one after another:
--             op      uint8: 0 peek (write nothing), 1 allow (record in every
--                     zone if all admit), 2 settle, 3 extend
--             zones   uint8: how many KEYS this request takes, in order
--             wait    double: microseconds the request may wait for its slot
--             then per zone:
--               kind    uint8: 0 log, 1 counter, 2 concurrency
--               window  double: microseconds (the lease time)
--               max     double: units in any window (leases at once)
--               cost    double: units to reserve (allow, peek), or the real
--                       cost (settle)
--               token   double: settle: the log's admission time, the
--                       counter's window index
--               aux     8 bytes: the lease id; counter settle: the units
--                       reserved (double)
-- ARGV[2]   optional, for tests: the time in microseconds, in place of TIME;
--           keys then get no expiry, which runs on Redis's clock
--
-- Reply: one string; per request a double, the delay in microseconds before
-- an admitted request goes on (0 when denied), then per zone, packed
-- big-endian:
--   flag       uint8: 0 denied, 1 admits (recorded only if every zone of the
--              request admits), 2 never (cost above max); settle and extend:
--              1 if done
--   remaining  double: units left now (after this one, when recorded)
--   reset      double: microseconds; denying zone: until it has room for this
--              cost; otherwise: until units next leave the window
--   token      double: the log's admission time, the counter's window index;
--              -1 when nothing was recorded
--
-- The ring of a log zone keeps the admissions that may still be in its
-- window, oldest first from slot h, in cap slots that wrap: a header, then
-- each admission's time (6 bytes: microseconds modulo 2^48, read back as the
-- one nearest now). Version 1, a count ring, holds costs of 1: sums are
-- indexes, nothing to store. Version 2, a units ring, adds each admission's
-- running sum within its bucket (rels, 6 bytes) and each bucket's base sum
-- (bases): sum_i = base[bucket(i)] + rel_i - floor, with buckets of S
-- consecutive admissions (by sequence number), so a settle rewrites at most
-- one bucket's rels and the later buckets' bases, never every later sum.
--   header  version u8, cap u32, h u32, n u32; version 2: seq (double, the
--           sequence number of slot h), floor u48 (the sum before it)
-- Admissions that aged out are dropped when the next one is recorded, so a
-- ring reuses their slots before it grows; one whose admissions all lie in
-- the window and that is full doubles. A value of at most SMALL bytes is read
-- and written whole (GET, SET); a larger one by ranges: the same decision,
-- read another way. Sums are kept modulo 2^48: the units a ring holds
-- saturate below that.

local unpack, pack, floor, ceil, sub = struct.unpack, struct.pack, math.floor, math.ceil, string.sub
local call, pcall, min, max = redis.call, redis.pcall, math.min, math.max

local M48 = 2 ^ 48
local S = 64
local SMALL = 2048
local CHUNK = 96
local REPLY = '>Bddd'

-- With the time given, expiry on Redis's own clock would not follow it:
-- keys are then kept.
local now, expires = tonumber(ARGV[2]), not ARGV[2]
if not now then
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
end
-- A time kept modulo 2^48 is the one in (tbase, tbase + 2^48]: up to 6.7
-- years back and 2.2 ahead.
local tbase = now - 0.75 * M48
local function dec(o) return tbase + (o - tbase) % M48 end
local function fmt(x) return string.format('%.0f', x) end

-- fresh returns reply, or nil after dropping key when it holds another kind's
-- state (the zone's algorithm changed), so the zone starts over rather than
-- failing until that state expires.
local function fresh(reply, key)
  if type(reply) == 'table' and reply.err then
    if not string.find(reply.err, 'WRONGTYPE', 1, true) then error(reply) end
    call('DEL', key)
    return nil
  end
  return reply
end

-- patch returns s, which holds the bytes from offset at on, with b written at
-- offset off where the two overlap.
local function patch(s, at, off, b)
  local lo, hi = max(off, at), min(off + #b, at + #s)
  if lo >= hi then return s end
  return sub(s, 1, lo - at) .. sub(b, lo - off + 1, hi - off) .. sub(s, hi - at + 1)
end

local Ring = {}
Ring.__index = Ring

function Ring:shape(ver, cap)
  self.ver, self.cap, self.B = ver, cap, floor(cap / S) + 2
  self.H = ver == 1 and 13 or 27
  self.RO = self.H + 6 * cap
  self.BO = self.RO + 6 * cap
  self.size = ver == 1 and self.RO or self.BO + 6 * self.B
end

-- load reads the ring at key: whole when small, else its first SMALL bytes,
-- the rest on demand. Anything else (unknown, or cut short) starts over.
local function load(key)
  local v = fresh(pcall('GETRANGE', key, 0, SMALL - 1), key) or ''
  local r = setmetatable({key = key, v = v, cache = {}, h = 0, n = 0, seq = 0, floor = 0}, Ring)
  local ver, cap = 0, 0
  if #v >= 13 then ver, cap, r.h, r.n = unpack('>BI4I4I4', v) end
  if ver == 2 and #v >= 27 then r.seq, r.floor = unpack('>dI6', v, 14) end
  if ver == 1 or ver == 2 then r:shape(ver, cap) end
  if not r.size or #v ~= r.size and #v < SMALL or ver == 2 and #v < 27 then
    r.h, r.n = 0, 0
    r:shape(1, 0)
    r.v = string.rep('\0', 13)
  end
  r.whole = #r.v == r.size
  return r
end

-- bytes returns len bytes at offset off.
function Ring:bytes(off, len)
  local v = self.v
  if v and off + len <= #v then return sub(v, off + 1, off + len) end
  return call('GETRANGE', self.key, off, off + len - 1)
end

-- u6 returns the 6-byte number at offset off, reading a large value a chunk
-- at a time.
function Ring:u6(off)
  local v = self.v
  if v and off + 6 <= #v then return (unpack('>I6', v, off + 1)) end
  local c0 = off - off % CHUNK
  local c = self.cache[c0]
  if not c then
    c = call('GETRANGE', self.key, c0, c0 + CHUNK + 5)
    self.cache[c0] = c
  end
  return (unpack('>I6', c, off - c0 + 1))
end

-- put writes b at offset off: into the value in hand when it is whole (SET
-- writes it), else at once, keeping what was read in step.
function Ring:put(off, b)
  if self.v then self.v = patch(self.v, 0, off, b) end
  if not self.whole then
    call('SETRANGE', self.key, off, b)
    for c0, c in pairs(self.cache) do self.cache[c0] = patch(c, c0, off, b) end
  end
end

function Ring:put6(off, x) self:put(off, pack('>I6', x % M48)) end

-- range returns the entries [i, j) of the region at off, oldest first.
function Ring:range(off, i, j)
  if j <= i then return '' end
  local p = (self.h + i) % self.cap
  local a = min(j - i, self.cap - p)
  local s = self:bytes(off + 6 * p, 6 * a)
  if a < j - i then s = s .. self:bytes(off, 6 * (j - i - a)) end
  return s
end

-- write writes the entries b from entry i on into the region at off.
function Ring:write(off, i, b)
  local p = (self.h + i) % self.cap
  local a = min(#b, 6 * (self.cap - p))
  self:put(off + 6 * p, sub(b, 1, a))
  if a < #b then self:put(off, sub(b, a + 1)) end
end

-- t returns the time of entry i (0 is the oldest kept).
function Ring:t(i) return dec(self:u6(self.H + 6 * ((self.h + i) % self.cap))) end

-- s returns the units of the entries kept up to i (0 for i < 0).
function Ring:s(i)
  if i < 0 then return 0 end
  if self.ver == 1 then return i + 1 end
  return (self:u6(self.BO + 6 * (floor((self.seq + i) / S) % self.B))
    + self:u6(self.RO + 6 * ((self.h + i) % self.cap)) - self.floor) % M48
end

-- search returns the first i in [lo, hi) with get(r, i) > x, get increasing
-- in i; hi if none.
local function search(r, get, x, lo, hi)
  while lo < hi do
    local m = floor((lo + hi) / 2)
    if get(r, m) > x then hi = m else lo = m + 1 end
  end
  return lo
end

-- gallop is search over [lo, n), probing lo, lo+1, lo+3, ... first: the
-- answer is usually next to lo.
local function gallop(r, get, x, lo)
  local hi, step = lo, 1
  while hi < r.n and get(r, hi) <= x do
    lo, hi, step = hi + 1, hi + step, step * 2
  end
  return search(r, get, x, lo, min(hi, r.n))
end

-- rebuild lays the ring out again from slot 0 in a new shape: grown, shrunk,
-- or a count ring made a units ring. It moves ranges, never one entry at a
-- time, and the value is then in hand, to be written whole.
local function rebuild(r, cap, ver)
  local n = r.n
  local body = r:range(r.H, 0, n) .. string.rep('\0', 6 * (cap - n))
  if ver == 2 then
    local B, bases, rels = floor(cap / S) + 2, {}, nil
    if r.ver == 2 then
      rels = r:range(r.RO, 0, n)
      for q = r.seq - r.seq % S, r.seq + n - 1, S do
        bases[floor(q / S) % B] = r:u6(r.BO + 6 * (floor(q / S) % r.B))
      end
    else
      -- Every cost so far is 1: sequence numbers and sums start at 0.
      local one = {}
      for i = 1, S do one[i] = pack('>I6', i) end
      rels = sub(string.rep(table.concat(one), ceil(n / S)), 1, 6 * n)
      for q = 0, n - 1, S do bases[q / S] = q end
      r.seq, r.floor = 0, 0
    end
    local b = {}
    for k = 0, B - 1 do b[k + 1] = pack('>I6', bases[k] or 0) end
    body = body .. rels .. string.rep('\0', 6 * (cap - n)) .. table.concat(b)
  end
  r.h = 0
  r:shape(ver, cap)
  r.v, r.whole, r.cache = string.rep('\0', r.H) .. body, true, {}
end

-- commit writes the header (and a value in hand) and keeps the key until the
-- newest admission ages out; an empty ring is deleted.
function Ring:commit(window)
  if self.n == 0 then
    call('DEL', self.key)
    return
  end
  local px = max(1, ceil((self:t(self.n - 1) + window - now) / 1000))
  local hdr = pack('>BI4I4I4', self.ver, self.cap, self.h, self.n)
  if self.ver == 2 then hdr = hdr .. pack('>dI6', self.seq, self.floor) end
  if self.whole and expires then
    call('SET', self.key, hdr .. sub(self.v, #hdr + 1), 'PX', px)
  elseif self.whole then
    call('SET', self.key, hdr .. sub(self.v, #hdr + 1))
  else
    call('SETRANGE', self.key, 0, hdr)
    if expires then call('PEXPIRE', self.key, px) end
  end
end

-- A log zone's decision, before any write: z.room, when its request fits;
-- z.held, the units in the window; z.f, the first entry in the window that
-- holds units, and z.first its time.
local function log_decide(z)
  local r = load(z.key)
  local n = r.n
  z.r = r
  local f = n > 0 and gallop(r, Ring.t, now - z.window, 0) or 0
  local before, total = r:s(f - 1), r:s(n - 1)
  z.held, z.room = total - before, now
  if r.ver == 2 then
    -- Entries settled to zero hold nothing: the window starts after them.
    while f < n and r:s(f) == before do f = f + 1 end
  end
  z.f, z.first = f, f < n and r:t(f) or nil
  z.newest = n > 0 and r:t(n - 1) or nil
  if z.held + z.cost > z.max and z.cost <= z.max then
    local T = total + z.cost - z.max
    local j = r.ver == 1 and T - 1 or gallop(r, Ring.s, T - 1, f)
    z.room = r:t(j) + z.window
  end
  z.reset = z.first and z.first + z.window - now or 0
end

-- Records the admission of a log zone at time at (or just after its newest):
-- drops what aged out first, then grows or shrinks the ring if it must.
local function log_record(z, at)
  local r = z.r
  if z.newest and z.newest >= at then at = z.newest + 1 end
  if z.f > 0 then
    r.floor = (r.floor + r:s(z.f - 1)) % M48
    r.h, r.n, r.seq = (r.h + z.f) % r.cap, r.n - z.f, r.seq + z.f
  end
  local n, cap, ver = r.n, r.cap, r.ver
  if z.cost ~= 1 then ver = 2 end
  if n == cap then
    cap = max(4, 2 * cap)
    if ver == 1 and n < z.max then cap = min(cap, z.max) end
  elseif cap > 64 and 4 * (n + 1) <= cap then
    cap = floor(cap / 2)
  end
  if cap ~= r.cap or ver ~= r.ver then rebuild(r, cap, ver) end
  local p = (r.h + n) % r.cap
  if r.ver == 2 then
    local q, rel = r.seq + n, z.cost
    if n == 0 or q % S == 0 then
      r:put6(r.BO + 6 * (floor(q / S) % r.B), r.floor + r:s(n - 1))
    else
      rel = rel + r:u6(r.RO + 6 * ((p - 1) % r.cap))
    end
    r:put6(r.RO + 6 * p, rel)
  end
  r:put6(r.H + 6 * p, at)
  r.n = n + 1
  r:commit(z.window)
  z.held = z.held + z.cost
  if not z.first then z.reset = at + z.window - now end
  return at
end

-- Settles the admission at time z.token to z.cost units. A count ring takes
-- a refunded entry out (the newer ones move back a slot); any other change
-- makes it a units ring, where the entry's bucket from it on and the later
-- buckets' bases change, and entries settled to zero are dropped once newest.
local function log_settle(z)
  local r = load(z.key)
  local n = r.n
  local e = search(r, Ring.t, z.token - 1, 0, n)
  if e == n or r:t(e) ~= z.token then return 0 end
  local old, c = r:s(e) - r:s(e - 1), z.cost
  if c == old then return 1 end
  if r.ver == 1 and c == 0 then
    r:write(r.H, e, r:range(r.H, e + 1, n))
    r.n = n - 1
  else
    if r.ver == 1 then rebuild(r, r.cap, 2) end
    c = min(c, M48 - 1 - r:s(n - 1) + old)
    local q, d = r.seq + e, c - old
    for i = e, min(n - 1, e + S - 1 - q % S) do
      local o = r.RO + 6 * ((r.h + i) % r.cap)
      r:put6(o, r:u6(o) + d)
    end
    for k = floor(q / S) + 1, floor((r.seq + n - 1) / S) do
      local o = r.BO + 6 * (k % r.B)
      r:put6(o, r:u6(o) + d)
    end
    while r.n > 0 and r:s(r.n - 1) == r:s(r.n - 2) do r.n = r.n - 1 end
  end
  r:commit(z.window)
  return 1
end

-- The sliding counter: the previous fixed window's units, weighted by how
-- much of it the sliding window still covers, plus the current one's.
local function counter_decide(z)
  local W = z.window
  z.idx = floor(now / W)
  z.e = now - z.idx * W
  local h = fresh(pcall('HMGET', z.key, 'w', 'c', 'p'), z.key) or {}
  local w, c, p = tonumber(h[1]), tonumber(h[2]) or 0, tonumber(h[3]) or 0
  if w == nil or w < z.idx - 1 then
    c, p = 0, 0
  elseif w == z.idx - 1 then
    c, p = 0, c
  end
  z.c, z.p = c, p
  z.held = p * (W - z.e) / W + c
  z.room, z.reset = now, 0
  local need = z.max - z.cost
  if z.held > need and need >= 0 then
    if c <= need and p > 0 then
      -- Within this window the previous one's weight decays linearly.
      z.room = now + ceil(W - (need - c) * W / p - z.e)
    else
      -- This window alone is too full: wait for the next, where c becomes p.
      z.room = now + ceil((W - z.e) + W - need * W / c)
    end
  end
  if p > 0 then
    z.reset = min(ceil(W / p), W - z.e)
  elseif c > 0 then
    z.reset = ceil((W - z.e) + W / c)
  end
end

local function counter_record(z)
  local c = z.c + z.cost
  call('HSET', z.key, 'w', z.idx, 'c', c, 'p', z.p)
  -- Kept while it can still weigh: to the end of the next window.
  if expires then call('PEXPIRE', z.key, ceil((2 * z.window - z.e) / 1000)) end
  z.held = z.held + z.cost
  if z.p == 0 then z.reset = ceil((z.window - z.e) + z.window / c) end
  return z.idx
end

local function counter_settle(z)
  local h = fresh(pcall('HMGET', z.key, 'w', 'c', 'p'), z.key) or {}
  local w, field = tonumber(h[1]), nil
  if w == z.token then field = 2 elseif w == z.token + 1 then field = 3 else return 0 end
  local d = z.cost - unpack('>d', z.aux)
  call('HSET', z.key, field == 2 and 'c' or 'p', max(0, (tonumber(h[field]) or 0) + d))
  return 1
end

-- A concurrency zone: the leases whose expiry is after now.
local function lease_decide(z)
  z.held = fresh(pcall('ZCOUNT', z.key, '(' .. fmt(now), '+inf'), z.key) or 0
  z.room, z.reset = now, 0
  if z.held > 0 then
    local first = call('ZRANGEBYSCORE', z.key, '(' .. fmt(now), '+inf', 'LIMIT', 0, 1, 'WITHSCORES')
    z.reset = tonumber(first[2]) - now
  end
  if z.held + 1 > z.max then z.room = now + z.reset end
end

-- expire keeps a lease key as long as its latest lease.
local function expire_leases(key)
  local last = call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if expires then call('PEXPIRE', key, max(1, ceil((tonumber(last[2]) - now) / 1000))) end
end

local function lease_record(z, at)
  call('ZREMRANGEBYSCORE', z.key, '-inf', fmt(now))
  call('ZADD', z.key, fmt(at + z.window), z.aux)
  expire_leases(z.key)
  z.held = z.held + 1
  if z.reset == 0 or at + z.window - now < z.reset then z.reset = at + z.window - now end
  return -1
end

local function lease_extend(z)
  local exp = tonumber(fresh(pcall('ZSCORE', z.key, z.aux), z.key))
  if not exp or exp <= now then return 0 end
  call('ZADD', z.key, 'XX', fmt(now + z.window), z.aux)
  expire_leases(z.key)
  return 1
end

local decide = {[0] = log_decide, counter_decide, lease_decide}
local record = {[0] = log_record, counter_record, lease_record}
local settle = {[0] = log_settle, counter_settle, function(z) return call('ZREM', z.key, z.aux) end}

local out, args, pos, k = {}, ARGV[1], 1, 0
while pos <= #args do
  local op, nz, wait
  op, nz, wait, pos = unpack('>BBd', args, pos)
  local zs = {}
  for i = 1, nz do
    local z = {}
    z.kind, z.window, z.max, z.cost, z.token, pos = unpack('>Bdddd', args, pos)
    z.aux, pos, k = sub(args, pos, pos + 7), pos + 8, k + 1
    z.key = KEYS[k]
    zs[i] = z
  end
  if op >= 2 then
    out[#out + 1] = pack('>d', 0)
    for _, z in ipairs(zs) do
      local done = op == 2 and settle[z.kind](z) or z.kind == 2 and lease_extend(z) or 0
      out[#out + 1] = pack(REPLY, done, 0, 0, -1)
    end
  else
    local at, admit = now, true
    for _, z in ipairs(zs) do
      decide[z.kind](z)
      z.ok = z.cost <= z.max and z.room - now <= (z.kind == 0 and wait or 0)
      if z.ok then at = max(at, z.room) else admit = false end
    end
    out[#out + 1] = pack('>d', admit and at - now or 0)
    for _, z in ipairs(zs) do
      local token, flag = -1, z.ok and 1 or 0
      if z.cost > z.max then flag = 2 end
      if admit and op == 1 then token = record[z.kind](z, at) end
      if not z.ok then z.reset = z.cost > z.max and 0 or z.room - now end
      out[#out + 1] = pack(REPLY, flag, max(0, floor(z.max - z.held)), z.reset, token)
    end
  end
end
return table.concat(out)
