-- Protocol 2's semaphore release (lua/p2/SEM.txt): gives back permits of
-- one semaphore name that the client holds, and grants the permits then
-- free directly to the live waiters at the head of the queue, in arrival
-- order, each its count, while enough are free (a message "P <attempt>
-- <count> <name>" on each one's channel: it holds them from then, under
-- that attempt, for its waiter ttl (or, if it holds live permits, until
-- those end: lua/p2/SEM.txt, Fairness), until it takes them and its
-- renewals extend them); the first waiter that cannot be served stops the
-- walk.
-- Dead waiters met on the way leave the queue.
-- KEYS[1] the name's hash, KEYS[3] wait queue, KEYS[4] liveness (as
-- lua/p2/sem_acquire.lua's); KEYS[2] protocol 1's fence and KEYS[5] its
-- turn, only read on a name without a hash (as sem_acquire.lua does);
-- KEYS[6], KEYS[7] unused (passed in lua/keys.lua's order)
-- ARGV[1] client id
-- ARGV[2] number of this call, from the client's one sequence (acquire
--         attempts, releases, leaves)
-- ARGV[3] permits to give back (1 .. ), or '0' to give back what attempt
--         ARGV[4] was granted
-- ARGV[4] with ARGV[3] '0': an attempt of this client whose outcome it
--         never learned (its reply was lost); its grant, if it is the
--         client's last one and its permits stand, is given back whole
-- ARGV[5] wake channel prefix: a waiter's channel is this + its id
-- ARGV[6] the semaphore's name, for the messages
-- ARGV[7] record lifetime in ms
-- Returns 1 when given back (2 when permits went to waiters), 0 when the
-- client held fewer permits than it gave back (they had ended: its lease
-- ran out) or, by attempt, that attempt holds no grant (it was refused, or
-- its grant ended or was given back); whatever it held of them is given
-- back. A client holding nothing has the call remembered all the same
-- (its field, with no permits), so that late copies of its older acquires
-- are refused. The same call again (a retry whose reply was lost) answers as the
-- first did (1 for 2) and gives back nothing more. Returns 3, having
-- changed nothing, when Redis has seen a newer call of this client for
-- this name (a late copy: this one ran before, or will never run).
-- Errors, having changed nothing: DLOCKPROTOCOL and DLOCKKIND as
-- lua/p2/sem_acquire.lua's.
local me = ARGV[1]
local num = tonumber(ARGV[2])
local count = tonumber(ARGV[3])
local keep = tonumber(ARGV[7])
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
if #all > 0 and (f.k ~= 's' or f.g) then
  return redis.error_reply('DLOCKKIND the data of this name is a lock (kind ' ..
    (f.k or 'exclusive') .. '), not a semaphore')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The clients' fields (lua/p2/sem_acquire.lua).
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
if not mine then
  -- Nothing held, nothing remembered (no field, or one past its <until>):
  -- Redis remembers this call, as a leave does (lua/p2/sem_leave.lua),
  -- so that a late copy of an older acquire (the attempt in doubt this
  -- release gives back) is refused, not granted.
  if #all == 0 and redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[5]) > 0 then
    return redis.error_reply('DLOCKKIND the data of this name is a lock (kind exclusive), '
      .. 'not a semaphore')
  end
  local rec = string.format('0 0 %.0f z 0 0 %.0f', num, now + keep)
  if #all == 0 then
    redis.call('HSET', KEYS[1], 'pv', '2', 'k', 's', 'c:' .. me, rec)
    redis.call('PEXPIRE', KEYS[1], keep)
  else
    redis.call('HSET', KEYS[1], 'c:' .. me, rec)
    redis.call('PEXPIRE', KEYS[1], keep, 'GT')
  end
  return 0
end
if num < mine.a then
  return 3
end
if num == mine.a then
  if mine.x == 'r' then
    return 1
  elseif mine.x == 'z' then
    return 0
  end
  return 3
end

local put, life, msgs = {}, 0, {}
local function write(id, r)
  r.u = math.max(r.u or 0, now + keep, r.exp)
  r.w = true
  put[#put + 1] = 'c:' .. id
  put[#put + 1] = string.format('%d %.0f %.0f %s %.0f %d %.0f', r.n, r.exp, r.a, r.x, r.g, r.gk,
    r.u)
  life = math.max(life, r.u - now)
end

local give, full
if count > 0 then
  give = math.min(count, mine.n)
  full = give == count
else
  give = (mine.g == tonumber(ARGV[4]) and mine.n > 0) and mine.gk or 0
  full = give > 0
  if full then
    mine.g, mine.gk = 0, 0
  end
end
mine.n = mine.n - give
used = used - give
if mine.n == 0 then
  mine.exp, mine.g, mine.gk = 0, 0, 0
elseif mine.gk > mine.n then
  mine.gk = mine.n
end
mine.a, mine.x = num, full and 'r' or 'z'
write(me, mine)
local reply = full and 1 or 0

-- The walk of the queue (lua/p2/sem_acquire.lua, Fairness).
local free = (tonumber(f.l) or 0) - used
if f.q and free > 0 then
  while true do
    local w = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not w then
      break
    end
    local dl, att, k, wttl = string.match(redis.call('HGET', KEYS[4], w) or '',
      '^(%d+) (%d+) (%d+) (%d+)')
    if dl and tonumber(dl) > now then
      if tonumber(k) > free then
        break
      end
      k = tonumber(k)
      local r = recs[w] or {n = 0, exp = 0, a = 0}
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
      msgs[#msgs + 1] = {ARGV[5] .. w, 'P ' .. att .. ' ' .. k .. ' ' .. ARGV[6]}
      if reply == 1 then
        reply = 2
      end
    end
    redis.call('ZREM', KEYS[3], w)
    redis.call('HDEL', KEYS[4], w)
  end
end
local del = {}
if f.q and redis.call('EXISTS', KEYS[3]) == 0 then
  del[1] = 'q'
end
if nf > 16 then
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
for i = 1, #del, 1000 do
  redis.call('HDEL', KEYS[1], unpack(del, i, math.min(i + 999, #del)))
end
redis.call('HSET', KEYS[1], unpack(put))
redis.call('PEXPIRE', KEYS[1], life, 'GT')
for _, m in ipairs(msgs) do
  redis.call('PUBLISH', m[1], m[2])
end
return reply
