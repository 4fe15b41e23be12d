-- Protocol 2's semaphore claim, for semaphores over several independent
-- masters (Redlock, docs/design.md "Redlock", Semaphores): a semaphore's
-- permits there are exclusive locks of their own keys (its slots), so the
-- name's own hash carries what a single server's semaphore hash says of
-- the name: that it is a semaphore (k 's', which every lock script
-- refuses with DLOCKKIND) of one limit (l). A client claims the name on
-- every node before it tries a slot (unless its own claim holds two
-- thirds of a lease more), and its renewal rounds claim it again while it
-- holds permits: a claim lives a time to live from then, and a claim of
-- another limit, or a lock, is refused while one lives on a
-- majority (lua/p2/SEM.txt, "Redlock's claim").
-- KEYS[i]  the hash of the i-th semaphore name (<prefix>{<name>})
-- ARGV[1]  the claim's time to live, ms
-- ARGV[1 + i]  the limit the i-th name is used with (1 or more)
-- Returns an array, one integer per key: 0 where the name is claimed for
-- that limit (the hash written, or found so; its time to live raised to
-- at least ARGV[1]); -1 where the name holds a lock's data, or another
-- protocol's (nothing written); L > 0 where it is claimed for another
-- limit L (nothing written). A time to live or a limit that is not a whole
-- number of at least 1: DLOCKARG, nothing written.
local ttl = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local limit = tonumber(ARGV[1 + i])
  if not ttl or ttl < 1 or not limit or limit < 1 or limit % 1 ~= 0 then
    return redis.error_reply('DLOCKARG claim of ' .. key .. ': time to live ' .. ARGV[1] ..
      ', limit ' .. (ARGV[1 + i] or 'none'))
  end
end
local out = {}
for i, key in ipairs(KEYS) do
  local h = redis.call('HMGET', key, 'pv', 'k', 'g', 'l')
  local limit = tonumber(ARGV[1 + i])
  local exists = h[1] or redis.call('EXISTS', key) == 1
  if exists and (h[1] ~= '2' or h[2] ~= 's' or h[3]) then
    out[i] = -1
  elseif exists and tonumber(h[4]) ~= limit then
    out[i] = tonumber(h[4]) or -1
  else
    if not exists then
      redis.call('HSET', key, 'pv', '2', 'k', 's', 'l', ARGV[1 + i])
    end
    if redis.call('PTTL', key) < ttl then
      redis.call('PEXPIRE', key, ttl)
    end
    out[i] = 0
  end
end
return out
