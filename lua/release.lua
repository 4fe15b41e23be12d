-- Gives a lease back, if the caller still owns this grant of it, and hands
-- the next turn to the first live waiter, waking that client only.
-- KEYS[1] lease hash  <prefix>{<name>}
-- KEYS[2] fence key   <prefix>{<name>}:fence
-- KEYS[3] wait queue  <prefix>{<name>}:q
-- KEYS[4] liveness    <prefix>{<name>}:qd
-- KEYS[5] turn        <prefix>{<name>}:turn
-- ARGV[1] client id
-- ARGV[2] 'token' or 'nonce': which field identifies the grant
-- ARGV[3] that field's value: the grant's token, or the nonce of an acquire
--         whose outcome the client never learned
-- ARGV[4] fence key lifetime in ms (the lease time)
-- ARGV[5] the last token handed out under this grant (local handoffs add 1
--         to the grant's token), or 0
-- ARGV[6] wake channel prefix: the next waiter's channel is this + its id
-- ARGV[7] the lock name, published to that channel
-- ARGV[8] waiter ttl in ms: how long the turn waits for its client
-- Returns 1 when released (2 when a waiter was woken), 0 when the caller did
-- not own that grant (it expired, was taken, or was granted again):
-- releasing twice is harmless.
--
-- The fence key keeps the last token for a while so that the next grant's
-- token exceeds it even if the server clock steps back; it expires, so no key
-- lives forever per name.
local lease = redis.call('HMGET', KEYS[1], 'owner', ARGV[2], 'token')
if lease[1] ~= ARGV[1] or lease[2] ~= ARGV[3] then
  return 0
end
local last = tonumber(lease[3])
local handed = tonumber(ARGV[5]) or 0
if handed > last then
  last = handed
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], string.format('%.0f', last), 'PX', ARGV[4])

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
while true do
  local h = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not h then
    redis.call('DEL', KEYS[5])
    return 1
  end
  local d = redis.call('HGET', KEYS[4], h)
  if d and tonumber(d) > now_ms then
    redis.call('SET', KEYS[5], h, 'PX', ARGV[8])
    redis.call('PUBLISH', ARGV[6] .. h, ARGV[7])
    return 2
  end
  redis.call('ZREM', KEYS[3], h)
  redis.call('HDEL', KEYS[4], h)
end
