-- Gives a lease back, if the caller still owns this grant of it.
-- KEYS[1] lease hash  <prefix>{<name>}
-- KEYS[2] fence key   <prefix>{<name>}:fence
-- ARGV[1] client id
-- ARGV[2] 'token' or 'nonce': which field identifies the grant
-- ARGV[3] that field's value: the grant's token, or the nonce of an acquire
--         whose outcome the client never learned
-- ARGV[4] fence key lifetime in ms
-- ARGV[5] the last token handed out under this grant (local handoffs add 1
--         to the grant's token), or 0
-- Returns 1 when released, 0 when the caller did not own that grant (it
-- expired, was taken, or was granted again): releasing twice is harmless.
--
-- The fence key keeps the last token for a while so that the next grant's
-- token exceeds it even if the server clock steps back; it expires, so no key
-- lives forever per name.
local lease = redis.call('HMGET', KEYS[1], 'owner', ARGV[2], 'token')
if lease[1] ~= ARGV[1] or lease[2] ~= ARGV[3] then
  return 0
end
local last = tonumber(lease[3])
local handed = tonumber(ARGV[5]) or 0
if handed > last then
  last = handed
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], string.format('%.0f', last), 'PX', ARGV[4])
return 1
