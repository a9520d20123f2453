-- Decides a batch of rate-limit requests in one call: TIME once, then each
-- request's zones all or nothing, then one packed reply. The chunk returns
-- that call, with what it needs made once: script.go wraps it as a Redis
-- Functions library (Redis 7+), whose chunk runs at its first call and
-- whose closures serve every later one, and as a script (EVALSHA) that
-- makes them at every call.
--
-- A log zone admits a request of cost c (1 in a count zone) when the units
-- in the last window, plus c, fit in max. With sum_i the units admitted up to
-- admission i and n the newest kept, j = the smallest kept with sum_j >=
-- sum_n + c - max must age out for c to fit: room = t_j + window (none:
-- now). If room - now <= wait (windows ahead too), it goes on at room,
-- recorded then or just after t_n (times strictly increase); else it is
-- denied, reset = room - now; c > max never fits. Several zones: the latest
-- room, recorded in each. A record goes after every entry and only those
-- after t_j share its window, so units in any window never exceed max, for
-- each call's own max. Entries merge (a ring of MERGE entries, within a span
-- of window/MERGE): an entry keeps its admissions' units and latest time, so
-- none leaves the window early; a client may be denied a span early. A
-- settle takes the reservation back and records the real cost as an
-- admission at its room from now (later only if promised slots or other
-- charges fill the window): every window stays within max, long calls too;
-- only c > max, recorded now, exceeds it. A counter weighs units as it
-- weighs requests; a concurrency zone holds a lease per request in flight,
-- expiring window after it was taken or extended; neither waits.
--
-- KEYS[i]  the i-th zone's state, requests in order: log, a ring (below);
--          counter, hash {w = current fixed window's index, c = its units,
--          p = the previous one's}; concurrency, zset of lease ids by expiry
-- ARGV[1]  requests, big-endian: op u8 (0 peek, 1 allow, 2 settle, 3
--          extend), zones u8 (KEYS it takes), wait double (µs); per zone:
--          kind u8 (0 log, 1 counter, 2 concurrency), window double (µs; the
--          lease time), max double, cost double (to reserve; settle: the
--          real cost), token double (settle: the log's admission time, the
--          counter's window index; -2, a floor: cost is what the zone must
--          hold at least, and only what it holds below that is recorded, as
--          a settle records), aux 8 bytes (lease id; settle: the
--          units reserved, double)
-- ARGV[2]  optional, for tests: the time in µs in place of TIME; keys then
--          get no expiry, which runs on Redis's clock
-- Reply    per request: delay double (µs an admitted request waits; 0 when
--          denied); per zone: flag u8 (0 denied, 1 admits (recorded if all
--          do), 2 never: cost above max; settle, extend: 1 done), remaining
--          double (units left, after this request if recorded; settle: before
--          it, so its caller knows if a denial may rest on it), reset double
--          (µs: denied, until room for this cost; else until units next leave
--          the window), token double (log: admission time, of a settle's
--          record too, a peek's lm; counter: window index; -1: none); last,
--          once: the call's time in Redis double (µs from its first TIME)
-- A ring holds the admissions that may still be in the window, oldest first
-- from slot h of cap, wrapping; what aged out goes at the next record, so a
-- ring reuses those slots before it grows (doubling, in place when large).
-- Entries are times (µs mod 2^48, read as the nearest to now); in a count
-- ring sums are indexes. The first byte tags the layout: SMALL_COUNT (4), a
-- count ring of at most SMALLCAP: tag, cap, h u8, newest time u48, n u32,
-- expiry (ms mod 2^40) u40. COUNT (3), a larger count ring: tag u8, cap, h,
-- n u32, expiry, newest; UNITS (2), the same with the sequence number of slot
-- h (double) and the sums before it and to the newest before the newest
-- time; an entry is a time and its units, and each bucket of S entries has
-- its base sum after the ring, so a settle writes one entry and the later
-- bases. Both then have the head and count (u8) of a mirror of 96 bytes that
-- holds copies of the oldest entries, so that a decision reads one range.
-- A decision reads a value's first SMALL bytes: all of a small one, whose
-- record then writes header and entry at once; no large one is read or built
-- whole (Redis's Lua hashes every string it makes). Sums are mod 2^48: a ring
-- saturates. Tag + WITH_LM (8, 7, 6): lm u48 (the newest record's max) ends
-- the header; SMALL_COUNT's, as large, ends n u8, lm u24 (0: larger).
local unpack, pack, floor, ceil, sub = struct.unpack, struct.pack, math.floor, math.ceil, string.sub
local call, pcall, min, max, fmt, byte = redis.call, redis.pcall, math.min, math.max, string.format, string.byte
local S, CHUNK, SMALL, SMALLCAP, MERGE, MAXCAP = 64, 120, 512, 80, 256, 1170
local UNITS, COUNT, SMALL_COUNT, WITH_LM, FLOOR = 2, 3, 4, 4, -2
-- A call's own: its time (now, Redis's clock at its start, and in ms), whether keys expire, a base that reads
-- 48-bit times as the nearest to now, TTLs formatted.
local now, expires, clock, tbase, ms, TTL
-- fresh returns reply, or nil after dropping key when it holds another kind's
-- state (the zone's algorithm changed), which then starts over.
local function fresh(reply, key)
  if type(reply) ~= 'table' or not reply.err then return reply end
  if not string.find(reply.err, 'WRONGTYPE', 1, true) then error(reply) end
  call('DEL', key)
end
-- A zone's table (z, r) holds its arguments (key, W, mx, c, token, aux), its
-- decision, and a log's ring in hand, so that a request's zones each keep
-- theirs until it records: v, its first vlen bytes (header and mirror, or all
-- of a small value), w, bytes from offset wo; the header (lay: the layout, m:
-- it holds lm); MO, H, E, BO, B, len: offsets of mirror, ring and bases, entry
-- size, bucket count, length; mir, the mirror to write; for the record: f,
-- the first entry in the window holding units, its time, the units before
-- it, the newest time.
local function layout(lay, size, m)
  local E, MO = lay == UNITS and 12 or 6, (lay == SMALL_COUNT and 18 or lay == COUNT and 26 or 46) + (m and lay ~= SMALL_COUNT and 6 or 0)
  local H, B = lay == SMALL_COUNT and MO or MO + 96, lay == UNITS and floor(size / S) + 2 or 0
  return H + E * size + 6 * B, E, MO, H, B
end
local function shape(r, lay, size, m)
  if r.lay == lay and r.cap == size and r.m == m then return r.len end -- most zones keep theirs
  local len, E, MO, H, B = layout(lay, size, m)
  r.E, r.MO, r.H, r.B, r.lay, r.m, r.cap, r.BO, r.len = E, MO, H, B, lay, m, size, H + E * size, len
  return len
end
local function header(r)
  local lay, m, lm, tag, last, exp = r.lay, r.m, r.lm, r.lay + (r.m and WITH_LM or 0), (r.last or 0) % 2 ^ 48, r.exp % 2 ^ 40
  if lay == SMALL_COUNT then return pack(m and '>BBBI6BI5I3' or '>BBBI6I4I5', tag, r.cap, r.h, last, r.n, exp, lm < 2 ^ 24 and lm or 0) end
  local x = m and pack('>I6', lm % 2 ^ 48) or ''
  if lay == COUNT then return pack('>BI4I4I4I5I6BB', tag, r.cap, r.h, r.n, exp, last, r.mh, r.mc) .. x end
  return pack('>BI4I4I4I5dI6I6I6BB', tag, r.cap, r.h, r.n, exp, r.seq, r.flo, r.total, last, r.mh, r.mc) .. x
end
local function blank(r)
  r.h, r.n, r.exp, r.v, r.vlen, r.last, r.mh, r.mc, r.lm, r.w, r.wo, r.whole = 0, 0, ms, '', 0, nil, 0, 0, 0, '', 0, false
  shape(r, SMALL_COUNT, 0, true)
end
local function load(r)
  local v = pcall('GETRANGE', r.key, '0', '511') -- numbers given to redis.call are formatted each call
  if type(v) ~= 'string' then v = fresh(v, r.key) or '' end
  local vlen, size, tag, last, lm = #v, 0, #v >= 18 and byte(v) or 0, nil, nil
  local m, lay = tag > 5, tag > 5 and tag - WITH_LM or tag
  r.v, r.vlen, r.w, r.wo, r.whole, r.mc, r.mir = v, vlen, '', 0, false, 0, nil
  if lay == SMALL_COUNT then size, r.h, last, r.n, r.exp, lm = unpack(m and '>BBI6BI5I3' or '>BBI6I4I5', v, 2)
  elseif lay == COUNT and vlen >= 32 then size, r.h, r.n, r.exp, last, r.mh, r.mc, lm = unpack('>I4I4I4I5I6BBI6', v, 2)
  elseif lay == UNITS and vlen >= 52 then size, r.h, r.n, r.exp, r.seq, r.flo, r.total, last, r.mh, r.mc, lm = unpack('>I4I4I4I5dI6I6I6BBI6', v, 2)
  else lay = 0 end
  if lay > 0 and (vlen == shape(r, lay, size, m) or vlen >= SMALL) then
    r.last, r.lm = tbase + (last - tbase) % 2 ^ 48, m and lm or 0 return
  end
  blank(r) -- nothing, or nothing this layout reads: the ring starts over
end
-- bytes returns len bytes at offset off, u6 the 6-byte number there (from v,
-- or w, which reads a chunk from there when it does not hold it); put writes
-- b at off, or into v when it is a whole value made anew (commit writes it),
-- keeping v and the chunk in step.
local function bytes(r, off, len)
  return off + len <= r.vlen and sub(r.v, off + 1, off + len) or call('GETRANGE', r.key, off, off + len - 1)
end
local function u6(r, off)
  if off + 6 <= r.vlen then return (unpack('>I6', r.v, off + 1)) end
  if off < r.wo or off + 6 > r.wo + #r.w then r.w, r.wo = call('GETRANGE', r.key, off, off + CHUNK - 1), off end
  return (unpack('>I6', r.w, off - r.wo + 1))
end
local function u48(x) return pack('>I6', x % 2 ^ 48) end
local function put(r, off, b)
  if not r.whole then call('SETRANGE', r.key, fmt('%d', off), b) end
  local v, w, wo, hi = r.v, r.w, r.wo, min(off + #b, r.vlen)
  if off < hi then r.v = sub(v, 1, off) .. sub(b, 1, hi - off) .. sub(v, hi + 1) end
  local lo, up = max(off, wo), min(off + #b, wo + #w) -- the chunk too: a settle reads on in it
  if lo < up then r.w = sub(w, 1, lo - wo) .. sub(b, lo - off + 1, up - off) .. sub(w, up - wo + 1) end
end
-- t returns the time of entry i (0 is the oldest kept), u its units, s the units of the entries kept up to it
-- (0 for i < 0): in a units ring, the base of i's bucket (the floor, in the oldest's) plus those from its start.
local function t(r, i)
  local o = i < r.mc and r.MO + r.E * (r.mh + i) or r.H + r.E * ((r.h + i) % r.cap)
  return tbase + ((o + 6 <= r.vlen and unpack('>I6', r.v, o + 1) or u6(r, o)) - tbase) % 2 ^ 48
end
local function u(r, i) return r.lay ~= UNITS and 1 or u6(r, (i < r.mc and r.MO + 12 * (r.mh + i) or r.H + 12 * ((r.h + i) % r.cap)) + 6) end
local function base(r, q) return (u6(r, r.BO + 6 * (q % r.B)) - r.flo) % 2 ^ 48 end
local function s(r, i)
  if i < 0 or r.lay ~= UNITS then return max(i + 1, 0) end
  if i == r.n - 1 then return (r.total - r.flo) % 2 ^ 48 end
  local q, j, sum = r.seq + i, 0, 0
  if floor(q / S) > floor(r.seq / S) then j, sum = i - q % S, base(r, floor(q / S)) end
  for m = j, i do sum = sum + u(r, m) end
  return sum
end
-- search returns the first i in [lo, hi) with get(r, i) > x (get increasing in i), hi if none; gallop searches
-- [lo, n) from lo by growing steps (the answer is usually near it), and returns it and get(r, it).
local function search(r, get, x, lo, hi)
  while lo < hi do
    local m = floor((lo + hi) / 2)
    if get(r, m) > x then hi = m else lo = m + 1 end
  end
  return lo
end
local function gallop(r, get, x, lo)
  local hi, step, y, n = lo, 1, nil, r.n
  while hi < n do
    y = get(r, hi)
    if y > x then break end
    lo, hi, step = hi + 1, hi + step, step * 2
  end
  local i = search(r, get, x, lo, min(hi, n))
  return i, i < n and (i == hi and y or get(r, i)) or nil
end
-- range returns the entries [i, j), oldest first.
local function range(r, i, j)
  if j <= i then return '' end
  local p, E, H = (r.h + i) % r.cap, r.E, r.H
  local a = min(j - i, r.cap - p)
  return a < j - i and bytes(r, H + E * p, E * a) .. bytes(r, H, E * (j - i - a)) or bytes(r, H + E * p, E * a)
end
local reshape, rare -- made by rare at first need: run as a script (EVAL), every closure costs each call
local function reshaped(r, size, lay) -- returns the fields a record reads on
  if not reshape then rare() end reshape(r, size, lay) return r.h, r.cap, r.lay, r.mc
end
-- commit writes b at offset off and the header (one write, through the bytes between, when they are in hand),
-- and keeps the key until its newest admission ages out, and an eighth of a window more (a key in use is then
-- not given a new expiry at each admission); an empty ring goes.
local function commit(r, at, off, b)
  local m, key, W = r.mir or '', r.key, r.W
  r.mir = nil -- written now, or dropped with the ring
  if r.n == 0 then return call('DEL', key) end
  r.last = at
  if r.whole then
    local v = off and sub(r.v, 1, off) .. b .. sub(r.v, off + #b + 1) or r.v
    r.exp = ceil((at + W + W / 8) / 1000)
    r.v = header(r) .. m .. sub(v, r.MO + #m + 1)
    return expires and call('SET', key, r.v, 'PX', max(1, r.exp - ms)) or call('SET', key, r.v)
  end
  if expires and at + W > (ms + (r.exp - ms + 2 ^ 39) % 2 ^ 40 - 2 ^ 39) * 1000 then
    local ttl = ceil((at - now + W + W / 8) / 1000) + 1
    TTL[ttl], r.exp = TTL[ttl] or fmt('%d', ttl), ms + ttl -- formatted once a call for most
    call('PEXPIRE', key, TTL[ttl])
  end
  local hd = header(r) .. m
  if off and off + #b <= min(r.vlen, SMALL) then return call('SETRANGE', key, '0', hd .. sub(r.v, #hd + 1, off) .. b) end
  if off then call('SETRANGE', key, fmt('%d', off), b) end
  call('SETRANGE', key, '0', hd)
end
-- A log zone's decision, before any write: when a request of cost c fits
-- (room), the units in the window (held), until units leave it (reset); and
-- the decision in hand. It reads the ring, or decides on the one in hand.
local function log_decide(r, c, inhand)
  local W, mx = r.W, r.mx
  if not inhand then load(r) end
  local n, cut, f, first, units = r.n, now - W, 0, nil, r.lay == UNITS
  if n > 0 then
    first = t(r, 0)
    if first <= cut then
      f, first = 1, n > 1 and t(r, 1) or nil
      if first and first <= cut then f, first = gallop(r, t, cut, 2) end
    end
  end
  local all, before, g = units and (r.total - r.flo) % 2 ^ 48 or n, units and s(r, f - 1) or f, f
  if units then -- entries settled to zero hold nothing: the window starts after them
    while g < n and u(r, g) == 0 do g = g + 1 end
    if g ~= f then f, first = g, g < n and t(r, g) or nil end
  end
  r.f, r.first, r.before, r.newest = f, first, before, n > 0 and r.last or nil
  local held, room = all - before, now
  if held + c > mx and c <= mx then
    local T, j = all + c - mx, units and f or all + c - mx - 1
    if units then -- whole buckets by their bases, then entry by entry
      local k0, sum = floor((r.seq + f) / S), before
      local kb = search(r, base, T - 1, k0 + 1, floor((r.seq + n - 1) / S) + 1) - 1
      if kb > k0 then j, sum = kb * S - r.seq, base(r, kb) end
      while sum + u(r, j) < T do sum, j = sum + u(r, j), j + 1 end
    end
    room = t(r, j) + W
  end
  return room, held, first and first + W - now or 0
end
-- Records an admission of a log zone at time at (or just after the newest), dropping what aged out,
-- growing, shrinking, merging or changing the ring's layout.
local function log_record(r, c, at, held, reset)
  local W, mx, f, newest, mc, n, h, cap, lay = r.W, r.mx, r.f, r.newest, r.mc, r.n, r.h, r.cap, r.lay
  if newest and newest >= at then at = newest + 1 end
  if f > 0 then
    h, n, mc, r.mh = (h + f) % cap, n - f, max(mc - f, 0), mc > f and r.mh + f or 0 r.h, r.n, r.mc = h, n, mc
    if lay == UNITS then r.flo, r.seq = (r.flo + r.before) % 2 ^ 48, r.seq + f end
  end
  if n == 0 and c == 1 and lay == UNITS then h, cap, lay, mc = reshaped(r, 4, SMALL_COUNT) end -- all aged out: a count ring again
  r.lm = mx if not r.m then h, cap, lay, mc = reshaped(r, cap, lay) end -- a ring written before lm gets room for it, once
  -- A units ring of MERGE entries puts an admission in the newest of its span (W / MERGE, keeping the
  -- latest time); one of MAXCAP always. A count ring of 4 MERGE (3, max > 4 MERGE) turns units.
  local units, span = lay == UNITS or c ~= 1 or n >= 4 * MERGE or n >= 3 * MERGE and mx > 4 * MERGE, max(1, floor(W / MERGE))
  if lay == UNITS and n > 0 and (n >= MERGE and floor(at / span) == floor(r.last / span) or n >= MAXCAP) then
    r.total = (r.total + c) % 2 ^ 48
    commit(r, at, r.H + 12 * ((h + n - 1) % cap), pack('>I6I6', at % 2 ^ 48, (u(r, n - 1) + c) % 2 ^ 48))
    return at, held + c, r.first and reset or at + W - now
  end
  if n == cap or cap > 64 and 4 * (n + 1) <= cap or units and lay ~= UNITS then -- grow, shrink or convert
    local size = n < cap and (cap > 64 and 4 * (n + 1) <= cap and floor(cap / 2) or cap)
      or c == 1 and lay ~= UNITS and n < mx and min(max(4, 2 * cap), mx) or max(4, 2 * cap)
    h, cap, lay, mc = reshaped(r, min(size, MAXCAP), units and UNITS or size <= SMALLCAP and SMALL_COUNT or COUNT)
  end
  -- The mirror runs low: it takes the oldest entries again (the header's write carries them).
  local H, E = r.H, r.E
  if lay ~= SMALL_COUNT and mc < 2 and n > mc then r.mh, r.mc, r.mir = 0, min(n, 96 / E), range(r, 0, min(n, 96 / E)) end
  local off, q = H + E * ((h + n) % cap), lay == UNITS and r.seq + n
  r.n = n + 1
  if q and q % S == 0 and n > 0 then put(r, r.BO + 6 * (floor(q / S) % r.B), u48(r.total)) end
  if q then r.total = (r.total + c) % 2 ^ 48 end
  commit(r, at, off, q and pack('>I6I6', at % 2 ^ 48, c % 2 ^ 48) or pack('>I6', at % 2 ^ 48))
  return at, held + c, r.first and reset or at + W - now
end
local lease_ext, decide, record, settle = nil, {[0] = log_decide}, {[0] = log_record}, {}
-- rare makes what log zones' steady state does not need: reshape, settles, other kinds' functions.
function rare()
  -- reshape gives the ring size slots in layout lay: grown, shrunk, or a count ring made a units ring (1 unit an
  -- entry). A large ring grows in place: the value is extended, and the smaller of the older and the newer part
  -- of its entries moves so that the free slots lie between them.
  function reshape(r, size, lay)
    local len, c0, B0, bases, h, H, E = layout(lay, size, true), r.cap, r.B, r.lay == UNITS and lay == UNITS and bytes(r, r.BO, 6 * r.B), r.h, r.H, r.E
    if r.lay == lay and size > c0 and len > SMALL then
      call('SETRANGE', r.key, len - 1, '\0')
      if h > 0 and h <= c0 - h then put(r, H + E * c0, bytes(r, H, E * h)) end
      if h > c0 - h then put(r, H + E * (h + size - c0), bytes(r, H + E * h, E * (c0 - h))) r.h = h + size - c0 end
    else
      local body = range(r, 0, r.n)
      if lay == UNITS and r.lay ~= UNITS then
        local parts, one = {}, u48(1)
        for i = 0, r.n - 1 do parts[i + 1] = sub(body, 6 * i + 1, 6 * i + 6) .. one end
        body, r.seq, r.flo, r.total = table.concat(parts), 0, 0, r.n
      end
      r.h, r.mh = 0, 0
      shape(r, lay, size, true)
      r.mc = lay == SMALL_COUNT and 0 or min(r.n, 96 / r.E) -- the mirror: the oldest entries
      local m = lay == SMALL_COUNT and '' or sub(body, 1, 96) .. string.rep('\0', 96 - min(96, #body))
      r.v, r.w, r.whole, r.mir, r.exp = header(r) .. m .. body, '', len <= SMALL, nil, ms
      -- A large value starts over, then takes its length.
      if r.whole then r.v = r.v .. string.rep('\0', len - #r.v) else call('SET', r.key, r.v) call('SETRANGE', r.key, len - 1, '\0') end
      r.vlen = #r.v
    end
    shape(r, lay, size, true)
    -- The kept buckets' bases move to their places (a converted ring's count).
    for q = lay == UNITS and r.seq - r.seq % S or 0, lay == UNITS and r.seq + r.n - 1 or -1, S do
      local kb = bases and floor(q / S) % B0
      put(r, r.BO + 6 * (floor(q / S) % r.B), bases and sub(bases, 6 * kb + 1, 6 * kb + 6) or u48(q))
    end
    if not r.whole then -- Redis gives a string it extends room for twice its length: a copy holds its length
      call('BITOP', 'OR', r.key .. '~', r.key) -- a copy, on every version of Redis
      call('RENAME', r.key .. '~', r.key)
      r.exp = ms
    end
  end
  -- Settles the admission at time token to c units, charged from now: the reservation is taken back (a
  -- count ring takes its entry out, the newer move back; a units ring holds it at zero, dropped once
  -- newest), and c is recorded as an admission at its room (now, unless promised slots or other charges
  -- hold it). Returns the units held before and the record's time. Extend moves a running call's reservation
  -- with it, settled to the units it reserved: the record's time is then the token its next settle finds it by.
  local function log_settle(r)
    local c, token, _, held0 = r.c, r.token, log_decide(r, 0)
    if token == FLOOR then c = max(0, c - held0) end
    local n, e, old, back = r.n, nil, nil, r.lay == UNITS and unpack('>d', r.aux) -- e, old: the entry settled, its units
    -- Most settle the newest admission, alone in its entry, to a cost that fits now: it moves to now, with c.
    if back and r.m and token == r.last and token <= now and c > 0 and held0 - back + c <= r.mx and u(r, n - 1) == back then
      r.total, r.lm, r.mc = (r.total - back + c) % 2 ^ 48, r.mx, min(r.mc, n - 1) -- the mirror keeps the older
      commit(r, now, r.H + 12 * ((r.h + n - 1) % r.cap), pack('>I6I6', now % 2 ^ 48, c))
      return 1, held0, now
    end
    if n > 0 and token <= r.last then -- most settle one of the newest: looking back from it, in one chunk
      local last, hi, step, o = r.last, n - 1, 1, max(r.H, r.H + r.E * ((r.h + n - 1) % r.cap + 1) - CHUNK)
      if o + CHUNK > r.vlen then r.w, r.wo = call('GETRANGE', r.key, fmt('%d', o), fmt('%d', o + CHUNK - 1)), o end
      while token < last and hi > 0 and t(r, max(hi - step, 0)) > token do hi, step = max(hi - step, 0), step * 2 end
      e = token < last and search(r, t, token - 1, max(hi - step, 0), hi) or hi
      local span = max(1, floor(r.W / MERGE)) -- or merged into a later entry of its span
      old = (t(r, e) == token or r.lay == UNITS and token > now - r.W and floor(t(r, e) / span) == floor(token / span)) and u(r, e)
    end
    if old and r.lay ~= UNITS then
      local b, p, cap = range(r, e + 1, n), (r.h + e) % r.cap, r.cap
      if #b > 0 then put(r, r.H + 6 * p, sub(b, 1, 6 * (cap - p))) end
      if #b > 6 * (cap - p) then put(r, r.H, sub(b, 6 * (cap - p) + 1)) end
      n = n - 1
    elseif old then -- the reservation, or what the entry holds
      back = min(old, back)
      for q = floor((r.seq + e) / S) + 1, floor((r.seq + n - 1) / S) do put(r, r.BO + 6 * (q % r.B), u48(u6(r, r.BO + 6 * (q % r.B)) - back)) end
      r.total = (r.total - back) % 2 ^ 48
      -- The newest settled to zero goes unwritten: the record (most settle the newest) takes its slot.
      if e == n - 1 and old == back then n = n - 1 else put(r, r.H + 12 * ((r.h + e) % r.cap) + 6, u48(old - back)) end
      while n > 0 and u(r, n - 1) == 0 do n = n - 1 end
    end
    if old then
      r.n, r.mc = n, e < r.mc and 0 or min(r.mc, n) -- mirror: a changed copy
      if e >= n and n > 0 then r.last = t(r, n - 1) end
      if n == 0 then commit(r, now) blank(r) elseif c == 0 then commit(r, r.last) end -- a ring emptied goes, starts over
    end
    if c == 0 then return 1, held0 end -- c goes at its earliest room, as a wait would (now if c > mx)
    -- Decided on the ring in hand, written once with the record (one header write for both).
    local room, held, reset = log_decide(r, c, true) -- sums are mod 2^48: what a ring holds saturates
    return 1, held0, log_record(r, min(c, 2 ^ 48 - 1 - held), room, held, reset)
  end
  -- The sliding counter: the previous fixed window's units, weighted by the part of it in the window, plus the current's.
  local function counter_decide(z, c)
    local W, idx = z.W, floor(now / z.W)
    local e, hm = now - idx * W, fresh(pcall('HMGET', z.key, 'w', 'c', 'p'), z.key) or {}
    local w, cur, prev = tonumber(hm[1]), tonumber(hm[2]) or 0, tonumber(hm[3]) or 0
    if w == nil or w < idx - 1 then cur, prev = 0, 0 elseif w == idx - 1 then cur, prev = 0, cur end
    local held, room, reset, need = prev * (W - e) / W + cur, now, 0, z.mx - c
    if held > need and need >= 0 then -- the previous window's weight decays; else the next window
      room = now + ceil(cur <= need and prev > 0 and W - (need - cur) * W / prev - e or (W - e) + W - need * W / cur)
    end
    if prev > 0 then reset = min(ceil(W / prev), W - e) elseif cur > 0 then reset = ceil((W - e) + W / cur) end
    z.idx, z.e, z.cur, z.prev = idx, e, cur, prev
    return room, held, reset
  end
  local function counter_record(z, c, _, held, reset)
    local W, e, cur, prev = z.W, z.e, z.cur, z.prev
    call('HSET', z.key, 'w', z.idx, 'c', cur + c, 'p', prev) -- kept while it weighs: to the next window's end
    if expires then call('PEXPIRE', z.key, ceil((2 * W - e) / 1000)) end
    return z.idx, held + c, prev > 0 and reset or ceil((W - e) + W / (cur + c))
  end
  -- A settle takes the reservation (aux) back from its window (token), charges c to the current one.
  local function counter_settle(z)
    local _, held, reset = counter_decide(z, 0)
    local back = unpack('>d', z.aux)
    if z.token == FLOOR then z.c = max(0, z.c - ceil(held)) end
    if z.token == z.idx then z.cur = max(0, z.cur - back) elseif z.token == z.idx - 1 then z.prev = max(0, z.prev - back) end
    counter_record(z, z.c, now, held, reset)
    return 1, held
  end
  -- A concurrency zone: the leases whose expiry is after now; its key lives as long as its latest lease.
  local function lease_decide(z)
    local k, held, reset = z.key, fresh(pcall('ZCOUNT', z.key, '(' .. fmt('%d', now), '+inf'), z.key) or 0, 0
    if held > 0 then reset = call('ZRANGEBYSCORE', k, '(' .. fmt('%d', now), '+inf', 'LIMIT', 0, 1, 'WITHSCORES')[2] - now end
    return held + 1 > z.mx and now + reset or now, held, reset
  end
  local function keep_leases(k)
    if expires then call('PEXPIRE', k, max(1, ceil((call('ZRANGE', k, -1, -1, 'WITHSCORES')[2] - now) / 1000))) end
  end
  local function lease_record(z, _, at, held, reset)
    local k, W = z.key, z.W
    call('ZREMRANGEBYSCORE', k, '-inf', fmt('%d', now))
    call('ZADD', k, fmt('%d', at + W), z.aux)
    return keep_leases(k) or -1, held + 1, (reset == 0 or at + W - now < reset) and at + W - now or reset
  end
  local function lease_extend(z)
    local lease = tonumber(fresh(pcall('ZSCORE', z.key, z.aux), z.key))
    if lease and lease > now then call('ZADD', z.key, 'XX', fmt('%d', now + z.W), z.aux) end
    return lease and lease > now and (keep_leases(z.key) or 1) or 0
  end
  decide[1], record[1], settle[1], decide[2], record[2] = counter_decide, counter_record, counter_settle, lease_decide, lease_record
  settle[0], settle[2], lease_ext = log_settle, function(z) return call('ZREM', z.key, z.aux) end, lease_extend
end
-- verdict is a zone's flag (2 never, 1 admits within the wait, which only log
-- zones take, 0 denied) and reset; reply packs a zone's answer.
local function verdict(kind, c, mx, room, reset, wait)
  if c > mx then return 2, 0 end
  if room - now <= (kind == 0 and wait or 0) then return 1, reset end
  return 0, room - now
end
local function reply(first, delay, flag, mx, held, reset, token)
  local rem = mx - held > 0 and mx - held - (mx - held) % 1 or 0
  return first and pack('>dBddd', delay, flag, rem, reset, token) or pack('>Bddd', flag, rem, reset, token)
end
-- zone makes a zone's table with a slot for each field it may take: one that grows rehashes at each doubling.
local function zone() return {key = nil, kind = nil, W = nil, mx = nil, c = nil, token = nil, aux = nil, held = nil, flag = nil, reset = nil,
  v = nil, vlen = nil, w = nil, wo = nil, whole = nil, mir = nil, lay = nil, m = nil, cap = nil, len = nil, E = nil, MO = nil, H = nil, B = nil,
  BO = nil, h = nil, n = nil, mh = nil, mc = nil, exp = nil, last = nil, lm = nil, seq = nil, flo = nil, total = nil, f = nil, first = nil,
  before = nil, newest = nil, idx = nil, e = nil, cur = nil, prev = nil} end
-- The chunk returns the call, of KEYS and ARGV as above. Each request: its zones' tables (kept from request
-- to request), each decided as it is read (locals hold what a zone's table would give back); then all record
-- at the latest room if all admit; or all settle or extend.
return function(KEYS, ARGV)
  now, expires, clock = tonumber(ARGV[2]), not ARGV[2], call('TIME')
  if not now then now = clock[1] * 1000000 + clock[2] end
  tbase, ms, TTL = now - 0.75 * 2 ^ 48, floor(now / 1000), {}
  local Z, out, args, pos, k = {}, {}, ARGV[1], 1, 0
  while pos <= #args do
    local op, nz, wait, kind, W, mx, c, token, p = unpack('>BBdBdddd', args, pos)
    local at, admit = now, true
    for i = 1, nz do
      local z = Z[i] or zone()
      if i > 1 then kind, W, mx, c, token, p = unpack('>Bdddd', args, p) end
      if (kind > 0 or op == 2) and not reshape then rare() end
      Z[i], k, z.key, z.kind, z.W, z.mx, z.c, z.token = z, k + 1, KEYS[k + 1], kind, W, mx, c, token
      z.aux, p = (kind == 2 or op == 2) and sub(args, p, p + 7), p + 8
      if op < 2 then
        local room, held, reset = decide[kind](z, c)
        z.held, z.flag, z.reset = held, verdict(kind, c, mx, room, reset, wait)
        if z.flag ~= 1 then admit = false elseif room > at then at = room end
      end
    end
    pos = p
    for i = 1, nz do
      local z, t = Z[i], -1
      local kind, held, reset, flag, mx = z.kind, z.held, z.reset, z.flag, z.mx
      if op == 2 then flag, held, t = settle[kind](z) -- done; what its zone held before, its record's time
      elseif op == 3 then flag, held = kind == 2 and lease_ext(z) or 0, nil
      elseif op == 0 and kind == 0 then t = z.lm -- a peek: the log's lm
      elseif op == 1 and admit then t, held, reset = record[kind](z, z.c, at, held, reset) end
      if op > 1 then held, reset, t = held or mx, 0, t or -1 end
      out[#out + 1] = reply(i == 1, admit and at - now or 0, flag, mx, held, reset, t)
    end
  end
  local done = call('TIME') -- the call's own time, so the caller tells Redis's time from the network's
  return table.concat(out) .. pack('>d', (done[1] - clock[1]) * 1000000 + done[2] - clock[2])
end
