-- The client side of dlock's protocol, as src/ (client.c, api.c, acquire.c, excl.c,
-- release.c, rpc.c) and the renewal manager (src/global/renew_round.c,
-- renew_jobs.c, renew_thread.c)
-- follow it, written as event handlers over the simulated world
-- (sim/world.lua). One table per client process: its threads, its entries
-- (the local tier, one per lock name), its renewal manager's registry and
-- background jobs, its subscriber.
--
-- This is a model of the C code, not the C code. What keeps the two in step:
-- every C function whose logic is modelled here is listed in
-- sim/protocol.lua with a digest of its text; tests/sim_protocol (ctest)
-- fails when one of them changes until this file is checked against it and
-- the digest renewed. Each handler below names the C function it follows.
--
-- Protocols (docs/design.md, "Protocol versions"): a client speaks both
-- protocol 1 (lua/) and 2 (lua/p2/), and its setting (c.protocol,
-- dlock_config.protocol) names the one it tries first. The rule, as
-- src/local/rpc.c, acquire.c, release.c and src/global/renew_*.c follow it:
-- an acquire attempt is sent in the setting's protocol, and if the script
-- refuses the name's data as the other protocol's (DLOCKPROTOCOL, naming
-- it), the same attempt (number and arguments) is sent again in the
-- protocol the refusal names, up to C.RESENDS times (the data may change
-- protocol between two sends); refused after that, the acquire fails
-- (ESERVER). A grant belongs to the protocol of the try that got it (a
-- direct grant: that of the release that made it, which its message names:
-- "g"/"u" from protocol 1's, "G"/"U" from protocol 2's); its renewals (one
-- renew call per protocol a round), its release and its local handoffs use
-- it. A background give-back of an attempt of unknown outcome goes in the
-- protocol that attempt was last sent in; a leave in that of the try that
-- queued the client. A release and a leave refused as the other protocol's
-- data are sent again in it, once; a background leave switches to it once,
-- a background give-back at each refusal until its time is over (C.run_job).
-- In a world of one protocol every client's setting is that protocol and
-- nothing is ever refused: the schedules are those of before this rule.
local C = {}

local floor = math.floor
local NEVER = math.huge

-- Derived settings, as dlock_client_open computes them (client.c,
-- dlock_renew_drift_ns in renew.c), in whole nanoseconds as C's integer
-- division gives them. Times on the client's boot clock in us.
function C.settings(cfg)
  local s = {}
  s.lease_ms, s.pass_limit, s.waiter_ttl_ms = cfg.lease_ms, cfg.pass_limit, cfg.waiter_ttl_ms
  local function ns(ms, div) return floor(ms * 1000000 / div) / 1000 end -- ms / div, in us
  local function drift(ms) return ns(ms, 100) + 2000 end -- 1% + 2 ms
  s.keep_ms = 2 * math.max(cfg.lease_ms, cfg.waiter_ttl_ms)
  s.fallback_us = ns(cfg.waiter_ttl_ms, 4)
  s.drift_us = drift(cfg.lease_ms)
  s.handoff_margin_us = ns(cfg.lease_ms, 3)
  s.grant_ms = math.min(cfg.waiter_ttl_ms, cfg.lease_ms)
  s.grant_drift_us = drift(s.grant_ms)
  s.grant_margin_us = ns(s.grant_ms, 4)
  s.period_us = cfg.lease_ms * 1000 / 3
  s.retry_us = 100000 -- RETRY_MS: a failed renewal round is tried again this soon
  s.pool_size = cfg.pool_size
  s.local_rule = cfg.local_rule -- see dlock_release_outermost below
  s.min_replicas = cfg.min_replicas or 0 -- grants and renewals count once WAIT confirms them
  s.join_us = (cfg.join_ms or 20) * 1000 -- the shared mode's join window (join_ms)
  return s
end

------------------------------------------------------------------------
-- The model's rules: the decisions of the C client, as functions of its
-- state and clock readings. The simulator's handlers below take every
-- decision through them, and so does the trace checker (sim/trace.lua),
-- which replays the C client's own traces through them. Times are on the
-- client's boot clock, in us.

-- poll_redis: a grant is valid from its acquire's send for the lease less
-- the drift margin; an answer that comes after that is too late.
function C.grant_valid(s, sent) return sent + s.lease_ms * 1000 - s.drift_us end
function C.too_late(s, sent, now) return now >= C.grant_valid(s, sent) end

-- take_direct_grant: a direct grant counts from the send of the refused
-- try it names, and is taken only if it names the poller's last refused
-- try and enough of its validity is left.
function C.direct_valid(s, try_sent) return try_sent + s.grant_ms * 1000 - s.grant_drift_us end
function C.direct_takes(s, msg_nonce, try_nonce, try_sent, now)
  return msg_nonce ~= 0 and msg_nonce == try_nonce
    and now + s.grant_margin_us < C.direct_valid(s, try_sent)
end

-- handoff_in_time (excl.c): the k-th local handoff of a grant only once
-- k us have passed since the client learned it, less 1% for drift.
function C.in_time(passes, since_grant_us)
  local us = floor(since_grant_us)
  return passes + 1 <= us - floor((us + 99) / 100)
end

-- dlock_release_outermost: a release passes the lease to a waiting thread
-- of its client (a local handoff) only below the pass limit, with enough validity
-- left, in time by the clock rule, and while the client is not closing.
function C.may_pass(s, e, now, waiting, closing)
  local clock_ok = s.local_rule ~= 'clock' or C.in_time(e.passes, now - e.grant_at)
  return waiting and e.passes < s.pass_limit and C.roomy(s, e, now) and clock_ok
    and not closing
end

-- The margin of validity a lease passed between threads keeps (excl.c,
-- may_pass; shared.c, roomy): a quarter of the grant's time for a direct
-- grant not renewed yet, else a third of the lease.
function C.roomy(s, e, now)
  local margin = e.provisional and s.grant_margin_us or s.handoff_margin_us
  return now + margin < e.valid_until
