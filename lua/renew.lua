-- Renews a batch of leases of one client in one call.
-- KEYS[i]   lease hash of the i-th lock
-- ARGV[1]   client id
-- ARGV[2]   lease time in ms
-- ARGV[i+2] token of the grant the client holds for KEYS[i]
-- Returns an array: 1 where that grant was renewed, 0 where it is gone (the
-- key expired, was deleted, or belongs to another grant). A grant is only
-- ever renewed with its own token, so a renewal that races a release cannot
-- extend the next owner's lease.
local out = {}
for i, key in ipairs(KEYS) do
  local lease = redis.call('HMGET', key, 'owner', 'token')
  if lease[1] == ARGV[1] and lease[2] == ARGV[i + 2] then
    redis.call('PEXPIRE', key, ARGV[2])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
