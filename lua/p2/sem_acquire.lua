-- Protocol 2's semaphore (lua/p2/SEM.txt): takes permits of one counting
-- semaphore name for a client, or queues the client. At most `limit`
-- permits of a name are held at once across all clients; a client's
-- permits are one field of the name's hash, with their count and their end
-- (a lease the renewal thread extends: lua/p2/sem_renew.lua).
-- KEYS[1] the name's hash  <prefix>{<name>}  (lua/keys.lua: LEASE)
-- KEYS[2] protocol 1's fence, only read: a name without a hash that a
--         protocol 1 lock used within a lease time is refused (lua/keys.lua:
--         FENCE)
-- KEYS[3] wait queue  zset: client id -> arrival (server us)
-- KEYS[4] liveness    hash: client id -> "<deadline (server ms)> <its newest
--                     attempt> <permits it waits for> <its waiter ttl> <its
--                     name>": what a direct grant to it needs
--         A name without a hash whose queue (or protocol 1's turn, KEYS[5],
--         only read) exists holds a protocol 1 lock's waiters (a
--         semaphore's queue never outlives its hash): refused, not read.
-- KEYS[6], KEYS[7]  unused (passed in lua/keys.lua's order)
-- ARGV[1] client id (32 hex digits)
-- ARGV[2] lease time in ms: the client's permits end this long after a
--         grant or a renewal
-- ARGV[3] number of this attempt: unique and increasing per client, from 1,
--         from the one sequence of all the client's calls (acquire, release,
--         leave)
-- ARGV[4] permits wanted (normally 1; 1 .. limit)
-- ARGV[5] waiter ttl in ms: how long a queued client stays without a retry,
--         and how long a direct grant to it lasts until it takes it (to a
--         client holding none; to one holding live permits, the grant
--         ends with them: lua/p2/SEM.txt, Fairness)
-- ARGV[6] '1' to join the wait queue when refused, '0' for a single try
-- ARGV[7] record lifetime in ms after the client's last call on this name
-- ARGV[8] the client's name (client_name: printable, no spaces)
-- ARGV[9] the semaphore's limit as the caller knows it
-- ARGV[10] an earlier attempt of this client that may have been granted
--         without the client taking the permits ('0' if none): its reply was
--         lost, or it was queued and a direct grant's message may have been
--         missed. If it is the client's last grant and still holds its
--         permits, this attempt takes that grant over (same count) instead of
--         taking more; with another count it is given back first.
-- ARGV[11] wake channel prefix: a waiter's channel is this + its id
-- ARGV[12] the semaphore's name, for the messages of direct grants
-- Returns {1, held} when granted (held: the permits the client now holds of
-- the name), {0, free, waiting} when refused (free: permits free now;
-- waiting: entries in the wait queue), then, if it asked to, the client is
-- queued, once, in arrival order, its deadline and attempt refreshed.
-- Returns {-1, 0}, having changed nothing, for a stale attempt: one older
-- than the newest call Redis remembers of this client for this name, or
-- that call's own number when it was a release or a leave. The newest
-- call's attempt again: refused, it is tried again (a queued client
-- refreshing its place); granted, while its permits stand (a retry whose
-- reply was lost), it is answered {1, held} without taking a permit and
-- extends the permits to a whole lease from now; granted, its permits
-- since ended, it is tried anew.
-- Errors, having changed nothing:
--   DLOCKPROTOCOL  data of another protocol (as lua/p2/acquire.lua's)
--   DLOCKKIND      the name holds a lock's data (pv 2 without k = 's', or
--                  with a grant g), or, without a hash, a protocol 1
--                  lock's fence, queue or turn
--   DLOCKLIMIT <theirs> <yours> ...  the limit differs from the one the
--                  semaphore's holders or other live waiters use
--   DLOCKARG       a count or limit out of range
--
-- Fairness (FIFO between clients): this acquire first grants free permits
-- to the live waiters at the head of the queue, in arrival order, each its
-- count, while enough are free (direct grants: a message "P <attempt>
-- <count> <name>" on each one's channel); dead waiters (deadline passed)
-- met on the way leave the queue. The first live waiter that cannot be
-- served stops the walk, and nobody behind it (this caller included) is
-- granted: a newcomer never overtakes a queued waiter. The caller is
-- granted when the walk ends at it or at an empty queue, with its count
-- free.
local me = ARGV[1]
local l = tonumber(ARGV[2])
local attempt = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local keep = tonumber(ARGV[7])
local limit = tonumber(ARGV[9])
local doubt = tonumber(ARGV[10]) or 0
local all = redis.call('HGETALL', KEYS[1])
local f = {}
for i = 1, #all, 2 do
  f[all[i]] = all[i + 1]
end
if f.pv ~= '2' and (f.pv or #all > 0) then
  local p = f.pv or '1'
  return redis.error_reply('DLOCKPROTOCOL the data of this name is dlock protocol ' .. p ..
    '; this client speaks protocol 2' .. ((tonumber(p) or 3) > 2 and ': upgrade it' or ''))
end
local new = #all == 0
if (not new and (f.k ~= 's' or f.g))
    or (new and redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[5]) > 0) then
  return redis.error_reply('DLOCKKIND the data of this name is a lock (kind ' ..
    (f.k or 'exclusive') .. '), not a semaphore')
end
if not limit or limit < 1 or limit % 1 ~= 0 or not want or want < 1 or want % 1 ~= 0
    or want > limit then
  return redis.error_reply('DLOCKARG permits ' .. ARGV[4] .. ' of limit ' .. ARGV[9] ..
    ': the limit must be at least 1, the permits 1 .. limit')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The clients' fields: c:<id> "<n> <exp> <a> <x> <g> <gk> <until>"
-- (lua/p2/SEM.txt). A field past <until> is none; permits past <exp> count
-- no more (and their grant with them).
local recs, used, stale, nf, ended, gone = {}, 0, {}, 0, {}, {}
for i = 1, #all, 2 do
  local id = string.match(all[i], '^c:(.+)$')
  if id then
    nf = nf + 1
    local n, e, a, x, g, gk, u = string.match(all[i + 1],
      '^(%d+) (%d+) (%d+) (%a) (%d+) (%d+) (%d+)$')
    if n and tonumber(u) >= now then
      local r = {n = tonumber(n), exp = tonumber(e), a = tonumber(a), x = x, g = tonumber(g),
        gk = tonumber(gk), u = tonumber(u)}
      if r.exp < now then
        if r.n > 0 then
          ended[#ended + 1] = id
        end
        r.n, r.exp, r.g, r.gk = 0, 0, 0, 0
      end
      recs[id] = r
      used = used + r.n
    else
      stale[#stale + 1] = all[i]
      if n and tonumber(n) > 0 then
        gone[#gone + 1] = all[i]
      end
    end
  end
end
local mine = recs[me]
if mine and attempt == mine.a and mine.x == 'g' and mine.g == attempt and mine.n > 0 then
  -- The same attempt again: its grant stands, without another permit, for
  -- a whole lease from now.
  mine.exp = math.max(mine.exp, now + l)
  mine.u = math.max(mine.u, mine.exp)
  redis.call('HSET', KEYS[1], 'c:' .. me, string.format('%d %.0f %.0f g %.0f %d %.0f',
    mine.n, mine.exp, mine.a, mine.g, mine.gk, mine.u))
  redis.call('PEXPIRE', KEYS[1], mine.u - now, 'GT')
  return {1, mine.n}
end
if mine and (attempt < mine.a or (attempt == mine.a and mine.x ~= 'q'
    and not (mine.x == 'g' and mine.n == 0))) then
  return {-1, 0}
end

-- The limit: it stands while anyone holds permits or another live client
-- waits; else the caller's becomes the semaphore's.
local lim = tonumber(f.l)
if lim ~= limit and lim then
  local other = used > 0
  local i = 0
  while not other and f.q do
    local ws = redis.call('ZRANGE', KEYS[3], i, i + 15)
    if #ws == 0 then
      break
    end
    for _, w in ipairs(ws) do
      local d = tonumber(string.match(redis.call('HGET', KEYS[4], w) or '', '^%d+'))
      if w ~= me and d and d > now then
        other = true
        break
      end
    end
    i = i + 16
  end
  if other then
    return redis.error_reply('DLOCKLIMIT ' .. f.l .. ' ' .. ARGV[9] .. ' the semaphore is used '
      .. 'with limit ' .. f.l .. '; this call gives limit ' .. ARGV[9])
  end
end

-- The writes, made once at the end: changed client fields, the life they
-- need (the hash's time to live only grows), the messages.
local put, life, msgs = {}, 0, {}
if new then
  put = {'pv', '2', 'k', 's'}
end
if lim ~= limit then
  put[#put + 1] = 'l'
  put[#put + 1] = ARGV[9]
end
local function write(id, r)
  r.u = math.max(r.u or 0, now + keep, r.exp)
  r.w = true
  put[#put + 1] = 'c:' .. id
  put[#put + 1] = string.format('%d %.0f %.0f %s %.0f %d %.0f', r.n, r.exp, r.a, r.x, r.g, r.gk,
    r.u)
  life = math.max(life, r.u - now)
end

-- An earlier attempt in doubt: its grant is taken over, or given back.
if mine and doubt > 0 and doubt < attempt and mine.g == doubt and mine.n > 0 then
  if mine.gk == want then
    mine.a, mine.x, mine.g = attempt, 'g', attempt
    mine.exp = math.max(mine.exp, now + l)
    redis.call('ZREM', KEYS[3], me)
    redis.call('HDEL', KEYS[4], me)
    write(me, mine)
    redis.call('HSET', KEYS[1], unpack(put))
    redis.call('PEXPIRE', KEYS[1], life, 'GT')
    return {1, mine.n}
  end
  mine.n = mine.n - mine.gk
  used = used - mine.gk
  mine.g, mine.gk = 0, 0
  if mine.n == 0 then
    mine.exp = 0
  end
end

-- The walk of the queue (Fairness, above).
local free = limit - used
local at = 'empty'
if f.q then
  while true do
    local w = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not w then
      break
    end
    local dl, att, k, wttl = string.match(redis.call('HGET', KEYS[4], w) or '',
      '^(%d+) (%d+) (%d+) (%d+)')
    local r = recs[w]
    if not dl or tonumber(dl) <= now then
      dl = nil -- dead: it leaves the queue
    elseif w == me then
      at = 'me'
      break
    elseif tonumber(k) > free then
      at = 'blocked'
      break
    else
      -- A direct grant under its newest attempt (lua/p2/SEM.txt, Fairness).
      k = tonumber(k)
      r = r or {n = 0, exp = 0, a = 0}
      -- (to a client holding live permits, they join them and end with
      -- them: one exp per client, never stretched by a direct grant)
      if r.n == 0 then
        r.exp = now + tonumber(wttl)
      end
      r.n = r.n + k
      r.g, r.gk = tonumber(att), k
      if r.a <= r.g then
        r.a, r.x = r.g, 'g'
      end
      recs[w] = r
      write(w, r)
      free = free - k
      msgs[#msgs + 1] = {ARGV[11] .. w, 'P ' .. att .. ' ' .. k .. ' ' .. ARGV[12]}
    end
    redis.call('ZREM', KEYS[3], w)
    redis.call('HDEL', KEYS[4], w)
  end
end

local reply
mine = mine or {n = 0, exp = 0, g = 0, gk = 0}
if at ~= 'blocked' and want <= free then
  mine.n = mine.n + want
  mine.exp = math.max(mine.exp, now + l)
  mine.a, mine.x, mine.g, mine.gk = attempt, 'g', attempt, want
  if at == 'me' then
    redis.call('ZREM', KEYS[3], me)
    redis.call('HDEL', KEYS[4], me)
  end
  write(me, mine)
  reply = {1, mine.n}
else
  mine.a, mine.x = attempt, 'q'
  write(me, mine)
  if ARGV[6] == '1' then
    redis.call('ZADD', KEYS[3], 'NX', t[1] .. string.rep('0', 6 - #t[2]) .. t[2], me)
    redis.call('HSET', KEYS[4], me, string.format('%.0f', now + ttl) .. ' ' .. ARGV[3] .. ' '
      .. ARGV[4] .. ' ' .. ARGV[5] .. ' ' .. ARGV[8])
    -- The queue vanishes once every waiter stopped refreshing it; a client
    -- with a shorter waiter ttl never shortens another's.
    for k = 3, 4 do
      if redis.call('PTTL', KEYS[k]) < 2 * ttl then
        redis.call('PEXPIRE', KEYS[k], 2 * ttl)
      end
    end
    life = math.max(life, 2 * ttl)
  end
  reply = {0, math.max(free, 0), redis.call('ZCARD', KEYS[3])}
end
-- q: while a waiter may be queued
local any = redis.call('EXISTS', KEYS[3]) == 1
if any and not f.q then
  put[#put + 1] = 'q'
  put[#put + 1] = '1'
  life = math.max(life, redis.call('PTTL', KEYS[3]))
end
local del = {}
if f.q and not any then
  del[1] = 'q'
end
if nf > 16 then
  -- the fields of clients past their <until> go, so that the hash of a
  -- name used by ever new clients stays bounded
  for _, fld in ipairs(stale) do
    del[#del + 1] = fld
  end
end
-- Permits seen ended no longer count, whatever the clock does next: their
-- fields keep no permits (their records stay), and a field past its
-- <until> that still holds some goes (lua/p2/SEM.txt, CLOCK).
for _, id in ipairs(ended) do
  local r = recs[id]
  if not r.w then
    put[#put + 1] = 'c:' .. id
    put[#put + 1] = string.format('0 0 %.0f %s 0 0 %.0f', r.a, r.x, r.u)
  end
end
for _, fld in ipairs(gone) do
  del[#del + 1] = fld
end
-- (deleted first: a field set here may have been past its <until>)
for i = 1, #del, 1000 do
  redis.call('HDEL', KEYS[1], unpack(del, i, math.min(i + 999, #del)))
end
redis.call('HSET', KEYS[1], unpack(put))
if new then
  redis.call('PEXPIRE', KEYS[1], life)
else
  redis.call('PEXPIRE', KEYS[1], life, 'GT')
end
for _, m in ipairs(msgs) do
  redis.call('PUBLISH', m[1], m[2])
end
return reply
