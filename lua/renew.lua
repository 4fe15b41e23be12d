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
-- A renewal never moves exp back, nor below a lease time from the grant
-- (since): after a step back of the server's clock, exp - since must still
-- cover how long the holder handed out tokens (acquire.lua, gone). The key
-- outlives exp by a lease time, and lives until the clock has read a lease
-- time past token + pass limit.
-- A lease hash that another protocol marked (field pv other than 1:
-- acquire.lua, "Protocol") is not renewed: 0, and nothing written to it
-- (that protocol keeps the hash as long as its own data lives).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local l = tonumber(ARGV[2])
local out = {}
for i, key in ipairs(KEYS) do
  local lease = redis.call('HMGET', key, 'owner', 'token', 'exp', 'since', 'pl', 'pv')
  if lease[1] == ARGV[1] and lease[2] == ARGV[i + 2] and
     (not lease[3] or tonumber(lease[3]) >= now_ms) and (not lease[6] or lease[6] == '1') then
    local exp = math.max(tonumber(lease[3]) or 0, now_ms + l, (tonumber(lease[4]) or 0) + l)
    redis.call('HSET', key, 'exp', string.format('%.0f', exp))
    redis.call('PEXPIRE', key, math.max(exp - now_ms + l,
      math.ceil((tonumber(lease[2]) + (tonumber(lease[5]) or 0)) / 1000) - now_ms + l + 1))
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
