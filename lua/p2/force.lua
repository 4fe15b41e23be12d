-- Protocol 2's forced release (dlockctl release --force; lua/p2/LAYOUT.txt):
-- lua/p2/release.lua run as the holder, wrapped, as lua/force.lua wraps
-- protocol 1's (its head says the rules). The line "--@release.lua" below
-- stands for lua/p2/release.lua's text. KEYS and ARGV as release.lua's;
-- ARGV[5] and ARGV[9] are adjusted here.
--
-- It answers -N, having changed nothing, while the holder's reservation
-- (token + pass limit) is ahead of server time; otherwise release.lua's
-- answer (0: not held by that grant).
local h = redis.call('HMGET', KEYS[1], 'pv', 'g', 'o', 'k')
if h[1] ~= '2' and (h[1] or redis.call('EXISTS', KEYS[1]) == 1) then
  return redis.error_reply('DLOCKPROTOCOL ' .. KEYS[1] .. ': the data of this name is '
    .. 'dlock protocol ' .. (h[1] or '1') .. '; this dlockctl speaks protocol 2')
end
if h[4] then
  return redis.error_reply('DLOCKKIND ' .. KEYS[1] .. ': the data of this name is a semaphore '
    .. '(kind ' .. h[4] .. '), not a lock')
end
-- the grant: g "token nonce pl exp dur u tell", o its owner
-- (lua/p2/LAYOUT.txt)
local tok, pl, exp = string.match(h[2] or '', '^(%d+) %d+ (%d+) (%d+) %d+ %d+ %d+$')
if not tok or h[3] ~= ARGV[1] or tok ~= ARGV[3] then return 0 end
local res = tonumber(tok) + tonumber(pl)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now / 1000)
-- a grant past its exp has expired: nobody holds it (acquire.lua)
if now_ms > tonumber(exp) then return 0 end
if res >= now then return -(math.floor((res - now) / 1000) + 1) end
if res > tonumber(ARGV[3]) then ARGV[5] = string.format('%.0f', res) end
-- the holder's record keeps a longer lifetime than ARGV[9]
local rk = 'c:' .. ARGV[1]
local rv = redis.call('HGET', KEYS[1], rk)
local left = rv and (tonumber(string.match(rv, ' (%d+)$') or '') or 0) - now_ms
  or redis.call('PTTL', KEYS[6]) -- (protocol 1's record, while the hash has none)
if left > tonumber(ARGV[9]) then
  ARGV[9] = string.format('%.0f', left)
end
local function release_as_holder()
--@release.lua
end
local rc = release_as_holder()
if type(rc) == 'table' and rc.err then return rc end
-- taken, not released: the holder's release of this token finds no record
-- of it (DLOCK_ELOST); its attempts stay ordered
local a, r, u = string.match(redis.call('HGET', KEYS[1], rk) or '', '^(%d+) %d+ (%d+) (%d+)$')
if a then
  redis.call('HSET', KEYS[1], rk, a .. ' 0 ' .. r .. ' ' .. u)
end
return rc
