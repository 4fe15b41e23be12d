-- Protocol 2's shared release (lua/p2/LAYOUT.txt, "Shared mode"): gives a
-- client's shared lease of a name back, if the caller still holds that
-- grant of it; the release of the last live shared lease grants the name
-- directly to the first live waiter, as lua/p2/release.lua does.
--
-- KEYS as lua/p2/release.lua's (lua/keys.lua, KEYS[1] .. KEYS[7]).
-- ARGV as lua/release.lua's: [1] client id, [2] 'token' or 'nonce', [3]
-- that field's value (the lease's token, or the number of an attempt whose
-- outcome the client never learned), [4] the lease time in ms, [5] unused
-- (a shared lease hands out no tokens of its own), [6] wake channel
-- prefix, [7] the lock name, [8] waiter ttl in ms (a turn's time), [9]
-- record lifetime in ms, [10] unused (a shared lease's end is told to
-- nobody: readers change nothing).
-- Replies as lua/release.lua's: 1 released (also when this very grant was
-- already released: the record keeps its token and attempt), 2 released
-- and the next waiter granted the name or woken, 0 the caller does not
-- hold that grant (expired, released long ago, another), 3 (by attempt) a
-- newer attempt of the client has been seen (its record, or its live lease
-- of either mode): no grant of that attempt exists or can appear.
--
-- Rules:
-- - The lease's field s:<id> goes, the caller's record takes its token and
--   attempt (as an exclusive release's). Every field past its <until> goes
--   too (the scan that finds the other holders reads them all), and r
--   becomes the latest exp of the live shared leases left.
-- - None left (the last shared lease): the first live waiter (dead ones
--   leave the queue's head) is granted directly, as by lua/p2/release.lua:
--   an exclusive waiter under its queued attempt for its waiter ttl, with
--   "G <attempt> <token> <name>" (or "U <end> ..." when the last exclusive
--   hold ended uncleanly: field u, which that grant takes, or 2 for an
--   exclusive grant that expired unreleased and is still told); a shared
--   waiter, with every live shared waiter after it up to the first live
--   exclusive waiter, each "S <end> <attempt> <token> <name>" (one token
--   for the run); a liveness value without the grant fields gets the turn,
--   "w <name>".
-- - Tokens of these direct grants: as lua/p2/release.lua's (above the
--   slot's mark, which every shared grant raised to its token).
-- - Protocol: as lua/p2/release.lua's.
local me = ARGV[1]
local rk, sk = 'c:' .. me, 's:' .. me
local h = redis.call('HMGET', KEYS[1], 'pv', sk, 'q', 't', rk, 'g', 'u', 'r', 'o', 'k')
if h[1] ~= '2' and (h[1] or redis.call('EXISTS', KEYS[1]) == 1) then
  local p = h[1] or '1'
  return redis.error_reply('DLOCKPROTOCOL the data of this name is dlock protocol ' .. p ..
    '; this client speaks protocol 2' .. ((tonumber(p) or 3) > 2 and ': upgrade it' or ''))
end
if h[10] then
  -- a semaphore's hash (lua/p2/SEM.txt): not a lock's
  return redis.error_reply('DLOCKKIND the data of this name is a semaphore (kind ' .. h[10] ..
    '), not a lock')
end
local t = redis.call('TIME')
local us6 = string.rep('0', 6 - #t[2]) .. t[2]
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local stok, snonce, sexp = string.match(h[2] or '', '^(%d+) (%d+) %d+ %d+ (%d+)$')
local live = stok and tonumber(sexp) >= now_ms
local ra, rt, rr, ru
if h[5] then
  ra, rt, rr, ru = string.match(h[5], '^(%d+) (%d+) (%d+) (%d+)$')
  if ru and tonumber(ru) < now_ms then
    ra, rt, rr = nil, nil, nil
  end
else
  ra, rt, rr = string.match(redis.call('MGET', KEYS[6])[1] or '', '^(%d+) (%d+) (%d+)$')
end
local keep = tonumber(ARGV[9])
local id = snonce
if ARGV[2] == 'token' then
  id = stok
end
if not live or id ~= ARGV[3] then
  if ARGV[2] == 'token' then
    if ra and rt == ARGV[3] then
      return 1
    end
  elseif ra then
    if tonumber(rr) == tonumber(ARGV[3]) then
      return 1
    end
    if tonumber(ra) > tonumber(ARGV[3]) then
      return 3
    end
  end
  -- (by attempt) a newer attempt of the client holds the name, shared or
  -- exclusively: no grant of that attempt can appear
  local newer
  if ARGV[2] == 'nonce' then
    local gt, gn, ge = string.match(h[6] or '', '^(%d+) (%d+) %d+ (%d+) ')
    if live and tonumber(snonce) > tonumber(ARGV[3]) then
      newer = snonce
    elseif gt and h[9] == me and tonumber(ge) >= now_ms and tonumber(gn) > tonumber(ARGV[3]) then
      newer = gn
    end
  end
  if not newer then
    return 0
  end
  -- the lease's grant is newer: the record takes its number now
  if ra and tonumber(ra) >= tonumber(newer) then
    return 3
  end
  redis.call('HSET', KEYS[1], rk, newer .. ' ' .. (rt or '0') .. ' ' .. (rr or '0') .. ' '
    .. string.format('%.0f', now_ms + keep))
  redis.call('PEXPIRE', KEYS[1], keep, 'GT')
  return 3
end

local seen = snonce
if ra and tonumber(ra) > tonumber(snonce) then
  seen = ra
end
local put = {rk, seen .. ' ' .. stok .. ' ' .. snonce .. ' ' .. string.format('%.0f', now_ms + keep)}
local del, life, reply = {sk}, keep, 1
local msgs = {}
-- The other shared leases (and the fields past their time, which go).
local rmax
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local f = all[i]
  if f ~= sk and f ~= 'g' then
    local tu = tonumber(string.match(all[i + 1], ' (%d+)$') or '')
    if tu and tu < now_ms then
      del[#del + 1] = f
    elseif tu and string.sub(f, 1, 2) == 's:' then
      rmax = math.max(rmax or 0, tu)
    end
  end
end
if rmax then
  put[#put + 1] = 'r'
  put[#put + 1] = string.format('%.0f', rmax)
elseif h[8] then
  del[#del + 1] = 'r'
end
local queued = h[3] or (h[4] and (tonumber(string.match(h[4], ' (%d+)$')) or 0) >= now_ms)
if not rmax and queued then
  -- The last shared lease: the name is free. The first live waiter.
  local function first_live()
    while true do
      local w = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
      if not w then
        return
      end
      local d = redis.call('HGET', KEYS[4], w) or ''
      local deadline = tonumber(string.match(d, '^%d+'))
      if deadline and deadline > now_ms then
        return w, d
      end
      redis.call('ZREM', KEYS[3], w)
      redis.call('HDEL', KEYS[4], w)
    end
  end
  local w, d = first_live()
  if h[4] then
    del[#del + 1] = 't'
  end
  if w then
    reply = 2
    -- how the last exclusive hold ended (lua/p2/acquire_shared.lua, End)
    local ended = 0
    local e, eu = string.match(h[7] or '', '^(%d+) (%d+)$')
    if e and tonumber(eu) >= now_ms then
      ended = tonumber(e)
    end
    local tok, pl, exp, tell = string.match(h[6] or '', '^(%d+) %d+ (%d+) (%d+) %d+ %d+ (%d+)$')
    if tok and now_ms > tonumber(exp) and now_ms <= math.max(tonumber(exp),
        math.ceil((tonumber(tok) + tonumber(pl)) / 1000)) + tonumber(tell) + 1 then
      ended = 2
    end
    local att, wpl, ttl, nm = string.match(d, '^%d+ (%d+) (%d+) (%d+) ?(%S*)$')
    local satt = string.match(d, '^%d+ (%d+) s %d+')
    if not att and not satt then
      put[#put + 1] = 't'
      put[#put + 1] = w .. ' ' .. string.format('%.0f', now_ms + tonumber(ARGV[8]))
      life = math.max(life, tonumber(ARGV[8]))
      msgs[1] = {ARGV[6] .. w, 'w ' .. ARGV[7]}
    else
      -- A direct grant's token (lua/p2/release.lua): above the mark.
      local mtok, mclk, mpl = string.match(redis.call('MGET', KEYS[7])[1] or '',
        '^(%d+) (%d+) (%d+)$')
      local last = tonumber(mtok) or 0
      if now_us < math.max(tonumber(mclk) or 0, last) then
        last = last + tonumber(mpl)
      end
      local wtok = t[1] .. us6
      if now_us <= last then
        wtok = string.format('%.0f', last + 1)
      end
      local half = math.floor(keep / 2)
      local mp = mpl or '0'
      if att then
        if tonumber(wpl) > tonumber(mp) then
          mp = wpl
        end
        redis.call('ZREM', KEYS[3], w)
        redis.call('HDEL', KEYS[4], w)
        put[#put + 1] = 'g'
        put[#put + 1] = wtok .. ' ' .. att .. ' ' .. wpl .. ' '
          .. string.format('%.0f', now_ms + tonumber(ttl)) .. ' ' .. ttl .. ' ' .. ended .. ' ' .. half
        put[#put + 1] = 'o'
        put[#put + 1] = w
        put[#put + 1] = 'n'
        put[#put + 1] = nm
        if h[7] then
          del[#del + 1] = 'u' -- (the grant takes it)
        end
        life = math.max(life, tonumber(ttl) + half,
          math.ceil((tonumber(wtok) + tonumber(wpl)) / 1000) - now_ms + half + 1)
        if ended > 0 then
          msgs[1] = {ARGV[6] .. w, 'U ' .. ended .. ' ' .. att .. ' ' .. wtok .. ' ' .. ARGV[7]}
        else
          msgs[1] = {ARGV[6] .. w, 'G ' .. att .. ' ' .. wtok .. ' ' .. ARGV[7]}
        end
      else
        -- the shared waiters at the head, up to the first exclusive one
        local top = 0
        while w do
          local sa, st = string.match(d, '^%d+ (%d+) s (%d+)')
          if not sa then
            break
          end
          redis.call('ZREM', KEYS[3], w)
          redis.call('HDEL', KEYS[4], w)
          local se = now_ms + tonumber(st)
          top = math.max(top, se)
          put[#put + 1] = 's:' .. w
          put[#put + 1] = wtok .. ' ' .. sa .. ' ' .. st .. ' ' .. ended .. ' '
            .. string.format('%.0f', se)
          msgs[#msgs + 1] = {ARGV[6] .. w, 'S ' .. ended .. ' ' .. sa .. ' ' .. wtok .. ' ' .. ARGV[7]}
          life = math.max(life, tonumber(st) + half)
          w, d = first_live()
        end
        put[#put + 1] = 'r'
        put[#put + 1] = string.format('%.0f', top)
        life = math.max(life, math.ceil(tonumber(wtok) / 1000) - now_ms + half + 1)
      end
      redis.call('SET', KEYS[7], wtok .. ' ' .. t[1] .. us6 .. ' ' .. mp)
    end
  end
  if h[3] and redis.call('EXISTS', KEYS[3]) == 0 then
    del[#del + 1] = 'q'
  end
end
-- (deleted first: a field set here may have been past its <until>)
for i = 1, #del, 1000 do
  redis.call('HDEL', KEYS[1], unpack(del, i, math.min(i + 999, #del)))
end
redis.call('HSET', KEYS[1], unpack(put))
redis.call('PEXPIRE', KEYS[1], life, 'GT')
for _, m in ipairs(msgs) do
  redis.call('PUBLISH', m[1], m[2])
end
return reply
