-- Protocol 2's shared acquire (lua/p2/LAYOUT.txt, "Shared mode"): grants a
-- client a shared lease of one lock name, or queues the client. Any number
-- of clients may hold a name shared at once, or one exclusively
-- (lua/p2/acquire.lua), never both. One shared lease per client per name:
-- the client's threads share it and its token.
--
-- KEYS as lua/p2/acquire.lua's (lua/keys.lua, KEYS[1] .. KEYS[7]).
-- ARGV as lua/acquire.lua's: [1] client id, [2] lease time in ms, [3] the
-- number of this attempt (one sequence per client, shared with exclusive
-- attempts and leaves), [4] pass limit (unused: a shared lease reserves no
-- local passes), [5] waiter ttl in ms, [6] '1' to join the wait queue when
-- refused, [7] record lifetime in ms, [8] the client's name; [9] and [10]
-- are not read.
-- Replies as lua/acquire.lua's: {1, token, end} granted; {0, pttl, holder,
-- held, waiting} refused (pttl: the exclusive grant's time left, or -1 when
-- a waiter or a turn comes first; holder and held: the exclusive holder's
-- name and how long it has held, else '' and -1); {-1, 0} a stale attempt,
-- having changed nothing. A hash of a semaphore (field k: lua/p2/SEM.txt)
-- is refused with a DLOCKKIND error, as by lua/p2/acquire.lua.
--
-- Rules:
-- - A client that holds the live exclusive grant is refused with an error,
--   DLOCKMODE, writing and queueing nothing: Redis does no downgrade (the
--   client releases first).
-- - Granted when no exclusive grant stands and no other client's live turn
--   stands, and no live exclusive waiter is ahead of the caller in the
--   queue (a caller not queued is behind every waiter; dead waiters at the
--   head are dropped): writers do not starve. Live shared waiters ahead do
--   not refuse it.
-- - A client that holds a live shared lease of the name keeps it whoever
--   waits: the same attempt again gets the same grant (its token, its end)
--   for a whole lease from now; a newer attempt is granted again at once,
--   with a new token, under that attempt (an older grant whose outcome the
--   client never learned). No other holder is added by either. A field
--   beside another's live exclusive grant (a step back of the clock) is no
--   lease: refused as any.
-- - Stale: an attempt older than one Redis has seen from this client for
--   this name (its record, its live exclusive grant's or shared lease's
--   attempt), or the attempt of a released grant: {-1, 0}, nothing written.
-- - Token: max(server time in us, last + 1), last as for an exclusive grant
--   (lua/acquire.lua, Tokens: the slot's mark, with its pass limit after a
--   step back of the clock; an expired exclusive grant's handoffs); the
--   grant writes the mark. So a shared token is above every token handed
--   out before it, and every later exclusive grant's is above it.
-- - End: how the last exclusive hold ended (field u while it lasts, or 2
--   while an exclusive grant that expired unreleased is told), without
--   consuming it: readers change nothing, so the next exclusive grant is
--   told the same. A shared lease's own end is told to nobody.
-- - The lease: field s:<id> "<token> <attempt> <dur> <end> <exp>" and the
--   hash's r "<until>", raised to its exp (lua/p2/LAYOUT.txt).
-- - An exclusive grant past its exp in g goes with the grant (g ''), so
--   that no step back of the clock makes it count again beside the new
--   lease; while it would still be told, u takes "2 <until>" in its place.
-- - Refused: the record keeps this attempt (as lua/p2/acquire.lua); queued
--   if asked, with the liveness value "<deadline> <attempt> s <waiter ttl>
--   <name>" ('s' where an exclusive waiter's pass limit stands).
-- - Protocol: as lua/p2/acquire.lua's; a hash made here takes over protocol
--   1's queue flag, turn and fence end word, as there.
local me = ARGV[1]
local attempt = tonumber(ARGV[3])
local l = tonumber(ARGV[2])
local rk, sk = 'c:' .. me, 's:' .. me
local h = redis.call('HMGET', KEYS[1], 'pv', 'g', 'u', 't', 'q', rk, 'o', 'n', 'r', sk, 'k')
if h[1] ~= '2' and (h[1] or redis.call('EXISTS', KEYS[1]) == 1) then
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
local us6 = string.rep('0', 6 - #t[2]) .. t[2]
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)

-- The exclusive grant (lua/p2/acquire.lua): live, or expired and still told.
local tok, nonce, pl, exp, dur, u, tell = string.match(h[2] or '',
  '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')
local owner = tok and h[7]
local gone, gone_told = 0, false
if owner and now_ms > tonumber(exp) then
  if now_ms <= math.max(tonumber(exp), math.ceil((tonumber(tok) + tonumber(pl)) / 1000))
      + tonumber(tell) + 1 then
    gone = tonumber(tok) + math.max(0, math.min(tonumber(pl), tonumber(dur) * 1000))
    gone_told = true
  end
  owner = nil
end
-- The caller's shared lease.
local stok, snonce, sdur, send, sexp = string.match(h[10] or '',
  '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
-- (beside another's live exclusive grant it is no lease: only a step back
-- of the server's clock before its exp can show one there)
local smine = stok and tonumber(sexp) >= now_ms and not owner
local r = tonumber(h[9] or '') or 0

local got
if new then
  got = redis.call('MGET', KEYS[7], KEYS[6], KEYS[2])
elseif not h[6] then
  got = redis.call('MGET', KEYS[7], KEYS[6])
else
  got = redis.call('MGET', KEYS[7])
end
local seen, rtok, ratt = 0, '0', '0'
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
if owner == me and tonumber(nonce) > seen then
  seen = tonumber(nonce)
end
if smine then
  local held = tonumber(snonce)
  if held == attempt and attempt >= seen then
    -- The same attempt again: its lease stands, for a whole lease from now.
    local since = tonumber(sexp) - tonumber(sdur)
    local e = math.max(tonumber(sexp), now_ms + l, since + l)
    redis.call('HSET', KEYS[1], sk, stok .. ' ' .. snonce .. ' '
      .. string.format('%.0f', e - since) .. ' ' .. send .. ' ' .. string.format('%.0f', e),
      'r', string.format('%.0f', math.max(r, e)))
    redis.call('PEXPIRE', KEYS[1], math.max(e - now_ms + l,
      math.ceil(tonumber(stok) / 1000) - now_ms + l + 1), 'GT')
    return {1, tonumber(stok), tonumber(send)}
  end
  if held > seen then
    seen = held
  end
end
if attempt < seen or attempt == tonumber(ratt) then
  return {-1, 0}
end
if owner == me then
  -- No mixing of modes within one client: refused, nothing written.
  return redis.error_reply('DLOCKMODE this client holds the name exclusively: a shared '
    .. 'acquire must wait for the release of its exclusive grant (no downgrade)')
end

local turn
if h[4] then
  local id, tu = string.match(h[4], '^(%x+) (%d+)$')
  if id and tonumber(tu) >= now_ms then
    turn = id
  end
end
local queued = h[5] or turn
local p1q = new and redis.call('EXISTS', KEYS[3], KEYS[5]) > 0
if p1q then
  queued = true
  turn = redis.call('GET', KEYS[5]) or nil
end
local put, del, life = {}, {}, 0
local tdead = false
local pttl
local function live_value(id)
  local d = redis.call('HGET', KEYS[4], id)
  local deadline = d and tonumber(string.match(d, '^%d+'))
  if deadline and deadline > now_ms then
    return d
  end
end
if owner then
  pttl = tonumber(exp) - now_ms + 1
elseif smine then
  -- a newer attempt of a shared holder: granted again, whoever waits
elseif queued then
  if turn and turn ~= me and live_value(turn) then
    pttl = -1
  elseif turn ~= me then
    if turn then
      tdead = true
      if h[4] then
        del[#del + 1] = 't'
      end
    end
    -- Writers first: a live exclusive waiter ahead refuses the caller
    -- (dead waiters at the head go).
    local head = true
    for _, w in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
      if w == me then
        break
      end
      local d = live_value(w)
      if not d then
        if head then
          redis.call('ZREM', KEYS[3], w)
          redis.call('HDEL', KEYS[4], w)
        end
      else
        head = false
        if not string.match(d, '^%d+ %d+ s ') then
          pttl = -1
          break
        end
      end
    end
  end
end
if not pttl and queued then
  redis.call('ZREM', KEYS[3], me)
  redis.call('HDEL', KEYS[4], me)
  if h[4] and (tdead or not turn or turn == me) then
    del[#del + 1] = 't' -- (another's live turn stays, past a shared holder)
  end
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

-- A hash made here takes over protocol 1's fence's end word (field u).
local fe = new and got[3] and string.match(got[3], ' (%d)$')
if fe then
  local px = redis.call('PTTL', KEYS[2])
  put[#put + 1] = 'u'
  put[#put + 1] = fe .. ' ' .. string.format('%.0f', now_ms + px)
  life = math.max(life, px)
end
local reply
if pttl then
  local keep = tonumber(ARGV[7])
  put[#put + 1] = rk
  put[#put + 1] = ARGV[3] .. ' ' .. rtok .. ' ' .. ratt .. ' ' .. string.format('%.0f', now_ms + keep)
  life = math.max(life, keep)
  if not new and not h[6] and redis.call('HLEN', KEYS[1]) > 16 then
    -- a new record field: the fields past their <until> go first
    local all = redis.call('HGETALL', KEYS[1])
    for i = 1, #all, 2 do
      local tu = tonumber(string.match(all[i + 1], ' (%d+)$') or '')
      if tu and tu < now_ms and all[i] ~= 'g' then
        del[#del + 1] = all[i]
      end
    end
  end
  if p1q then
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
      .. ' s ' .. ARGV[5] .. ' ' .. ARGV[8])
    for k = 3, 4 do
      if redis.call('PTTL', KEYS[k]) < 2 * ttl then
        redis.call('PEXPIRE', KEYS[k], 2 * ttl)
      end
    end
  end
  reply = {0, pttl, holder, held, redis.call('ZCARD', KEYS[3])}
else
  -- Granted. The end of the last exclusive hold, told, not consumed.
  local ended = 0
  if smine then
    ended = tonumber(send)
  elseif h[3] then
    local e, eu = string.match(h[3], '^(%d+) (%d+)$')
    if e and tonumber(eu) >= now_ms then
      ended = tonumber(e)
    end
  elseif fe then
    ended = tonumber(fe)
  end
  if gone_told and not smine then
    ended = 2
  end
  local last = gone
  if new and got[3] then
    last = math.max(last, tonumber(string.match(got[3], '^%d+') or '0') or 0)
  end
  local mtok, mclk, mpl = string.match(got[1] or '', '^(%d+) (%d+) (%d+)$')
  local mark = tonumber(mtok) or 0
  if now_us < math.max(tonumber(mclk) or 0, mark) then
    mark = mark + tonumber(mpl)
  end
  if mark > last then
    last = mark
  end
  if smine and tonumber(stok) > last then
    last = tonumber(stok)
  end
  local gt = t[1] .. us6
  local token = now_us
  if token <= last then
    token = last + 1
    gt = string.format('%.0f', token)
  end
  local e = now_ms + l
  if tok and not owner then
    -- An exclusive grant past its exp goes (g ''): after a step back of the
    -- server's clock to before its exp it would count again beside this
    -- lease (renewed, or granted again to a late copy of its attempt).
    -- Its tokens are below this one, which the mark keeps; the word that
    -- it expired unreleased moves into u for as long as g would tell it.
    put[#put + 1] = 'g'
    put[#put + 1] = ''
    if gone_told then
      local tu = math.max(tonumber(exp), math.ceil((tonumber(tok) + tonumber(pl)) / 1000))
        + tonumber(tell) + 1
      put[#put + 1] = 'u'
      put[#put + 1] = '2 ' .. string.format('%.0f', tu)
      life = math.max(life, tu - now_ms)
    end
  end
  put[#put + 1] = sk
  put[#put + 1] = gt .. ' ' .. ARGV[3] .. ' ' .. ARGV[2] .. ' ' .. ended .. ' '
    .. string.format('%.0f', e)
  put[#put + 1] = 'r'
  put[#put + 1] = string.format('%.0f', math.max(r, e))
  life = math.max(life, 2 * l, math.ceil(token / 1000) - now_ms + l + 1)
  redis.call('SET', KEYS[7], gt .. ' ' .. t[1] .. us6 .. ' ' .. (mpl or '0'))
  reply = {1, token, ended}
end
if new then
  redis.call('HSET', KEYS[1], 'pv', '2', unpack(put))
  redis.call('PEXPIRE', KEYS[1], life)
else
  for i = 1, #del, 1000 do
    redis.call('HDEL', KEYS[1], unpack(del, i, math.min(i + 999, #del)))
  end
  redis.call('HSET', KEYS[1], unpack(put))
  redis.call('PEXPIRE', KEYS[1], life, 'GT')
end
return reply
