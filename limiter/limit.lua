-- Decides a batch of rate-limit requests in one call: TIME once, then each
-- request's zones all or nothing, then one packed reply.
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
--          counter's window index), aux 8 bytes (lease id; settle: the
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
--
-- A ring holds the admissions that may still be in the window, oldest first
-- from slot h of cap, wrapping; what aged out goes at the next record, so a
-- ring reuses those slots before it grows (doubling, in place when large).
-- Entries are times (µs mod 2^48, read as the nearest to now); in a count
-- ring sums are indexes. Version 4, a count ring of at most SMALLCAP: header
-- version, cap, h u8, newest time u48, n u32, expiry (ms mod 2^40) u40.
-- Version 3, a larger count ring: version u8, cap, h, n u32, expiry, newest;
-- version 2, units, the same with the sequence number of slot h (double) and
-- the sums before it and to the newest before the newest time; an entry is a
-- time and its units, and each bucket of S entries has its base sum after the
-- ring, so a settle writes one entry and the later bases. Both then have the
-- head and count (u8) of a mirror of 96 bytes that holds copies of the oldest
-- entries, so that a decision reads one range. Values of up to SMALL bytes
-- are read whole, no large one is read or built whole (Redis's Lua hashes
-- every string it makes). Sums are mod 2^48: a ring saturates. Versions 7, 6
-- are 3, 2 with lm u48 (the newest record's max) ending the header; 8 is 4
-- of the same size, n u8, lm u24 (0: larger) ending it.
local unpack, pack, floor, ceil, sub = struct.unpack, struct.pack, math.floor, math.ceil, string.sub
local call, pcall, min, max, fmt, byte = redis.call, redis.pcall, math.min, math.max, string.format, string.byte
local S, CHUNK, SMALL, SMALLCAP, MERGE, MAXCAP = 64, 120, 512, 80, 256, 1170
local now, expires, clock = tonumber(ARGV[2]), not ARGV[2], call('TIME')
if not now then now = clock[1] * 1000000 + clock[2] end
local tbase, ms, TTL = now - 0.75 * 2 ^ 48, floor(now / 1000), {}
-- fresh returns reply, or nil after dropping key when it holds another kind's
-- state (the zone's algorithm changed), which then starts over.
local function fresh(reply, key)
  if type(reply) ~= 'table' or not reply.err then return reply end
  if not string.find(reply.err, 'WRONGTYPE', 1, true) then error(reply) end
  call('DEL', key)
end
-- The ring in hand: key; v, its first vlen bytes (header and mirror, or all
-- of a small value), w, bytes from offset wo; the header; MO, H, E, BO: the
-- offsets of mirror and ring, an entry's size, the bases' offset; mir, the
-- mirror to write. The decision in hand, for the record: f, the first entry in
-- the window holding units, its time, the units before it, the newest time.
local key, v, w, wo, mh = nil, nil, '', 0, 0
local vlen, whole, ver, mv, lm, cap, h, n, exp, seq, flo, total, last, mc, mir, MO, H, E, B, BO
local f, first, before, newest, t, tc, tw
-- shape gives the ring the layout of version with size slots, with lm (m) or not; it returns the length.
local function shape(version, size, m)
  ver, mv, cap, E, MO = version, m, size, version == 2 and 12 or 6, (version == 4 and 18 or version == 3 and 26 or 46) + (m and version < 4 and 6 or 0)
  H = version == 4 and MO or MO + 96
  BO, B = H + E * size, version == 2 and floor(size / S) + 2 or 0
  return BO + 6 * B
end
local function header()
  local b, x = ver + (mv and 4 or 0), mv and pack('>I6', lm % 2 ^ 48) or ''
  if ver == 4 then return pack(mv and '>BBBI6BI5I3' or '>BBBI6I4I5', b, cap, h, (last or 0) % 2 ^ 48, n, exp % 2 ^ 40, lm < 2 ^ 24 and lm or 0) end
  if ver == 3 then return pack('>BI4I4I4I5I6BB', b, cap, h, n, exp % 2 ^ 40, (last or 0) % 2 ^ 48, mh, mc) .. x end
  return pack('>BI4I4I4I5dI6I6I6BB', b, cap, h, n, exp % 2 ^ 40, seq, flo, total, (last or 0) % 2 ^ 48, mh, mc) .. x
end
local function blank()
  h, n, exp, v, vlen, last, t, mc, lm, w, whole = 0, 0, ms, '', 0, nil, tc, 0, 0, '', false
  shape(4, 0, true)
end
local function load(k, small)
  -- Numbers given to redis.call are formatted at each call: these are not.
  key, w, whole, mc, v = k, '', false, 0, pcall('GETRANGE', k, '0', small and '511' or '147')
  vlen = #v
  if vlen == 0 and type(v) ~= 'string' then v = fresh(v, k) or '' end
  local version, size = vlen >= 18 and byte(v) or 0, 0
  local m = version > 5 if m then version = version - 4 end
  if version == 4 then size, h, last, n, exp, lm = unpack(m and '>BBI6BI5I3' or '>BBI6I4I5', v, 2)
  elseif version == 3 and vlen >= 32 then size, h, n, exp, last, mh, mc, lm = unpack('>I4I4I4I5I6BBI6', v, 2)
  elseif version == 2 and vlen >= 52 then size, h, n, exp, seq, flo, total, last, mh, mc, lm = unpack('>I4I4I4I5dI6I6I6BBI6', v, 2)
  else version = 0 end
  if version > 0 and (vlen == shape(version, size, m) or vlen >= (small and SMALL or 148)) then
    last, t, lm = tbase + (last - tbase) % 2 ^ 48, vlen == BO and tw or tc, m and lm or 0 return
  end
  blank() -- nothing, or nothing this version reads: the ring starts over
end
local function save() return {key, v, w, mh, ver, cap, h, n, exp, seq, flo, total, last, f, first, before, newest, mc, mv, lm} end
local function restore(r)
  key, v, w, vlen, whole, mh, h, n, exp, seq, flo, total, last = r[1], r[2], '', #r[2], false, r[4], r[7], r[8], r[9], r[10], r[11], r[12], r[13]
  f, first, before, newest, t, mc, lm = r[14], r[15], r[16], r[17], tc, r[18], r[20]
  shape(r[5], r[6], r[19])
end
-- bytes returns len bytes at offset off, u6 the 6-byte number there (from v,
-- or w, which reads a chunk from there when it does not hold it); put writes
-- b at off, or into v when it is a whole value made anew (commit writes it),
-- keeping v and the chunk in step.
local function bytes(off, len)
  return off + len <= vlen and sub(v, off + 1, off + len) or call('GETRANGE', key, off, off + len - 1)
end
local function u6(off)
  if off + 6 <= vlen then return (unpack('>I6', v, off + 1)) end
  if off < wo or off + 6 > wo + #w then w, wo = call('GETRANGE', key, off, off + CHUNK - 1), off end
  return (unpack('>I6', w, off - wo + 1))
end
local function put(off, b)
  if not whole then call('SETRANGE', key, fmt('%d', off), b) end
  local hi = min(off + #b, vlen)
  if off < hi then v = sub(v, 1, off) .. sub(b, 1, hi - off) .. sub(v, hi + 1) end
  local lo, up = max(off, wo), min(off + #b, wo + #w) -- the chunk too: a settle reads on in it
  if lo < up then w = sub(w, 1, lo - wo) .. sub(b, lo - off + 1, up - off) .. sub(w, up - wo + 1) end
end
local function u48(x) return pack('>I6', x % 2 ^ 48) end
-- t returns the time of entry i (0 is the oldest kept; tw when v holds the
-- whole value), u its units, s the units of the entries kept up to it (0 for
-- i < 0): in a units ring, the base of i's bucket (the floor, in the
-- oldest's) plus those from its start.
function tc(i)
  local o = i < mc and MO + E * (mh + i) or H + E * ((h + i) % cap)
  return tbase + ((o + 6 <= vlen and unpack('>I6', v, o + 1) or u6(o)) - tbase) % 2 ^ 48
end
function tw(i) return tbase + (unpack('>I6', v, H + 1 + E * ((h + i) % cap)) - tbase) % 2 ^ 48 end
local function u(i) return ver ~= 2 and 1 or u6((i < mc and MO + 12 * (mh + i) or H + 12 * ((h + i) % cap)) + 6) end
local function s(i)
  if i < 0 or ver ~= 2 then return max(i + 1, 0) end
  if i == n - 1 then return (total - flo) % 2 ^ 48 end
  local q, j, sum = seq + i, 0, 0
  if floor(q / S) > floor(seq / S) then j, sum = i - q % S, (u6(BO + 6 * (floor(q / S) % B)) - flo) % 2 ^ 48 end
  for m = j, i do sum = sum + u(m) end
  return sum
end
-- search returns the first i in [lo, hi) with get(i) > x (get increasing in
-- i), hi if none; gallop searches [lo, n) from lo by growing steps (the answer
-- is usually near it), and returns it and get(it).
local function search(get, x, lo, hi)
  while lo < hi do
    local m = floor((lo + hi) / 2)
    if get(m) > x then hi = m else lo = m + 1 end
  end
  return lo
end
local function gallop(get, x, lo)
  local hi, step, y = lo, 1, nil
  while hi < n do
    y = get(hi)
    if y > x then break end
    lo, hi, step = hi + 1, hi + step, step * 2
  end
  local i = search(get, x, lo, min(hi, n))
  return i, i < n and (i == hi and y or get(i)) or nil
end
-- range returns the entries [i, j), oldest first.
local function range(i, j)
  if j <= i then return '' end
  local p = (h + i) % cap
  local a = min(j - i, cap - p)
  return a < j - i and bytes(H + E * p, E * a) .. bytes(H, E * (j - i - a)) or bytes(H + E * p, E * a)
end
-- reshape gives the ring size slots in the layout of version: grown, shrunk,
-- or a count ring made a units ring (1 unit an entry). A large ring grows in
-- place: the value is extended, and the smaller of the older and the newer
-- part of its entries moves so that the free slots lie between them.
local function reshape(size, version)
  local v0, c0, m0, B0, bases = ver, cap, mv, B, ver == 2 and version == 2 and bytes(BO, 6 * B)
  local len = shape(version, size, true)
  shape(v0, c0, m0)
  if ver == version and size > cap and len > SMALL then
    call('SETRANGE', key, len - 1, '\0')
    if h > 0 and h <= cap - h then put(H + E * cap, bytes(H, E * h)) end
    if h > cap - h then put(H + E * (h + size - cap), bytes(H + E * h, E * (cap - h))) h = h + size - cap end
  else
    local body = range(0, n)
    if version == 2 and ver ~= 2 then
      local parts, one = {}, u48(1)
      for i = 0, n - 1 do parts[i + 1] = sub(body, 6 * i + 1, 6 * i + 6) .. one end
      body, seq, flo, total = table.concat(parts), 0, 0, n
    end
    h, mh = 0, 0
    shape(version, size, true)
    mc = version == 4 and 0 or min(n, 96 / E) -- the mirror: the oldest entries
    local m = version == 4 and '' or sub(body, 1, 96) .. string.rep('\0', 96 - min(96, #body))
    v, w, exp, whole, mir = header() .. m .. body, '', ms, len <= SMALL, nil
    if whole then
      v = v .. string.rep('\0', len - #v)
    else
      call('SET', key, v) -- the value starts over, then takes its length
      call('SETRANGE', key, len - 1, '\0')
    end
    vlen = #v
  end
  shape(version, size, true)
  -- The kept buckets' bases move to their places (a converted ring's count).
  for q = version == 2 and seq - seq % S or 0, version == 2 and seq + n - 1 or -1, S do
    local kb = bases and floor(q / S) % B0
    put(BO + 6 * (floor(q / S) % B), bases and sub(bases, 6 * kb + 1, 6 * kb + 6) or u48(q))
  end
  if not whole then -- Redis gives a string it extends room for twice its length: a copy holds its length
    call('BITOP', 'OR', key .. '~', key) -- a copy, on every version of Redis
    call('RENAME', key .. '~', key)
    exp = ms
  end
end
-- commit writes b at offset off and the header, and keeps the key until its
-- newest admission ages out, and an eighth of a window more (a key in use is
-- then not given a new expiry at each admission); an empty ring goes.
local function commit(at, window, off, b)
  local m = mir or ''
  mir = nil -- written now, or dropped with the ring
  if n == 0 then return call('DEL', key) end
  last = at
  if whole then
    exp = ceil((at + window + window / 8) / 1000)
    if off then v = sub(v, 1, off) .. b .. sub(v, off + #b + 1) end
    v = header() .. m .. sub(v, MO + #m + 1)
    return expires and call('SET', key, v, 'PX', max(1, exp - ms)) or call('SET', key, v)
  end
  if expires and at + window > (ms + (exp - ms + 2 ^ 39) % 2 ^ 40 - 2 ^ 39) * 1000 then
    local ttl = ceil((at - now + window + window / 8) / 1000) + 1
    TTL[ttl], exp = TTL[ttl] or fmt('%d', ttl), ms + ttl -- formatted once a call for most
    call('PEXPIRE', key, TTL[ttl])
  end
  if off then call('SETRANGE', key, fmt('%d', off), b) end
  call('SETRANGE', key, '0', header() .. m)
end
-- A log zone's decision, before any write: when a request of cost c fits
-- (room), the units in the window (held), until units leave it (reset); and
-- the decision in hand.
local function log_decide(k, W, mx, c, inhand)
  if not inhand then load(k, 18 + 6 * mx <= SMALL) end
  local cut = now - W
  f, first, newest = 0, nil, n > 0 and last or nil
  if n > 0 then
    first = t(0)
    if first <= cut then
      f, first = 1, n > 1 and t(1) or nil
      if first and first <= cut then f, first = gallop(t, cut, 2) end
    end
  end
  local all, g = ver ~= 2 and n or (total - flo) % 2 ^ 48, f
  before = ver ~= 2 and f or s(f - 1)
  if ver == 2 then -- entries settled to zero hold nothing: the window starts after them
    while g < n and u(g) == 0 do g = g + 1 end
    if g ~= f then f, first = g, g < n and t(g) or nil end
  end
  local held, room = all - before, now
  if held + c > mx and c <= mx then
    local T, j = all + c - mx, ver ~= 2 and all + c - mx - 1 or f
    if ver == 2 then -- whole buckets by their bases, then entry by entry
      local k0, sum = floor((seq + f) / S), before
      local kb = search(function(q) return (u6(BO + 6 * (q % B)) - flo) % 2 ^ 48 end, T - 1, k0 + 1, floor((seq + n - 1) / S) + 1) - 1
      if kb > k0 then j, sum = kb * S - seq, (u6(BO + 6 * (kb % B)) - flo) % 2 ^ 48 end
      while sum + u(j) < T do sum, j = sum + u(j), j + 1 end
    end
    room = t(j) + W
  end
  return room, held, first and first + W - now or 0
end
-- Records an admission of a log zone at time at (or just after the newest), dropping what aged out,
-- growing, shrinking, merging or changing the ring's kind.
local function log_record(k, W, mx, c, at, held, reset)
  if newest and newest >= at then at = newest + 1 end
  if f > 0 then
    h, n, mh, mc = (h + f) % cap, n - f, mc > f and mh + f or 0, max(mc - f, 0)
    if ver == 2 then flo, seq = (flo + before) % 2 ^ 48, seq + f end
  end
  if ver == 2 and n == 0 and c == 1 then reshape(4, 4) end -- all aged out: a count ring again
  lm = mx if not mv then reshape(cap, ver) end -- a ring written before lm gets room for it, once
  -- A units ring of MERGE entries puts an admission in the newest of its span (W / MERGE, keeping the
  -- latest time); one of MAXCAP always. A count ring of 4 MERGE (3, max > 4 MERGE) turns units.
  local span, units = max(1, floor(W / MERGE)), ver == 2 or c ~= 1 or n >= 4 * MERGE or n >= 3 * MERGE and mx > 4 * MERGE
  if ver == 2 and n > 0 and (n >= MERGE and floor(at / span) == floor(last / span) or n >= MAXCAP) then
    total = (total + c) % 2 ^ 48
    commit(at, W, H + 12 * ((h + n - 1) % cap), pack('>I6I6', at % 2 ^ 48, (u(n - 1) + c) % 2 ^ 48))
    return at, held + c, first and reset or at + W - now
  end
  if n == cap or cap > 64 and 4 * (n + 1) <= cap or units and ver ~= 2 then -- grow, shrink or convert
    local size = n < cap and (cap > 64 and 4 * (n + 1) <= cap and floor(cap / 2) or cap)
      or c == 1 and ver ~= 2 and n < mx and min(max(4, 2 * cap), mx) or max(4, 2 * cap)
    reshape(min(size, MAXCAP), units and 2 or size <= SMALLCAP and 4 or 3)
  end
  -- The mirror runs low: it takes the oldest entries again (the header's write carries them).
  if ver ~= 4 and mc < 2 and n > mc then mh, mc, mir = 0, min(n, 96 / E), range(0, min(n, 96 / E)) end
  local off = H + E * ((h + n) % cap)
  n = n + 1
  if ver == 2 and (seq + n - 1) % S == 0 and n > 1 then put(BO + 6 * (floor((seq + n - 1) / S) % B), u48(total)) end
  total = ver == 2 and (total + c) % 2 ^ 48 or total
  commit(at, W, off, ver == 2 and pack('>I6I6', at % 2 ^ 48, c % 2 ^ 48) or pack('>I6', at % 2 ^ 48))
  return at, held + c, first and reset or at + W - now
end
-- Settles the admission at time token to c units, charged from now: the reservation is taken back (a
-- count ring takes its entry out, the newer move back; a units ring holds it at zero, dropped once
-- newest), and c is recorded as an admission at its room (now, unless promised slots or other charges
-- hold it). Returns the units held before and the record's time.
local function log_settle(k, W, mx, c, token, aux)
  local _, held0, _, e, old = log_decide(k, W, mx, 0) -- e, old: the entry settled, its units
  if n > 0 and token <= last then -- most settle one of the newest: looking back from it
    local hi, step, o = n - 1, 1, max(H, H + E * ((h + n - 1) % cap + 1) - CHUNK) -- a chunk that ends at the newest
    if o + CHUNK > vlen then w, wo = call('GETRANGE', key, fmt('%d', o), fmt('%d', o + CHUNK - 1)), o end
    while token < last and hi > 0 and t(max(hi - step, 0)) > token do hi, step = max(hi - step, 0), step * 2 end
    e = token < last and search(t, token - 1, max(hi - step, 0), hi) or hi
    local span = max(1, floor(W / MERGE)) -- or merged into a later entry of its span
    old = (t(e) == token or ver == 2 and token > now - W and floor(t(e) / span) == floor(token / span)) and u(e)
  end
  if old and ver ~= 2 then
    local b, p = range(e + 1, n), (h + e) % cap
    if #b > 0 then put(H + 6 * p, sub(b, 1, 6 * (cap - p))) end
    if #b > 6 * (cap - p) then put(H, sub(b, 6 * (cap - p) + 1)) end
    n = n - 1
  elseif old then -- the reservation, or what the entry holds
    local r = min(old, (unpack('>d', aux)))
    for q = floor((seq + e) / S) + 1, floor((seq + n - 1) / S) do put(BO + 6 * (q % B), u48(u6(BO + 6 * (q % B)) - r)) end
    total = (total - r) % 2 ^ 48
    -- The newest settled to zero goes unwritten: the record (most settle the newest) takes its slot.
    if e == n - 1 and old == r then n = n - 1 else put(H + 12 * ((h + e) % cap) + 6, u48(old - r)) end
    while n > 0 and u(n - 1) == 0 do n = n - 1 end
  end
  if old then
    mc = e < mc and 0 or min(mc, n) -- mirror: a changed copy
    if e >= n and n > 0 then last = t(n - 1) end
    if c == 0 or n == 0 then commit(n > 0 and last or now, W) end -- a ring emptied goes, and starts over
    if n == 0 then blank() end
  end
  if c == 0 then return 1, held0 end -- c goes at its earliest room, as a wait would (now if c > mx)
  -- Decided on the ring in hand, written once with the record (one header write for both).
  local room, held, reset = log_decide(k, W, mx, c, true) -- sums are mod 2^48: what a ring holds saturates
  return 1, held0, log_record(k, W, mx, min(c, 2 ^ 48 - 1 - held), room, held, reset)
end
-- The sliding counter: the previous fixed window's units, weighted by the part of it in the window, plus the current's.
local function counter_decide(k, W, mx, c)
  local idx = floor(now / W)
  local e, hm = now - idx * W, fresh(pcall('HMGET', k, 'w', 'c', 'p'), k) or {}
  local w, cur, prev = tonumber(hm[1]), tonumber(hm[2]) or 0, tonumber(hm[3]) or 0
  if w == nil or w < idx - 1 then cur, prev = 0, 0 elseif w == idx - 1 then cur, prev = 0, cur end
  local held, room, reset, need = prev * (W - e) / W + cur, now, 0, mx - c
  if held > need and need >= 0 then -- the previous window's weight decays; else the next window
    room = now + ceil(cur <= need and prev > 0 and W - (need - cur) * W / prev - e or (W - e) + W - need * W / cur)
  end
  if prev > 0 then reset = min(ceil(W / prev), W - e) elseif cur > 0 then reset = ceil((W - e) + W / cur) end
  return room, held, reset, idx, e, cur, prev
end
local function counter_record(k, W, mx, c, at, held, reset, idx, e, cur, prev)
  call('HSET', k, 'w', idx, 'c', cur + c, 'p', prev) -- kept while it weighs: to the next window's end
  if expires then call('PEXPIRE', k, ceil((2 * W - e) / 1000)) end
  return idx, held + c, prev > 0 and reset or ceil((W - e) + W / (cur + c))
end
-- A settle takes the reservation (aux) back from its window (token), charges c to the current one.
local function counter_settle(k, W, mx, c, token, aux)
  local room, held, reset, idx, e, cur, prev = counter_decide(k, W, mx, 0)
  if token == idx then cur = max(0, cur - unpack('>d', aux)) elseif token == idx - 1 then prev = max(0, prev - unpack('>d', aux)) end
  counter_record(k, W, mx, c, now, held, reset, idx, e, cur, prev)
  return 1, held
end
-- A concurrency zone: the leases whose expiry is after now; its key lives as
-- long as its latest lease.
local function lease_decide(k, W, mx)
  local held, reset = fresh(pcall('ZCOUNT', k, '(' .. fmt('%d', now), '+inf'), k) or 0, 0
  if held > 0 then reset = call('ZRANGEBYSCORE', k, '(' .. fmt('%d', now), '+inf', 'LIMIT', 0, 1, 'WITHSCORES')[2] - now end
  return held + 1 > mx and now + reset or now, held, reset
end
local function keep_leases(k)
  local latest = call('ZRANGE', k, -1, -1, 'WITHSCORES')[2]
  if expires then call('PEXPIRE', k, max(1, ceil((latest - now) / 1000))) end
end
local function lease_record(k, W, mx, c, at, held, reset, _, _, _, _, aux)
  call('ZREMRANGEBYSCORE', k, '-inf', fmt('%d', now))
  call('ZADD', k, fmt('%d', at + W), aux)
  return keep_leases(k) or -1, held + 1, (reset == 0 or at + W - now < reset) and at + W - now or reset
end
local function lease_extend(k, W, aux)
  local lease = tonumber(fresh(pcall('ZSCORE', k, aux), k))
  if lease and lease > now then call('ZADD', k, 'XX', fmt('%d', now + W), aux) end
  return lease and lease > now and (keep_leases(k) or 1) or 0
end
local decide = {[0] = log_decide, counter_decide, lease_decide}
local record = {[0] = log_record, counter_record, lease_record}
local settle = {[0] = log_settle, counter_settle, function(k, _, _, _, _, aux) return call('ZREM', k, aux) end}
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
local Z, out, args, pos, k = {}, {}, ARGV[1], 1, 0 -- Z: the zones of a request of several
local KEY, KIND, WIN, MAX, COST, TOKEN, AUX, ROOM, HELD, RESET, FLAG, X = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
while pos <= #args do
  local op, nz, wait, kind, window, mx, cost, token, p = unpack('>BBdBdddd', args, pos)
  if nz == 1 and op < 2 then
    local key, aux = KEYS[k + 1], kind == 2 and sub(args, p, p + 7)
    pos, k = p + 8, k + 1
    local room, held, reset, a, b, c, d, t = decide[kind](key, window, mx, cost)
    local flag, r = verdict(kind, cost, mx, room, reset, wait)
    if flag == 1 and op == 1 then t, held, r = record[kind](key, window, mx, cost, room, held, r, a, b, c, d, aux) end
    out[#out + 1] = reply(true, flag == 1 and room - now or 0, flag, mx, held, r, t or op == 0 and kind == 0 and lm or -1)
  else
    pos = p
    for i = 1, nz do
      if i > 1 then kind, window, mx, cost, token, pos = unpack('>Bdddd', args, pos) end
      local z = Z[i] or {}
      Z[i], k = z, k + 1
      z[KEY], z[KIND], z[WIN], z[MAX], z[COST], z[TOKEN] = KEYS[k], kind, window, mx, cost, token
      z[AUX], pos = (kind == 2 or op == 2) and sub(args, pos, pos + 7), pos + 8
    end
    if op > 1 then
      for i = 1, nz do
        local z, done, held, at = Z[i], 0, nil, nil -- a settle: what its zone held before, its record's time
        if op == 2 then done, held, at = settle[z[KIND]](z[KEY], z[WIN], z[MAX], z[COST], z[TOKEN], z[AUX])
        elseif z[KIND] == 2 then done = lease_extend(z[KEY], z[WIN], z[AUX]) end
        out[#out + 1] = reply(i == 1, 0, done, z[MAX], held or z[MAX], 0, at or -1)
      end
    else
      -- All decide, then record at the latest room if every one admits.
      local at, admit = now, true
      for i = 1, nz do
        local z = Z[i]
        z[ROOM], z[HELD], z[RESET], z[X], z[X + 1], z[X + 2], z[X + 3] = decide[z[KIND]](z[KEY], z[WIN], z[MAX], z[COST])
        if z[KIND] == 0 then z.sv = save() end
        z[FLAG], z[RESET] = verdict(z[KIND], z[COST], z[MAX], z[ROOM], z[RESET], wait)
        if z[FLAG] ~= 1 then admit = false elseif z[ROOM] > at then at = z[ROOM] end
      end
      for i = 1, nz do
        local z, t = Z[i], op == 0 and Z[i][KIND] == 0 and Z[i].sv[20] or -1 -- a peek: the log's lm
        if admit and op == 1 then
          if z[KIND] == 0 then restore(z.sv) end
          t, z[HELD], z[RESET] = record[z[KIND]](z[KEY], z[WIN], z[MAX], z[COST], at, z[HELD], z[RESET], z[X], z[X + 1], z[X + 2], z[X + 3], z[AUX])
        end
        out[#out + 1] = reply(i == 1, admit and at - now or 0, z[FLAG], z[MAX], z[HELD], z[RESET], t)
      end
    end
  end
end
local done = call('TIME') -- the call's own time, so the caller tells Redis's time from the network's
return table.concat(out) .. pack('>d', (done[1] - clock[1]) * 1000000 + done[2] - clock[2])
