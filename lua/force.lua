-- dlockctl release --force: lua/release.lua run as the holder, wrapped. The
-- line "--@release.lua" below stands for release.lua's text (dlockctl and
-- the simulator put it there; this file alone does not run). KEYS and ARGV
-- as release.lua's; ARGV[5] and ARGV[9] are adjusted here.
--
-- It answers a negative number -N, having changed nothing, while the
-- holder's reservation is ahead of server time: the caller waits N ms and
-- tries again. Otherwise release.lua's answer (0: not held by that grant).
local lease = redis.call('HMGET', KEYS[1], 'owner', 'token', 'pl', 'exp', 'pv')
if lease[5] and lease[5] ~= '1' then
  return redis.error_reply('DLOCKPROTOCOL ' .. KEYS[1] .. ': the data of this name is '
    .. 'dlock protocol ' .. lease[5] .. '; this dlockctl speaks protocol 1')
end
if lease[1] ~= ARGV[1] or lease[2] ~= ARGV[3] then return 0 end
-- The holder's reservation for its threads (token + pass limit): it may go
-- on handing them out until it learns of this release, so the fence keeps
-- it as the last token; and it waits until server time has passed it, so
-- that the fence is not ahead of the server's clock (a restart that lost
-- it could not undercut the holder's tokens then).
local res = tonumber(lease[2]) + (tonumber(lease[3]) or 0)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- a grant past its exp has expired: nobody holds it (acquire.lua)
if lease[4] and math.floor(now / 1000) > tonumber(lease[4]) then return 0 end
if res >= now then return -(math.floor((res - now) / 1000) + 1) end
local fence = tonumber(string.match(redis.call('GET', KEYS[2]) or '0', '^%d+') or '0') or 0
if fence > res then res = fence end
if res > tonumber(ARGV[3]) then ARGV[5] = string.format('%.0f', res) end
-- the holder's record keeps a longer lifetime than ARGV[9]
local kt = redis.call('PTTL', KEYS[6])
if kt > tonumber(ARGV[9]) then ARGV[9] = tostring(kt) end
local function release_as_holder()
--@release.lua
end
local rc = release_as_holder()
-- refused (another protocol's data: release.lua, Protocol): nothing
-- written, here neither
if type(rc) == 'table' and rc.err then return rc end
-- taken, not released: the holder's release of this token finds no record
-- of it (DLOCK_ELOST); its attempts stay ordered
local rec = redis.call('GET', KEYS[6])
local a, _, r = string.match(rec or '', '^(%d+) (%d+) (%d+)$')
if a then
  redis.call('SET', KEYS[6], a .. ' 0 ' .. r, 'PX', math.max(redis.call('PTTL', KEYS[6]), 1))
end
return rc
