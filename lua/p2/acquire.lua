-- Protocol 2's acquire (lua/p2/LAYOUT.txt): grants the lease of one lock
-- name to a client, or queues the client. KEYS, ARGV, replies and every
-- rule as lua/acquire.lua's (its head says them: attempts, stale copies,
-- direct grants, fairness, Tokens, End); only the data in Redis differs.
--
-- Protocol: the name's hash carries pv = 2. A hash of another protocol (pv
-- other than 2, or protocol 1's grant without pv) is refused, changing
-- nothing, with an error that names both protocols. Protocol 1's keys that
-- may still live when the hash is new (its fence KEYS[2], its turn KEYS[5])
-- or when this client has no record in it (its record KEYS[6]) are read, so
-- that a name moved from protocol 1 keeps what it remembered. A semaphore's
-- hash (field k: lua/p2/SEM.txt) is refused likewise, with a DLOCKKIND
-- error: the field comes in the one HMGET.
--
-- Shared mode (lua/p2/LAYOUT.txt, lua/p2/acquire_shared.lua): while a
-- shared lease lives (field r: no shared lease lasts past it), the acquire
-- is refused with pttl the time to r (+1), holder '' and held -1, and
-- queued as behind an exclusive holder. The caller's own live shared lease
-- (its attempt counts as one Redis has seen) refuses it with an error,
-- DLOCKMODE, writing and queueing nothing: Redis does no upgrade, the
-- client releases its shared lease first. A shared waiter ahead in the
-- queue comes first, as any waiter. A grant made with r present (past its
-- time) removes r and every s:<id> field (all past their exp), so that a
-- step back of the clock cannot bring one back beside the grant.
--
-- The floor (a lock over several masters, Redlock: docs/design.md
-- "Redlock", the token): ARGV[11], absent on one server. With it,
-- a grant's token is at least the floor, its mark is written as the token
-- + the pass limit (the write-back's value, not reserved only while the
-- clock is behind), and the reply carries the server time it read:
-- {1, token, end, now_us}. Votes of one token from every node thus hold
-- that token's mark already, and need no write-back (a majority would
-- not do: docs/design.md, "Redlock", hand-out order).
--
-- Cost: the common case, a name this client used before with nobody
-- queued, runs 6 commands (HMGET, TIME, MGET of the mark (and protocol 1's
-- record), HSET, PEXPIRE, SET of the mark); a new hash 8 (an EXISTS of
-- the hash, which tells protocol 1's from none, and one of the queue and
-- protocol 1's turn).
local me = ARGV[1]
local attempt = tonumber(ARGV[3])
local l = tonumber(ARGV[2])
local rk = 'c:' .. me
local h = redis.call('HMGET', KEYS[1], 'pv', 'g', 'u', 't', 'q', rk, 'o', 'n', 'r', 's:' .. me,
  'k')
if h[1] ~= '2' and (h[1] or redis.call('EXISTS', KEYS[1]) == 1) then
  -- another protocol's data (a hash without pv is protocol 1's)
  local p = h[1] or '1'
  return redis.error_reply('DLOCKPROTOCOL the data of this name is dlock protocol ' .. p ..
    '; this client speaks protocol 2' .. ((tonumber(p) or 3) > 2 and ': upgrade it' or ''))
end
if h[11] then
  -- a semaphore's hash (lua/p2/SEM.txt): not a lock's
  return redis.error_reply('DLOCKKIND the data of this name is a semaphore (kind ' .. h[11] ..
    '), not a lock')
end
local new = not h[1]
local t = redis.call('TIME')
local us6 = string.rep('0', 6 - #t[2]) .. t[2] -- microseconds, 6 digits
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)

-- The grant: g "token nonce pl exp dur u tell" (dur: exp less the
-- grant's time; tell: how long past exp its expiry is told), o its owner,
-- n the owner's name. One past its exp is nobody's; its handoffs (token ..
-- token + pl, no faster than time passed from the grant to exp) bound the
-- next grant's token, and for `tell` ms past exp (past token + pl, if
-- later) its end is told (2: expired unreleased), as protocol 1's key
-- lives that long.
local tok, nonce, pl, exp, dur, u, tell = string.match(h[2] or '',
  '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')
