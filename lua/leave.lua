-- Takes a client out of a lock's wait queue (its waiters gave up). If a
-- release had granted it the lease directly (release.lua) and its grant
-- message came too late, or the turn was its own while the lease is free,
-- it gives that up: the lease is freed and the turn passes to the next live
-- waiter, which is woken and acquires it.
-- KEYS[1] lease hash, KEYS[3] wait queue, KEYS[4] liveness, KEYS[5] turn,
-- KEYS[6] record (see acquire.lua); KEYS[2], the fence key, when it frees a
-- lease granted to the client (the keys are those of acquire)
-- ARGV[1] client id
-- ARGV[2] wake channel prefix
-- ARGV[3] the lock name
-- ARGV[4] waiter ttl in ms
-- ARGV[5] number of this call, from the same sequence as acquire attempts
-- ARGV[6] record lifetime in ms
-- Returns 1 if the client was queued (or granted), else 0. A leave older than an attempt
-- Redis has already seen from this client for this name (a retry sent late
-- by the background thread) changes nothing and returns 0: it must not take
-- out a client that has queued again since.
--
-- Protocol: this script speaks dlock protocol 1 (DLOCK_PROTOCOL_VERSION in
-- dlock.h). A lease hash whose field pv names another protocol holds data of
-- a later release (which keeps that field for as long as any of its data of
-- the name lives: docs/design.md, "Protocol versions"): the script refuses
-- it, changing nothing, with an error that names both protocols.
local me = ARGV[1]
local pv = redis.call('HGET', KEYS[1], 'pv')
if pv and pv ~= '1' then -- another protocol's data (Protocol, above)
  return redis.error_reply('DLOCKPROTOCOL the data of this name is dlock protocol ' ..
    pv .. '; this client speaks protocol 1: upgrade it')
end
local n = tonumber(ARGV[5])
local rec = redis.call('GET', KEYS[6])
local rtok, ratt = '0', '0'
if rec then
  local a, t, r = string.match(rec, '^(%d+) (%d+) (%d+)$')
  if a and tonumber(a) > n then
    return 0
  end
  if a then
    rtok, ratt = t, r
  end
end
redis.call('SET', KEYS[6], ARGV[5] .. ' ' .. rtok .. ' ' .. ratt, 'PX', ARGV[6])
local was = redis.call('ZREM', KEYS[3], me)
redis.call('HDEL', KEYS[4], me)
-- A lease this client owns under an attempt older than this call is one it
-- gave up waiting for. One granted under a newer attempt is held: a late
-- copy of this leave, whose record has expired, must not touch it.
local lease = redis.call('HMGET', KEYS[1], 'owner', 'nonce', 'token', 'exp', 'u')
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- An expired grant (acquire.lua) is nobody's: its key stays, as a fence.
local live = lease[1] and not (lease[4] and now_ms > tonumber(lease[4]))
if live and lease[1] == me and (tonumber(lease[2]) or 0) < n then
  -- Nobody used it, but its token was handed out: the fence keeps it (as a
  -- release's fence does), so that no later grant goes below it even if
  -- the server's clock steps back; and it passes on how the grant before
  -- it ended (its field u: acquire.lua, "End").
  local tok = tonumber(lease[3]) or 0
  local fv = redis.call('GET', KEYS[2])
  local f = tonumber(string.match(fv or '0', '^%d+') or '0') or 0
  local ended = tonumber(lease[5] or '0') or 0
  if tok > f or ended > 0 then
    local px = math.max(tonumber(ARGV[6]),
      math.ceil(math.max(tok, f) / 1000) - now_ms + math.floor(tonumber(ARGV[6]) / 2) + 1)
    if fv then
      px = math.max(px, redis.call('PTTL', KEYS[2]))
    end
    local top = lease[3]
    if tok <= f then
      top = string.match(fv, '^%d+')
    end
    if ended > 0 then
      top = top .. ' ' .. ended
    end
    redis.call('SET', KEYS[2], top, 'PX', px)
  end
  redis.call('DEL', KEYS[1])
  live = false
  was = 1
elseif redis.call('GET', KEYS[5]) ~= me then
  return was
end
redis.call('DEL', KEYS[5])
if live then
  return was -- held: nothing to pass on
end
while true do
  local h = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not h then
    return was
  end
  local d = redis.call('HGET', KEYS[4], h)
  local deadline = d and tonumber(string.match(d, '^%d+'))
  if deadline and deadline > now_ms then
    redis.call('SET', KEYS[5], h, 'PX', ARGV[4])
    redis.call('PUBLISH', ARGV[2] .. h, 'w ' .. ARGV[3])
    return was
  end
  redis.call('ZREM', KEYS[3], h)
  redis.call('HDEL', KEYS[4], h)
end
