-- Protocol 2's release (lua/p2/LAYOUT.txt): gives a lease back, if the
-- caller still owns this grant of it, and grants it directly to the first
-- live waiting client. KEYS, ARGV, replies and every rule as
-- lua/release.lua's (its head says them); only the data in Redis differs:
-- the grant's field is emptied, the caller's record set in the hash, and
-- how the grant ended, if not by its holder's release, kept in field u for
-- the next grant (ARGV[4], a lease time, or until the clock has passed the
-- last token by a lease time). No fence token is kept: the slot's mark,
-- raised here past the tokens the holder's threads handed out, bounds the
-- next grant's.
--
-- Protocol: as lua/p2/acquire.lua's. Protocol 1's record of the caller
-- (KEYS[6]) is read when the hash has none.
--
-- Messages: as lua/release.lua's, but a direct grant's are "G <attempt>
-- <token> <name>" and "U <end> <attempt> <token> <name>": the waiter may
-- have queued through protocol 1 (the queue is both protocols'), and takes
-- the grant in the protocol of the release that made it.
--
-- Shared mode (lua/p2/LAYOUT.txt): a shared waiter at the head of the
-- queue (its liveness value has 's' for its pass limit) is granted
-- directly together with every live shared waiter after it up to the
-- first live exclusive waiter: one token for the run (above the slot's
-- mark and the last token handed out under this grant; the mark takes
-- it), each a field s:<id> for its waiter ttl, r their latest exp, and a
-- message "S <end> <attempt> <token> <name>" to each (end: this grant's,
-- which stays in field u for the next exclusive grant). Reply 2.
--
-- Cost: a release with nobody queued, by a client the hash has a record
-- of, runs 4 commands (HMGET, TIME, HSET, PEXPIRE), and a MGET of the mark
-- more when its holder handed out tokens locally (a SET of it when they are
-- above it).
local me = ARGV[1]
local rk = 'c:' .. me
local h = redis.call('HMGET', KEYS[1], 'pv', 'g', 'q', 't', rk, 'o', 's:' .. me, 'k')
if h[1] ~= '2' and (h[1] or redis.call('EXISTS', KEYS[1]) == 1) then
  -- another protocol's data (a hash without pv is protocol 1's)
  local p = h[1] or '1'
  return redis.error_reply('DLOCKPROTOCOL the data of this name is dlock protocol ' .. p ..
    '; this client speaks protocol 2' .. ((tonumber(p) or 3) > 2 and ': upgrade it' or ''))
end
if h[8] then
  -- a semaphore's hash (lua/p2/SEM.txt): not a lock's
  return redis.error_reply('DLOCKKIND the data of this name is a semaphore (kind ' .. h[8] ..
    '), not a lock')
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- The grant: g "token nonce pl exp dur u tell", o its owner
-- (lua/p2/LAYOUT.txt).
local tok, nonce, pl, exp, u = string.match(h[2] or '', '^(%d+) (%d+) (%d+) (%d+) %d+ (%d+) %d+$')
local owner = tok and h[6]
if owner and now_ms > tonumber(exp) then
  owner = nil -- expired: nobody's, and stays as it is (lua/p2/acquire.lua)
end
-- The caller's record: the hash's field, or else protocol 1's key.
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

-- Off the common path, the writes to the hash are made once, at the end:
-- fields to set, fields to delete, the life they need (the hash exists
-- then: its time to live only grows); and the message to publish.
local put, del, life, reply, chan, msg
local id = nonce
if ARGV[2] == 'token' then
  id = tok
end
if owner ~= me or id ~= ARGV[3] then
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
  -- (by attempt) a newer attempt of the client holds the name, exclusively
  -- or shared (its field s:<id>: lua/p2/LAYOUT.txt, Shared mode)
  local newer
  if ARGV[2] == 'nonce' then
    local sn, sx = string.match(h[7] or '', '^%d+ (%d+) %d+ %d+ (%d+)$')
    if owner == me and tonumber(nonce) > tonumber(ARGV[3]) then
      newer = nonce
    elseif sn and tonumber(sx) >= now_ms and tonumber(sn) > tonumber(ARGV[3]) then
      newer = sn
    end
  end
  if not newer then
    return 0
  end
  -- The lease's grant is newer: the record takes its number now
  -- (lua/release.lua).
  if ra and tonumber(ra) >= tonumber(newer) then
    return 3
  end
  put = {rk, newer .. ' ' .. (rt or '0') .. ' ' .. (rr or '0') .. ' '
    .. string.format('%.0f', now_ms + keep)}
  del, life, reply = {}, keep, 3