end

-- The shared mode (src/local/shared.h, S1 to S8). A try is sent first in
-- the client's setting, a shared one in protocol 2 whatever the setting
-- (poll_redis: protocol 1 has no shared mode).
function C.first_protocol(c, mode)
  if mode == 'S' then return 2 end
  return c.protocol
end

-- take_direct_grant, wake_one (S7): a direct grant is taken only in the
-- mode its poller waits in ("S" shared, "X" exclusive); one of the other
-- mode goes back.
function C.direct_mode_ok(msg_mode, wait_mode) return (msg_mode or 'X') == (wait_mode or 'X') end

-- S1 (shared.c, joinable): a thread asking shared joins the client's
-- lease without Redis only while it is a shared lease or a reader phase,
-- held, with the margin a handoff keeps, no thread of the client waiting
-- for the name exclusively (xwaiting, their count), and its join window
-- open: join_ms from the grant, or from the phase's start (e.join_until).
-- The window bounds a writer's wait behind the client's readers (S3).
function C.joins(s, e, now, xwaiting)
  return (e.lmode == 'S' or e.phase == true) and e.state == 'HELD' and xwaiting == 0
    and now < e.join_until and C.roomy(s, e, now)
end

-- S2: a thread invited to a new grant (or phase) holds it only if, when
-- it runs, the lease is still held and valid (the take rule of handoffs).
C.invited_takes = function(e, now) return C.takes(e, now) end

-- S8 (dlock_shared_phase): when the holder of an exclusive lease releases
-- it and no local handoff was made, the threads waiting shared (swaiting)
-- hold it together, as one pass of the pass limit with the next token,
-- only if none waits exclusively (xwaiting) and a pass is allowed.
function C.phase_may(s, e, now, swaiting, xwaiting, closing)
  return e.lmode ~= 'S' and e.state == 'HELD' and swaiting > 0 and xwaiting == 0
    and C.may_pass(s, e, now, true, closing)
end

-- take_handoff, take_direct_handoff: a passed lease is taken only while it
-- is held and valid.
function C.takes(e, now) return e.state == 'HELD' and now < e.valid_until end

-- renew_round.c, apply: a renewal's verdict on a grant it renewed:
-- 'renewed' with the new validity, 'lost', or 'kept' (unknown, still valid).
function C.verdict(s, e, v, sent, now)
  if v == 1 then return 'renewed', sent + s.lease_ms * 1000 - s.drift_us end
  if v == 0 or now >= e.valid_until then return 'lost' end
  return 'kept'
end

-- dlock_rpc_acquire: an attempt refused as the other protocol's data is
-- sent again in it at most this many times (DLOCK_RPC_RESENDS): the data
-- may change protocol between two sends.
C.RESENDS = 2

-- dlock_rpc_acquire (resend_in): the protocol an acquire sent in `sent_in`
-- and refused as the other protocol's data (reply rep) is sent again in,
-- or nil: the refusal names a protocol this client speaks (1 or 2) other
-- than the one it was sent in.
function C.resend_in(rep, sent_in)
  local p = C.refusal_protocol(rep)
  if p and p ~= sent_in then return p end
end

-- dlock_conn_refusal_protocol: the protocol a DLOCKPROTOCOL refusal names
-- as the data's (1 or 2), or nil (no refusal, or another protocol).
function C.refusal_protocol(rep)
  local e = type(rep) == 'table' and rep.err
  local p = e and tonumber(e:match('^DLOCKPROTOCOL the data of this name is dlock protocol (%d+)'))
  if p == 1 or p == 2 then return p end
end

-- Whether rep is a DLOCKPROTOCOL refusal (dlock_conn_is_other_protocol).
function C.refused(rep)
  local e = type(rep) == 'table' and rep.err
  return e and e:find('^DLOCKPROTOCOL') ~= nil or false
end

-- dlock_rpc_acquire: the acquire script's ARGV for attempt `nonce`.
function C.acquire_argv(c, e, nonce, once)
  local a = c.args
  return {c.id, a.lease, tostring(nonce), a.pl, a.ttl, once and '0' or '1', a.keep, c.name,
          string.format('%.0f', e.unconfirmed or 0),
          tostring((e.unconfirmed or 0) > 0 and e.unconfirmed_end or 0)}
end

-- dlock_rpc_release: the release script's ARGV for e's grant.
function C.release_argv(c, e, ending)
  return {c.id, 'token', string.format('%.0f', e.grant_token), c.args.lease,
          string.format('%.0f', e.token), c.args.wake, e.name, c.args.ttl, c.args.keep,
          tostring(ending)}
end

-- A new client (dlock_client_open). W is the world; id 32 hex digits.
function C.new(W, idx, id, cfg)
  local c = {
    W = W, idx = idx, id = id, cfg = cfg, s = C.settings(cfg),
    alive = true, attempts = 0, entries = {}, threads = {},
    jobs = {}, renew_epoch = 0, renew_timer = nil, renewing = false,
    pool_next = 1, name = 'client' .. idx,
    protocol = cfg.protocol or 1, -- its setting: the protocol every attempt is sent in first
  }
  c.args = {
    lease = tostring(cfg.lease_ms), pl = tostring(cfg.pass_limit),
    ttl = tostring(cfg.waiter_ttl_ms), keep = tostring(c.s.keep_ms),
    wake = 'dlock:wake:',
  }
  return c
end

