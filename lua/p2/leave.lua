-- Protocol 2's leave (lua/p2/LAYOUT.txt): takes a client out of a lock's
-- wait queue, giving up a direct grant or a turn it never took. KEYS, ARGV,
-- replies and every rule as lua/leave.lua's (its head says them); only the
-- data in Redis differs: a grant given up leaves how the grant before it
-- ended in field u (for a record lifetime, or until half of one past its
-- token), and no fence token (the release that made it wrote it into the
-- slot's mark).
--
-- Shared mode (lua/p2/LAYOUT.txt): a shared lease the caller holds under
-- an attempt older than this call (a release's direct grant it never
-- took) is given up as an exclusive one is: its field goes; if no other
-- shared lease lives the name is free and the turn passes to the first
-- live waiter, else r becomes the latest exp of those left.
--
-- Protocol: as lua/p2/acquire.lua's. Protocol 1's record of the caller
-- (KEYS[6]) is read when the hash has none.
local me = ARGV[1]
local rk = 'c:' .. me
local h = redis.call('HMGET', KEYS[1], 'pv', 'g', 'q', 't', rk, 'o', 's:' .. me, 'k')
if h[1] ~= '2' and (h[1] or redis.call('EXISTS', KEYS[1]) == 1) then -- another protocol's data
  local p = h[1] or '1'
  return redis.error_reply('DLOCKPROTOCOL the data of this name is dlock protocol ' .. p ..
    '; this client speaks protocol 2' .. ((tonumber(p) or 3) > 2 and ': upgrade it' or ''))
end
if h[8] then
  -- a semaphore's hash (lua/p2/SEM.txt): not a lock's
  return redis.error_reply('DLOCKKIND the data of this name is a semaphore (kind ' .. h[8] ..
    '), not a lock')
end
local new = not h[1]
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The hash's writes, flushed once (lua/p2/acquire.lua).
local put, del, life, added = {}, {}, 0, false
local function set(f, v, ms)
  put[#put + 1] = f
  put[#put + 1] = v
  if ms > life then life = ms end
end
local function flush()
  if added and not new and redis.call('HLEN', KEYS[1]) > 16 then
    local all = redis.call('HGETALL', KEYS[1])
    for i = 1, #all, 2 do
      local u = tonumber(string.match(all[i + 1], ' (%d+)$') or '')
      if u and u < now_ms and all[i] ~= 'g' then
        del[#del + 1] = all[i]
      end
    end
  end
  -- (deleted first: a field set here may have been past its <until>; pv,
  -- which has none, keeps the hash)
  for i = 1, #del, 1000 do -- (unpack takes some thousands of values at most)
    redis.call('HDEL', KEYS[1], unpack(del, i, math.min(i + 999, #del)))
  end
  if #put > 0 then
    redis.call('HSET', KEYS[1], 'pv', '2', unpack(put))
  end
  if life > 0 and (#put > 0 or not new) then
    if new then
      redis.call('PEXPIRE', KEYS[1], life)
    else
      redis.call('PEXPIRE', KEYS[1], life, 'GT')
    end
  end
end

local n = tonumber(ARGV[5])
local keep = tonumber(ARGV[6])
local rec
if h[5] then
  local a, tk, r, u = string.match(h[5], '^(%d+) (%d+) (%d+) (%d+)$')
  if a and tonumber(u) >= now_ms then
    rec = a .. ' ' .. tk .. ' ' .. r
  end
elseif new then
  -- (a hash made here takes over protocol 1's fence's end word, field u,
  -- for the fence's time left: it is read only while the hash is new)
  local got = redis.call('MGET', KEYS[6], KEYS[2])
  rec = got[1] or nil
  local fe = got[2] and string.match(got[2], ' (%d)$')
  if fe then
    local px = redis.call('PTTL', KEYS[2])
    set('u', fe .. ' ' .. string.format('%.0f', now_ms + px), px)
  end
else
  rec = redis.call('MGET', KEYS[6])[1] or nil
end
local rtok, ratt = '0', '0'
if rec then
  local a, tk, r = string.match(rec, '^(%d+) (%d+) (%d+)$')
  if a and tonumber(a) > n then
    return 0
  end
  if a then
    rtok, ratt = tk, r
  end
end
added = not h[5]
set(rk, ARGV[5] .. ' ' .. rtok .. ' ' .. ratt .. ' ' .. string.format('%.0f', now_ms + keep), keep)
local was = redis.call('ZREM', KEYS[3], me)
redis.call('HDEL', KEYS[4], me)
-- A lease this client owns under an attempt older than this call is one it
-- gave up waiting for; one granted under a newer attempt is held.
-- (the grant: g "token nonce pl exp dur u tell", o its owner)
local tok, nonce, exp, u = string.match(h[2] or '', '^(%d+) (%d+) %d+ (%d+) %d+ (%d+) %d+$')
local owner = tok and h[6]
local live = owner and now_ms <= tonumber(exp)
local turn = h[4] and string.match(h[4], '^(%x+) (%d+)$')
if turn and tonumber(string.match(h[4], ' (%d+)$')) < now_ms then
  turn = nil
end
if new then
  -- On a new hash, protocol 1's queue and turn count as this layout's,
  -- taken over (fields q and t) while they last.
  local qx = redis.call('PTTL', KEYS[3])
  if qx > 0 then
    set('q', '1', qx)
    h[3] = '1'
  end
  local tx = redis.call('PTTL', KEYS[5])
  turn = tx > 0 and redis.call('GET', KEYS[5]) or nil
  if turn then
    h[4] = turn .. ' ' .. string.format('%.0f', now_ms + tx)
    if turn ~= me then
      set('t', h[4], tx)
    end
  end
end
-- A shared lease granted under an older attempt (a direct grant to this
-- shared waiter) is given up too (lua/p2/LAYOUT.txt, Shared mode). It can
-- only be a direct grant the client never took: a client leaves only a
-- wait it gave up, under an attempt newer than the lease's, and a client
-- holding a live shared lease never waits: its exclusive acquire is
-- refused (DLOCKMODE, not queued), its shared acquire granted at once
-- (the field then under that newer attempt); a lease it took in an
-- acquire's reply is under an attempt no older than any leave it sent
-- before (a late copy: not matched).
local sa, se = string.match(h[7] or '', '^%d+ (%d+) %d+ %d+ (%d+)$')
local sgive = sa and tonumber(se) >= now_ms and tonumber(sa) < n
if live and owner == me and tonumber(nonce) < n then
  -- Nobody used it: it passes on how the grant before it ended (its u).
  local ended = tonumber(u)
  if ended > 0 then
    local px = math.max(keep,
      math.ceil(tonumber(tok) / 1000) - now_ms + math.floor(keep / 2) + 1)
    set('u', ended .. ' ' .. string.format('%.0f', now_ms + px), px)
  end
  set('g', '', 0)
  live = false
  was = 1
elseif sgive then
  -- the other live shared leases, if any, keep the name (r: their latest
  -- exp); else it is free, and the turn passes as below
  del[#del + 1] = 's:' .. me
  was = 1
  local top
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local e = string.sub(all[i], 1, 2) == 's:' and all[i] ~= 's:' .. me
      and tonumber(string.match(all[i + 1], ' (%d+)$') or '')
    if e and e >= now_ms then
      top = math.max(top or 0, e)
    elseif e then
      del[#del + 1] = all[i] -- (ended: it goes with r, below or later)
    end
  end
  if top then
    set('r', string.format('%.0f', top), 0)
    flush()
    return was
  end
  del[#del + 1] = 'r'
elseif turn ~= me then
  flush()
  return was
end
if live then
  if h[4] then
    del[#del + 1] = 't' -- (the turn was this client's)
  end
  flush()
  return was -- held: nothing to pass on
end
while true do
  local w = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not w then
    if h[4] then
      del[#del + 1] = 't'
    end
    if h[3] then
      del[#del + 1] = 'q'
    end
    flush()
    return was
  end
  local d = redis.call('HGET', KEYS[4], w)
  local deadline = d and tonumber(string.match(d, '^%d+'))
  if deadline and deadline > now_ms then
    set('t', w .. ' ' .. string.format('%.0f', now_ms + tonumber(ARGV[4])), tonumber(ARGV[4]))
    flush()
    redis.call('PUBLISH', ARGV[2] .. w, 'w ' .. ARGV[3])
    return was
  end
  redis.call('ZREM', KEYS[3], w)
  redis.call('HDEL', KEYS[4], w)
end
