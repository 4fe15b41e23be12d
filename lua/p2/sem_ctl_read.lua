-- Protocol 2's read of one semaphore for dlockctl (show, list, watch;
-- lua/p2/SEM.txt), in one step with the server's clock: its limit, its
-- holders with their permits and when these end, and its wait queue.
-- KEYS[1] the name's hash, KEYS[2] the queue, KEYS[3] the waiters'
-- liveness (lua/keys.lua: LEASE, QUEUE, LIVE, as lua/ctl_read.lua's).
-- Returns {server ms, limit (false when no semaphore data lives), permits
-- in use, holders, then per holder: client id, permits, their end (server
-- ms), then per waiter: id, arrival (us), liveness value ("<deadline>
-- <attempt> <permits wanted> <waiter ttl> <name>"), 1 if alive else 0}.
-- Holders are the clients whose permits have not ended, in the hash's
-- order. Data of another protocol, or a lock's, is refused, not misread;
-- without a hash, no waiters are listed.
local all = redis.call('HGETALL', KEYS[1])
local f = {}
for i = 1, #all, 2 do
  f[all[i]] = all[i + 1]
end
if f.pv ~= '2' and (f.pv or #all > 0) then
  return redis.error_reply('DLOCKPROTOCOL ' .. KEYS[1] .. ': the data of this name is '
    .. 'dlock protocol ' .. (f.pv or '1') .. '; this dlockctl speaks protocol 2')
end
if #all > 0 and (f.k ~= 's' or f.g) then
  return redis.error_reply('DLOCKKIND ' .. KEYS[1] .. ': the data of this name is a lock (kind '
    .. (f.k or 'exclusive') .. '), not a semaphore')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hold, used = {}, 0
for i = 1, #all, 2 do
  local id = string.match(all[i], '^c:(.+)$')
  if id then
    local n, e, u = string.match(all[i + 1], '^(%d+) (%d+) %d+ %a %d+ %d+ (%d+)$')
    if n and tonumber(n) > 0 and tonumber(e) >= now and tonumber(u) >= now then
      hold[#hold + 1] = {id, tonumber(n), tonumber(e)}
      used = used + tonumber(n)
    end
  end
end
local out = {now, f.l or false, used, #hold}
for _, h in ipairs(hold) do
  out[#out + 1] = h[1]
  out[#out + 1] = h[2]
  out[#out + 1] = h[3]
end
-- (a name without a hash has no semaphore waiters: a queue there is a
-- protocol 1 lock's)
local q = #all > 0 and redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES') or {}
for i = 1, #q, 2 do
  local d = redis.call('HGET', KEYS[3], q[i]) or ''
  local deadline = tonumber(string.match(d, '^%d+')) or 0
  out[#out + 1] = q[i]
  out[#out + 1] = q[i + 1]
  out[#out + 1] = d
  out[#out + 1] = deadline > now and 1 or 0
end
return out