-- The keys of a name, as lua/keys.lua lists them (the one table of them).
local KEYS = dofile((debug.getinfo(1, 'S').source:match('^@(.*)/[^/]*$') or '.') .. '/../lua/keys.lua')
local SLOT = dofile((debug.getinfo(1, 'S').source:match('^@(.*)/[^/]*$') or '.') .. '/slot.lua')
local function keys(name, id)
  local k = 'dlock:{' .. name .. '}'
  local out = {}
  for i, key in ipairs(KEYS) do out[i] = k .. key[2] end
  assert(KEYS[6][1] == 'CLIENT' and KEYS[7][1] == 'HW')
  out[6] = out[6] .. id
  out[7] = 'dlock:' .. KEYS[7][2] .. '{' .. SLOT.tag(SLOT.of(k)) .. '}'
  return out
end
C.keys = keys

-- The client's boot clock now (us).
local function cnow(c) return c.W:clock(c) end

local function entry(c, name)
  local e = c.entries[name]
  if not e then
    e = {name = name, keys = keys(name, c.id), state = 'NONE', owner = nil, token = 0,
         grant_token = 0, valid_until = 0, passes = 0, epoch = 0, provisional = false,
         queue = {}, poller = nil, queued = false, try_nonce = 0, try_sent = 0,
         msg = nil, woken = false, registered = false, revoked = nil, grant_at = 0}
    c.entries[name] = e
  end
  return e
end

-- dlock_rpc_number (rpc.c): the client's attempt sequence.
local function next_number(c)
  c.attempts = c.attempts + 1
  return c.attempts
end

local function trace(c, fmt, ...)
  local W = c.W
  if W.tracing then W:trace(string.format('%s ' .. fmt, c.name, ...)) end
end

------------------------------------------------------------------------
-- Threads: think, acquire, hold, release, again.

function C.start_thread(c, t)
  local th = {c = c, idx = t, name = c.name .. '.t' .. t, state = 'idle'}
  c.threads[t] = th
  C.think(th)
end

function C.think(th)
  local c, W = th.c, th.c.W
  th.state = 'idle'
  th.e = nil
  if W.stopping then return end
  W:after_client(c, W:rint(0, W.cfg.think_us), function() C.want(th) end)
end

