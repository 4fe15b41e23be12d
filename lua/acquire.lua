-- Grants the lease of one lock name to a client, or queues the client.
-- KEYS[1] lease hash  <prefix>{<name>}       fields: owner, token, nonce
-- KEYS[2] fence key   <prefix>{<name>}:fence  a token no later grant may reach
-- KEYS[3] wait queue  <prefix>{<name>}:q      zset: client id -> arrival (server us)
-- KEYS[4] liveness    <prefix>{<name>}:qd     hash: client id -> deadline (server ms)
-- KEYS[5] turn        <prefix>{<name>}:turn   the client whose turn it is
-- ARGV[1] client id (32 hex digits)
-- ARGV[2] lease time in ms
-- ARGV[3] nonce of this attempt (unique per client): lets the client release
--         exactly this grant if it never learns the outcome of this call
-- ARGV[4] pass limit: tokens the client may hand out locally after this one
-- ARGV[5] waiter ttl in ms: how long a queued client stays without a retry
-- ARGV[6] '1' to join the wait queue when refused, '0' for a single try
-- Returns {1, token} when granted, or {0, pttl} when the client must wait
-- (pttl: the lease's remaining time, or -1 when the lease is free but another
-- client's turn comes first); then, if it asked to, the client is in the
-- wait queue, once, in arrival order, with its deadline refreshed.
-- A lease the caller already owns (left by a release or an attempt whose
-- outcome it never learned) is granted again, with a new token and nonce.
--
-- Fairness: a free lease goes to the client whose turn it is (set by the
-- release that freed it, cleared when that client is gone), else to the
-- first live client in the queue, else to anyone. Dead waiters (deadline
-- passed) are pruned from the head of the queue; all times are the server's.
--
-- Tokens: max(server time in us, last + 1), where last is the larger of the
-- lease's token (when the caller owned it) and the fence. The grant reserves
-- token .. token + pass limit for local handoffs by setting the fence to
-- token + pass limit for one lease time; after that, server time alone is
-- past the reservation, since the client accepts pass limits only below the
-- lease time in us. Server time in us is below 2^53, so Lua's doubles hold
-- it exactly; it is stored with %.0f so that it reads back as the same
-- decimal string the client sends.
local me = ARGV[1]
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local ttl = tonumber(ARGV[5])

local function alive(id)
  local d = redis.call('HGET', KEYS[4], id)
  return d and tonumber(d) > now_ms
end

-- The first live waiter, after dropping dead ones from the head.
local function head()
  while true do
    local h = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not h then
      return nil
    end
    if alive(h) then
      return h
    end
    redis.call('ZREM', KEYS[3], h)
    redis.call('HDEL', KEYS[4], h)
  end
end

local function wait(pttl)
  if ARGV[6] ~= '1' then
    return {0, pttl}
  end
  redis.call('ZADD', KEYS[3], 'NX', now_us, me)
  redis.call('HSET', KEYS[4], me, now_ms + ttl)
  -- The queue vanishes once every waiter stopped refreshing it; a client
  -- with a shorter waiter ttl never shortens another's.
  for k = 3, 4 do
    if redis.call('PTTL', KEYS[k]) < 2 * ttl then
      redis.call('PEXPIRE', KEYS[k], 2 * ttl)
    end
  end
  return {0, pttl}
end

local lease = redis.call('HMGET', KEYS[1], 'owner', 'token')
if lease[1] and lease[1] ~= me then
  return wait(redis.call('PTTL', KEYS[1]))
end
if not lease[1] then
  local turn = redis.call('GET', KEYS[5])
  if turn and turn ~= me then
    if alive(turn) then
      return wait(-1)
    end
    redis.call('DEL', KEYS[5]) -- its holder is gone: the turn passes on
    turn = nil
  end
  if not turn then
    local h = head()
    if h and h ~= me then
      return wait(-1)
    end
  end
end

redis.call('ZREM', KEYS[3], me)
redis.call('HDEL', KEYS[4], me)
redis.call('DEL', KEYS[5])
local token = now_us
local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local mine = tonumber(lease[2] or '0') or 0
if mine > last then
  last = mine
end
if token <= last then
  token = last + 1
end
redis.call('HSET', KEYS[1], 'owner', me, 'token', string.format('%.0f', token), 'nonce', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local reserved = token + tonumber(ARGV[4])
if reserved > last then
  redis.call('SET', KEYS[2], string.format('%.0f', reserved), 'PX', ARGV[2])
end
return {1, token}
