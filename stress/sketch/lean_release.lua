-- A sketch, not a lock: the release by token, with nobody queued and no
-- local handoffs, of the layout lean_acquire.lua describes, written to be
-- measured beside lua/release.lua (stress/script_cost --also). It takes
-- release.lua's keys, arguments and replies; the caller's record, with the
-- server time (s) until which it lasts (so that stale records can be
-- pruned from the hash), goes into the name's hash with the grant cleared:
-- one write where protocol 1 deletes the lease and writes a fence and a
-- record.
local me = ARGV[1]
local l = redis.call('HMGET', KEYS[1], 'g', 'pv', 'q', 'c:' .. me)
if l[2] and l[2] ~= '2' then
  return redis.error_reply('DLOCKPROTOCOL not this sketch\'s data')
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local owner, tok, nonce, _, exp = string.match(l[1] or '', '^(%S+) (%d+) (%d+) (%d+) (%d+)')
if owner ~= me or tok ~= ARGV[3] or tonumber(exp) < now_ms then
  return 0
end
local seen = nonce
if l[4] then
  local a = string.match(l[4], '^(%d+) ')
  if a and tonumber(a) > tonumber(nonce) then
    seen = a
  end
end
local untl = tostring(tonumber(t[1]) + math.ceil(tonumber(ARGV[9]) / 1000))
redis.call('HSET', KEYS[1], 'g', '', 'c:' .. me, seen .. ' ' .. tok .. ' ' .. nonce .. ' ' .. untl)
redis.call('PEXPIRE', KEYS[1], ARGV[9], 'GT') -- (the grant made the hash: it has a ttl)
if l[3] and redis.call('EXISTS', KEYS[3], KEYS[5]) > 0 then
  return 2
end
return 1
