-- Gives a lease back, if the caller still owns this grant of it, and hands
-- the next turn to the first live waiter, waking that client only.
-- KEYS[1] lease hash  <prefix>{<name>}
-- KEYS[2] fence key   <prefix>{<name>}:fence
-- KEYS[3] wait queue  <prefix>{<name>}:q
-- KEYS[4] liveness    <prefix>{<name>}:qd
-- KEYS[5] turn        <prefix>{<name>}:turn
-- KEYS[6] record      <prefix>{<name>}:c:<client id> (see acquire.lua)
-- ARGV[1] client id
-- ARGV[2] 'token' or 'nonce': which field identifies the grant
-- ARGV[3] that field's value: the grant's token, or the number of an acquire
--         attempt whose outcome the client never learned
-- ARGV[4] fence key lifetime in ms (the lease time)
-- ARGV[5] the last token handed out under this grant (local handoffs add 1
--         to the grant's token), or 0
-- ARGV[6] wake channel prefix: the next waiter's channel is this + its id
-- ARGV[7] the lock name, published to that channel
-- ARGV[8] waiter ttl in ms: how long the turn waits for its client
-- ARGV[9] record lifetime in ms
-- Returns 1 when released (2 when a waiter was woken), also when this very
-- grant had already been released by an earlier call (a retry whose first
-- try ran but whose answer was lost): releasing is idempotent. Returns 0
-- when the caller does not own that grant (it expired, was taken, or was
-- granted again), and, for an attempt number, 3 when a newer attempt of the
-- client has been seen: no grant of that attempt exists or can appear.
--
-- The fence key keeps the last token for a while so that the next grant's
-- token exceeds it even if the server clock steps back; it expires, so no key
-- lives forever per name.
local me = ARGV[1]
local lease = redis.call('HMGET', KEYS[1], 'owner', 'token', 'nonce')
local id = lease[3]
if ARGV[2] == 'token' then
  id = lease[2]
end
if lease[1] ~= me or id ~= ARGV[3] then
  local rec = redis.call('GET', KEYS[6])
  if rec then
    local a, t, r = string.match(rec, '^(%d+) (%d+) (%d+)$')
    if ARGV[2] == 'token' then
      if t == ARGV[3] then
        return 1
      end
    else
      if tonumber(r) == tonumber(ARGV[3]) then
        return 1
      end
      if a and tonumber(a) > tonumber(ARGV[3]) then
        return 3
      end
    end
  end
  if ARGV[2] == 'nonce' and lease[1] == me and (tonumber(lease[3]) or 0) > tonumber(ARGV[3]) then
    return 3
  end
  return 0
end
local last = tonumber(lease[2])
local handed = tonumber(ARGV[5]) or 0
if handed > last then
  last = handed
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], string.format('%.0f', last), 'PX', ARGV[4])
-- Remember the release, so that a retry of it, or a late copy of the
-- acquire that made this grant, finds it done.
local seen = tonumber(lease[3]) or 0
local rec = redis.call('GET', KEYS[6])
if rec then
  local a = tonumber(string.match(rec, '^(%d+) '))
  if a and a > seen then
    seen = a
  end
end
redis.call('SET', KEYS[6], string.format('%.0f %s %.0f', seen, lease[2], tonumber(lease[3]) or 0),
  'PX', ARGV[9])

if redis.call('EXISTS', KEYS[3], KEYS[5]) == 0 then
  return 1 -- nobody queued and no turn given: nothing to pass on
end
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
