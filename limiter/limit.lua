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
local SMALL, SMALL_END = 512, '511'
local CHUNK = 120

-- With the time given, expiry on Redis's own clock would not follow it:
-- keys are then kept.
local now, expires = tonumber(ARGV[2]), not ARGV[2]
if not now then
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
end
-- A time kept modulo 2^48 is the one in (tbase, tbase + 2^48]: up to 6.7
-- years back and 2.2 ahead.
local tbase, ms = now - 0.75 * M48, floor(now / 1000)
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

-- The ring in hand: its key; v, what was read of it from offset 0 (the whole
-- value when small), and cache, chunks read beyond; the header's fields;
-- E, the bytes of an entry, and BO, the offset of the bases. One ring is in
-- hand at a time; the zones of one request save it and take it back.
local key, v, whole, cache
local ver, cap, h, n, exp, seq, flo, total, H, E, B, BO

local function shape(version, size)
  ver, cap, B = version, size, floor(size / S) + 2
  H, E = version == 1 and 18 or 38, version == 1 and 6 or 12
  BO = H + E * cap
  return version == 1 and BO or BO + 6 * B
end

-- load takes the ring at k in hand, reading it whole when it is expected
-- small; anything else (unknown, or cut short) starts over.
local function load(k, small)
  -- Numbers given to redis.call are formatted each time: these are not.
  key, cache, v = k, false, pcall('GETRANGE', k, '0', small and SMALL_END or '37')
  if type(v) ~= 'string' then v = fresh(v, k) or '' end
  local version, size = 0, nil
  h, n, exp, seq, flo, total = 0, 0, ms, 0, 0, 0
  if #v >= 18 then version, size, h, n, exp = unpack('>BI4I4I4I5', v) end
  if version == 2 and #v >= 38 then seq, flo, total = unpack('>dI6I6', v, 19) end
  size = (version == 1 or version == 2) and shape(version, size)
  if not size or #v ~= size and #v < (small and SMALL or 38) or version == 2 and #v < 38 then
    h, n, exp, seq, flo, total = 0, 0, ms, 0, 0, 0
    size, v = shape(1, 0), ''
  end
  whole = #v == size
end

local function save(sv)
  sv[1], sv[2], sv[3], sv[4], sv[5], sv[6], sv[7], sv[8], sv[9], sv[10], sv[11], sv[12] =
    key, v, whole, cache, ver, cap, h, n, exp, seq, flo, total
end

local function restore(sv)
  key, v, whole, cache, h, n, exp, seq, flo, total = sv[1], sv[2], sv[3], sv[4], sv[7], sv[8], sv[9], sv[10], sv[11], sv[12]
  shape(sv[5], sv[6])
end

-- bytes returns len bytes at offset off.
local function bytes(off, len)
  if off + len <= #v then return sub(v, off + 1, off + len) end
  return call('GETRANGE', key, off, off + len - 1)
end

-- u6 returns the 6-byte number at offset off, reading a large value a chunk
-- at a time.
local function u6(off)
  if off + 6 <= #v then return (unpack('>I6', v, off + 1)) end
  local c0 = off - off % CHUNK
  local c = cache and cache[c0]
  if not c then
    c = call('GETRANGE', key, c0, c0 + CHUNK + 5)
    cache = cache or {}
    cache[c0] = c
  end
  return (unpack('>I6', c, off - c0 + 1))
end

