-- dlockctl's read of one lock (show, list, watch): the lease, its time
-- left, the turn, and the queue with each waiter's liveness value and the
-- server's verdict on it, in one step (a script runs alone: a consistent
-- snapshot), with the server's clock. Data of another protocol is refused,
-- not misread (lua/acquire.lua, "Protocol").
--
-- KEYS[1] the lease, KEYS[2] the queue, KEYS[3] the waiters' liveness,
-- KEYS[4] the turn (lua/keys.lua: LEASE, QUEUE, LIVE, TURN).
-- Returns {server ms, owner, token, name, since, exp, lease pttl, turn,
-- then per waiter: id, arrival (us), liveness value, 1 if alive else 0}.
local l = redis.call('HMGET', KEYS[1], 'owner', 'token', 'name', 'since', 'exp', 'pv')
if l[6] and l[6] ~= '1' then
  return redis.error_reply('DLOCKPROTOCOL ' .. KEYS[1] .. ': the data of this name is '
    .. 'dlock protocol ' .. l[6] .. '; this dlockctl speaks protocol 1')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now, l[1], l[2], l[3], l[4], l[5], redis.call('PTTL', KEYS[1]),
  redis.call('GET', KEYS[4])}
local q = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #q, 2 do
  local d = redis.call('HGET', KEYS[3], q[i]) or ''
  local deadline = tonumber(string.match(d, '^%d+')) or 0
  out[#out + 1] = q[i]
  out[#out + 1] = q[i + 1]
  out[#out + 1] = d
  out[#out + 1] = deadline > now and 1 or 0
end
return out
