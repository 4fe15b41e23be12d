-- Protocol 2's read of one lock for dlockctl (show, list, watch;
-- lua/p2/LAYOUT.txt): KEYS and reply as lua/ctl_read.lua's (its head says
-- them), in one step with the server's clock. A hash of another protocol
-- is refused, not misread. A grant in g is shown past its exp for as long
-- as protocol 1's lease key would live (dlockctl says it expired); the
-- turn only until its time, or protocol 1's turn on a name without a hash. The lease's pttl is the hash's, which may outlive the
-- grant (it holds the clients' records).
--
-- Shared mode (lua/p2/LAYOUT.txt): with ARGV[1] = 'modes' the reply has,
-- after the turn, the name's mode ('exclusive', 'shared' or 'free') and the
-- number m of live shared holders, then m times {client id, token, since,
-- exp}, then the waiters as above (a shared waiter's liveness value has
-- 's' for its pass limit). Without it, the reply is the one above (the
-- holder fields only ever show an exclusive grant), as dlockctl reads it.
local h = redis.call('HMGET', KEYS[1], 'pv', 'g', 'o', 'n', 't', 'k')
if h[1] ~= '2' and (h[1] or redis.call('EXISTS', KEYS[1]) == 1) then
  return redis.error_reply('DLOCKPROTOCOL ' .. KEYS[1] .. ': the data of this name is '
    .. 'dlock protocol ' .. (h[1] or '1') .. '; this dlockctl speaks protocol 2')
end
if h[6] then
  return redis.error_reply('DLOCKKIND ' .. KEYS[1] .. ': the data of this name is a semaphore '
    .. '(kind ' .. h[6] .. '), not a lock')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tok, pl, exp, dur, tell = string.match(h[2] or '',
  '^(%d+) %d+ (%d+) (%d+) (%d+) %d+ (%d+)$')
if tok and now > math.max(tonumber(exp), math.ceil((tonumber(tok) + tonumber(pl)) / 1000))
    + tonumber(tell) + 1 then
  tok = nil -- (past where protocol 1's lease key is gone: lua/p2/acquire.lua)
end
local owner, name, since
if tok then
  owner, name = h[3], h[4]
  since = string.format('%.0f', tonumber(exp) - tonumber(dur))
end
local turn = string.match(h[5] or '', '^(%x+) (%d+)$')
if turn and tonumber(string.match(h[5], ' (%d+)$')) < now then
  turn = nil
end
if not h[1] then
  turn = redis.call('GET', KEYS[4]) or nil -- protocol 1's, which an acquire honours
end
local out = {now, owner or false, tok or false, name or false, since or false, exp or false,
  tok and redis.call('PTTL', KEYS[1]) or -2, turn or false}
if ARGV[1] == 'modes' then
  local held = {}
  if h[1] then
    local all = redis.call('HGETALL', KEYS[1])
    for i = 1, #all, 2 do
      local st, sd, sx = string.match(all[i + 1], '^(%d+) %d+ (%d+) %d+ (%d+)$')
      if string.sub(all[i], 1, 2) == 's:' and st and tonumber(sx) >= now then
        held[#held + 1] = {string.sub(all[i], 3), st,
          string.format('%.0f', tonumber(sx) - tonumber(sd)), sx}
      end
    end
  end
  table.sort(held, function(x, y) return x[1] < y[1] end)
  local live = tok and now <= tonumber(exp)
  out[#out + 1] = live and 'exclusive' or (#held > 0 and 'shared' or 'free')
  out[#out + 1] = #held
  for _, x in ipairs(held) do
    for j = 1, 4 do
      out[#out + 1] = x[j]
    end
  end
end
local q = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #q, 2 do
  local d = redis.call('HGET', KEYS[3], q[i]) or ''
  local deadline = tonumber(string.match(d, '^%d+')) or 0
  out[#out + 1] = q[i]
  out[#out + 1] = q[i + 1]
  out[#out + 1] = d
  out[#out + 1] = deadline > now and 1 or 0
end
return out
