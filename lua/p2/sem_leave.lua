-- Protocol 2's semaphore leave (lua/p2/SEM.txt): takes a client out of a
-- semaphore's wait queue (its waiting thread gave up), giving back a direct
-- grant it never took: if the client's last grant is the attempt it gives
-- up (a release granted it directly, and the message came too late or not
-- at all), its permits are given back, and the permits then free go to the
-- live waiters at the head of the queue as a release's do
-- (lua/p2/sem_release.lua).
-- KEYS[1] the name's hash, KEYS[2] protocol 1's fence and KEYS[5] its
-- turn (only read, as sem_acquire.lua does), KEYS[3] wait queue, KEYS[4]
-- liveness (as lua/p2/sem_acquire.lua's); KEYS[6], KEYS[7] unused (passed
-- in lua/keys.lua's order)
-- ARGV[1] client id
-- ARGV[2] wake channel prefix
-- ARGV[3] the semaphore's name
-- ARGV[4] waiter ttl in ms (unused: the direct grants last each waiter's own)
-- ARGV[5] number of this call, from the client's one sequence
-- ARGV[6] record lifetime in ms
-- ARGV[7] the attempt given up (the one the client was queued with)
-- Returns 1 if the client was queued or held a direct grant of that
-- attempt (given back now), else 0. A leave older than the newest call
-- Redis remembers of this client for this name (a late copy), or with that
-- call's number when it was not this leave, changes nothing and returns
-- 0: it must not take out a client that queued again since. The same leave
-- again finds nothing more to do.
-- Errors, having changed nothing: DLOCKPROTOCOL and DLOCKKIND as
-- lua/p2/sem_acquire.lua's.
local me = ARGV[1]
local num = tonumber(ARGV[5])
local keep = tonumber(ARGV[6])
local gave_up = tonumber(ARGV[7]) or 0
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
if mine and (num < mine.a or (num == mine.a and mine.x ~= 'l')) then
  return 0
end

local put, life, msgs = {}, 0, {}
if new then
  put = {'pv', '2', 'k', 's'}
end
local function write(id, r)
  r.u = math.max(r.u or 0, now + keep, r.exp)
  r.w = true
  put[#put + 1] = 'c:' .. id
  put[#put + 1] = string.format('%d %.0f %.0f %s %.0f %d %.0f', r.n, r.exp, r.a, r.x, r.g, r.gk,
    r.u)
  life = math.max(life, r.u - now)
end

local was = redis.call('ZREM', KEYS[3], me)
redis.call('HDEL', KEYS[4], me)
mine = mine or {n = 0, exp = 0, g = 0, gk = 0}
if gave_up > 0 and gave_up < num and mine.g == gave_up and mine.n > 0 then
  -- a grant of the attempt given up: nobody took it
  mine.n = mine.n - mine.gk
  used = used - mine.gk
  mine.g, mine.gk = 0, 0
  if mine.n == 0 then
    mine.exp = 0
  end
  was = 1
end
mine.a, mine.x = num, 'l'
write(me, mine)

-- The walk of the queue (lua/p2/sem_acquire.lua, Fairness): the permits
-- given back, or the place this client left at the head, may serve the
-- waiters behind.
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
      msgs[#msgs + 1] = {ARGV[2] .. w, 'P ' .. att .. ' ' .. k .. ' ' .. ARGV[3]}
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
if new then
  redis.call('PEXPIRE', KEYS[1], life)
else
  redis.call('PEXPIRE', KEYS[1], life, 'GT')
end
for _, m in ipairs(msgs) do
  redis.call('PUBLISH', m[1], m[2])
end
return was
