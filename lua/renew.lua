-- Renews a batch of leases of one client in one call.
-- KEYS[i]   lease hash of the i-th lock
-- ARGV[1]   client id
-- ARGV[2]   lease time in ms
-- ARGV[i+2] token of the grant the client holds for KEYS[i]
-- Returns an array: 1 where that grant was renewed, 0 where it is gone (the
-- grant expired (exp, server ms, passed: acquire.lua), was deleted, or the
-- key belongs to another grant). A grant is only ever renewed with its own
-- token, so a renewal that races a release cannot extend the next owner's
-- lease; an expired grant is never brought back.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local exp = string.format('%.0f', now_ms + tonumber(ARGV[2]))
local px = 2 * tonumber(ARGV[2]) -- the key outlives the grant by a lease time
local out = {}
for i, key in ipairs(KEYS) do
  local lease = redis.call('HMGET', key, 'owner', 'token', 'exp')
  if lease[1] == ARGV[1] and lease[2] == ARGV[i + 2] and
     (not lease[3] or tonumber(lease[3]) >= now_ms) then
    redis.call('HSET', key, 'exp', exp)
    redis.call('PEXPIRE', key, px)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