-- put writes b at offset off, keeping what was read in step.
local function put(off, b)
  call('SETRANGE', key, off, b)
  local lo, hi = max(off, 0), min(off + #b, #v)
  if lo < hi then v = sub(v, 1, lo) .. sub(b, lo - off + 1, hi - off) .. sub(v, hi + 1) end
  cache = false
end

local function u48(x) return pack('>I6', x % M48) end

-- at returns the offset of entry i (0 is the oldest kept).
local function at(i) return H + E * ((h + i) % cap) end

-- t returns the time of entry i; u its units.
local function t(i)
  local off = H + E * ((h + i) % cap)
  return tbase + ((off + 6 <= #v and unpack('>I6', v, off + 1) or u6(off)) - tbase) % M48
end

local function u(i)
  if ver == 1 then return 1 end
  local off = H + 12 * ((h + i) % cap) + 6
  return off + 6 <= #v and unpack('>I6', v, off + 1) or u6(off)
end

-- s returns the units of the entries kept up to i (0 for i < 0): in a units
-- ring, the base of i's bucket (or the floor, in the oldest's) plus the
-- units from its start.
local function s(i)
  if i < 0 then return 0 end
  if ver == 1 then return i + 1 end
  if i == n - 1 then return (total - flo) % M48 end
  local q = seq + i
  local j, sum = 0, 0
  if floor(q / S) > floor(seq / S) then
    j, sum = i - q % S, (u6(BO + 6 * (floor(q / S) % B)) - flo) % M48
  end
  for m = j, i do sum = sum + u(m) end
  return sum
end

-- search returns the first i in [lo, hi) with get(i) > x, get increasing in
-- i; hi if none.
local function search(get, x, lo, hi)
  while lo < hi do
    local m = floor((lo + hi) / 2)
    if get(m) > x then hi = m else lo = m + 1 end
  end
  return lo
end

-- gallop is search over [lo, n), probing lo, lo+1, lo+3, ... first, as the
-- answer is usually next to lo; it returns the answer and get(answer).
local function gallop(get, x, lo)
  local hi, step, y = lo, 1, nil
  while hi < n do
    y = get(hi)
    if y > x then break end
    lo, hi, step = hi + 1, hi + step, step * 2
  end
  local i = search(get, x, lo, min(hi, n))
  if i == hi and hi < n then return i, y end
  return i, i < n and get(i) or nil
end

-- range returns the entries [i, j), oldest first.
local function range(i, j)
  if j <= i then return '' end
  local p = (h + i) % cap
  local a = min(j - i, cap - p)
  local r = bytes(H + E * p, E * a)
  if a < j - i then r = r .. bytes(H, E * (j - i - a)) end
  return r
end

-- write writes the entries b from entry i on.
local function write(i, b)
  local p = (h + i) % cap
  local a = min(#b, E * (cap - p))
  put(H + E * p, sub(b, 1, a))
  if a < #b then put(H, sub(b, a + 1)) end
end

local function header()
  local hdr = pack('>BI4I4I4I5', ver, cap, h, n, exp % 2 ^ 40)
  if ver == 2 then hdr = hdr .. pack('>dI6I6', seq, flo, total) end
  return hdr
end

local function size_of(version, size) return version == 1 and 18 + 6 * size or 38 + 12 * size + 6 * (floor(size / S) + 2) end

-- reshape gives the ring size slots and the layout of version: grown,
-- shrunk, or a count ring made a units ring (each of its entries then holds
-- 1 unit). A large ring grows in place: the value is extended, and the
-- older or the newer part of its entries, the smaller, moves so that the
-- free slots lie between them; otherwise it is written anew from its
-- entries. Never is a large value read or written whole.
local function reshape(size, version)
  local B0, bases = B, ver == 2 and version == 2 and bytes(BO, 6 * B)
  if ver == version and size > cap and size_of(version, size) > SMALL then
    call('SETRANGE', key, size_of(version, size) - 1, '\0')
    if h > 0 and h <= cap - h then
      put(H + E * cap, bytes(H, E * h))
    elseif h > 0 then
      put(H + E * (h + size - cap), bytes(H + E * h, E * (cap - h)))
      h = h + size - cap
    end
    shape(version, size)
  else
    local body = range(0, n)
    if version == 2 and ver == 1 then
      local parts, one = {}, u48(1)
      for i = 0, n - 1 do parts[i + 1] = sub(body, 6 * i + 1, 6 * i + 6) .. one end
      body, seq, flo, total = table.concat(parts), 0, 0, n
    end
    h = 0
    shape(version, size)
    v = header() .. body
    local len = size_of(version, size)
    call('DEL', key)
    call('SETRANGE', key, len - 1, '\0')
    call('SETRANGE', key, 0, v)
    v, whole, cache, exp = len <= SMALL and v .. string.rep('\0', len - #v) or v, len <= SMALL, false, ms
  end
  if version == 2 then
    -- Each kept bucket's base takes its place among the new number of
    -- bases (a converted ring's start at 0, one unit an entry).
    for q = seq - seq % S, seq + n - 1, S do
      local k = floor(q / S)
      put(BO + 6 * (k % B), bases and sub(bases, 6 * (k % B0) + 1, 6 * (k % B0) + 6) or u48(q))
    end
  end
end

-- commit writes b at offset off and the header, and keeps the key until its
-- newest admission ages out (and an eighth of a window more, so that a key in
-- use is not given a new expiry at each admission); an empty ring is
-- deleted.
local function commit(newest, window, off, b)
  if n == 0 then
    call('DEL', key)
    return
  end
  -- exp is the key's expiry in milliseconds, modulo 2^40.
  if expires and newest + window > (ms + (exp - ms + 2 ^ 39) % 2 ^ 40 - 2 ^ 39) * 1000 then
    exp = ceil((newest + window + window / 8) / 1000)
    call('PEXPIRE', key, max(1, exp - ms))
  end
  if off then call('SETRANGE', key, off, b) end
  call('SETRANGE', key, '0', ver == 1 and pack('>BI4I4I4I5', 1, cap, h, n, exp % 2 ^ 40) or header())
end

-- A log zone's decision, before any write: z.room, when its request fits;
-- z.held, the units in the window; z.f, the first entry in the window that
-- holds units, z.first its time, z.before the units before it; z.newest.
local function log_decide(z)
  load(z.key, 18 + 6 * z.max <= SMALL)
  local W, c = z.window, z.cost
  local f, first = 0, n > 0 and t(0)
  if first and first <= now - W then f, first = gallop(t, now - W, 1) end
  local before, all = f, n
  if ver == 2 then
    before, all = s(f - 1), (total - flo) % M48
    -- Entries settled to zero hold nothing: the window starts after them.
    local g = f
    while g < n and u(g) == 0 do g = g + 1 end
    if g ~= f then f, first = g, g < n and t(g) or nil end
  end
  local room = now
  z.held = all - before
  if z.held + c > z.max and c <= z.max then
    -- The newest admission that must age out for c to fit: the first j
    -- with s(j) >= T; a units ring skips whole buckets by their bases.
    local T, j = all + c - z.max, 0
    if ver == 1 then
      j = T - 1
    else
      local k0 = floor((seq + f) / S)
      local k = search(function(k) return (u6(BO + 6 * (k % B)) - flo) % M48 end, T - 1, k0 + 1, floor((seq + n - 1) / S) + 1) - 1
      local sum
      j, sum = f, before
      if k > k0 then j, sum = k * S - seq, (u6(BO + 6 * (k % B)) - flo) % M48 end
      while sum + u(j) < T do sum, j = sum + u(j), j + 1 end
    end
    room = t(j) + W
  end
  z.f, z.first, z.before, z.room = f, first or false, before, room
  z.newest = n > 0 and (f == n - 1 and first or t(n - 1))
  z.reset = first and first + W - now or 0
end

-- Records the admission of a log zone at time at (or just after its newest):
-- drops what aged out first, then grows, shrinks or makes a units ring if it
-- must.
local function log_record(z, at)
  if z.newest and z.newest >= at then at = z.newest + 1 end
  local f, c = z.f, z.cost
  if f > 0 then
    flo, h, n, seq = (flo + z.before) % M48, (h + f) % cap, n - f, seq + f
  end
  local size, version = cap, c == 1 and ver or 2
  if n == cap then
    size = max(4, 2 * cap)
    if version == 1 and n < z.max then size = min(size, z.max) end
  elseif cap > 64 and 4 * (n + 1) <= cap then
    size = floor(cap / 2)
  end
  if size ~= cap or version ~= ver then reshape(size, version) end
  local off, entry = H + E * ((h + n) % cap), pack('>I6', at % M48)
  if ver == 2 then
    if (seq + n) % S == 0 and n > 0 then put(BO + 6 * (floor((seq + n) / S) % B), u48(total)) end
    entry, total = entry .. u48(c), (total + c) % M48
  end
  n = n + 1
  commit(at, z.window, off, entry)
  z.held = z.held + c
  if not z.first then z.reset = at + z.window - now end
  return at
end

-- Settles the admission at time z.token to z.cost units. A count ring takes
-- a refunded entry out (the newer ones move back a slot); any other change
-- makes it a units ring, where the entry's units and the bases of the later
-- buckets change, and entries settled to zero are dropped once newest.
local function log_settle(z)
  load(z.key, false)
  local e = search(t, z.token - 1, 0, n)
  if e == n or t(e) ~= z.token then return 0 end
  local old, c = u(e), z.cost
  if c == old then return 1 end
  if ver == 1 and c == 0 then
    write(e, range(e + 1, n))
    n = n - 1
  else
    if ver == 1 then reshape(cap, 2) end
    c = min(c, M48 - 1 - (total - flo) % M48 + old)
    local d = c - old
    put(at(e) + 6, u48(c))
    for k = floor((seq + e) / S) + 1, floor((seq + n - 1) / S) do
      local o = BO + 6 * (k % B)
      put(o, u48(u6(o) + d))
    end
    total = (total + d) % M48
    while n > 0 and u(n - 1) == 0 do n = n - 1 end
  end
  commit(n > 0 and t(n - 1) or now, z.window)
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

-- Z holds the zones of the request at hand, made once with all their fields
-- and reused.
local Z = {}
local function zone(i)
  local z = Z[i]
  if not z then
    z = {key = false, kind = 0, window = 0, max = 0, cost = 0, token = 0, aux = false,
      room = 0, held = 0, reset = 0, ok = false, f = 0, first = false, newest = false,
      idx = 0, e = 0, c = 0, p = 0, before = 0, sv = {}}
    Z[i] = z
  end
  return z
end

local out, args, pos, k = {}, ARGV[1], 1, 0
while pos <= #args do
  local op, nz, wait, kind, window, mx, cost, token
  op, nz, wait, kind, window, mx, cost, token, pos = unpack('>BBdBdddd', args, pos)
  for i = 1, nz do
    if i > 1 then kind, window, mx, cost, token, pos = unpack('>Bdddd', args, pos) end
    local z = Z[i] or zone(i)
    k = k + 1
    z.key, z.kind, z.window, z.max, z.cost, z.token = KEYS[k], kind, window, mx, cost, token
    if kind == 2 or op == 2 then z.aux = sub(args, pos, pos + 7) end
    pos = pos + 8
  end
  if op >= 2 then
    out[#out + 1] = pack('>d', 0)
    for i = 1, nz do
      local z = Z[i]
      local done = op == 2 and settle[z.kind](z) or z.kind == 2 and lease_extend(z) or 0
      out[#out + 1] = pack('>Bddd', done, 0, 0, -1)
    end
  else
    local at, admit = now, true
    for i = 1, nz do
      local z = Z[i]
      decide[z.kind](z)
      if nz > 1 and z.kind == 0 then save(z.sv) end
      z.ok = z.cost <= z.max and z.room - now <= (z.kind == 0 and wait or 0)
      if not z.ok then admit = false elseif z.room > at then at = z.room end
    end
    local recording = admit and op == 1
    for i = 1, nz do
      local z = Z[i]
      local token, flag = -1, z.ok and 1 or 0
      if z.cost > z.max then
        flag, z.reset = 2, 0
      elseif not z.ok then
        z.reset = z.room - now
      end
      if recording then
        if nz > 1 and z.kind == 0 then restore(z.sv) end
        token = record[z.kind](z, at)
      end
      local rem = z.max - z.held
      rem = rem > 0 and rem - rem % 1 or 0
      if i == 1 then
        out[#out + 1] = pack('>dBddd', admit and at - now or 0, flag, rem, z.reset, token)
      else
        out[#out + 1] = pack('>Bddd', flag, rem, z.reset, token)
      end
    end
  end
end
return table.concat(out)
