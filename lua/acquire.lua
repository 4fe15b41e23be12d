-- Grants the lease of one lock name to a client, or queues the client.
-- KEYS[1] lease hash  <prefix>{<name>}       fields: owner, token, nonce, and
--                     for operators since (server ms of the grant), name
--                     (the owner's client_name)
-- KEYS[2] fence key   <prefix>{<name>}:fence  a token no later grant may reach
-- KEYS[3] wait queue  <prefix>{<name>}:q      zset: client id -> arrival (server us)
-- KEYS[4] liveness    <prefix>{<name>}:qd     hash: client id -> "<deadline (server
--                     ms)> <its newest attempt> <its pass limit> <its waiter ttl>
--                     <its name>":
--                     what a release needs to grant it the lease directly
-- KEYS[5] turn        <prefix>{<name>}:turn   the client whose turn it is
-- KEYS[6] record      <prefix>{<name>}:c:<client id>  what Redis remembers of this
--                     client for this name: "<newest attempt> <token of its last
--                     released grant> <attempt of that grant>" (see below)
-- ARGV[1] client id (32 hex digits)
-- ARGV[2] lease time in ms
-- ARGV[3] number of this attempt: unique and increasing per client, from 1;
--         it lets the client release exactly this grant if it never learns
--         the outcome of this call, and lets Redis refuse the attempt if it
--         arrives after a newer one
-- ARGV[4] pass limit: tokens the client may hand out locally after this one
-- ARGV[5] waiter ttl in ms: how long a queued client stays without a retry
-- ARGV[6] '1' to join the wait queue when refused, '0' for a single try
-- ARGV[7] record lifetime in ms after the client's last call on this name
-- ARGV[8] the client's name (client_name: printable, no spaces), stored with
--         a grant for operators (dlockctl), and in the liveness hash so that
--         a direct grant stores it too
-- Returns {1, token} when granted, or {0, pttl} when the client must wait
-- (pttl: the lease's remaining time, or -1 when the lease is free but another
-- client's turn comes first); then, if it asked to, the client is in the
-- wait queue, once, in arrival order, with its deadline refreshed.
-- Returns {-1, 0}, having changed nothing at all, for a stale attempt: one
-- older than an attempt Redis has already seen from this client for this
-- name, or one whose grant was already released. A late copy of an old
-- attempt (a retransmitted request, a stalled server serving an old
-- connection late) can thus never displace a newer grant, queue a client
-- that stopped waiting, or take a turn. The same attempt seen again while
-- its grant stands is answered with that grant, unchanged.
-- A lease the caller already owns under an older attempt (one whose outcome
-- it never learned, or whose release failed) is granted again, with a new
-- token and this attempt's number.
--
-- A lease granted to the caller by a release (release.lua: the direct
-- grant, under attempt `nonce`, for the caller's waiter ttl only) is found
-- here as the caller's own: the same attempt again gets it at the full
-- lease time, a newer attempt gets it again with a new token.
--
-- Fairness: a free lease goes to the client whose turn it is (set by a leave
-- that gave up a grant or a turn, cleared when that client is gone), else to
-- the first live client in the queue, else to anyone. Dead waiters (deadline
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
local attempt = tonumber(ARGV[3])
local lease = redis.call('HMGET', KEYS[1], 'owner', 'token', 'nonce')
local mine = lease[1] == me
local rec = redis.call('GET', KEYS[6])
local seen, rtok, ratt = 0, '0', '0' -- attempts are numbered from 1
if rec then
  local a, t, r = string.match(rec, '^(%d+) (%d+) (%d+)$')
  if a then -- anything else in the key is treated as no record
    seen, rtok, ratt = tonumber(a), t, r
  end
end
if mine then
  local held = tonumber(lease[3]) or 0
  if held == attempt then
    -- The same attempt again: its grant stands, for a whole lease from now
    -- (the caller counts its validity from this call; a direct grant was
    -- made for the waiter ttl only).
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, tonumber(lease[2])}
  end
  if held > seen then
    seen = held
  end
end
if attempt < seen or attempt == tonumber(ratt) then
  return {-1, 0}
end
redis.call('SET', KEYS[6], string.format('%.0f %s %s', attempt, rtok, ratt), 'PX', ARGV[7])

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local ttl = tonumber(ARGV[5])

local function alive(id)
  local d = redis.call('HGET', KEYS[4], id)
  local deadline = d and tonumber(string.match(d, '^%d+'))
  return deadline and deadline > now_ms
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
  redis.call('HSET', KEYS[4], me,
    string.format('%.0f %s %s %s %s', now_ms + ttl, ARGV[3], ARGV[4], ARGV[5], ARGV[8]))
  -- The queue vanishes once every waiter stopped refreshing it; a client
  -- with a shorter waiter ttl never shortens another's.
  for k = 3, 4 do
    if redis.call('PTTL', KEYS[k]) < 2 * ttl then
      redis.call('PEXPIRE', KEYS[k], 2 * ttl)
    end
  end
  return {0, pttl}
end

if lease[1] and not mine then
  return wait(redis.call('PTTL', KEYS[1]))
end
-- Nobody queued and no turn given: the common, uncontended case touches no
-- queue key at all.
local queued = redis.call('EXISTS', KEYS[3], KEYS[5]) > 0
if queued and not lease[1] then
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

if queued then
  redis.call('ZREM', KEYS[3], me)
  redis.call('HDEL', KEYS[4], me)
  redis.call('DEL', KEYS[5])
end
local token = now_us
local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local prev = tonumber(lease[2] or '0') or 0
if prev > last then
  last = prev
end
if token <= last then
  token = last + 1
end
redis.call('HSET', KEYS[1], 'owner', me, 'token', string.format('%.0f', token), 'nonce', ARGV[3],
  'since', string.format('%.0f', now_ms), 'name', ARGV[8])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local reserved = token + tonumber(ARGV[4])
if reserved > last then
  redis.call('SET', KEYS[2], string.format('%.0f', reserved), 'PX', ARGV[2])
end
return {1, token}