local owner = tok and h[7]
local gone, gone_told, dead = 0, false, false
if owner and now_ms > tonumber(exp) then
  -- (past `tell` after it, where protocol 1's lease key is gone, it counts
  -- no more, and goes with this script's writes)
  dead = now_ms > math.max(tonumber(exp), math.ceil((tonumber(tok) + tonumber(pl)) / 1000))
    + tonumber(tell) + 1
  if not dead then
    local lasted = tonumber(dur) * 1000
    gone = tonumber(tok) + math.max(0, math.min(tonumber(pl), lasted))
    gone_told = true
  end
  owner = nil
end
local mine = owner == me

-- The mark, and this client's record: the hash's field, or else protocol
-- 1's key; on a new hash protocol 1's fence too.
local got
if new then
  got = redis.call('MGET', KEYS[7], KEYS[6], KEYS[2])
elseif not h[6] then
  got = redis.call('MGET', KEYS[7], KEYS[6])
else
  got = redis.call('MGET', KEYS[7])
end
local seen, rtok, ratt = 0, '0', '0' -- attempts are numbered from 1
local a, rt, rr, ru
if h[6] then
  a, rt, rr, ru = string.match(h[6], '^(%d+) (%d+) (%d+) (%d+)$')
  if ru and tonumber(ru) < now_ms then
    a = nil
  end
elseif got[2] then
  a, rt, rr = string.match(got[2], '^(%d+) (%d+) (%d+)$')
end
if a then
  seen, rtok, ratt = tonumber(a), rt, rr
end
-- Shared leases (lua/p2/LAYOUT.txt, Shared mode): r, the latest exp of
-- any, refuses an exclusive grant while it lasts (the caller's own too);
-- the caller's own live one counts as an attempt seen.
local shared = tonumber(h[9] or '')
if shared and shared < now_ms then
  shared = nil
end
local sa, se = string.match(h[10] or '', '^%d+ (%d+) %d+ %d+ (%d+)$')
if sa and tonumber(se) >= now_ms and tonumber(sa) > seen then
  seen = tonumber(sa)
end
if mine then
  local held = tonumber(nonce)
  if held == attempt and attempt >= seen then
    -- The same attempt again: its grant stands, for a whole lease from now
    -- (lua/acquire.lua).
    local since = tonumber(exp) - tonumber(dur)
    local e = math.max(tonumber(exp), now_ms + l, since + l)
    redis.call('HSET', KEYS[1], 'g', tok .. ' ' .. nonce .. ' ' .. pl .. ' '
      .. string.format('%.0f', e) .. ' ' .. string.format('%.0f', e - since) .. ' ' .. u .. ' '
      .. ARGV[2])
    redis.call('PEXPIRE', KEYS[1], math.max(e - now_ms + l,
      math.ceil((tonumber(tok) + tonumber(pl)) / 1000) - now_ms + l + 1), 'GT')
    return {1, tonumber(tok), tonumber(u)}
  end
  if held > seen then
    seen = held
  end
end
if attempt < seen or attempt == tonumber(ratt) then
  return {-1, 0}
end
if sa and tonumber(se) >= now_ms and not owner then
  -- No mixing of modes within one client (lua/p2/LAYOUT.txt, Shared mode):
  -- refused, nothing written, nothing queued. (Beside another's live grant
  -- the field is no lease: only a step back of the clock can show one.)
  return redis.error_reply('DLOCKMODE this client holds the name shared: an exclusive '
    .. 'acquire must wait for the release of its shared lease (no upgrade)')
end

-- The turn (field t; on a new hash, protocol 1's key) and the queue: the
-- common case, no q and no t, touches no queue key.
local turn
if h[4] then
  local id, tu = string.match(h[4], '^(%x+) (%d+)$')
  if id and tonumber(tu) >= now_ms then
    turn = id
  end
end
local queued = h[5] or turn
-- On a new hash, protocol 1's queue and turn count as this layout's (and
-- are taken over below, field q and t, while they last).
local p1q = new and redis.call('EXISTS', KEYS[3], KEYS[5]) > 0
if p1q then
  queued = true
  turn = redis.call('GET', KEYS[5]) or nil
end
-- The writes to the hash, made once below: fields to set, fields to
-- delete, the life they need (its time to live only grows).
local put, del, life = {}, {}, 0
if dead then
  put[1], put[2] = 'g', ''
end
local tdead = false -- the turn's client is gone: the turn passes on
local reply
local pttl -- refused: the lease's time left, or -1 for another's turn
if owner and not mine then
  pttl = tonumber(exp) - now_ms + 1 -- it ends after this ms
elseif shared then
  pttl = shared - now_ms + 1 -- the shared leases end after this ms at most
elseif queued then
  if not owner then
    local function alive(id)
      local d = redis.call('HGET', KEYS[4], id)
      local deadline = d and tonumber(string.match(d, '^%d+'))
      return deadline and deadline > now_ms
    end
    if turn and turn ~= me and alive(turn) then
      pttl = -1
    elseif not turn or turn ~= me then
      -- The first live waiter, after dropping dead ones from the head (a
      -- turn whose client is gone passes on).
      if turn then
        tdead = true
        if h[4] then
          del[#del + 1] = 't'
        end
      end
      while true do
        local w = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
        if not w then
          break
        end
        if alive(w) then
          if w ~= me then
            pttl = -1
          end
          break
        end
        redis.call('ZREM', KEYS[3], w)
        redis.call('HDEL', KEYS[4], w)
      end
    end
  end
  if not pttl then
    redis.call('ZREM', KEYS[3], me)
    redis.call('HDEL', KEYS[4], me)
    if h[4] then
      del[#del + 1] = 't'
    end
    -- q stays while anyone waits (protocol 1's waiters, on a new hash, too)
    if redis.call('EXISTS', KEYS[3]) == 0 then
      if h[5] then
        del[#del + 1] = 'q'
      end
    elseif not h[5] then
      put[#put + 1] = 'q'
      put[#put + 1] = '1'
      life = math.max(2 * tonumber(ARGV[5]), p1q and redis.call('PTTL', KEYS[3]) or 0)
    end
  end
end

if pttl then
  -- Refused: Redis remembers this attempt (so that a late copy of an older
  -- one is refused), and, if asked, queues the client.
  local keep = tonumber(ARGV[7])
  put[#put + 1] = rk
  put[#put + 1] = ARGV[3] .. ' ' .. rtok .. ' ' .. ratt .. ' ' .. string.format('%.0f', now_ms + keep)
  life = math.max(life, keep)
  if not new and not h[6] and redis.call('HLEN', KEYS[1]) > 16 then
    -- A new record field: first the fields past their <until> go (records,
    -- u, t: each ends with it), so that the hash of a name used by ever new
    -- clients stays bounded.
    local all = redis.call('HGETALL', KEYS[1])
    for i = 1, #all, 2 do
      local tu = tonumber(string.match(all[i + 1], ' (%d+)$') or '')
      if tu and tu < now_ms and all[i] ~= 'g' then
        del[#del + 1] = all[i]
      end
    end
  end
  -- A hash made here takes over protocol 1's fence's end word (field u),
  -- for the fence's time left: it is read only while the hash is new.
  local fe = new and got[3] and string.match(got[3], ' (%d)$')
  if fe then
    local px = redis.call('PTTL', KEYS[2])
    put[#put + 1] = 'u'
    put[#put + 1] = fe .. ' ' .. string.format('%.0f', now_ms + px)
    life = math.max(life, px)
  end
  if p1q then
    -- protocol 1's queue (for as long as its keys last) and its turn, if
    -- it still stands
    local qx = redis.call('PTTL', KEYS[3])
    if qx > 0 then
      put[#put + 1] = 'q'
      put[#put + 1] = '1'
      life = math.max(life, qx)
    end
    local tx = turn and not tdead and redis.call('PTTL', KEYS[5]) or 0
    if tx > 0 then
      put[#put + 1] = 't'
      put[#put + 1] = turn .. ' ' .. string.format('%.0f', now_ms + tx)
      life = math.max(life, tx)
    end
  end
  local holder, held = '', -1
  if pttl >= 0 and owner then
    holder = h[8] or ''
    held = now_ms - (tonumber(exp) - tonumber(dur))
  end
  if ARGV[6] == '1' then
    local ttl = tonumber(ARGV[5])
    put[#put + 1] = 'q'
    put[#put + 1] = '1'
    life = math.max(life, 2 * ttl)
    redis.call('ZADD', KEYS[3], 'NX', t[1] .. us6, me)
    redis.call('HSET', KEYS[4], me, tostring(now_ms + ttl) .. ' ' .. ARGV[3]
      .. ' ' .. ARGV[4] .. ' ' .. ARGV[5] .. ' ' .. ARGV[8])
    -- The queue vanishes once every waiter stopped refreshing it; a client
    -- with a shorter waiter ttl never shortens another's.
    for k = 3, 4 do
      if redis.call('PTTL', KEYS[k]) < 2 * ttl then
        redis.call('PEXPIRE', KEYS[k], 2 * ttl)
      end
    end
  end
  reply = {0, pttl, holder, held, redis.call('ZCARD', KEYS[3])}
else
  -- Granted. How the hold before ended: field u (a release's or a leave's
  -- word, told once), or on a new hash protocol 1's fence; 2 when the grant
  -- before expired unreleased; for the caller's own older grant, its own.
  local ended = 0
  if h[3] then
    local e, eu = string.match(h[3], '^(%d+) (%d+)$')
    if e and tonumber(eu) >= now_ms then
      ended = tonumber(e)
    end
    del[#del + 1] = 'u'
  elseif new and got[3] then
    ended = tonumber(string.match(got[3], ' (%d)$') or '0')
  end
  local last = 0
  if new and got[3] then
    last = tonumber(string.match(got[3], '^%d+') or '0') or 0
  end
  if gone > last then
    last = gone
  end
  if gone_told then
    ended = 2
  end
  -- The slot's mark (lua/acquire.lua, Tokens).
  local mtok, mclk, mpl = string.match(got[1] or '', '^(%d+) (%d+) (%d+)$')
  local mark = tonumber(mtok) or 0
  if now_us < math.max(tonumber(mclk) or 0, mark) then
    mark = mark + tonumber(mpl)
  end
  if mark > last then
    last = mark
  end
  if mine then
    -- The caller's own grant, under an older attempt (lua/acquire.lua).
    local used = math.max(tonumber(tok), tonumber(ARGV[9] or '0') or 0)
    if used > last then
      last = used
    end
    if tonumber(tok) <= (tonumber(ARGV[9] or '0') or 0) then
      ended = tonumber(ARGV[10] or '0') or 0
    else
      ended = tonumber(u)
    end
  end
  local gt = t[1] .. us6
  local token = now_us
  if token <= last then
    token = last + 1 -- ahead of server time, after a step back of its clock
    gt = string.format('%.0f', token)
  end
  local floor_us = tonumber(ARGV[11] or '')
  if floor_us and token < floor_us then
    token = floor_us -- the token the client proposed (Redlock)
    gt = string.format('%.0f', token)
  end
  if h[9] then
    -- Every shared lease has ended: r and their fields go (rare: the last
    -- shared lease expired unreleased), as a newer grant replaces g, so
    -- that none counts again after a step back of the clock.
    del[#del + 1] = 'r'
    local all = redis.call('HGETALL', KEYS[1])
    for i = 1, #all, 2 do
      if string.sub(all[i], 1, 2) == 's:' then
        del[#del + 1] = all[i]
      end
    end
  end
  put[#put + 1] = 'g'
  put[#put + 1] = gt .. ' ' .. ARGV[3] .. ' ' .. ARGV[4] .. ' '
    .. string.format('%.0f', now_ms + l) .. ' ' .. ARGV[2] .. ' ' .. ended .. ' ' .. ARGV[2]
  if h[7] ~= me then
    put[#put + 1] = 'o'
    put[#put + 1] = me
  end
  if h[8] ~= ARGV[8] then
    put[#put + 1] = 'n'
    put[#put + 1] = ARGV[8]
  end
  -- The grant outlives its exp by a lease time, and the clock must have
  -- read a lease time past every token it bounds.
  life = math.max(life, 2 * l, math.ceil((token + tonumber(ARGV[4])) / 1000) - now_ms + l + 1)
  local mp = ARGV[4]
  if mpl and tonumber(mpl) > tonumber(mp) then
    mp = mpl
  end
  local mt = gt
  if floor_us then
    mt = string.format('%.0f', token + tonumber(ARGV[4]))
  end
  redis.call('SET', KEYS[7], mt .. ' ' .. t[1] .. us6 .. ' ' .. mp)
  reply = {1, token, ended}
  if floor_us then
    reply[4] = now_us
  end
end
if new then
  redis.call('HSET', KEYS[1], 'pv', '2', unpack(put))
  redis.call('PEXPIRE', KEYS[1], life)
else
  -- (deleted first: a field set here may have been past its <until>; pv,
  -- which has none, keeps the hash)
  for i = 1, #del, 1000 do -- (unpack takes some thousands of values at most)
    redis.call('HDEL', KEYS[1], unpack(del, i, math.min(i + 999, #del)))
  end
  redis.call('HSET', KEYS[1], unpack(put))
  redis.call('PEXPIRE', KEYS[1], life, 'GT')
end
return reply
