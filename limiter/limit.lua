-- All-or-nothing rate-limit decision over one or more zones of one request.
-- Run alone: redis-cli --eval limit.lua 'srl:{1.2.3.4}:default' , 1 log 60000000 60
--
-- KEYS[i]       state of zone i for one client:
--                 log:     sorted set of admissions, member = sequence number
--                          (short, unique in the set), score = admission time
--                          in microseconds of the Redis clock
--                 counter: hash {w = index of the current fixed window,
--                          c = admissions in it, p = admissions in the one before}
-- ARGV[1]       1: record the admission in every zone if all admit; 0: dry run,
--               write nothing (inspection, or zones after a denial elsewhere)
-- ARGV[3i-1]    algorithm of zone i: log | counter
-- ARGV[3i]      window of zone i, in microseconds
-- ARGV[3i+1]    max admissions of zone i in any window
--
-- Reply: one {allowed, remaining, reset_us, token} per key.
--   allowed    1 if this zone admits (recorded only if every zone admits)
--   remaining  admissions left now (after this one, when it was recorded)
--   reset_us   denying zone: exact time until it admits again;
--              otherwise: time until the count next drops (a slot frees)
--   token      what was recorded, for a refund (refund.lua): the log member,
--              or the counter's window index; -1 when nothing was recorded

-- One clock for every caller: Redis's own, not each server's.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local record = ARGV[1] == '1'

-- Checks the reply of a zone's first command on its key (run with
-- redis.pcall). A key that holds the other algorithm's state, because the
-- zone's algorithm changed on a config reload, is dropped and the zone starts
-- over, rather than failing with WRONGTYPE on every request until that state
-- expires; started_over then reports true.
local function started_over(reply, key)
  if type(reply) == 'table' and reply.err then
    if string.find(reply.err, 'WRONGTYPE', 1, true) then
      redis.call('DEL', key)
      return true
    end
    -- Any other error fails the script, as redis.call would.
    error(reply)
  end
  return false
end

local zones = {}
local admit = true
for i, key in ipairs(KEYS) do
  local z = {
    key = key,
    algo = ARGV[3 * i - 1],
    window = tonumber(ARGV[3 * i]),
    max = tonumber(ARGV[3 * i + 1]),
  }
  if z.algo == 'counter' then
    -- Sliding-window counter: the previous fixed window's count, weighted by
    -- how much of it the sliding window still covers, plus the current one's.
    z.index = math.floor(now / z.window)
    z.elapsed = now - z.index * z.window
    local h = redis.pcall('HMGET', key, 'w', 'c', 'p')
    if started_over(h, key) then
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
  else
    -- Sliding-window log: the admissions still inside the window.
    -- The key is empty after a start over, so ZCARD then counts 0.
    started_over(redis.pcall('ZREMRANGEBYSCORE', key, '-inf', now - z.window), key)
    z.count = redis.call('ZCARD', key)
    z.allowed = z.count < z.max
  end
  if not z.allowed then
    admit = false
  end
  zones[i] = z
end
local write = record and admit

-- Time until a counter zone's estimate allows one more admission.
local function counter_wait(z)
  local W, e, c, p, max = z.window, z.elapsed, z.c, z.p, z.max
  if c + 1 <= max and p > 0 then
    -- Within this window the previous one's weight decays linearly.
    return math.ceil(W - (max - 1 - c) * W / p - e)
  end
  -- This window alone is full: wait for the next, where c becomes p.
  return math.ceil((W - e) + W - (max - 1) * W / c)
end

-- Time until a counter zone's estimate next falls by about one.
local function counter_reset(z, c, p)
  if p > 0 then
    return math.min(math.ceil(z.window / p), z.window - z.elapsed)
  elseif c > 0 then
    return math.ceil((z.window - z.elapsed) + z.window / c)
  end
  return 0
end

local reply = {}
for i, z in ipairs(zones) do
  local key = z.key
  if z.algo == 'counter' then
    if not z.allowed then
      reply[i] = {0, 0, counter_wait(z), -1}
    elseif write then
      local c = z.c + 1
      redis.call('HSET', key, 'w', z.index, 'c', c, 'p', z.p)
      -- Kept while it can still weigh: to the end of the next window.
      redis.call('PEXPIRE', key, math.ceil((2 * z.window - z.elapsed) / 1000))
      local left = math.floor(z.max - (z.count + 1))
      reply[i] = {1, left, counter_reset(z, c, z.p), z.index}
    else
      reply[i] = {1, math.floor(z.max - z.count), counter_reset(z, z.c, z.p), -1}
    end
  else
    local count = z.count
    if not z.allowed then
      -- The (count-max+1)-th oldest admission must age out before one more fits.
      local pivot = redis.call('ZRANGE', key, count - z.max, count - z.max, 'WITHSCORES')
      reply[i] = {0, 0, tonumber(pivot[2]) + z.window - now, -1}
    else
      local reset, oldest = 0, nil
      if count > 0 then
        oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
        reset = tonumber(oldest[2]) + z.window - now
      end
      if write then
        local at, seq = now, 0
        if count > 0 then
          local newest = oldest
          if count > 1 then
            newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
          end
          seq = tonumber(newest[1]) + 1
          -- Scores strictly increase with the sequence, even for two calls in
          -- one microsecond or a Redis clock that steps back, so the newest
          -- member is always the last one and never ties with another.
          if tonumber(newest[2]) >= at then
            at = tonumber(newest[2]) + 1
          end
        else
          reset = z.window
        end
        redis.call('ZADD', key, at, seq)
        redis.call('PEXPIRE', key, math.ceil((at + z.window - now) / 1000))
        reply[i] = {1, z.max - count - 1, reset, seq}
      else
        reply[i] = {1, z.max - count, reset, -1}
      end
    end
  end
end
return reply
