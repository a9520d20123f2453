-- Decides a batch of rate-limit requests in one call: TIME once, then each
-- request's zones all or nothing, then one packed reply.
--
-- A log zone admits a request of cost c (1 in a count zone) when the units
-- in the last window, plus c, fit in max. With sum_i the units admitted up to
-- admission i and n the newest kept, j = the smallest kept with sum_j >=
-- sum_n + c - max must age out for c to fit: room = t_j + window (none:
-- now). If room - now <= wait, the request goes on at room, recorded then or
-- just after t_n (times strictly increase); else it is denied, reset = room -
-- now; c > max never fits. With several zones it goes on at the latest room,
-- recorded then in each. A promised admission is recorded at its future
-- time, so no later one takes its slot: units with times in any window never
-- exceed max, exact for each call's own max. Settling changes an admission's
-- units (zero takes it back). A counter weighs units as it weighs requests;
-- a concurrency zone holds one lease per request in flight, expiring window
-- after it was taken or extended. Neither waits (the store refuses a wait).
--
-- KEYS[i]  the i-th zone's state, requests in order: log, a ring (below);
--          counter, hash {w = current fixed window's index, c = its units,
--          p = the previous one's}; concurrency, zset of lease ids by expiry
-- ARGV[1]  requests, big-endian: op u8 (0 peek, 1 allow, 2 settle, 3
--          extend), zones u8 (KEYS it takes), wait double (µs); per zone:
--          kind u8 (0 log, 1 counter, 2 concurrency), window double (µs; the
--          lease time), max double, cost double (to reserve; settle: the
--          real cost), token double (settle: the log's admission time, the
--          counter's window index), aux 8 bytes (lease id; counter settle:
--          the units reserved, double)
-- ARGV[2]  optional, for tests: the time in µs in place of TIME; keys then
--          get no expiry, which runs on Redis's clock
-- Reply    per request: delay double (µs an admitted request waits; 0 when
--          denied); per zone: flag u8 (0 denied, 1 admits (recorded if all
--          do), 2 never: cost above max; settle, extend: 1 done), remaining
--          double (units left, after this request if recorded), reset double
--          (µs: denied, until room for this cost; else until units next
--          leave the window), token double (log: admission time; counter:
--          window index; -1: none)
--
-- A ring holds the admissions that may still be in the window, oldest first
-- from slot h of cap, wrapping; what aged out goes at the next record, so a
-- ring reuses those slots before it grows (doubling, in place when large).
-- Header: version u8, cap, h, n u32, expiry (ms mod 2^40). Version 1, a count
-- ring of at most SMALLCAP: entries are times (µs mod 2^48, 6 bytes, read as
-- the nearest to now); sums are indexes. Version 3, a larger count ring, adds
-- the newest time. Version 2, units, adds the sequence number of slot h
-- (double), the sums before it and to the newest, and the newest time; an
-- entry is a time and its units; then each bucket of S entries has its base
-- sum, so a settle writes one entry and the later bases. Values of up to
-- SMALL bytes are read whole, no large one is read or built whole (Redis's
-- Lua hashes every string it makes). Sums are mod 2^48: a ring saturates.

local unpack, pack, floor, ceil, sub = struct.unpack, struct.pack, math.floor, math.ceil, string.sub
local call, pcall, min, max, fmt = redis.call, redis.pcall, math.min, math.max, string.format
local M48, S, CHUNK, SMALL, SMALLCAP = 2 ^ 48, 64, 120, 512, 80

-- With the time given, expiry on Redis's own clock would not follow it.
local now, expires, clock = tonumber(ARGV[2]), not ARGV[2], nil
if not now then clock = call('TIME') now = clock[1] * 1000000 + clock[2] end
local tbase, ms = now - 0.75 * M48, floor(now / 1000)
-- fresh returns reply, or nil after dropping key when it holds another kind's
-- state (the zone's algorithm changed), which then starts over.
local function fresh(reply, key)
  if type(reply) ~= 'table' or not reply.err then return reply end
  if not string.find(reply.err, 'WRONGTYPE', 1, true) then error(reply) end
  call('DEL', key)
end
-- The ring in hand: key; v, what was read from offset 0 (all of a small
-- value), cache, chunks beyond; the header; H, E, BO: sizes of header and
-- entry, the bases' offset. The zones of a request save and restore it.
local key, v, vlen, whole, cache, ver, cap, h, n, exp, seq, flo, total, last, H, E, B, BO
local function size_of(version, size)
  return version == 2 and 44 + 12 * size + 6 * (floor(size / S) + 2) or (version == 1 and 18 or 24) + 6 * size
end
local function shape(version, size)
  ver, cap, B, E = version, size, floor(size / S) + 2, version == 2 and 12 or 6
  H = version == 1 and 18 or version == 3 and 24 or 44
  BO = H + E * size
end
local function header()
  if ver == 2 then return pack('>BI4I4I4I5dI6I6I6', 2, cap, h, n, exp % 2 ^ 40, seq, flo, total, (last or 0) % M48) end
  return pack(ver == 1 and '>BI4I4I4I5' or '>BI4I4I4I5I6', ver, cap, h, n, exp % 2 ^ 40, (last or 0) % M48)
end
local function load(k, small)
  -- Numbers given to redis.call are formatted at each call: these are not.
  key, cache, whole, v = k, false, false, pcall('GETRANGE', k, '0', small and '511' or '43')
  if type(v) ~= 'string' then v = fresh(v, k) or '' end
  vlen = #v
  local version, size = 0, 0
  if vlen >= 18 then version, size, h, n, exp = unpack('>BI4I4I4I5', v) end
  if version == 3 and vlen >= 24 then last = unpack('>I6', v, 19) end
  if version == 2 and vlen >= 44 then seq, flo, total, last = unpack('>dI6I6I6', v, 19) end
  if version >= 1 and version <= 3 and vlen >= (version == 1 and 18 or version == 3 and 24 or 44)
    and (vlen == size_of(version, size) or vlen >= (small and SMALL or 44)) then
    last = version ~= 1 and tbase + (last - tbase) % M48
    return shape(version, size)
  end
  -- Nothing, or nothing this version reads: the ring starts over.
  h, n, exp, v, vlen = 0, 0, ms, '', 0
  shape(1, 0)
end
local function save() return {key, v, cache, ver, cap, h, n, exp, seq, flo, total, last} end
local function restore(r)
  key, v, vlen, cache, whole, h, n, exp, seq, flo, total, last = r[1], r[2], #r[2], r[3], false, r[6], r[7], r[8], r[9], r[10], r[11], r[12]
  shape(r[4], r[5])
end

-- bytes returns len bytes at offset off, u6 the 6-byte number there (beyond
-- what was read, a chunk at a time); put writes b there, or into v when it
-- is a whole value made anew (commit writes it), keeping v in step.
local function bytes(off, len)
  if off + len <= vlen then return sub(v, off + 1, off + len) end
  return call('GETRANGE', key, off, off + len - 1)
end
local function u6(off)
  if off + 6 <= vlen then return (unpack('>I6', v, off + 1)) end
  local c0 = off - off % CHUNK
  cache = cache or {}
  cache[c0] = cache[c0] or call('GETRANGE', key, c0, c0 + CHUNK + 5)
  return (unpack('>I6', cache[c0], off - c0 + 1))
end
local function put(off, b)
  if not whole then call('SETRANGE', key, off, b) end
  local hi = min(off + #b, vlen)
  if off < hi then v = sub(v, 1, off) .. sub(b, 1, hi - off) .. sub(v, hi + 1) end
  cache = false
end
local function u48(x) return pack('>I6', x % M48) end

-- t returns the time of entry i (0 is the oldest kept), u its units, s the
-- units of the entries kept up to it (0 for i < 0): in a units ring, the
-- base of i's bucket (the floor, in the oldest's) plus those from its start.
local function t(i)
  local o = H + E * ((h + i) % cap)
  return tbase + ((o + 6 <= vlen and unpack('>I6', v, o + 1) or u6(o)) - tbase) % M48
end
local function u(i)
  if ver ~= 2 then return 1 end
  local o = H + 12 * ((h + i) % cap) + 6
  return o + 6 <= vlen and unpack('>I6', v, o + 1) or u6(o)
end
local function s(i)
  if i < 0 or ver ~= 2 then return max(i + 1, 0) end
  if i == n - 1 then return (total - flo) % M48 end
  local q, j, sum = seq + i, 0, 0
  if floor(q / S) > floor(seq / S) then j, sum = i - q % S, (u6(BO + 6 * (floor(q / S) % B)) - flo) % M48 end
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
  if i == n then return n, nil end
  return i, i == hi and y or get(i)
end

-- range returns the entries [i, j), oldest first.
local function range(i, j)
  if j <= i then return '' end
  local p = (h + i) % cap
  local a = min(j - i, cap - p)
  local r = bytes(H + E * p, E * a)
  return a < j - i and r .. bytes(H, E * (j - i - a)) or r
end

-- reshape gives the ring size slots in the layout of version: grown, shrunk,
-- or a count ring made a units ring (1 unit an entry). A large ring grows in
-- place: the value is extended, and the smaller of the older and the newer
-- part of its entries moves so that the free slots lie between them.
local function reshape(size, version)
  local B0, bases = B, ver == 2 and version == 2 and bytes(BO, 6 * B)
  if ver == version and size > cap and size_of(version, size) > SMALL then
    call('SETRANGE', key, size_of(version, size) - 1, '\0')
    if h > 0 and h <= cap - h then put(H + E * cap, bytes(H, E * h)) end
    if h > cap - h then
      put(H + E * (h + size - cap), bytes(H + E * h, E * (cap - h)))
      h = h + size - cap
    end
  else
    local body = range(0, n)
    if version == 2 and ver ~= 2 then
      local parts, one = {}, u48(1)
      for i = 0, n - 1 do parts[i + 1] = sub(body, 6 * i + 1, 6 * i + 6) .. one end
      body, seq, flo, total = table.concat(parts), 0, 0, n
    end
    h = 0
    shape(version, size)
    local len = size_of(version, size)
    v, cache, exp, whole = header() .. body, false, ms, len <= SMALL
    if whole then
      v = v .. string.rep('\0', len - #v)
    else
      call('DEL', key)
      call('SETRANGE', key, len - 1, '\0')
      call('SETRANGE', key, '0', v)
    end
    vlen = #v
  end
  shape(version, size)
  -- The kept buckets' bases move to their places (a converted ring's count).
  for q = version == 2 and seq - seq % S or 0, version == 2 and seq + n - 1 or -1, S do
    local kb = floor(q / S) % B0
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
local function commit(newest, window, off, b)
  if n == 0 then return call('DEL', key) end
  last = newest
  if whole then
    exp = ceil((newest + window + window / 8) / 1000)
    if off then v = sub(v, 1, off) .. b .. sub(v, off + #b + 1) end
    v = header() .. sub(v, H + 1)
    return expires and call('SET', key, v, 'PX', max(1, exp - ms)) or call('SET', key, v)
  end
  if expires and newest + window > (ms + (exp - ms + 2 ^ 39) % 2 ^ 40 - 2 ^ 39) * 1000 then
    exp = ceil((newest + window + window / 8) / 1000)
    call('PEXPIRE', key, max(1, exp - ms))
  end
  if off then call('SETRANGE', key, off, b) end
  call('SETRANGE', key, '0', header())
end

-- A log zone's decision, before any write: when a request of cost c fits
-- (room), the units in the window (held), until units leave it (reset); for
-- the record: f, the first entry in the window holding units, its time, the
-- units before it, the newest time.
local function log_decide(k, W, mx, c)
  load(k, 18 + 6 * mx <= SMALL)
  local cut, first, f, newest = now - W, nil, 0, last
  if n == cap and ver == 1 and h > 0 and h < cap - 1 and vlen == BO then
    -- A full ring, as at a client's limit: newest, oldest and next lie side by side.
    local a, b
    newest, a, b = unpack('>I6I6I6', v, H + 6 * h - 5)
    newest, first = tbase + (newest - tbase) % M48, tbase + (a - tbase) % M48
    if first <= cut then
      f, first = 1, tbase + (b - tbase) % M48
      if first <= cut then f, first = gallop(t, cut, 2) end
    end
  elseif n > 0 then
    first = t(0)
    if first <= cut then f, first = gallop(t, cut, 1) end
    if ver == 1 then newest = f == n - 1 and first or t(n - 1) end
  end
  local before, all = f, n
  if ver == 2 then -- entries settled to zero hold nothing: the window starts after them
    local g = f
    before, all = s(f - 1), (total - flo) % M48
    while g < n and u(g) == 0 do g = g + 1 end
    if g ~= f then f, first = g, g < n and t(g) or nil end
  end
  local held, room = all - before, now
  if held + c > mx and c <= mx then
    local T, j = all + c - mx, f
    if ver ~= 2 then j = T - 1 end
    if ver == 2 then -- whole buckets by their bases, then entry by entry
      local k0, sum = floor((seq + f) / S), before
      local kb = search(function(q) return (u6(BO + 6 * (q % B)) - flo) % M48 end, T - 1, k0 + 1, floor((seq + n - 1) / S) + 1) - 1
      if kb > k0 then j, sum = kb * S - seq, (u6(BO + 6 * (kb % B)) - flo) % M48 end
      while sum + u(j) < T do sum, j = sum + u(j), j + 1 end
    end
    room = t(j) + W
  end
  return room, held, first and first + W - now or 0, f, first, before, n > 0 and newest
end

-- Records an admission of a log zone at time at (or just after the newest),
-- dropping what aged out, growing, shrinking or making a units ring.
local function log_record(k, W, mx, c, at, held, reset, f, first, before, newest)
  if newest and newest >= at then at = newest + 1 end
  if f > 0 then
    h, n = (h + f) % cap, n - f
    if ver == 2 then flo, seq = (flo + before) % M48, seq + f end
  end
  local size = cap > 64 and 4 * (n + 1) <= cap and floor(cap / 2) or cap
  if n == cap then size = c == 1 and ver ~= 2 and n < mx and min(max(4, 2 * cap), mx) or max(4, 2 * cap) end
  if size ~= cap or c ~= 1 and ver ~= 2 then
    reshape(size, (c ~= 1 or ver == 2) and 2 or size <= SMALLCAP and 1 or 3)
  end
  local off, entry = H + E * ((h + n) % cap), pack('>I6', at % M48)
  if ver == 2 then
    if (seq + n) % S == 0 and n > 0 then put(BO + 6 * (floor((seq + n) / S) % B), u48(total)) end
    entry, total = pack('>I6I6', at % M48, c % M48), (total + c) % M48
  end
  n = n + 1
  commit(at, W, off, entry)
  return at, held + c, first and reset or at + W - now
end

-- Settles the admission at time token to c units. A count ring takes a
-- refund out (the newer entries move back); any other change makes it a
-- units ring; entries settled to zero go once newest.
local function log_settle(k, W, c, token)
  load(k, false)
  local e = search(t, token - 1, 0, n)
  if e == n or t(e) ~= token then return 0 end
  local old = u(e)
  if c == old then return 1 end
  if ver ~= 2 and c == 0 then
    local b, p = range(e + 1, n), (h + e) % cap
    local a = min(#b, 6 * (cap - p))
    put(H + 6 * p, sub(b, 1, a))
    if a < #b then put(H, sub(b, a + 1)) end
    n = n - 1
  else
    if ver ~= 2 then reshape(cap, 2) end
    c = min(c, M48 - 1 - (total - flo) % M48 + old)
    put(H + 12 * ((h + e) % cap) + 6, u48(c))
    for q = floor((seq + e) / S) + 1, floor((seq + n - 1) / S) do put(BO + 6 * (q % B), u48(u6(BO + 6 * (q % B)) + c - old)) end
    total = (total + c - old) % M48
    while n > 0 and u(n - 1) == 0 do n = n - 1 end
  end
  commit(n > 0 and t(n - 1) or now, W)
  return 1
end

-- The sliding counter: the previous fixed window's units, weighted by how much
-- of it the sliding window covers, plus the current one's.
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
local function counter_settle(k, W, c, token, aux)
  local hm = fresh(pcall('HMGET', k, 'w', 'c', 'p'), k) or {}
  local field = tonumber(hm[1]) == token and 2 or tonumber(hm[1]) == token + 1 and 3
  if field then call('HSET', k, field == 2 and 'c' or 'p', max(0, (tonumber(hm[field]) or 0) + c - unpack('>d', aux))) end
  return field and 1 or 0
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
local settle = {[0] = log_settle, counter_settle, function(k, _, _, _, aux) return call('ZREM', k, aux) end}
-- verdict is a zone's flag (2 never, 1 admits within the wait, which only log
-- zones take, 0 denied) and reset; reply packs a zone's answer.
local function verdict(kind, c, mx, room, reset, wait)
  if c > mx then return 2, 0 end
  if room - now <= (kind == 0 and wait or 0) then return 1, reset end
  return 0, room - now
end
local function reply(first, delay, flag, mx, held, reset, token)
  local rem = mx - held > 0 and mx - held - (mx - held) % 1 or 0
  if first then return pack('>dBddd', delay, flag, rem, reset, token) end
  return pack('>Bddd', flag, rem, reset, token)
end
local Z, out, args, pos, k = {}, {}, ARGV[1], 1, 0 -- Z: the zones of a request of several
local KEY, KIND, WIN, MAX, COST, TOKEN, AUX, ROOM, HELD, RESET, FLAG, X = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
while pos <= #args do
  local op, nz, wait, kind, window, mx, cost, token, aux
  op, nz, wait, kind, window, mx, cost, token, pos = unpack('>BBdBdddd', args, pos)
  for i = 1, nz do
    if i > 1 then kind, window, mx, cost, token, pos = unpack('>Bdddd', args, pos) end
    aux, pos, k = (kind == 2 or op == 2) and sub(args, pos, pos + 7), pos + 8, k + 1
    if nz > 1 or op > 1 then
      local z = Z[i] or {}
      Z[i], z[KEY], z[KIND], z[WIN], z[MAX], z[COST], z[TOKEN], z[AUX] = z, KEYS[k], kind, window, mx, cost, token, aux
    end
  end
  if nz == 1 and op < 2 then
    local room, held, reset, a, b, c, d = decide[kind](KEYS[k], window, mx, cost)
    local t, flag = -1, nil
    flag, reset = verdict(kind, cost, mx, room, reset, wait)
    if flag == 1 and op == 1 then t, held, reset = record[kind](KEYS[k], window, mx, cost, room, held, reset, a, b, c, d, aux) end
    out[#out + 1] = reply(true, flag == 1 and room - now or 0, flag, mx, held, reset, t)
  elseif op > 1 then
    out[#out + 1] = pack('>d', 0)
    for i = 1, nz do
      local z = Z[i]
      local done = op == 2 and settle[z[KIND]](z[KEY], z[WIN], z[COST], z[TOKEN], z[AUX])
        or z[KIND] == 2 and lease_extend(z[KEY], z[WIN], z[AUX]) or 0
      out[#out + 1] = pack('>Bddd', done, 0, 0, -1)
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
      local z, t = Z[i], -1
      if admit and op == 1 then
        if z[KIND] == 0 then restore(z.sv) end
        t, z[HELD], z[RESET] = record[z[KIND]](z[KEY], z[WIN], z[MAX], z[COST], at, z[HELD], z[RESET], z[X], z[X + 1], z[X + 2], z[X + 3], z[AUX])
      end
      out[#out + 1] = reply(i == 1, admit and at - now or 0, z[FLAG], z[MAX], z[HELD], z[RESET], t)
    end
  end
end
return table.concat(out)
