-- The floor: the least a batched decision can cost Redis, in limit.lua's
-- wire format. For each request's keys a GET and a SET of a value the size of
-- the many clients scenario's rings (some 60 admissions, about 400 bytes),
-- and every request admitted: remaining max - 1, reset one window. No ring is
-- read, searched or written in place. See floor.go. As limit.lua's, the
-- chunk returns the call, which the module runs as a Redis function or a
-- script.
local unpack, pack, call = struct.unpack, struct.pack, redis.call
local filler = string.rep('x', 400)
return function(KEYS, ARGV)
  local clock = call('TIME')
  local now = clock[1] * 1000000 + clock[2]
  local out, args, pos, k = {}, ARGV[1], 1, 0
  while pos <= #args do
    local _, nz = unpack('>BB', args, pos)
    pos = pos + 10 -- op, zones, wait
    for i = 1, nz do
      local _, W, mx = unpack('>Bdd', args, pos)
      pos, k = pos + 41, k + 1 -- kind, window, max, cost, token, aux
      call('SET', KEYS[k], call('GET', KEYS[k]) or filler, 'PX', '75000')
      out[#out + 1] = i == 1 and pack('>dBddd', 0, 1, mx - 1, W, now) or pack('>Bddd', 1, mx - 1, W, now)
    end
  end
  local done = call('TIME')
  return table.concat(out) .. pack('>d', (done[1] - clock[1]) * 1000000 + done[2] - clock[2])
end
