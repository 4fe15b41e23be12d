-- Gives a lease back, if the caller still owns this grant of it.
-- KEYS[1] lease hash  <prefix>{<name>}
-- KEYS[2] fence key   <prefix>{<name>}:fence
-- ARGV[1] client id
-- ARGV[2] token of the grant being released, or "*" for whatever grant this
--         client owns (used only to clean up after an acquire whose outcome
--         is unknown, while no other grant of this name can exist locally)
-- ARGV[3] fence key lifetime in ms
-- ARGV[4] the last token handed out under this grant (local handoffs add 1
--         to the grant's token); the fence keeps the larger of the two
-- Returns 1 when released, 0 when the caller did not own that grant (it
-- expired or was taken): releasing twice is harmless.
--
-- The fence key keeps the last token for a while so that the next grant's
-- token exceeds it even if the server clock steps back; it expires, so no key
-- lives forever per name.
local lease = redis.call('HMGET', KEYS[1], 'owner', 'token')
if lease[1] ~= ARGV[1] or (ARGV[2] ~= '*' and lease[2] ~= ARGV[2]) then
  return 0
end
local last = tonumber(lease[2])
local handed = tonumber(ARGV[4] or '0') or 0
if handed > last then
  last = handed
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], string.format('%.0f', last), 'PX', ARGV[3])
return 1
