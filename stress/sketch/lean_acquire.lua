-- A sketch, not a lock: the uncontended path of a leaner data layout for a
-- later protocol, written to be measured (stress/script_cost --also, with
-- lean_release.lua; docs/performance.md, "A leaner layout, measured"),
-- before a protocol is built on it. It takes lua/acquire.lua's keys,
-- arguments and replies, and runs the commands that layout's acquire would
-- run on a free name with nobody queued; it has no queue, no direct grant,
-- no regrant of the caller's own lease, no end codes and reads no other
-- protocol's data.
--
-- The layout: one hash per name (KEYS[1]) holds everything of the name but
-- its queue: field g, the grant, "owner token nonce pl exp since name" in
-- one field (one field read and written instead of eight; '' once
-- released); pv, the protocol; q, set while a waiter may be queued (so a
-- name nobody waits for needs no EXISTS); c:<client id>, what Redis
-- remembers of one client for the name, as protocol 1's record key (so a
-- release writes one key, not three: no fence key, whose token the slot's
-- mark already bounds, and no record key). The slot's mark (KEYS[7]) is
-- protocol 1's. The hash's time to live only grows: a hash that existed
-- (it has pv) takes PEXPIRE ... GT (Redis 7.0; on Redis 6, which protocol 1
-- supports, a PTTL more per call), a new one a plain PEXPIRE.
local me = ARGV[1]
local l = redis.call('HMGET', KEYS[1], 'g', 'pv', 'q', 'c:' .. me)
if l[2] and l[2] ~= '2' then
  return redis.error_reply('DLOCKPROTOCOL not this sketch\'s data')
end
local t = redis.call('TIME')
local us6 = string.rep('0', 6 - #t[2]) .. t[2]
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local last = 0
if l[1] and l[1] ~= '' then
  local _, tok, _, pl, exp = string.match(l[1], '^(%S+) (%d+) (%d+) (%d+) (%d+)')
  if tonumber(exp) >= now_ms then
    return {0, tonumber(exp) - now_ms + 1, '', -1, 0}
  end
  last = tonumber(tok) + tonumber(pl)
end
local seen, ratt = 0, 0
if l[4] then
  local a, r = string.match(l[4], '^(%d+) %d+ (%d+)')
  seen, ratt = tonumber(a) or 0, tonumber(r) or 0
end
local attempt = tonumber(ARGV[3])
if attempt < seen or attempt == ratt then
  return {-1, 0}
end
if l[3] and redis.call('EXISTS', KEYS[3], KEYS[5]) > 0 then
  return {0, -1, '', -1, 0}
end
local mtok, mclk, mpl = string.match(redis.call('GET', KEYS[7]) or '', '^(%d+) (%d+) (%d+)$')
local mark = tonumber(mtok) or 0
if now_us < math.max(tonumber(mclk) or 0, mark) then
  mark = mark + tonumber(mpl)
end
if mark > last then
  last = mark
end
local tok = t[1] .. us6
local token = now_us
if token <= last then
  token = last + 1
  tok = string.format('%.0f', token)
end
redis.call('HSET', KEYS[1], 'g', me .. ' ' .. tok .. ' ' .. ARGV[3] .. ' ' .. ARGV[4] .. ' '
  .. string.format('%.0f', now_ms + tonumber(ARGV[2])) .. ' ' .. t[1] .. string.sub(us6, 1, 3)
  .. ' ' .. ARGV[8], 'pv', '2')
if l[2] then
  redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2]), 'GT') -- never shortens the records' life
else
  redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
end
local pl = ARGV[4]
if mpl and tonumber(mpl) > tonumber(pl) then
  pl = mpl
end
redis.call('SET', KEYS[7], tok .. ' ' .. t[1] .. us6 .. ' ' .. pl)
return {1, token, 0}
