-- Grants the lease of one lock name to a client, or says who has it.
-- KEYS[1] lease hash  <prefix>{<name>}       fields: owner, token, nonce
-- KEYS[2] fence key   <prefix>{<name>}:fence  a token no later grant may reach
-- ARGV[1] client id (32 hex digits)
-- ARGV[2] lease time in ms
-- ARGV[3] nonce of this attempt (unique per client): lets the client release
--         exactly this grant if it never learns the outcome of this call
-- ARGV[4] pass limit: tokens the client may hand out locally after this one
-- Returns {1, token} when granted, or {0, pttl} when another client owns it.
-- A lease the caller already owns (left by a release or an attempt whose
-- outcome it never learned) is granted again, with a new token and nonce.
--
-- Tokens: max(server time in us, last + 1), where last is the larger of the
-- lease's token (when the caller owned it) and the fence. The grant reserves
-- token .. token + pass limit for local handoffs by setting the fence to
-- token + pass limit for one lease time; after that, server time alone is
-- past the reservation, since the client accepts pass limits only below the
-- lease time in us. Server time in us is below 2^53, so Lua's doubles hold
-- it exactly; it is stored with %.0f so that it reads back as the same
-- decimal string the client sends.
local lease = redis.call('HMGET', KEYS[1], 'owner', 'token')
if lease[1] and lease[1] ~= ARGV[1] then
  return {0, redis.call('PTTL', KEYS[1])}
end
local t = redis.call('TIME')
local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local mine = tonumber(lease[2] or '0') or 0
if mine > last then
  last = mine
end
if token <= last then
  token = last + 1
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', string.format('%.0f', token),
           'nonce', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local reserved = token + tonumber(ARGV[4])
if reserved > last then
  redis.call('SET', KEYS[2], string.format('%.0f', reserved), 'PX', ARGV[2])
end
return {1, token}