else
  -- The last token handed out under this grant, as the client says, or the
  -- grant's own token.
  local last, top = tonumber(tok), tok
  local handed = tonumber(ARGV[5]) or 0
  if handed > last then
    last, top = handed, ARGV[5]
  end
  local ended = tonumber(ARGV[10] or '0') or 0
  if ARGV[2] == 'nonce' then
    ended = tonumber(u)
  end
  local mtok, mclk, mpl
  if last > tonumber(tok) then
    -- tokens handed out locally: the mark may be below them
    mtok, mclk, mpl = string.match(redis.call('MGET', KEYS[7])[1] or '', '^(%d+) (%d+) (%d+)$')
  else
    mtok = tok -- (the mark is at least the grant's token: not read)
  end
  if last > (tonumber(mtok) or 0) then
    mtok = top
    mclk = mclk or '0'
    if not mpl or tonumber(mpl) < tonumber(pl) then
      mpl = pl
    end
    redis.call('SET', KEYS[7], mtok .. ' ' .. mclk .. ' ' .. mpl)
  end
  local seen = nonce
  if ra and tonumber(ra) > tonumber(nonce) then
    seen = ra
  end
  local rv = seen .. ' ' .. tok .. ' ' .. nonce .. ' ' .. string.format('%.0f', now_ms + keep)
  -- How it ended, for the next grant: for a lease time, counted from when
  -- the server's clock has passed the last token (it may be ahead, after a
  -- step back of the clock), as protocol 1's fence.
  local uv, px
  if ended > 0 then
    px = math.max(tonumber(ARGV[4]), math.ceil(last / 1000) - now_ms + tonumber(ARGV[4]) + 1)
    uv = ended .. ' ' .. string.format('%.0f', now_ms + px)
  end
  local queued = h[3] or (h[4] and (tonumber(string.match(h[4], ' (%d+)$')) or 0) >= now_ms)
  if not queued and h[5] then
    -- The common case: nobody queued, no turn given, the record in place.
    if uv then
      redis.call('HSET', KEYS[1], 'g', '', rk, rv, 'u', uv)
      redis.call('PEXPIRE', KEYS[1], math.max(keep, px), 'GT')
    else
      redis.call('HSET', KEYS[1], 'g', '', rk, rv)
      redis.call('PEXPIRE', KEYS[1], keep, 'GT')
    end
    return 1
  end
  put, del, life, reply = {'g', '', rk, rv}, {}, keep, 1
  local w
  if queued then
    -- The first live waiter gets the lease (or, with a liveness value
    -- without the grant fields, the turn); dead ones leave the queue.
    while true do
      w = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
      if not w then
        break
      end
      local d = redis.call('HGET', KEYS[4], w) or ''
      local deadline = tonumber(string.match(d, '^%d+'))
      if deadline and deadline > now_ms then
        break
      end
      redis.call('ZREM', KEYS[3], w)
      redis.call('HDEL', KEYS[4], w)
    end
  end
  local att, wpl, ttl, nm, lv
  if w then
    lv = redis.call('HGET', KEYS[4], w)
    att, wpl, ttl, nm = string.match(lv, '^%d+ (%d+) (%d+) (%d+) ?(%S*)$')
    reply, chan = 2, ARGV[6] .. w
  end
  -- a shared waiter ('s' for its pass limit: lua/p2/acquire_shared.lua)
  local shared = w and string.match(lv, '^%d+ %d+ s %d+')
  if w and not att and not shared then
    -- the turn: the waiter acquires the lease itself when woken
    put[#put + 1] = 't'
    put[#put + 1] = w .. ' ' .. string.format('%.0f', now_ms + tonumber(ARGV[8]))
    life = math.max(life, tonumber(ARGV[8]))
    msg = 'w ' .. ARGV[7]
  else
    if h[4] then
      del[#del + 1] = 't'
    end
    if w then
      redis.call('ZREM', KEYS[3], w)
      redis.call('HDEL', KEYS[4], w)
    end
    if shared then
      -- Direct grants to the shared waiters at the head, up to the first
      -- live exclusive waiter (lua/p2/LAYOUT.txt, Shared mode): one token
      -- for the run, above the slot's mark, which it writes; each a shared
      -- lease for its waiter ttl, told "S <end> <attempt> <token> <name>".
      -- The end word stays for the next exclusive grant (field u, below).
      local us6 = string.rep('0', 6 - #t[2]) .. t[2]
      local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
      if not mclk then
        mtok, mclk, mpl = string.match(redis.call('MGET', KEYS[7])[1] or '', '^(%d+) (%d+) (%d+)$')
      end
      local mark = tonumber(mtok) or 0
      if now_us < math.max(tonumber(mclk) or 0, mark) then
        mark = mark + tonumber(mpl)
      end
      local top, stok = 0, t[1] .. us6
      if now_us <= math.max(mark, last) then
        stok = string.format('%.0f', math.max(mark, last) + 1)
      end
      redis.call('SET', KEYS[7], stok .. ' ' .. t[1] .. us6 .. ' ' .. (mpl or pl))
      local half, d = math.floor(keep / 2), lv
      while w do
        local sa, st = string.match(d, '^%d+ (%d+) s (%d+)')
        if not sa then
          break
        end
        redis.call('ZREM', KEYS[3], w)
        redis.call('HDEL', KEYS[4], w)
        top = math.max(top, now_ms + tonumber(st))
        put[#put + 1] = 's:' .. w
        put[#put + 1] = stok .. ' ' .. sa .. ' ' .. st .. ' ' .. ended .. ' '
          .. string.format('%.0f', now_ms + tonumber(st))
        life = math.max(life, tonumber(st) + half)
        redis.call('PUBLISH', ARGV[6] .. w, 'S ' .. ended .. ' ' .. sa .. ' ' .. stok .. ' ' .. ARGV[7])
        w = nil
        while true do
          local x = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
          if not x then
            break
          end
          d = redis.call('HGET', KEYS[4], x) or ''
          if (tonumber(string.match(d, '^%d+')) or 0) > now_ms then
            w = x
            break
          end
          redis.call('ZREM', KEYS[3], x)
          redis.call('HDEL', KEYS[4], x)
        end
      end
      put[#put + 1] = 'r'
      put[#put + 1] = string.format('%.0f', top)
      life = math.max(life, math.ceil(tonumber(stok) / 1000) - now_ms + half + 1)
    end
    if h[3] and redis.call('EXISTS', KEYS[3]) == 0 then
      del[#del + 1] = 'q'
    end
  end
  if not att and uv then
    put[#put + 1] = 'u'
    put[#put + 1] = uv
    life = math.max(life, px)
  end
  if att then
    -- A direct grant, under the waiter's newest attempt, for its waiter
    -- ttl; it carries the end (its u). Its token as any grant's, above the
    -- slot's mark, which it writes (lua/acquire.lua, Tokens).
    local us6 = string.rep('0', 6 - #t[2]) .. t[2] -- microseconds, 6 digits
    local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local wtok = t[1] .. us6
    if not mclk then
      mtok, mclk, mpl = string.match(redis.call('MGET', KEYS[7])[1] or '', '^(%d+) (%d+) (%d+)$')
    end
    local mark = tonumber(mtok) or 0
    if now_us < math.max(tonumber(mclk) or 0, mark) then
      mark = mark + tonumber(mpl) -- the clock stepped back
    end
    if mark > last then
      last = mark
    end
    if now_us <= last then
      wtok = string.format('%.0f', last + 1) -- after a step back of the clock
    end
    local mp = wpl
    if mpl and tonumber(mpl) > tonumber(wpl) then
      mp = mpl
    end
    redis.call('SET', KEYS[7], wtok .. ' ' .. t[1] .. us6 .. ' ' .. mp)
    local half = math.floor(keep / 2)
    put[2] = wtok .. ' ' .. att .. ' ' .. wpl .. ' '
      .. string.format('%.0f', now_ms + tonumber(ttl)) .. ' ' .. ttl .. ' ' .. ended .. ' ' .. half
    put[#put + 1] = 'o'
    put[#put + 1] = w
    put[#put + 1] = 'n'
    put[#put + 1] = nm
    -- The hash outlives the grant by half the record lifetime, counted from
    -- when the clock has passed token + pass limit (lua/release.lua).
    life = math.max(life, tonumber(ttl) + half,
      math.ceil((tonumber(wtok) + tonumber(wpl)) / 1000) - now_ms + half + 1)
    if ended > 0 then
      msg = 'U ' .. ended .. ' ' .. att .. ' ' .. wtok .. ' ' .. ARGV[7]
    else
      msg = 'G ' .. att .. ' ' .. wtok .. ' ' .. ARGV[7]
    end
  end
end
if not h[5] and redis.call('HLEN', KEYS[1]) > 16 then
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
-- (deleted first: a field set here may have been past its <until>; pv,
-- which has none, keeps the hash)
for i = 1, #del, 1000 do -- (unpack takes some thousands of values at most)
  redis.call('HDEL', KEYS[1], unpack(del, i, math.min(i + 999, #del)))
end
redis.call('HSET', KEYS[1], unpack(put))
redis.call('PEXPIRE', KEYS[1], life, 'GT')
if msg then
  redis.call('PUBLISH', chan, msg)
end
return reply
