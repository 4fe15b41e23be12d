-- Protocol 2's renewal (lua/p2/LAYOUT.txt): renews a batch of leases of
-- one client in one call. KEYS, ARGV, replies and every rule as
-- lua/renew.lua's (its head says them); the grant is the hash's field g.
-- A hash that is not protocol 2's (pv other than 2, or none) is not renewed:
-- 0, and nothing written to it.
-- Shared leases (lua/p2/LAYOUT.txt, Shared mode) are renewed by the same
-- call: ARGV[i + 2] is the token of the grant the client holds, exclusive
-- (field g) or shared (its field s:<client id>); a shared token is never an
-- exclusive grant's, so the token tells which. A shared lease is renewed
-- while it lives, whoever waits (writers wait for its release or its end),
-- by the same rule as an exclusive grant, and r is raised to its new exp;
-- never while a live exclusive grant stands (a shared field counts again
-- beside one only after a step back of the server's clock).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local l = tonumber(ARGV[2])
local out = {}
for i, key in ipairs(KEYS) do
  -- the grant: g "token nonce pl exp dur u tell", o its owner
  -- (lua/p2/LAYOUT.txt); a renewal tells its expiry a lease time past exp
  local h = redis.call('HMGET', key, 'pv', 'g', 'o', 's:' .. ARGV[1], 'r')
  local tok, nonce, pl, exp, dur, u
  if h[1] == '2' then
    tok, nonce, pl, exp, dur, u = string.match(h[2] or '',
      '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) %d+$')
  end
  -- the caller's shared lease: s:<id> "token nonce dur end exp"
  local st, sn, sd, se, sx
  if h[1] == '2' then
    st, sn, sd, se, sx = string.match(h[4] or '', '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
  end
  if tok and h[3] == ARGV[1] and tok == ARGV[i + 2] and tonumber(exp) >= now_ms then
    local since = tonumber(exp) - tonumber(dur)
    local e = math.max(tonumber(exp), now_ms + l, since + l)
    redis.call('HSET', key, 'g', tok .. ' ' .. nonce .. ' ' .. pl .. ' ' .. string.format('%.0f', e)
      .. ' ' .. string.format('%.0f', e - since) .. ' ' .. u .. ' ' .. ARGV[2])
    redis.call('PEXPIRE', key, math.max(e - now_ms + l,
      math.ceil((tonumber(tok) + tonumber(pl)) / 1000) - now_ms + l + 1), 'GT')
    out[i] = 1
  elseif st and st == ARGV[i + 2] and tonumber(sx) >= now_ms
      and not (tok and tonumber(exp) >= now_ms) then
    -- (a live exclusive grant beside it: a step back of the server's clock
    -- made the field count again; it is nobody's, and stays so)
    local since = tonumber(sx) - tonumber(sd)
    local e = math.max(tonumber(sx), now_ms + l, since + l)
    redis.call('HSET', key, 's:' .. ARGV[1], st .. ' ' .. sn .. ' ' .. string.format('%.0f', e - since)
      .. ' ' .. se .. ' ' .. string.format('%.0f', e),
      'r', string.format('%.0f', math.max(tonumber(h[5] or '') or 0, e)))
    redis.call('PEXPIRE', key, math.max(e - now_ms + l, math.ceil(tonumber(st) / 1000) - now_ms + l + 1),
      'GT')
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
