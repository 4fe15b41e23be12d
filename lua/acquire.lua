-- Grants the lease of one lock name to a client, or queues the client.
-- KEYS[1] lease hash  <prefix>{<name>}       fields: owner, token, nonce, pl (the
--                     grant's pass limit: it reserves token .. token + pl),
--                     exp (server ms: the grant ends then; the key lives a
--                     lease time longer, as a fence), and for operators since
--                     (server ms of the grant), name (the owner's client_name)
-- KEYS[2] fence key   <prefix>{<name>}:fence  the last token a released grant
--                     handed out: no later grant may reach it; followed by
--                     " <end>" when that grant ended uncleanly (release.lua)
-- KEYS[3] wait queue  <prefix>{<name>}:q      zset: client id -> arrival (server us)
-- KEYS[4] liveness    <prefix>{<name>}:qd     hash: client id -> "<deadline (server
--                     ms)> <its newest attempt> <its pass limit> <its waiter ttl>
--                     <its name>":
--                     what a release needs to grant it the lease directly
-- KEYS[5] turn        <prefix>{<name>}:turn   the client whose turn it is
-- KEYS[6] record      <prefix>{<name>}:c:<client id>  what Redis remembers of this
--                     client for this name: "<newest attempt> <token of its last
--                     released grant> <attempt of that grant>" (see below)
-- KEYS[7] slot mark   <prefix>hw:{<tag>}  of every name in this name's hash slot:
--                     "<token> <clock> <pass limit>": the highest token a
--                     grant of the slot took (or a release reported its
--                     holder handed out: release.lua), the server time (us)
--                     the latest grant of the slot read, and the largest
--                     pass limit of its grants; no expiry (see Tokens)
-- ARGV[1] client id (32 hex digits)
-- ARGV[2] lease time in ms
-- ARGV[3] number of this attempt: unique and increasing per client, from 1;
--         it lets the client release exactly this grant if it never learns
--         the outcome of this call, and lets Redis refuse the attempt if it
--         arrives after a newer one
-- ARGV[4] pass limit: tokens the client may hand out locally after this one
-- ARGV[5] waiter ttl in ms: how long a queued client stays without a retry
-- ARGV[6] '1' to join the wait queue when refused, '0' for a single try
-- ARGV[7] record lifetime in ms after the client's last call on this name
-- ARGV[8] the client's name (client_name: printable, no spaces), stored with
--         a grant for operators (dlockctl), and in the liveness hash so that
--         a direct grant stores it too
-- ARGV[9] the last token the client handed out under a grant of this name
--         whose release failed ('0' if none, or absent): if that grant is
--         still the client's lease, this grant's token is above it
-- ARGV[10] how that grant ended (with ARGV[9] only; '0' or absent: its
--         holder released it, '1' for a holder thread that exited, '2' it
--         was lost): if it is still the client's lease, the new grant
--         reports that end (see End)
-- ARGV[11] protocol 2 only (lua/p2/acquire.lua), a lock over several
--         masters only, absent otherwise: the token the client proposes
--         (a floor); this script ignores it
-- Returns {1, token, end} when granted, or {0, pttl, holder, held, waiting}
-- when the client must wait (pttl: the lease's remaining time, or -1 when the
-- lease is free but another client's turn comes first; for the caller's
-- messages: the holder's client name ('' when none), how long it has held
-- the lease in ms (-1 unknown), and the number of clients in the wait queue
-- (after a single try, which does not join it, those queued before; entries
-- of waiters that stopped waiting count until a free lease prunes them));
-- then, if it asked to, the
-- client is in the wait queue, once, in arrival order, with its deadline
-- refreshed.
-- Returns {-1, 0}, having changed nothing at all, for a stale attempt: one
-- older than an attempt Redis remembers from this client for this name (the
-- attempt of the grant it holds, one that was refused or queued, a leave,
-- the attempt of a released grant), or one whose grant was already
-- released. A late copy of an old attempt (a retransmitted request, a
-- stalled server serving an old connection late) can thus never displace a
-- newer grant, queue a client that stopped waiting, or take a turn. The
-- same attempt seen again while its grant stands is answered with that
-- grant, unchanged. (A grant that expired unreleased leaves no record of its
-- attempt: a late copy of an older attempt may then be granted or queued.
-- Nobody uses that grant: the client releases it in the background, by
-- attempt number, if it never learned that attempt's outcome; takes it as
-- its own with its next attempt; or else it expires after one lease time.
-- A direct grant to that queue entry lasts the waiter ttl.)
-- A lease the caller already owns under an older attempt (one whose outcome
-- it never learned, or whose release failed) is granted again, with a new
-- token and this attempt's number.
--
-- A lease granted to the caller by a release (release.lua: the direct
-- grant, under attempt `nonce`, for the caller's waiter ttl only) is found
-- here as the caller's own: the same attempt again gets it at the full
-- lease time, a newer attempt gets it again with a new token.
--
-- Fairness: a free lease goes to the client whose turn it is (set by a leave
-- that gave up a grant or a turn, cleared when that client is gone), else to
-- the first live client in the queue, else to anyone. Dead waiters (deadline
-- passed) are pruned from the head of the queue; all times are the server's.
--
-- Tokens: max(server time in us, last + 1), where last is the highest
-- token any earlier grant of the name may have handed out: the fence a
-- release left (the last token its holder used), or, for the grant the
-- caller already owns, its token or the last one the caller handed out
-- under it (ARGV[9]); and the slot's mark (KEYS[7]): its token, and, when
-- server time is below the clock the mark read or below its token (the
-- clock stepped back: a grant then goes a pass limit above the last, until
-- the clock has caught up), its token + its pass limit, which bounds
-- whatever a grant of the slot may have handed out. The mark never
-- expires, so no step back of the server's clock, of any size, and no
-- restart that kept the data, sends a token back once a name's fence and
-- expired lease key are gone; but for one case: a grant that expired
-- unreleased after handing out tokens locally above both the mark's token
-- and the latest time a grant of its slot read, and a step back that
-- returns the clock to within those tokens (at most a pass limit in us
-- after its grant) (docs/guide.md).
-- A grant's token is server time, except after a step back of the
-- server's clock; a client's local handoffs take the next tokens no faster
-- than server time passes (release.c, handoff_in_time). So no token in use
-- is ahead of server time, and a restart or failover that loses the fence
-- and the mark cannot undercut one: the next grant's server time is past
-- it. After a step back a grant is ahead, until the clock has caught up.
-- Server time in us is below 2^53, so Lua's doubles hold it exactly.
--
-- End: how the grant before this one ended, when not by its holder's
-- release: 1 its holder thread exited or its client closed holding it (the
-- library released it), 2 it expired unreleased (its process died or
-- stalled, or its release never arrived: this script finds its key past
-- exp), 3 an operator released it (dlockctl release --force); 0 otherwise.
-- A release leaves it in the fence, an expired grant in its key, both for a
-- lease time: a grant made later than that reports 0. A grant nobody used
-- (an attempt of unknown outcome, a direct grant to a waiter that gave up)
-- passes its own `end` on (lease field u). The grant keeps it in field u, so
-- that the same attempt seen again reports it too.
--
-- Protocol: this script speaks dlock protocol 1 (DLOCK_PROTOCOL_VERSION in
-- dlock.h). A lease hash whose field pv names another protocol holds data of
-- a later release (which keeps that field for as long as any of its data of
-- the name lives: docs/design.md, "Protocol versions"): the script refuses
-- it, changing nothing, with an error that names both protocols.
-- A grant writes pv = 1 into the lease; a hash without pv is read as
-- protocol 1's.
--
-- Cost: the common case, a free name with nobody queued, runs 7 commands
-- (HMGET, TIME, MGET of the record, the fence and the mark, EXISTS of the
-- queue keys, HSET, PEXPIRE, SET of the mark) and formats one number (exp):
-- the token, the grant time and the mark are cut from TIME's strings. A
-- grant writes no record: the lease's nonce is this attempt, and the
-- release writes the record (release.lua).
local me = ARGV[1]
local attempt = tonumber(ARGV[3])
local lease = redis.call('HMGET', KEYS[1], 'owner', 'token', 'nonce', 'pl', 'exp', 'since', 'u',
  'name', 'pv')
if lease[9] and lease[9] ~= '1' then -- another protocol's data (Protocol, above)
  return redis.error_reply('DLOCKPROTOCOL the data of this name is dlock protocol ' ..
    lease[9] .. '; this client speaks protocol 1: upgrade it')
end
local t = redis.call('TIME')
local us6 = string.rep('0', 6 - #t[2]) .. t[2] -- microseconds, 6 digits
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
-- A grant ends at exp (server ms); its key lives a lease time longer, so
-- that after it expired unreleased its tokens still bound the next grant's
-- if the server's clock steps back by up to a lease time. Its holder
-- handed out tokens up to token + pass limit, and no faster than time
-- passed from its grant (since, server ms) to exp (release.c,
-- handoff_in_time).
local gone = 0
if lease[1] and lease[5] and now_ms > tonumber(lease[5]) then
  local tk = tonumber(lease[2]) or 0
  local lasted = (tonumber(lease[5]) - (tonumber(lease[6]) or 0)) * 1000
  gone = tk + math.max(0, math.min(tonumber(lease[4]) or 0, lasted))
  lease = {false, false, false, false, false, false, false, false, false}
end
local mine = lease[1] == me
local got = redis.call('MGET', KEYS[6], KEYS[2], KEYS[7]) -- the record, the fence, the mark
local seen, rtok, ratt = 0, '0', '0' -- attempts are numbered from 1
if got[1] then
  local a, t, r = string.match(got[1], '^(%d+) (%d+) (%d+)$')
  if a then -- anything else in the key is treated as no record
    seen, rtok, ratt = tonumber(a), t, r
  end
end
if mine then
  local held = tonumber(lease[3]) or 0
  if held == attempt and attempt >= seen then
    -- The same attempt again: its grant stands, for a whole lease from now
    -- (the caller counts its validity from this call; a direct grant was
    -- made for the waiter ttl only). Not if Redis saw a newer attempt of the
    -- client: a direct grant made under the attempt of an old queue entry
    -- (the client tried again without queueing) is not this copy's to take.
    local l = tonumber(ARGV[2])
    local exp = math.max(tonumber(lease[5]) or 0, now_ms + l, (tonumber(lease[6]) or 0) + l)
    redis.call('HSET', KEYS[1], 'exp', string.format('%.0f', exp))
    redis.call('PEXPIRE', KEYS[1], math.max(exp - now_ms + l,
      math.ceil(((tonumber(lease[2]) or 0) + (tonumber(lease[4]) or 0)) / 1000) - now_ms + l + 1))
    return {1, tonumber(lease[2]), tonumber(lease[7] or '0') or 0}
  end
  if held > seen then
    seen = held
  end
end
if attempt < seen or attempt == tonumber(ratt) then
  return {-1, 0}
end

-- Refused: Redis remembers this attempt (so that a late copy of an older
-- one is refused), and, if asked, queues the client.
local function wait(pttl)
  redis.call('SET', KEYS[6], ARGV[3] .. ' ' .. rtok .. ' ' .. ratt, 'PX', ARGV[7])
  local holder, held = '', -1
  if pttl >= 0 and lease[1] then
    holder = lease[8] or ''
    if lease[6] then
      held = now_ms - tonumber(lease[6])
    end
  end
  if ARGV[6] ~= '1' then
    -- a single try: not queued, but told how many are
    return {0, pttl, holder, held, redis.call('ZCARD', KEYS[3])}
  end
  local ttl = tonumber(ARGV[5])
  redis.call('ZADD', KEYS[3], 'NX', t[1] .. us6, me)
  redis.call('HSET', KEYS[4], me, tostring(math.floor(now_us / 1000) + ttl) .. ' ' .. ARGV[3]
    .. ' ' .. ARGV[4] .. ' ' .. ARGV[5] .. ' ' .. ARGV[8])
  -- The queue vanishes once every waiter stopped refreshing it; a client
  -- with a shorter waiter ttl never shortens another's.
  for k = 3, 4 do
    if redis.call('PTTL', KEYS[k]) < 2 * ttl then
      redis.call('PEXPIRE', KEYS[k], 2 * ttl)
    end
  end
  return {0, pttl, holder, held, redis.call('ZCARD', KEYS[3])}
end

if lease[1] and not mine then
  if lease[5] then
    return wait(tonumber(lease[5]) - now_ms + 1) -- it ends after this ms
  end
  return wait(redis.call('PTTL', KEYS[1])) -- a lease of an earlier version
end
-- Nobody queued and no turn given: the common, uncontended case touches no
-- queue key at all.
local queued = redis.call('EXISTS', KEYS[3], KEYS[5]) > 0
if queued then
  local function alive(id)
    local d = redis.call('HGET', KEYS[4], id)
    local deadline = d and tonumber(string.match(d, '^%d+'))
    return deadline and deadline > now_ms
  end
  if not lease[1] then
    local turn = redis.call('GET', KEYS[5])
    if turn and turn ~= me then
      if alive(turn) then
        return wait(-1)
      end
      redis.call('DEL', KEYS[5]) -- its holder is gone: the turn passes on
      turn = nil
    end
    if not turn then
      -- The first live waiter, after dropping dead ones from the head.
      while true do
        local h = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
        if not h then
          break
        end
        if alive(h) then
          if h ~= me then
            return wait(-1)
          end
          break
        end
        redis.call('ZREM', KEYS[3], h)
        redis.call('HDEL', KEYS[4], h)
      end
    end
  end
  redis.call('ZREM', KEYS[3], me)
  redis.call('HDEL', KEYS[4], me)
  redis.call('DEL', KEYS[5])
end

local last = tonumber(string.match(got[2] or '0', '^%d+') or '0') or 0
local ended = tonumber(string.match(got[2] or '', ' (%d)$') or '0')
if gone > last then
  last = gone
end
-- The slot's mark (Tokens, above).
local mtok, mclk, mpl = string.match(got[3] or '', '^(%d+) (%d+) (%d+)$')
local mark = tonumber(mtok) or 0
if now_us < math.max(tonumber(mclk) or 0, mark) then
  mark = mark + tonumber(mpl)
end
if mark > last then
  last = mark
end
if gone > 0 then
  ended = 2
end
if mine then
  -- The caller's own grant, under an older attempt: one whose outcome it
  -- never learned (it used none of its tokens), or one whose release failed
  -- (ARGV[9]: the last token it handed out under it).
  local used = math.max(tonumber(lease[2]) or 0, tonumber(ARGV[9] or '0') or 0)
  if used > last then
    last = used
  end
  -- How the hold before this grant ended is how the caller's own ended:
  -- the grant whose release failed (ARGV[9], at or above its token), as the
  -- caller says (ARGV[10]); a grant never used (an attempt of unknown
  -- outcome, whose token is above any the caller used), what that grant
  -- was told itself (its u). The fence is older than that grant: its word
  -- was told to it already.
  if (tonumber(lease[2]) or 0) <= (tonumber(ARGV[9] or '0') or 0) then
    ended = tonumber(ARGV[10] or '0') or 0
  else
    ended = tonumber(lease[7] or '0') or 0
  end
end
local tok = t[1] .. us6
local token = now_us
if token <= last then
  -- Ahead of server time (after a step back of its clock): the holder's
  -- handoffs follow at most as fast as time passes, and whatever it hands
  -- out stays bounded by the fence its release writes, or by its key once
  -- the grant expired unreleased (gone, above), or by the mark.
  token = last + 1
  tok = string.format('%.0f', token)
end
redis.call('HSET', KEYS[1], 'owner', me, 'token', tok, 'nonce', ARGV[3], 'pl', ARGV[4],
  'since', t[1] .. string.sub(us6, 1, 3), 'name', ARGV[8],
  'exp', string.format('%.0f', now_ms + tonumber(ARGV[2])), 'pv', '1')
if ended > 0 then
  -- (a key that held a u before is the caller's own, or expired: ended > 0)
  redis.call('HSET', KEYS[1], 'u', tostring(ended))
elseif mine and lease[7] then
  -- the caller's own grant told a word its successor must not repeat
  redis.call('HDEL', KEYS[1], 'u')
end
-- The mark: this token, the clock now, the largest pass limit. (A grant
-- behind the mark's clock need not keep that clock: its token is above
-- the mark's token and pass limit, so the mark now bounds every earlier
-- grant of the slot with its token alone.)
local pl = ARGV[4]
if mpl and tonumber(mpl) > tonumber(pl) then
  pl = mpl
end
redis.call('SET', KEYS[7], tok .. ' ' .. t[1] .. us6 .. ' ' .. pl)
-- The key outlives the grant by a lease time, and the clock must have read
-- a lease time past every token the grant bounds before it goes (a grant
-- ahead of the clock, after a step back, lives that much longer).
local l = tonumber(ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.max(2 * l,
  math.ceil((token + tonumber(ARGV[4])) / 1000) - now_ms + l + 1))
return {1, token, ended}