-- dlock_acquire (api.c: acquire; acquire.c: dlock_acquire_run): a thread wants a name.
function C.want(th)
  local c, W = th.c, th.c.W
  if not c.alive or W.stopping then return end
  if c.closing then return end -- DLOCK_ECLOSED at once: the thread stops
  local name = W.names[W:rint(1, #W.names)]
  local r = W:rand()
  local wait_ms
  if r < 0.15 then wait_ms = 0 elseif r < 0.9 then wait_ms = W:rint(1, W.cfg.max_wait_ms) else wait_ms = -1 end
  local e = entry(c, name)
  th.e = e
  th.state = 'waiting'
  th.once = wait_ms == 0
  th.deadline = wait_ms < 0 and NEVER or cnow(c) + wait_ms * 1000
  th.fail_seq = e.fail_seq or 0
  th.stop = nil
  th.want_seq = (th.want_seq or 0) + 1
  -- (the shared worlds: shared with the client's probability, from the
  -- world's stream of modes; else exclusive)
  th.mode = W.shared and (W:rand4() < c.shared_frac and 'S' or 'X') or nil
  e.queue[#e.queue + 1] = th
  trace(c, '%s wants %s (wait %d ms)%s', th.name, name, wait_ms, th.mode == 'S' and ' shared' or '')
  if th.deadline ~= NEVER then
    W:at_client_clock(c, th.deadline, function() C.deadline(th) end)
  end
  if W.cfg.faults.life and W:rand() < 0.15 then
    -- another thread fires this acquire's cancel token (dlock_cancel_fire)
    local seq = th.want_seq
    W:after_client(c, W:rint(0, 2 * W.cfg.max_wait_ms * 1000), function()
      C.stop(th, 'ECANCELED', seq)
    end)
  end
  C.progress(e, c)
end

local function dequeue(e, th)
  for i, x in ipairs(e.queue) do
    if x == th then
      table.remove(e.queue, i)
      return
    end
  end
end

-- The thread's call returns: rc is 'OK' or an error name. With `quiet`, the
-- caller runs C.progress itself afterwards.
local function finish(th, rc, quiet)
  local c, e = th.c, th.e
  assert(e, 'a thread finished twice')
  trace(c, '%s acquire of %s: %s', th.name, e.name, rc)
  if rc ~= 'OK' then
    th.state = 'done'
    -- dlock_acquire_run: the last thread here that gives up takes the
    -- client out of the queue in Redis.
    dequeue(e, th)
    if e.queued and #e.queue == 0 and not e.poller and not e.owner and e.state == 'NONE' then
      local n = next_number(c)
      e.queued = false
      -- (in the protocol of the try that queued it: dlock_acquire_run)
      if rc == 'ETIMEDOUT' or rc == 'EBUSY' then
        C.leave(c, e, n, false)
      else
        C.job(c, e, 'leave', n, 2 * c.s.waiter_ttl_ms * 1000, e.queue_proto or c.protocol)
      end
    end
    C.think(th)
    if not quiet then C.progress(e, c) end
    return
  end
  th.state = 'holding'
  local W = c.W
  W:after_client(c, W:rint(0, W.cfg.hold_us), function() C.release(th) end)
end

-- A waiting thread's deadline (its timed wait in the local queue).
function C.deadline(th)
  if th.state ~= 'waiting' then return end
  local e = th.e
  -- the poller checks its deadline itself; a thread being passed the lease
  -- is its owner already
  if e.poller == th or e.owner == th then return end
  finish(th, 'ETIMEDOUT')
end

-- A waiting acquire stops: its cancel token was fired (rc 'ECANCELED', seq
-- its want) or its client shuts down ('ECLOSED'): client.c dlock_client_stop_rc, looked
-- at by a waiting thread at once, by the poller between its tries (a call
-- under way ends first).
function C.stop(th, rc, seq)
  if th.state ~= 'waiting' or (seq and th.want_seq ~= seq) then return end
  local c, e = th.c, th.e
  if not c.alive or e.owner == th then return end -- granted before: DLOCK_OK
  trace(c, '%s: %s', th.name, rc)
  if rc == 'ECANCELED' then c.W.faults.cancelled = (c.W.faults.cancelled or 0) + 1 end
  if e.poller == th then
    if e.sleeping then
      e.sleeping = nil
      return C.poll_done(c, e, rc) -- a direct grant message is left to the leave
    end
    th.stop = th.stop or rc -- inside its Redis call: when it returns
    return
  end
  finish(th, rc)
end

-- dlock_client_shutdown: every waiting acquire stops, later ones too, and
-- no lease passes to another thread any more (dlock_release_outermost).
function C.shutdown(c)
  c.closing = true
  for _, th in ipairs(c.threads) do
    if th.state == 'waiting' then C.stop(th, 'ECLOSED') end
  end
end

-- Whenever e changes: a waiting thread may have something to do (dlock_entry_kick_head).
function C.progress(e, c)
  if not c.alive then return end
  if e.owner or e.poller or e.state ~= 'NONE' then return end
  -- The head of the local queue becomes the poller (I9).
  local th = e.queue[1]
  while th do
    if th.state ~= 'waiting' then
      table.remove(e.queue, 1)
    else
      break
    end
    th = e.queue[1]
  end
  if not th then return C.maybe_free(c, e) end
  if c.closing then return finish(th, 'ECLOSED') end -- stop_rc before polling
  if not th.once and cnow(c) >= th.deadline then
    return finish(th, 'ETIMEDOUT') -- no Redis call after the deadline
  end
  table.remove(e.queue, 1)
  e.poller = th
  e.try_nonce = 0 -- poll_redis: a new wait, no direct grant yet
  e.msg = nil
  C.try(c, e)
end

-- The poller ends its poll with rc; waiters behind a failed poll fail too (I8).
local function poll_done(c, e, rc)
  local th = e.poller
  e.poller = nil
  if rc == 'OK' then
    return finish(th, 'OK')
  end
  local failing = {}
  if rc ~= 'EBUSY' and rc ~= 'ETIMEDOUT' and rc ~= 'ECANCELED' and rc ~= 'ECLOSED' then
    for _, w in ipairs(e.queue) do
      if w.state == 'waiting' then failing[#failing + 1] = w end
    end
  end
  finish(th, rc, true)
  for _, w in ipairs(failing) do
    if w.state == 'waiting' and e.owner ~= w then finish(w, rc, true) end
  end
  C.progress(e, c)
end

C.poll_done = poll_done

-- dlock_client_unconfirmed_end (client.c): the grant ended without a release Redis
-- confirmed, after `tok`, as `how` (0 a release, 1 abandoned, 2 lost).
function C.unconfirmed_end(e, tok, how)
  if tok >= (e.unconfirmed or 0) then
    e.unconfirmed = tok
    e.unconfirmed_end = how
  end
end

-- The client's unconfirmed set (unconfirmed.c): what dlock_client_unconfirmed_end
-- records (the entry's, and here, for keep_ms from now, so that it outlives
-- the entry), and dlock_unconfirmed_get.
function C.unconfirmed_record(c, e, tok, how)
  C.unconfirmed_end(e, tok, how)
  c.uset = c.uset or {}
  local r = c.uset[e.name]
  local now = cnow(c)
  if not r or e.unconfirmed > r.token or r.until_t <= now then
    r = {token = e.unconfirmed, end_ = e.unconfirmed_end}
  elseif e.unconfirmed == r.token and e.unconfirmed_end > r.end_ then
    r.end_ = e.unconfirmed_end
  end
  r.until_t = now + c.s.keep_ms * 1000
  c.uset[e.name] = r
end

local function unconfirmed_get(c, name)
  local r = c.uset and c.uset[name]
  if r and r.until_t > cnow(c) then return r.token, r.end_ end
  return 0, 0
end

-- An entry no thread uses any more is freed (dlock_table_put: its last
-- reference), or stays a while (a reference held a moment longer): the
-- model frees it or not, drawn from the world's second stream. What it
-- knew of unconfirmed ends lives on in the set above.
function C.maybe_free(c, e)
  if e.state == 'NONE' and not e.owner and not e.poller and #e.queue == 0 and not e.registered
     and not e.passing and not e.sleeping and c.entries[e.name] == e and c.W:frees(c) then
    c.entries[e.name] = nil
  end
end

-- take_grant (acquire.c): the grant is in protocol `proto`.
local function take_grant(c, e, th, token, valid_until, unclean, proto)
  e.state = 'HELD'
  e.gproto = proto
  e.grant_token = token
  e.token = token
  e.epoch = e.epoch + 1
  e.valid_until = valid_until
  e.provisional = false
  e.msg = nil
  e.passes = 0
  e.queued = false
  e.registered = true
  e.revoked = nil
  e.grant_at = cnow(c)
  if (e.unconfirmed or 0) > 0 and c.uset then c.uset[e.name] = nil end
  e.unconfirmed = 0
  e.unconfirmed_end = 0
  e.unclean = unclean or 0 -- acquire.lua "End", or the message's (dlock_unclean)
  e.ending = nil
  e.owner = th
  c.W:acquired(c, e, th, token, false)
end

-- take_direct_grant (acquire.c): the poller looks at a grant message.
local function take_direct_grant(c, e)
  local m = e.msg
  e.msg = nil
  local now = cnow(c)
  if not m or not C.direct_takes(c.s, m.nonce, e.try_nonce, e.try_sent, now) then return false end
  local valid = C.direct_valid(c.s, e.try_sent)
  trace(c, 'takes the direct grant of %s (attempt %d, token %.0f)', e.name, m.nonce, m.token)
  -- (the shared worlds: a direct grant is of the mode its attempt queued
  -- the client in: "S" for a shared try, "G"/"U" for an exclusive one)
  if c.W.shared and not C.direct_mode_ok(m.mode, e.try_mode) then
    c.W:violation('mode', string.format('%s: %s got a direct grant of mode %s for its %s attempt %d',
      e.name, c.name, m.mode, e.try_mode or 'X', m.nonce))
  end
  e.mode = m.mode
  -- (in the protocol of the release that made it, as its message says:
  -- acquire.c, take_direct_grant; wake_one)
  take_grant(c, e, e.poller, m.token, valid, m.unclean, m.proto)
  e.provisional = true
  if #e.queue > 0 then
    C.renew_round(c)
  else
    C.renew_by(c, now + (valid - now) / 2)
  end
  return true
end

-- One try of the poller (poll_redis, dlock_rpc_acquire): in the setting's
-- protocol, and, refused as the other protocol's data, the same attempt
-- again in that one, up to C.RESENDS times (its last send counts).
function C.try(c, e)
  local th = e.poller
  e.state = 'ACQUIRING'
  e.woken = false
  local nonce = next_number(c)
  local kept, kept_end = unconfirmed_get(c, e.name)
  if kept > (e.unconfirmed or 0) then
    -- the set's (the entry was freed and made anew): poll_redis keeps it
    e.unconfirmed, e.unconfirmed_end = kept, kept_end
  end
  local argv = C.acquire_argv(c, e, nonce, th.once)
  local sent = cnow(c)
  -- (the shared worlds: a shared try runs lua/p2/acquire_shared.lua, and
  -- its give-back lua/p2/release_shared.lua)
  local mode = th.mode or 'X'
  local proto, resent = C.first_protocol(c, mode), 0
  local script = mode == 'S' and 'acquire_shared' or 'acquire'
  trace(c, '%s polls %s: acquire attempt %d', th.name, e.name, nonce)
  local function answered(rep, how, acked)
    if not c.alive then return end
    local other = how == 'reply' and resent < C.RESENDS and C.resend_in(rep, proto)
    if other then
      -- the same attempt, its arguments unchanged, in the protocol the
      -- refusal names (it wrote nothing: the number is unused in Redis)
      trace(c, '%s: attempt %d of %s refused in protocol %d: sent again in protocol %d', th.name,
        nonce, e.name, proto, other)
      c.W.faults.proto_resend = (c.W.faults.proto_resend or 0) + 1
      resent, proto, sent = resent + 1, other, cnow(c)
      return c.W:request(c, script, e.name, e.keys, argv, {nonce = nonce, proto = proto}, answered)
    end
    e.state = 'NONE'
    if how ~= 'reply' then
      -- call_script failed: if it reached Redis, the outcome is unknown,
      -- and the renewal thread releases this attempt's grant (a give-back);
      -- it may have queued the client too (a wait's try): the last waiter
      -- to go takes the client out, as after a refusal (poll_loop)
      if how ~= 'unsent' then
        C.job(c, e, 'giveback', nonce, c.s.keep_ms * 1000, proto, mode)
        if not th.once then
          e.queued = true
          e.queue_proto = proto
        end
      end
      return poll_done(c, e, th.stop or 'EREDIS')
    end
    local unqueued = false
    if type(rep) == 'table' and rep.err and rep.err:find('^DLOCKMODE') then
      -- the client's lease of the other mode lives on in Redis (a release
      -- not confirmed, a lease found lost): a try of either mode (rpc.c,
      -- dlock_rpc_acquire) is refused as busy (pttl -1), written and
      -- queued nowhere; the poller tries again after its pause (a single
      -- try: EBUSY)
      c.W.faults.mode_refused = (c.W.faults.mode_refused or 0) + 1
      rep, unqueued = {n = 5, 0, -1, '', -1, -1}, true
    end
    if C.refused(rep) then
      -- refused in each protocol (the data changed between): no give-back,
      -- which would be refused the same way (dlock_rpc_acquire)
      c.W.faults.proto_refused = (c.W.faults.proto_refused or 0) + 1
      return poll_done(c, e, th.stop or 'ESERVER')
    end
    if type(rep) ~= 'table' or rep.err or rep.n < 2 then
      C.job(c, e, 'giveback', nonce, c.s.keep_ms * 1000, proto, mode)
      return poll_done(c, e, th.stop or 'EREDIS')
    end
    local granted, v = rep[1], rep[2]
    if th.stop then
      -- stopped during the call: a grant is given back in the background
      if granted == 1 then
        C.job(c, e, 'giveback', nonce, c.s.keep_ms * 1000, proto, mode)
      elseif granted == 0 and not th.once and not unqueued then
        e.queued = true -- the last waiter to go takes the client out
        e.queue_proto = proto -- (its leave's protocol)
      end
      return poll_done(c, e, th.stop)
    end
    if granted == 1 and c.s.min_replicas > 0 and (acked or 0) < c.s.min_replicas then
      -- dlock_rpc_acquire: a grant WAIT confirmed on too few replicas is
      -- given back (a failover could lose it) and the try fails
      c.W.faults.wait_short = (c.W.faults.wait_short or 0) + 1
      C.job(c, e, 'giveback', nonce, c.s.keep_ms * 1000, proto, mode)
      return poll_done(c, e, 'EREDIS')
    end
    if granted == 1 then
      if C.too_late(c.s, sent, cnow(c)) then
        C.job(c, e, 'giveback', nonce, c.s.keep_ms * 1000, proto, mode) -- answered too late
        return poll_done(c, e, 'EREDIS')
      end
      e.mode = mode
      take_grant(c, e, th, v, C.grant_valid(c.s, sent), rep[3], proto)
      return poll_done(c, e, 'OK')
    elseif granted == 0 then
      if th.once then return poll_done(c, e, 'EBUSY') end
      if not unqueued then
        e.queued = true
        e.queue_proto = proto -- (its leave's protocol)
      end
      e.try_mode = mode
      e.try_nonce = nonce
      e.try_sent = sent
      if e.msg and take_direct_grant(c, e) then return poll_done(c, e, 'OK') end
      local now = cnow(c)
      if now >= th.deadline then return poll_done(c, e, 'ETIMEDOUT') end
      local delay = c.s.fallback_us
      if v > 0 and v * 1000 < delay then delay = v * 1000 + 500 end
      delay = delay - c.W:rint(0, floor(delay / 4))
      local wake = math.min(now + delay, th.deadline)
      e.sleep = (e.sleep or 0) + 1
      local token = e.sleep
      e.sleeping = token
      c.W:at_client_clock(c, wake, function()
        if e.sleeping == token then C.wake_poller(c, e) end
      end)
    else
      return poll_done(c, e, 'EREDIS') -- a stale attempt: impossible here
    end
  end
  c.W:request(c, script, e.name, e.keys, argv, {nonce = nonce, proto = proto}, answered)
end

-- The poller wakes: a message, its fallback time, or its deadline.
function C.wake_poller(c, e)
  if not c.alive or not e.poller or not e.sleeping then return end
  e.sleeping = nil
  if e.msg and take_direct_grant(c, e) then return poll_done(c, e, 'OK') end
  if cnow(c) >= e.poller.deadline then return poll_done(c, e, 'ETIMEDOUT') end
  C.try(c, e)
end

-- dlock_release (release.c: dlock_release_outermost). The rule for local handoffs
-- is cfg.local_rule: 'clock' (excl.c, handoff_in_time: the k-th handoff of
-- a grant only once k us have passed on the client's clock since it took
-- the grant, less 1% for drift, so that its token is never ahead of the
-- server's clock), or 'passes' (the pass limit alone, as before 0.3: sim
-- --local-rule passes shows what that rule lets happen).
function C.release(th)
  local c, e, W = th.c, th.e, th.c.W
  if not c.alive then return end
  -- The holder thread exits instead (the thread-exit hook releases for it:
  -- on_thread_exit, abandon): its hold ends as DLOCK_UNCLEAN_ABANDONED.
  local ending = 0
  if W.cfg.faults.life and e.state ~= 'LOST' and W:rand() < 0.05 then
    ending = 1
    W.faults.abandoned = (W.faults.abandoned or 0) + 1
    trace(c, '%s exits holding %s', th.name, e.name)
  end
  e.owner = nil
  th.state = 'idle'
  if e.state == 'LOST' then
    trace(c, '%s releases %s: ELOST (found lost before)', th.name, e.name)
    if (e.unconfirmed or 0) > 0 then -- found lost by the renewal: recorded now
      C.unconfirmed_record(c, e, e.unconfirmed, e.unconfirmed_end)
    end
    e.state = 'NONE'
    W:released(c, e, th)
    C.think(th)
    return C.progress(e, c)
  end
  local now = cnow(c)
  local head
  for _, w in ipairs(e.queue) do
    if w.state == 'waiting' then head = w break end
  end
  -- (the shared worlds: a shared lease is not passed between threads,
  -- nor an exclusive one to a thread that wants the name shared)
  if C.may_pass(c.s, e, now, head ~= nil, c.closing) and (e.mode or 'X') ~= 'S'
     and (head.mode or 'X') == 'X' then
    -- A local handoff: the next token, to the head of the queue.
    e.passes = e.passes + 1
    e.token = e.token + 1
    dequeue(e, head)
    e.owner = head
    e.passing = true
    W:released(c, e, th)
    local tok = e.token
    trace(c, '%s passes %s to %s (token %.0f)', th.name, e.name, head.name, tok)
    -- It runs a moment later (take_handoff, take_direct_handoff): if the
    -- validity ran out meanwhile the lease is lost and it polls.
    W:after_client(c, W:thread_delay(c, W:rint(0, W.cfg.pass_us)), function()
      e.passing = false
      if not c.alive then return end
      if not C.takes(e, cnow(c)) then
        if e.state == 'HELD' then
          e.registered = false
          C.unconfirmed_record(c, e, e.token, 2) -- lost by validity alone
        end
        e.state = 'NONE'
        e.owner = nil
        table.insert(e.queue, 1, head)
        return C.progress(e, c)
      end
      head.state = 'holding'
      e.unclean = ending -- told how the hold before ended
      W:acquired(c, e, head, tok, true)
      finish(head, 'OK')
    end)
    C.think(th)
    return
  end
  e.registered = false -- dlock_renew_remove: no renewal after this point
  e.state = 'RELEASING'
  W:released(c, e, th)
  local argv = C.release_argv(c, e, ending)
  trace(c, '%s releases %s (grant %.0f, last %.0f)', th.name, e.name, e.grant_token, e.token)
  -- (in its grant's protocol: dlock_release_outermost; refused as the
  -- other protocol's data, once more in that one: dlock_rpc_release)
  local proto, resent = e.gproto, false
  local script = e.mode == 'S' and 'release_shared' or 'release'
  local function released(rep, how)
    if not c.alive then return end
    local other = how == 'reply' and not resent and C.resend_in(rep, proto)
    if other then
      trace(c, '%s: release of %s refused in protocol %d: sent again in protocol %d', th.name,
        e.name, proto, other)
      c.W.faults.proto_release_resend = (c.W.faults.proto_release_resend or 0) + 1
      resent, proto = true, other
      return W:request(c, script, e.name, e.keys, argv, {proto = proto}, released)
    end
    if how ~= 'reply' or type(rep) ~= 'number' or rep < 1 then
      -- the lease may still be ours in Redis, or ours again after a step
      -- back of the server's clock (unconfirmed.h)
      C.unconfirmed_record(c, e, e.token, (how == 'reply' and rep == 0) and 2 or ending)
    end
    e.state = 'NONE'
    C.think(th)
    C.progress(e, c)
  end
  W:request(c, script, e.name, e.keys, argv, {proto = proto}, released)
end

------------------------------------------------------------------------
-- dlock_rpc_leave (rpc.c), and the renewal thread's background jobs:
-- give-backs (dlock_renew_give_back) and leaves (dlock_renew_leave).

-- (dlock_rpc_leave: in the protocol of the try that queued the client,
-- e.queue_proto; refused as the other protocol's data, once more in that one)
function C.leave(c, e, n, background)
  local argv = {c.id, c.args.wake, e.name, c.args.ttl, tostring(n), c.args.keep}
  local proto, resent = e.queue_proto or c.protocol, false
  trace(c, 'leaves the queue of %s (call %d)', e.name, n)
  local function left(rep, how)
    local other = how == 'reply' and not resent and C.resend_in(rep, proto)
    if other then
      trace(c, 'leave of %s refused in protocol %d: sent again in protocol %d', e.name, proto, other)
      resent, proto = true, other
      return c.W:request(c, 'leave', e.name, e.keys, argv, {nonce = n, proto = proto}, left)
    end
    if how ~= 'reply' or type(rep) ~= 'number' then
      if not background then C.job(c, e, 'leave', n, 2 * c.s.waiter_ttl_ms * 1000, proto) end
    end
  end
  c.W:request(c, 'leave', e.name, e.keys, argv, {nonce = n, proto = proto}, left)
end

-- A background job in protocol `proto` (add_job: a give-back's is the
-- protocol its attempt was last sent in, a leave's that of the try that
-- queued the client); refused as the other protocol's data, it switches to
-- that one: a leave once, a give-back each time (C.run_job).
function C.job(c, e, kind, n, for_us, proto, mode)
  if not c.alive then return end
  local j = {kind = kind, e = e, n = n, until_t = cnow(c) + for_us, backoff = 100000,
             proto = proto or c.protocol, switched = false, mode = mode}
  c.jobs[#c.jobs + 1] = j
  trace(c, 'background %s of %s (%d)', kind, e.name, n)
  C.run_job(c, j)
end

function C.run_job(c, j)
  if not c.alive then return end
  local e = j.e
  local argv, script
  if j.kind == 'leave' then
    script = 'leave'
    argv = {c.id, c.args.wake, e.name, c.args.ttl, tostring(j.n), c.args.keep}
  else
    -- (a shared attempt's give-back: lua/p2/release_shared.lua)
    script = j.mode == 'S' and 'release_shared' or 'release'
    argv = {c.id, 'nonce', tostring(j.n), c.args.lease, '0', c.args.wake, e.name,
            c.args.ttl, c.args.keep, '0'}
  end
  local meta = {nonce = j.n, background = true, proto = j.proto}
  c.W:request(c, script, e.name, e.keys, argv, meta, function(rep, how)
    if not c.alive then return end
    local done
    if how == 'reply' and type(rep) == 'number' then
      done = j.kind == 'leave' or rep >= 1 -- job_result (renew_jobs.c)
    elseif how == 'reply' and C.refused(rep) then
      -- Refused as the other protocol's data: tried in that one after the
      -- pause (job_result). A leave once (its queue entry is both
      -- protocols', a direct grant or a turn may be in the other's data);
      -- a give-back at each refusal until its time is over: a grant of its
      -- attempt may be a direct grant of either protocol's release (the
      -- queue is both's), or come with a late copy of the attempt in the
      -- protocol it was sent in.
      local other = C.resend_in(rep, j.proto)
      if other and (j.kind == 'giveback' or not j.switched) then
        j.proto, j.switched = other, true
      else
        done = true -- refused again: its queue entry expires by itself
      end
    end
    if done and j.kind == 'giveback' and c.W.mixed then
      -- (the checker: no grant of this attempt was left standing)
      c.W:gave_back(c, e.name, j.n, meta)
    end
    if done or cnow(c) >= j.until_t then return end
    local wait = j.backoff
    j.backoff = math.min(j.backoff * 2, 1000000)
    c.W:after_client(c, wait, function() C.run_job(c, j) end)
  end)
end

------------------------------------------------------------------------
-- The renewal manager (renew_round.c, renew_thread.c): one round renews every registered grant.

function C.start_renewal(c)
  C.schedule_round(c, cnow(c) + c.s.period_us)
end

function C.schedule_round(c, at)
  c.round_gen = (c.round_gen or 0) + 1
  local gen = c.round_gen
  c.round_at = at
  c.W:at_client_clock(c, at + c.W:thread_delay(c, 0), function()
    if c.round_gen == gen then C.renew_round(c) end
  end)
end

-- dlock_renew_by: a round by then at the latest.
function C.renew_by(c, at)
  if not c.round_at or at < c.round_at then C.schedule_round(c, at) end
end

function C.renew_round(c)
  if not c.alive then return end
  if c.renewing then
    c.renew_again = true -- a kick during a round: another one right after
    return
  end
  local names = {}
  for name, e in pairs(c.entries) do
    if e.registered and e.state ~= 'NONE' and e.state ~= 'LOST' and e.state ~= 'RELEASING' then
      names[#names + 1] = name
    end
  end
  table.sort(names)
  if #names == 0 then
    if c.W.stopping then return end -- the schedule winds down
    return C.schedule_round(c, cnow(c) + c.s.period_us)
  end
  -- One renew call per protocol (renew_round.c: chunks of one protocol
  -- each, its script's), in the protocols' order, all in one round.
  local groups, by = {}, {}
  for _, name in ipairs(names) do
    local e = c.entries[name]
    local p = e.gproto or c.protocol
    local g = by[p]
    if not g then
      g = {proto = p, snap = {}, ks = {}, argv = {c.id, c.args.lease}, names = {}}
      by[p] = g
    end
    local i = #g.snap + 1
    g.snap[i] = {e = e, epoch = e.epoch}
    g.ks[i] = e.keys[1]
    g.argv[i + 2] = string.format('%.0f', e.grant_token)
    g.names[i] = name
  end
  for p = 1, 2 do groups[#groups + 1] = by[p] end
  local sent = cnow(c)
  c.renewing = true
  c.round_at = nil
  local waiting = #groups
  for _, g in ipairs(groups) do
    c.W:request(c, 'renew', g.names[1], g.ks, g.argv, {renew = g.snap, proto = g.proto},
      function(rep, how, acked)
        g.rep, g.how, g.acked = rep, how, acked
        waiting = waiting - 1
        if waiting == 0 then C.renewed(c, groups, sent) end
      end)
  end
end

-- A round's replies are in (renew_round.c: its verdicts applied, apply):
-- each call's verdicts count if it was answered, and, with min_replicas,
-- only if WAIT confirmed every call of the round.
function C.renewed(c, groups, sent)
  c.renewing = false
  if not c.alive then return end
  local now = cnow(c)
  -- with min_replicas, a round counts only once WAIT confirms it (one
  -- WAIT after the round's calls: every call answered must be confirmed)
  local answered, confirmed = true, true
  for _, g in ipairs(groups) do
    local rep = g.rep
    g.ok = g.how == 'reply' and type(rep) == 'table' and not rep.err and rep.n == #g.snap
    answered = answered and g.ok
    if g.ok and c.s.min_replicas > 0 and (g.acked or 0) < c.s.min_replicas then confirmed = false end
  end
  local ok = answered and confirmed
  local earliest = NEVER
  for _, g in ipairs(groups) do
    local counts = g.ok and confirmed
    for i, sn in ipairs(g.snap) do
      local e = sn.e
      if e.state == 'HELD' and e.epoch == sn.epoch and e.registered then
        local v = counts and g.rep[i] or -1
        local verdict, valid = C.verdict(c.s, e, v, sent, now)
        if verdict == 'renewed' then
          e.valid_until = valid
          e.provisional = false
          c.W:touch(e.name)
        elseif verdict == 'lost' then
          trace(c, 'renewal finds %s lost (grant %.0f)', e.name, e.grant_token)
          -- Redis may still have it, or have it again (unconfirmed.h)
          C.unconfirmed_end(e, e.token, 2)
          e.registered = false
          e.state = 'LOST'
          if not e.owner then
            -- nobody holds it: nobody to tell (take_handoff); the waiter
            -- that finds it records the end (dlock_acquire_run)
            C.unconfirmed_record(c, e, e.unconfirmed, e.unconfirmed_end)
            e.state = 'NONE'
            C.progress(e, c)
          end
        elseif e.valid_until < earliest then
          earliest = e.valid_until
        end
      end
    end
  end
  local nxt = now + (ok and c.s.period_us or c.s.retry_us)
  if earliest < nxt then nxt = earliest end
  if c.renew_again then
    c.renew_again = false
    nxt = now
  end
  C.schedule_round(c, nxt)
end

------------------------------------------------------------------------
-- The subscriber (client.c: wake_one, wake_all).

function C.message(c, msg)
  if not c.alive then return end
  local kind = msg:sub(1, 1)
  if kind == 'f' then
    local tok, name = msg:match('^f (%d+) (.+)$')
    local e = c.entries[name]
    trace(c, 'message "%s"', msg)
    if e and e.state == 'HELD' and e.grant_token == tonumber(tok) then
      C.renew_round(c) -- asks Redis; marks it lost only if Redis says so
    end
    return
  end
  -- (a direct grant: "g ..." and "u ..." from protocol 1's release, "G ..."
  -- and "U ..." from protocol 2's, lua/p2/release.lua: the grant is in the
  -- protocol of the release that made it)
  local nonce, tok, name, unclean
  local proto = (kind == 'G' or kind == 'U' or kind == 'S') and 2 or 1
  local mode = 'X'
  if kind == 'S' then
    -- a direct shared grant (lua/p2/release.lua, release_shared.lua):
    -- "S <end> <attempt> <token> <name>"
    unclean, nonce, tok, name = msg:match('^S (%d) (%d+) (%d+) (.+)$')
    unclean, nonce, tok = tonumber(unclean), tonumber(nonce), tonumber(tok)
    mode = 'S'
  elseif kind == 'g' or kind == 'G' then
    nonce, tok, name = msg:match('^[gG] (%d+) (%d+) (.+)$')
    nonce, tok = tonumber(nonce), tonumber(tok)
  elseif kind == 'u' or kind == 'U' then
    unclean, nonce, tok, name = msg:match('^[uU] (%d) (%d+) (%d+) (.+)$')
    unclean, nonce, tok = tonumber(unclean), tonumber(nonce), tonumber(tok)
  elseif kind == 'w' then
    name = msg:match('^w (.+)$')
  end
  trace(c, 'message "%s"', msg)
  local e = name and c.entries[name]
  if not e then return end
  -- (with min_replicas a direct grant is not taken from its message: the
  -- releaser's WAIT is not the taker's; the poller's next try confirms it)
  if nonce and e.poller and c.s.min_replicas == 0 then
    e.msg = {nonce = nonce, token = tok, unclean = unclean, proto = proto, mode = mode}
  end
  e.woken = true
  if e.sleeping then C.wake_poller(c, e) end
end

-- The subscriber reconnected: every poller tries again, a round goes now.
function C.resubscribed(c)
  if not c.alive then return end
  trace(c, 'subscriber reconnected: wakes every poller')
  -- (in the names' order: the order of pairs() over a table whose keys
  -- come and go depends on when the collector ran, and a seed must replay
  -- the same schedule whatever the allocations of a trace)
  for _, name in ipairs(c.W.names) do
    local e = c.entries[name]
    if e then
      e.woken = true
      if e.sleeping then C.wake_poller(c, e) end
    end
  end
  C.renew_round(c)
end

return C
