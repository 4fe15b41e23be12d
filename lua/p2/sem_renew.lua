-- Protocol 2's semaphore renewal (lua/p2/SEM.txt): renews the permits of
-- one client on a batch of semaphore names in one call.
-- KEYS[i]  the hash of the i-th semaphore name (<prefix>{<name>})
-- ARGV[1]  client id
-- ARGV[2]  lease time in ms
-- Returns an array: 1 where the client's permits of KEYS[i] were renewed
-- (they end a lease time from now, or later if they ended later already),
-- 0 where it holds none: they ended (their exp, server ms, passed: the
-- client stopped renewing for a lease time, and the permits counted no more
-- from then), were all given back, or the key is not a semaphore of
-- protocol 2 (another protocol, a lock's hash, no hash), in which case
-- nothing is written to it. Permits that ended are never brought back. A
-- renewal changes no call number: it neither answers nor refuses an
-- attempt. The hash's time to live only grows, to cover the permits' end.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local l = tonumber(ARGV[2])
local fld = 'c:' .. ARGV[1]
local out = {}
for i, key in ipairs(KEYS) do
  local h = redis.call('HMGET', key, 'pv', 'k', 'g', fld)
  local n, e, a, x, g, gk, u
  if h[1] == '2' and h[2] == 's' and not h[3] then
    n, e, a, x, g, gk, u = string.match(h[4] or '', '^(%d+) (%d+) (%d+) (%a) (%d+) (%d+) (%d+)$')
  end
  if n and tonumber(n) > 0 and tonumber(e) >= now and tonumber(u) >= now then
    local exp = math.max(tonumber(e), now + l)
    local until_ = math.max(tonumber(u), exp)
    redis.call('HSET', key, fld, n .. ' ' .. string.format('%.0f', exp) .. ' ' .. a .. ' ' .. x
      .. ' ' .. g .. ' ' .. gk .. ' ' .. string.format('%.0f', until_))
    redis.call('PEXPIRE', key, until_ - now, 'GT')
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
