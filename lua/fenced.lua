-- The fenced store: data a dlock lock protects, kept in Redis (docs/guide.md,
-- "Fencing"), read and written only with the holder's fencing token, so
-- that a holder whose lease was lost (paused past it, cut off, or a Redis
-- restart that lost it) cannot overwrite or act on what a later holder did.
-- The library gives this text (dlock_fenced_script); the application loads
-- it into the Redis that keeps its data (SCRIPT LOAD, then EVALSHA).
--
-- KEYS[1]  the protected record, a hash; its field `fence` is the highest
--          token that has read or written it (reserved: no `set` of it)
-- ARGV[1]  the caller's fencing token, in decimal, as dlock_acquire gave it
-- ARGV[2]  'get': read the fields ARGV[3], ARGV[4], ...
--          'set': write the field, value pairs ARGV[3], ARGV[4], ...
-- Returns {1, value, ...} for get (a missing field is nil) and {1} for set
-- when the token is at least the highest seen, which it then becomes; or
-- {0, highest} when refused: a later holder has read or written the record,
-- so the caller no longer holds the lock and nothing was read or changed.
-- The 1 and 0 are integers; the values, and highest, are bulk strings
-- (highest in decimal digits, so that no client rounds a 64-bit integer).
--
-- Never DEL or EXPIRE a record a holder may still write: its highest token
-- goes with it. Mark a record deleted with a field instead.
--
-- The rule it keeps: the token travels with every read and write, the
-- store refuses any operation whose token is below the highest it has seen,
-- and equal tokens pass (one holder may read and write many times). A read
-- that only checked at write time would let a stale holder's write land
-- between a newer holder's read and write: that update is lost.
local tok = tonumber(ARGV[1])
if not tok or tok < 1 or not string.match(ARGV[1], '^%d+$') or #ARGV[1] > 16 then
  -- (tokens are below 2^53: 16 digits at most, exact in Lua's numbers)
  return redis.error_reply('ERR fenced: the token must be a positive decimal integer')
end
local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0') or 0
if tok < seen then
  return {0, string.format('%.0f', seen)}
end
if ARGV[2] == 'get' then
  if tok > seen then
    redis.call('HSET', KEYS[1], 'fence', ARGV[1])
  end
  local out = {1}
  for i = 3, #ARGV do
    out[i - 1] = redis.call('HGET', KEYS[1], ARGV[i]) or false
  end
  return out
elseif ARGV[2] == 'set' then
  if #ARGV % 2 ~= 0 then
    return redis.error_reply('ERR fenced: set takes field, value pairs')
  end
  for i = 3, #ARGV, 2 do
    if ARGV[i] == 'fence' then
      return redis.error_reply('ERR fenced: the field fence is the store\'s own')
    end
  end
  if tok > seen then
    redis.call('HSET', KEYS[1], 'fence', ARGV[1])
  end
  for i = 3, #ARGV, 2 do
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
  return {1}
end
return redis.error_reply('ERR fenced: ARGV[2] must be get or set')
