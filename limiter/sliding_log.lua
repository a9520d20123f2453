-- Sliding-window log, all or nothing over one or more zones of one request.
-- Run alone: redis-cli --eval sliding_log.lua srl:{1.2.3.4}:default , 60000000 60
--
-- KEYS[i]      sorted set of zone i's admissions for one client:
--              member = sequence number (short, unique in the set),
--              score  = admission time in microseconds of the Redis clock
-- ARGV[2i-1]   window of zone i, in microseconds
-- ARGV[2i]     max admissions of zone i in any window
--
-- Reply: one {allowed, remaining, reset_us} per key.
--   All admit: each key records the admission; allowed = 1, remaining after
--   it, reset_us = time until the oldest admission ages out.
--   Any denies: nothing is written anywhere. A denying key has allowed = 0,
--   remaining = 0, reset_us = exact time until it admits again; the others
--   report allowed = 1 and their unchanged remaining.

-- One clock for every caller: Redis's own, not each server's.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local counts = {}
local admit = true
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - tonumber(ARGV[2 * i - 1]))
  counts[i] = redis.call('ZCARD', key)
  if counts[i] >= tonumber(ARGV[2 * i]) then
    admit = false
  end
end

local reply = {}
for i, key in ipairs(KEYS) do
  local window = tonumber(ARGV[2 * i - 1])
  local max = tonumber(ARGV[2 * i])
  local count = counts[i]
  if count >= max then
    -- The (count-max+1)-th oldest admission must age out before one more fits.
    local pivot = redis.call('ZRANGE', key, count - max, count - max, 'WITHSCORES')
    reply[i] = {0, 0, tonumber(pivot[2]) + window - now}
  elseif not admit then
    local reset = 0
    if count > 0 then
      local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      reset = tonumber(oldest[2]) + window - now
    end
    reply[i] = {1, max - count, reset}
  else
    local at, seq, reset = now, 0, window
    if count > 0 then
      local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      seq = tonumber(newest[1]) + 1
      -- Scores strictly increase with the sequence, even for two calls in
      -- one microsecond or a Redis clock that steps back, so the newest
      -- member is always the last one and never ties with another.
      if tonumber(newest[2]) >= at then
        at = tonumber(newest[2]) + 1
      end
      local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      reset = tonumber(oldest[2]) + window - now
    end
    redis.call('ZADD', key, at, seq)
    redis.call('PEXPIRE', key, math.ceil((at + window - now) / 1000))
    reply[i] = {1, max - count - 1, reset}
  end
end
return reply
