-- Takes back admissions that limit.lua recorded, when another zone of the
-- same request, in another Redis Cluster slot, denied it.
--
-- KEYS[i]      the zone's key, as given to limit.lua
-- ARGV[2i-1]   algorithm of zone i: log | counter
-- ARGV[2i]     token limit.lua replied for it (log member, counter window index)
for i, key in ipairs(KEYS) do
  local token = ARGV[2 * i]
  if ARGV[2 * i - 1] == 'counter' then
    local w = tonumber(redis.call('HGET', key, 'w'))
    if w == tonumber(token) then
      redis.call('HINCRBY', key, 'c', -1)
    elseif w == tonumber(token) + 1 then
      redis.call('HINCRBY', key, 'p', -1)
    end
  else
    redis.call('ZREM', key, token)
  end
end
return #KEYS
