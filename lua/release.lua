-- Gives a lease back, if the caller still owns this grant of it, and grants
-- it directly to the first live waiting client, which learns it from one
-- message on its channel and owns the lease without another call: a
-- crossing between clients costs the waiter's refused try and this release.
--
-- The direct grant is made under the waiter's newest attempt (its nonce,
-- from the liveness hash) and lasts only the waiter's ttl: a waiter that
-- died or stopped waiting since its last refresh blocks the name for no
-- longer than that. The waiter takes the grant only if it still waits in
-- that attempt, counts its validity from when it sent the attempt, and
-- renews it to a whole lease; a newer attempt of its own finds the lease its
-- own (acquire.lua), so a grant message lost or late costs nothing but time.
-- Its tokens follow as for any grant: max(server time in us, last + 1),
-- above the slot's mark, which it writes (acquire.lua, Tokens).
-- KEYS[1] lease hash  <prefix>{<name>}
-- KEYS[2] fence key   <prefix>{<name>}:fence
-- KEYS[3] wait queue  <prefix>{<name>}:q
-- KEYS[4] liveness    <prefix>{<name>}:qd     (see acquire.lua)
-- KEYS[5] turn        <prefix>{<name>}:turn
-- KEYS[6] record      <prefix>{<name>}:c:<client id> (see acquire.lua)
-- KEYS[7] slot mark   <prefix>hw:{<tag>} (see acquire.lua, Tokens)
-- ARGV[1] client id
-- ARGV[2] 'token' or 'nonce': which field identifies the grant
-- ARGV[3] that field's value: the grant's token, or the number of an acquire
--         attempt whose outcome the client never learned
-- ARGV[4] fence key lifetime in ms (the lease time)
-- ARGV[5] the last token handed out under this grant (local handoffs add 1
--         to the grant's token), or 0
-- ARGV[6] wake channel prefix: the next waiter's channel is this + its id
-- ARGV[7] the lock name; the message on that channel is
--         "g <attempt> <token> <name>" for a direct grant, "w <name>" for a
--         turn (a liveness value without the grant fields)
-- ARGV[8] waiter ttl in ms: how long the turn waits for its client
-- ARGV[9] record lifetime in ms
-- ARGV[10] how this grant ends (acquire.lua, "End"): '0' (or absent) its
--         holder released it; '1' the library released it for a holder
--         thread that exited or a client that closed; '3' an operator
--         (dlockctl release --force). A grant released by attempt number
--         was never used: it passes on the end of the grant before it (its
--         field u). The fence keeps it (" <end>") for the next grant, and a
--         direct grant carries it (field u, message "u <end> <attempt>
--         <token> <name>" instead of "g ...").
-- Returns 1 when released (2 when the next waiter was granted it or woken),
-- also when this very
-- grant had already been released by an earlier call (a retry whose first
-- try ran but whose answer was lost): releasing is idempotent. Returns 0
-- when the caller does not own that grant (it expired, was taken, or was
-- granted again), and, for an attempt number, 3 when a newer attempt of the
-- client has been seen: no grant of that attempt exists or can appear.
--
-- The fence key keeps the last token for a lease time, or until server time
-- has passed it if that is longer (a token may be ahead of server time), so
-- that the next grant's token exceeds it even if the server clock steps
-- back by up to a lease time; it expires, so no key lives forever per name.
-- A grant that expires unreleased leaves its key behind for a lease time to
-- the same end (acquire.lua).
--
-- Protocol: this script speaks dlock protocol 1 (DLOCK_PROTOCOL_VERSION in
-- dlock.h). A lease hash whose field pv names another protocol holds data of
-- a later release (which keeps that field for as long as any of its data of
-- the name lives: docs/design.md, "Protocol versions"): the script refuses
-- it, changing nothing, with an error that names both protocols.
-- A grant writes pv = 1 into the lease; a hash without pv is read as
-- protocol 1's.
--
-- The slot's mark (acquire.lua, Tokens): a release whose holder handed
-- out tokens above the mark's token raises it to the last of them, so that
-- after a step back of the clock no grant of the slot goes below them once
-- the fence has gone.
--
-- Cost: a release with nobody queued runs 7 commands (HMGET, TIME, DEL, SET
-- of the fence, GET of the record (MGET of the record and the mark when its
-- holder handed out tokens locally), SET of the record, EXISTS of the queue
-- keys), and an 8th, a SET of the mark, when those tokens are above the
-- mark (no grant of the slot came since); it formats no number.
local me = ARGV[1]
local lease = redis.call('HMGET', KEYS[1], 'owner', 'token', 'nonce', 'pl', 'since', 'exp', 'u',
  'pv')
if lease[8] and lease[8] ~= '1' then -- another protocol's data (Protocol, above)
  return redis.error_reply('DLOCKPROTOCOL the data of this name is dlock protocol ' ..
    lease[8] .. '; this client speaks protocol 1: upgrade it')
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if lease[6] and now_ms > tonumber(lease[6]) then
  -- The grant expired (acquire.lua: its key stays a lease time longer, as a
  -- fence): it is nobody's, and stays as it is.
  lease = {false, false, false, false, false, false, false, false}
end
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
    -- The lease's grant is newer. A grant writes no record, so the record
    -- takes its number now: once the lease is gone, a late copy of the
    -- attempt released here must still be refused (3 means no grant of it
    -- can appear).
    local rtok, ratt = '0', '0'
    if rec then
      local a, t, r = string.match(rec, '^(%d+) (%d+) (%d+)$')
      if a and tonumber(a) < tonumber(lease[3]) then
        rtok, ratt = t, r
      elseif a then
        return 3
      end
    end
    redis.call('SET', KEYS[6], lease[3] .. ' ' .. rtok .. ' ' .. ratt, 'PX', ARGV[9])
    return 3
  end
  return 0
end
-- The fence: the last token handed out under this grant, as the client
-- says, or the grant's own token (strings as Redis stored them: no number
-- is formatted here).
local last, fence = tonumber(lease[2]), lease[2]
local handed = tonumber(ARGV[5]) or 0
if handed > last then
  last, fence = handed, ARGV[5]
end
local ended = tonumber(ARGV[10] or '0') or 0
if ARGV[2] == 'nonce' then
  ended = tonumber(lease[7] or '0') or 0
end
if ended > 0 then
  fence = fence .. ' ' .. ended
end
redis.call('DEL', KEYS[1])
-- The fence lives a lease time, counted from when the server's clock has
-- passed its token (it may be ahead, after a step back of the clock).
local px = ARGV[4]
local ahead = math.ceil(last / 1000) - now_ms + tonumber(ARGV[4]) + 1
if ahead > tonumber(px) then
  px = string.format('%.0f', ahead)
end
redis.call('SET', KEYS[2], fence, 'PX', px)
-- Remember the release, so that a retry of it, or a late copy of the
-- acquire that made this grant, finds it done.
local nonce = string.match(lease[3] or '', '^%d+$') or '0'
local seen = nonce
local rec, mtok, mclk, mpl
if last > tonumber(lease[2]) then
  -- tokens handed out locally: the mark may be below them
  local got = redis.call('MGET', KEYS[6], KEYS[7]) -- the record, the mark
  rec = got[1]
  mtok, mclk, mpl = string.match(got[2] or '', '^(%d+) (%d+) (%d+)$')
else
  rec = redis.call('GET', KEYS[6])
  mtok = lease[2] -- (the mark is at least the grant's token: not read)
end
if last > (tonumber(mtok) or 0) then
  -- tokens handed out above the mark (Tokens, above)
  mtok = string.match(fence, '^%d+')
  mclk = mclk or '0'
  if not mpl or tonumber(mpl) < (tonumber(lease[4]) or 0) then
    mpl = string.match(lease[4] or '', '^%d+$') or '0'
  end
  redis.call('SET', KEYS[7], mtok .. ' ' .. mclk .. ' ' .. mpl)
end
if rec then
  local a = string.match(rec, '^(%d+) ')
  if a and tonumber(a) > (tonumber(nonce) or 0) then
    seen = a
  end
end
redis.call('SET', KEYS[6], seen .. ' ' .. lease[2] .. ' ' .. nonce, 'PX', ARGV[9])

if redis.call('EXISTS', KEYS[3], KEYS[5]) == 0 then
  return 1 -- nobody queued and no turn given: nothing to pass on
end
local us6 = string.rep('0', 6 - #t[2]) .. t[2] -- microseconds, 6 digits
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
while true do
  local h = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not h then
    redis.call('DEL', KEYS[5])
    return 1
  end
  local d = redis.call('HGET', KEYS[4], h) or ''
  local deadline = tonumber(string.match(d, '^%d+'))
  if deadline and deadline > now_ms then
    local _, att, pl, ttl, nm = string.match(d, '^(%d+) (%d+) (%d+) (%d+) ?(%S*)$')
    if not att then
      -- A liveness value without the grant fields (a deadline only): the
      -- waiter gets the turn and acquires the lease itself when woken.
      redis.call('SET', KEYS[5], h, 'PX', ARGV[8])
      redis.call('PUBLISH', ARGV[6] .. h, 'w ' .. ARGV[7])
      return 2
    end
    redis.call('ZREM', KEYS[3], h)
    redis.call('HDEL', KEYS[4], h)
    redis.call('DEL', KEYS[5])
    local tok = t[1] .. us6
    if not mclk then
      -- (MGET: a key of another type reads as none)
      mtok, mclk, mpl = string.match(redis.call('MGET', KEYS[7])[1] or '', '^(%d+) (%d+) (%d+)$')
    end
    local mark = tonumber(mtok) or 0
    if now_us < math.max(tonumber(mclk) or 0, mark) then
      mark = mark + tonumber(mpl) -- the clock stepped back (acquire.lua, Tokens)
    end
    if mark > last then
      last = mark
    end
    if now_us <= last then
      tok = string.format('%.0f', last + 1) -- after a step back of the clock
    end
    local mp = pl
    if mpl and tonumber(mpl) > tonumber(pl) then
      mp = mpl
    end
    redis.call('SET', KEYS[7], tok .. ' ' .. t[1] .. us6 .. ' ' .. mp)
    -- The waiter's local handoffs follow no faster than time passes
    -- (release.c, handoff_in_time): a waiter that never took the grant
    -- leaves nothing ahead of the clock, and one that did is bounded by
    -- its release's fence, or by its key once the grant expired
    -- (acquire.lua, gone).
    redis.call('HSET', KEYS[1], 'owner', h, 'token', tok, 'nonce', att, 'pl', pl,
      'since', t[1] .. string.sub(us6, 1, 3), 'name', nm,
      'exp', string.format('%.0f', now_ms + tonumber(ttl)), 'pv', '1')
    -- Its key outlives it by half the record lifetime (the larger of the
    -- lease time and the waiter ttl), as a fence (acquire.lua), counted
    -- from when the clock has passed token + pass limit.
    local keep = math.floor(tonumber(ARGV[9]) / 2)
    redis.call('PEXPIRE', KEYS[1], math.max(tonumber(ttl) + keep,
      math.ceil((tonumber(tok) + tonumber(pl)) / 1000) - now_ms + keep + 1))
    if ended > 0 then
      redis.call('HSET', KEYS[1], 'u', tostring(ended))
      redis.call('PUBLISH', ARGV[6] .. h, 'u ' .. ended .. ' ' .. att .. ' ' .. tok .. ' ' .. ARGV[7])
    else
      redis.call('PUBLISH', ARGV[6] .. h, 'g ' .. att .. ' ' .. tok .. ' ' .. ARGV[7])
    end
    return 2
  end
  redis.call('ZREM', KEYS[3], h)
  redis.call('HDEL', KEYS[4], h)
end
