-- Trace conformance of Redlock mode (sim/trace.lua's head; docs/simulation.md,
-- "Trace conformance"): the lines a client with dlock_config.redlock_nodes
-- records in place of a single server's acq/rep and rel, checked against
-- the Redlock rule (docs/design.md "Redlock", sim/redlock.lua's client):
--   rl.open ID N M DRIFT_NS                 the node set: N nodes, a majority M,
--                                           the drift allowance (the open line's)
--   rl.acq  NAME NONCE RC TOKEN VOTES SENT FIRST VALID KEPT OLDER
--                                           a quorum acquire (src/local/rlmode.c):
--                                           SENT before the call, FIRST its first
--                                           send, VALID the validity it computed;
--                                           a wait's try: KEPT 1 if it kept its
--                                           split vote, OLDER 1 if a node that
--                                           refused it is held by a client whose
--                                           wait began first
--   rl.wend NAME KEPT                       the end of a wait: the attempt whose
--                                           vote its last try kept (0 none), given
--                                           back just before
--   rl.leave NAME NUMBER RC                 a background leave of every node's
--                                           queue (src/global/renew_redlock.c)
--   rl.rel  NAME TOKEN RC RAN_OUT           the quorum release of the grant of
--                                           TOKEN; RAN_OUT: its validity had
--                                           passed when it was called
--   rl.giveback NAME NONCE RC               a background give-back of attempt NONCE
--                                           on every node (src/global/renew_redlock.c)
-- The rules: an attempt is a new number, sent in a poll, one at a time; a
-- grant had at least M votes, its validity is its first send + the lease -
-- the drift allowance (the model's grant validity: the 'tried' and 'grant'
-- lines that follow are held to it, and a grant answered after it is given
-- back); an attempt that failed other than refused (EBUSY) is given back
-- on every node; a wait's split vote (some votes, fewer than M) is kept
-- only by a try of a wait, and only if no node that refused it is held by
-- an older waiter (wait-die: docs/design.md "Redlock", Waiting), and an
-- attempt kept is given back once the next try is answered or the wait
-- ends; a release names its grant's token, and a releaser whose
-- lease ran out, or whose release found it lost, is told DLOCK_ELOST. The
-- local tier's lines (rdec, take, reent, ok, verdict...) are checked by
-- sim/trace.lua as with one server: Redlock mode keeps the local tier.
local C = require('client')

local RL = {}

local E = {OK = 0, EBUSY = -2, ELOST = -5, EREDIS = -6}

local function num(s) return tonumber(s) end
local function us(ns) return tonumber(ns) / 1000 end
-- C times are integer ns; the model's in us: equal within a nanosecond.
local function same_time(a_us, b_ns) return math.abs(a_us * 1000 - b_ns) < 1.5 end

-- The rl.open line: X = {c, bad}. The client becomes a Redlock client.
function RL.open(X, f)
  local c = X.c
  local n, m, drift = num(f[5]), num(f[6]), num(f[7])
  if not n or n < 3 or n % 2 == 0 then X.bad('a node set of %s nodes, not an odd number >= 3', f[5]) end
  if m ~= math.floor((n or 0) / 2) + 1 then X.bad('a majority of %s of %s nodes', f[6], f[5]) end
  if not drift or math.abs(drift - c.s.drift_us * 1000) > 0.5 then
    X.bad('a drift allowance of %s ns; the model %.0f (1%% of the lease + 2 ms)', f[7],
      c.s.drift_us * 1000)
  end
  c.rl = {n = n, m = m}
end

-- A line of Redlock mode for entry e, or false: X = {c, bad, stats,
-- numbers}. stamp: the line's time (ns).
function RL.line(X, e, kind, f, stamp)
  local c, bad, stats = X.c, X.bad, X.stats
  local s = c.s
  if kind == 'rl.acq' then
    stats.tries = stats.tries + 1
    local nonce, rc, token, votes = num(f[5]), num(f[6]), num(f[7]), num(f[8])
    local sent, first, valid = num(f[9]), num(f[10]), num(f[11])
    if not c.rl then bad('a quorum acquire of %s by a client not in Redlock mode', e.name) end
    if not e.polling then bad('an acquire of %s outside a poll', e.name) end
    if e.pending then
      bad('attempt %d of %s sent while attempt %d is unanswered', nonce, e.name, e.pending.nonce)
    end
    if X.numbers[nonce] then bad('attempt number %d used twice', nonce) end
    X.numbers[nonce] = true
    if nonce <= e.last_nonce then
      bad('attempt %d of %s after attempt %d: the nodes would refuse it as stale', nonce, e.name,
        e.last_nonce)
    end
    e.last_nonce = nonce
    if sent > stamp then bad('sent at %.0f, after it was recorded (%.0f)', sent, stamp) end
    if rc == E.OK and c.rl then
      if votes < c.rl.m then
        bad('attempt %d of %s granted by %d votes; a majority of %d nodes is %d', nonce, e.name,
          votes, c.rl.n, c.rl.m)
      elseif first < sent or first > stamp then
        bad('attempt %d of %s first sent at %.0f, outside its call (%.0f .. %.0f)', nonce, e.name,
          first, sent, stamp)
      elseif not same_time(C.grant_valid(s, us(first)), valid) then
        bad('attempt %d of %s valid until %.0f; the model %.0f (the first send + the lease - the '
          .. 'drift allowance)', nonce, e.name, valid, C.grant_valid(s, us(first)) * 1000)
      elseif token < 1 then
        bad('attempt %d of %s granted with token %.0f', nonce, e.name, token)
      end
    end
    -- A split vote kept (f[12]; traces before waits have none).
    local kept, older = f[12] == '1', f[13] == '1'
    if kept then
      if rc ~= E.EBUSY then bad('attempt %d of %s kept its votes and returned %d', nonce, e.name, rc) end
      if c.rl and (votes < 1 or votes >= c.rl.m) then
        bad('attempt %d of %s kept %d votes: a split vote has 1 .. %d', nonce, e.name, votes, c.rl.m - 1)
      end
      if older then
        bad('attempt %d of %s kept its votes although a node that refused it is held by a client '
          .. 'waiting since before it (wait-die gives them back)', nonce, e.name)
      end
      if e.poll_once then bad('attempt %d of %s, a single try, kept its votes', nonce, e.name) end
    end
    -- the vote an earlier try kept goes back once this one is answered
    if e.rl_kept then X.need_giveback(e, e.rl_kept) end
    e.rl_kept = kept and nonce or nil
    -- (granted: 1, 0 refused, -8 too few nodes answered, which may have
    -- queued the client: given back, and left as after a refusal; nil of
    -- another error)
    local granted = rc == E.OK and 1 or rc == E.EBUSY and 0 or rc == E.EREDIS and -8 or nil
    e.pending = {nonce = nonce, sent = rc == E.OK and first or sent, proto = 2,
                 rep = {sent = true, granted = granted, value = token, rc = rc}}
    e.protos[nonce] = 2
    e.state = 'ACQ'
  elseif kind == 'rl.rel' then
    stats.releases = stats.releases + 1
    local token, rc, ran_out = num(f[5]), num(f[6]), f[7] == '1'
    if e.state ~= 'RELEASING' then bad('a quorum release of %s, which is %s', e.name, e.state) end
    if token ~= e.grant_token then
      bad('the quorum release of %s names the grant of token %.0f; the model\'s grant is %.0f',
        e.name, token, e.grant_token)
    end
    if ran_out and e.valid_until * 1000 > stamp then
      bad('the release of %s found its validity passed, which lasts until %.0f (now %.0f)', e.name,
        e.valid_until * 1000, stamp)
    end
    e.rel = {proto = 2, rl = {lost = ran_out or rc == E.ELOST, rc = rc}}
  elseif kind == 'rl.wend' then
    local kept = num(f[5])
    if kept ~= (e.rl_kept or 0) then
      bad('the wait for %s ended with attempt %d kept; the model: %d', e.name, kept, e.rl_kept or 0)
    elseif kept ~= 0 and not e.givebacks[kept] then
      bad('the wait for %s ended without giving back the votes attempt %d kept', e.name, kept)
    end
    e.rl_kept = nil
  elseif kind == 'rl.leave' then
    -- (a leave takes nothing the client holds: it is numbered anew, or,
    -- after a granted wait, as the grant's own attempt, and leave.lua
    -- gives up only grants of attempts older than its number)
  elseif kind == 'rl.giveback' then
    local nonce = num(f[5])
    if not e.givebacks[nonce] then
      bad('a give-back on the nodes of attempt %d of %s, which none started', nonce, e.name)
    end
  else
    return false
  end
  return true
end

-- The releaser's outcome (a 'released' line, RC) after a quorum release.
function RL.released(X, e, rc)
  local r = e.rel and e.rel.rl
  if not r then return end
  if r.lost and rc ~= E.ELOST then
    X.bad('the lease of %s ran out before its release, or its release found it lost (rc %d): '
      .. 'the releaser was told %d, not DLOCK_ELOST', e.name, r.rc, rc)
  elseif not r.lost and r.rc ~= rc then
    X.bad('the quorum release of %s returned %d; the releaser was told %d', e.name, r.rc, rc)
  end
end

return RL
