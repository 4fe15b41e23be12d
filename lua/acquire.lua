-- Grants the lease of one lock name to a client, or says who has it.
-- KEYS[1] lease hash  <prefix>{<name>}       fields: owner, token
-- KEYS[2] fence key   <prefix>{<name>}:fence  last token of a released lease
-- ARGV[1] client id (32 hex digits)
-- ARGV[2] lease time in ms
-- Returns {1, token} when granted (also when the caller already owned the
-- lease: a retry after an unknown outcome is granted again, with a fresh
-- token), or {0, pttl} when another client owns it.
--
-- Tokens: max(server time in us, last token + 1), where the last token is
-- the current owner's (on a retry) or the fence key's. Server time in us is
-- below 2^53, so Lua's doubles hold it exactly; it is stored with %.0f so
-- that it reads back as the same decimal string the client sends.
local lease = redis.call('HMGET', KEYS[1], 'owner', 'token')
if lease[1] and lease[1] ~= ARGV[1] then
  return {0, redis.call('PTTL', KEYS[1])}
end
local t = redis.call('TIME')
local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(lease[2] or redis.call('GET', KEYS[2]) or '0')
if token <= last then
  token = last + 1
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', string.format('%.0f', token))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, token}
