-- Trace conformance: replays a trace the C client recorded (a build with
-- DLOCK_TRACE, src/common/trace.h) through the model's rules
-- (sim/client.lua, "The model's rules") and reports the first step the
-- model would not take. Per client, per lock name, it keeps the model's
-- view of the entry (the lease's state, grant, token, passes, validity,
-- the poller's last refused try, the tokens of unconfirmed ends) and
-- checks every decision the C client recorded against it: the scripts'
-- arguments, a grant's validity and the answered-too-late rule, the take
-- rule of direct grants, every local handoff against the pass limit, the
-- validity margin and the clock rule, a passed lease taken only while
-- valid, the renewal's verdicts, releases, background releases of grants
-- of unknown outcome, and WAIT's acknowledgements; and the rule for two
-- protocols (sim/client.lua, its head): an attempt's first send is in the
-- client's setting, a resend only after its refusal (a `proto` line), in
-- the protocol the refusal names, at most C.RESENDS times, the same attempt
-- with the same arguments; a release is sent first in its grant's protocol
-- (the answered try's, or for a direct grant the one its message names), a
-- leave in that of the try that queued the client, and each, refused, again
-- once in the protocol the refusal names (relproto, leaveproto); a
-- give-back in the protocol its attempt was last sent in.
-- A trace of a client before these fields (no PROTOCOL on its open line,
-- no PROTO on the others) is read as protocol 1's throughout.
--
-- The lines, "<boot ns> <thread> <kind> <fields>" (strings escaped as
-- \xHH; the empty string as \x00), by kind:
--   names  ID PREFIX CLIENT_NAME WAKE_PREFIX
--   open   ID LEASE_MS PASS_LIMIT WAITER_TTL_MS KEEP_MS MIN_REPLICAS DRIFT_NS
--          HANDOFF_MARGIN_NS GRANT_MS GRANT_DRIFT_NS GRANT_MARGIN_NS FALLBACK_NS
--          PROTOCOL JOIN_NS                   (the setting: dlock_config.protocol; join_ms)
--   poll   NAME ONCE MADE MODE                a poll starts (poll_redis), MODE x or s (shared)
--   acq    NAME SENT KEYS(7) ARGV(10) PROTO   the acquire script sent in protocol PROTO
--                                             (dlock_rpc_acquire)
--   proto  NAME NONCE FROM TO                 attempt NONCE, sent in FROM, was refused as
--                                             protocol TO's data: it is sent again in TO
--                                             (the next acq of NAME; no rep for the refusal;
--                                             at most C.RESENDS times an attempt)
--   rep    NAME NONCE SENT GRANTED VALUE ACKED RC   its reply, as read (GRANTED -8: no
--                                             answer came; -9: none as an integer)
--   tried  NAME NONCE RC SENT ANSWERED STOP  the try's outcome for the poller
--   grant  NAME TOKEN UNCLEAN VALID_UNTIL GRANT_AT EPOCH   take_grant
--   msg    NAME NONCE TOKEN UNCLEAN STORED PROTOCOL SHARED   a wake-up message (wake_one); a
--                                             direct grant's protocol: g, u 1, G, U, S 2; S shared
--   dgrant NAME MSG_NONCE MSG_TOKEN TRY_NONCE TRY_SENT NOW TAKEN   take_direct_grant
--   rdec   NAME PASS NOW WAITERS PASSES TOKEN VALID_UNTIL PROVISIONAL CLOSING ENDING XWAITERS
--                                             an outermost release decides (XWAITERS: those
--                                             waiting exclusively, whom a handoff serves)
--   take   NAME TOKEN NOW OK                  an open handoff taken (take_handoff)
--   dtake  NAME TOKEN NOW OK                  a direct handoff taken (take_direct_handoff)
--   reent  NAME TOKEN NOW OK                  a reentrant acquire
--   ok     NAME TOKEN                         an acquire returns DLOCK_OK
--   rlost  NAME                               an outermost release of a lost lease
--   rel    NAME KEYS(7) ARGV(10) PROTO MODE   the release script sent, in PROTO (MODE x, s)
--   relproto NAME FROM TO                     it was refused as protocol TO's data: the
--                                             next rel of NAME sends it again in TO
--   released NAME RC                          its outcome, for the releaser
--   verdict NAME EPOCH V SENT NOW VALID_UNTIL a renewal's verdict applied
--   unconf NAME LAST END                      dlock_client_unconfirmed_end
--   giveback NAME NONCE PROTO MODE            a background release of an attempt, in PROTO
--   leave  NAME KEYS(7) ARGV(6) PROTO         a leave sent (its protocol checked)
--   leaveproto NAME FROM TO                   it was refused as protocol TO's data: the
--                                             next leave of NAME sends it again in TO
--   leavebg NAME NUMBER PROTO                 a leave left to the background (the same)
--   gaveup NAME RC WAITERS POLLER HELD LEASE PASSING   an acquire that failed, before the
--                                             leave's decision: the threads waiting (this
--                                             one included), a poller, a holder, the lease's
--                                             state (0 none), a lease passed on. When the
--                                             model has the client queued and this is the
--                                             last thread that wanted the name, the same
--                                             thread's next line of the name is its leave
-- and the shared mode's (src/local/shared.c; checked by sim/trace_shared.lua):
--   sinv   NAME HOLDERS                       a shared grant's holders, its poller and the
--                                             threads it invited (S2), before its grant line
--   stake  NAME TOKEN NOW OK XWAITERS         an invitation taken (or refused: OK 0)
--   sjoin  NAME TOKEN NOW OK XWAITERS         a join (S1) decided on its own reading NOW
--   sreent NAME TOKEN NOW OK NESTED           a reentrant shared acquire (NESTED: in an
--                                             exclusive hold, S4)
--   srel   NAME HOLDERS NOW                   a holder's outermost release, HOLDERS left (S5)
--   shandle NAME take|release ID              the calling thread's shared hold becomes
--                                             handle ID's (src/api/handle.c), or the
--                                             calling thread releases handle ID's: its
--                                             next srel or rlost is the handle's
--   sphase NAME OK HOLDERS TOKEN NOW SWAITERS XWAITERS CLOSING   after an exclusive
--                                             release kept no handoff: a reader phase (S8)
--   sem.*                                     the semaphore's (sim/trace_sem.lua checks them)
--   rl.*                                      Redlock mode's (sim/trace_redlock.lua checks them)
local C = require('client')
local SLOT = require('slot')
local SH = require('trace_shared') -- the shared mode's lines (its head)
local TS = require('trace_sem') -- the semaphore's lines (its head)
local RL = require('trace_redlock') -- Redlock mode's lines (its head)

local T = {}

-- The error codes of include/dlock.h.
local E = {OK = 0, EINVAL = -1, EBUSY = -2, ETIMEDOUT = -3, ENOTHELD = -4, ELOST = -5,
           EREDIS = -6, ENOMEM = -7, EFORK = -8, ECLOSED = -9, ESERVER = -10, ECANCELED = -11}
T.E = E

local function unesc(s)
  if s == '\\x00' then return '' end
  return (s:gsub('\\x(%x%x)', function(h) return string.char(tonumber(h, 16)) end))
end

local function split(line)
  local f = {}
  for w in line:gmatch('%S+') do f[#f + 1] = w end
  return f
end

local function num(s) return tonumber(s) end
local function us(ns) return tonumber(ns) / 1000 end

-- One trace file. Returns nil if it conforms, else a message naming the
-- line; and counts of what was checked.
function T.check_file(path)
  local fh, err = io.open(path, 'r')
  if not fh then return 'cannot read ' .. path .. ': ' .. err, {} end
  local stats = {lines = 0, grants = 0, passes = 0, takes = 0, verdicts = 0, tries = 0,
                 direct = 0, releases = 0, resends = 0, leaves_due = 0}
  local c -- the model's client
  local sem = TS.new(stats) -- the model of its semaphores
  local entries = {}
  local numbers = {} -- attempt numbers used by this client
  local lineno, fail = 0, nil
  local ev, f

  local function bad(fmt, ...)
    if not fail then
      fail = string.format('%s:%d: %s: ', path, lineno, f and f[3] or '?')
        .. string.format(fmt, ...)
    end
  end

  -- A protocol field: 1 or 2; absent (a trace before the field), 1.
  local function proto_field(v, what)
    if v == nil then return 1 end
    local p = tonumber(v)
    if p ~= 1 and p ~= 2 then
      bad('%s is %s, not a protocol this client speaks (1 or 2)', what, v)
      return 1
    end
    return p
  end

  local function entry(name)
    local e = entries[name]
    if not e then
      e = {name = name, state = 'NONE', grant_token = 0, token = 0, passes = 0, valid_until = 0,
           grant_at = 0, provisional = false, epoch = 0, try_nonce = 0, try_sent = 0,
           unconfirmed = 0, unconfirmed_end = 0, last_nonce = 0, givebacks = {}, msg = nil,
           protos = {}} -- attempt number -> the protocol it was last sent in
      entries[name] = e
    end
    return e
  end

  -- the entry's keys, as dlock_table_create builds them
  local function keys(name)
    local k = c.prefix .. '{' .. name .. '}'
    return {k, k .. ':fence', k .. ':q', k .. ':qd', k .. ':turn', k .. ':c:' .. c.id,
            c.prefix .. 'hw:{' .. SLOT.tag(SLOT.of(k)) .. '}'}
  end

  local function same_list(want, got, first, what)
    for i, w in ipairs(want) do
      if got[first + i - 1] ~= w then
        bad('%s %d is %q, the model sends %q', what, i, tostring(got[first + i - 1]), w)
        return false
      end
    end
    return true
  end

  -- C times are integer ns; the model's in us: equal within a nanosecond.
  local function same_time(a_us, b_ns) return math.abs(a_us * 1000 - b_ns) < 1.5 end

  -- The unconfirmed set (src/local/unconfirmed.c): records per name, kept
  -- keep_ms from their last write.
  local uset = {}
  local function set_value(name, now)
    local r = uset[name]
    if r and r.until_ns > now then return r.token, r.end_ end
    return 0, 0
  end

  -- Deferred checks: a give-back due for an attempt, checked at the entry's
  -- next event (the C client records it right after).
  local function settle(e)
    if e.giveback_due and not e.givebacks[e.giveback_due] then
      bad('attempt %d of %s needed a background release (its grant, if any, would stay '
        .. 'until it expires) and none was started', e.giveback_due, e.name)
    end
    e.giveback_due = nil
  end

  local function need_giveback(e, nonce) e.giveback_due = nonce end

  for line in fh:lines() do
    lineno = lineno + 1
    if fail then break end
    f = split(line)
    if #f < 3 then break end -- a cut line at the end of a trace whose process died
    if #f < 4 then bad('a line without its fields') break end
    stats.lines = stats.lines + 1
    local stamp, tid, kind = num(f[1]), f[2], f[3]
    if kind == 'names' then
      c = c or {}
      c.id = unesc(f[4])
      c.prefix, c.name, c.wake = unesc(f[5]), unesc(f[6]), unesc(f[7])
    elseif kind == 'open' then
      if not c then bad('open before names') break end
      local cfg = {lease_ms = num(f[5]), pass_limit = num(f[6]), waiter_ttl_ms = num(f[7]),
                   local_rule = 'clock', join_ms = f[17] and num(f[17]) / 1e6}
      c.s = C.settings(cfg)
      c.min_replicas = num(f[9])
      local s = c.s
      local want = {{'keep_ms', num(f[8]), s.keep_ms}, {'drift', num(f[10]), s.drift_us * 1000},
        {'handoff margin', num(f[11]), s.handoff_margin_us * 1000}, {'grant_ms', num(f[12]), s.grant_ms},
        {'grant drift', num(f[13]), s.grant_drift_us * 1000},
        {'grant margin', num(f[14]), s.grant_margin_us * 1000},
        {'fallback', num(f[15]), s.fallback_us * 1000}}
      for _, w in ipairs(want) do
        if math.abs(w[2] - w[3]) > 0.5 then
          bad('the client derives %s %.0f from its settings; the model %.0f', w[1], w[2], w[3])
        end
      end
      c.args = {lease = f[5], pl = f[6], ttl = f[7], keep = f[8], wake = c.wake}
      c.protocol = proto_field(f[16], 'the setting')
    elseif not c or not c.s then
      bad('an event before the client opened')
    elseif kind == 'rl.open' then
      RL.open({c = c, bad = bad}, f)
    elseif kind:sub(1, 4) == 'sem.' then
      local why = sem:line(c, f)
      if why then bad('%s', why) end
    else
      local e = entry(unesc(f[4]))
      local s = c.s
      if kind ~= 'giveback' and kind ~= 'unconf' and kind ~= 'msg' and kind ~= 'rep' and
        kind ~= 'rl.giveback' and kind ~= 'rl.leave' then
        settle(e) -- (not at a background job's line, which may come in between)
      end
      -- (a leave due: the giving-up thread's next line of the name)
      if e.leave_due == tid then
        if kind ~= 'leave' and kind ~= 'leavebg' then
          bad('the last thread waiting for %s gave up while the client was queued in Redis and '
            .. 'sent no leave (its queue entry would stay until its waiter ttl)', e.name)
        end
        e.leave_due = nil
      end
      local X = {c = c, bad = bad, stats = stats, need_giveback = need_giveback, numbers = numbers}
      if SH.line(X, e, kind, f, tid, stamp) then
        -- (a line of the shared mode: sim/trace_shared.lua)
      elseif RL.line(X, e, kind, f, stamp) then
        -- (a line of Redlock mode: sim/trace_redlock.lua)
      elseif kind == 'poll' then
        if e.state ~= 'NONE' and e.state ~= 'LOST' then
          bad('a poll of %s while its lease is %s', e.name, e.state)
        end
        local made = num(f[6])
        if e.made and made ~= e.made then
          -- the entry was freed and made anew (a new entry knows no
          -- unconfirmed end of its own: the set's, if any, is what counts)
          e.unconfirmed, e.unconfirmed_end = 0, 0
        end
        e.made = made
        e.poll_once = f[5] == '1'
        e.state = 'NONE'
        e.try_nonce, e.try_sent, e.msg = 0, 0, nil -- a new wait
        e.once = f[5] == '1'
        e.polling = true
      elseif kind == 'acq' and e.resend and e.pending then
        -- the same attempt again, in the protocol that refused it named
        stats.resends = stats.resends + 1
        local sent = num(f[5])
        local nonce = num(f[15])
        local proto = proto_field(f[23], 'the acquire\'s protocol')
        local x, p = e.resend, e.pending
        e.resend = nil
        if nonce ~= x.nonce then
          bad('attempt %d of %s sent after attempt %d was refused as protocol %d\'s data: not the '
            .. 'same attempt again', nonce, e.name, x.nonce, x.to)
        elseif proto ~= x.to then
          bad('attempt %d of %s, refused as protocol %d\'s data, sent again in protocol %d', nonce,
            e.name, x.to, proto)
        elseif table.concat(f, ' ', 6, 22) ~= p.args then
          bad('attempt %d of %s sent again with other keys or arguments', nonce, e.name)
        end
        if sent > stamp then bad('sent at %.0f, after it was recorded (%.0f)', sent, stamp) end
        if sent < p.sent then bad('attempt %d sent again at %.0f, before its last send (%.0f)', nonce,
          sent, p.sent) end
        p.sent, p.proto, p.resends = sent, proto, (p.resends or 0) + 1
        e.protos[nonce] = proto
      elseif kind == 'acq' then
        stats.tries = stats.tries + 1
        local sent = num(f[5])
        local nonce = num(f[15]) -- (ARGV[3], after the 7 keys)
        local proto = proto_field(f[23], 'the acquire\'s protocol')
        if not e.polling then bad('an acquire of %s outside a poll', e.name) end
        if e.pending then bad('attempt %d of %s sent while attempt %d is unanswered', nonce,
          e.name, e.pending.nonce) end
        if numbers[nonce] then bad('attempt number %d used twice', nonce) end
        numbers[nonce] = true
        if nonce <= e.last_nonce then
          bad('attempt %d of %s after attempt %d: Redis would refuse it as stale', nonce, e.name,
            e.last_nonce)
        end
        e.last_nonce = nonce
        if proto ~= C.first_protocol(c, e.mode) then
          bad('attempt %d of %s sent first in protocol %d; the client\'s setting is %d', nonce,
            e.name, proto, c.protocol)
        end
        e.protos[nonce] = proto
        if sent > stamp then bad('sent at %.0f, after it was recorded (%.0f)', sent, stamp) end
        local k = {}
        for i = 5 + 1, 5 + 7 do k[#k + 1] = unesc(f[i]) end
        local a = {}
        for i = 13, 22 do a[#a + 1] = unesc(f[i]) end
        same_list(keys(e.name), k, 1, 'key')
        -- what the client knows of unconfirmed ends: the entry's, or the
        -- set's if higher (the entry was freed and made anew meanwhile: poll)
        local sv, se = set_value(e.name, stamp)
        local model = {unconfirmed = math.max(e.unconfirmed, sv),
                       unconfirmed_end = e.unconfirmed >= sv and e.unconfirmed_end or se}
        -- (the poller keeps the set's in the entry too, so that a grant,
        -- which goes above it, clears both: poll_redis)
        e.unconfirmed, e.unconfirmed_end = model.unconfirmed, model.unconfirmed_end
        same_list(C.acquire_argv(c, model, nonce, a[6] == '0'), a, 1, 'acquire argument')
        if (a[6] == '0') ~= e.once then bad('a single try sent as a waiting one, or back') end
        e.pending = {nonce = nonce, sent = sent, proto = proto, args = table.concat(f, ' ', 6, 22)}
        e.state = 'ACQ'
      elseif kind == 'proto' then
        -- attempt NONCE refused as protocol TO's data: sent again in TO
        local nonce, from, to = num(f[5]), num(f[6]), num(f[7])
        local p = e.pending
        if not p or p.nonce ~= nonce or p.rep then
          bad('attempt %d of %s refused, which is not the one sent and unanswered', nonce, e.name)
        elseif (p.resends or 0) >= C.RESENDS then
          bad('attempt %d of %s refused after %d resends, to be sent again: the rule sends it '
            .. 'again %d times at most', nonce, e.name, p.resends, C.RESENDS)
        elseif from ~= p.proto then
          bad('attempt %d of %s refused in protocol %d; it was sent in %d', nonce, e.name, from, p.proto)
        elseif (to ~= 1 and to ~= 2) or to == from then
          bad('attempt %d of %s, sent in protocol %d, to be sent again in protocol %d', nonce, e.name,
            from, to)
        end
        e.resend = {nonce = nonce, to = to}
      elseif kind == 'rep' then
        local nonce = num(f[5])
        if e.resend then
          bad('a reply to attempt %d of %s after its refusal, before it was sent again', nonce, e.name)
        end
        if not e.pending or e.pending.nonce ~= nonce then
          bad('a reply to attempt %d of %s, which is not the one sent', nonce, e.name)
        else
          e.pending.rep = {sent = f[6] == '1', granted = num(f[7]), value = num(f[8]),
                           acked = num(f[9]), rc = num(f[10])}
          local r = e.pending.rep
          if r.granted == 1 and c.min_replicas > 0 and r.acked < c.min_replicas then
            if r.rc == E.OK then
              bad('attempt %d granted with %d of the %d replicas WAIT asks for: taken', nonce,
                r.acked, c.min_replicas)
            elseif not e.givebacks[nonce] then
              bad('attempt %d granted short of replicas and not given back', nonce)
            end
          elseif r.granted == 1 and r.rc ~= E.OK then
            bad('attempt %d granted but reported %d', nonce, r.rc)
          end
        end
      elseif kind == 'tried' then
        local nonce, rc, sent, answered, stop = num(f[5]), num(f[6]), num(f[7]), num(f[8]), num(f[9])
        local p = e.pending
        e.pending = nil
        e.state = 'NONE'
        if not p or p.nonce ~= nonce or not p.rep then
          bad('the outcome of attempt %d of %s, which was not sent or not answered', nonce, e.name)
        elseif sent ~= p.sent then
          bad('attempt %d: send time %.0f, recorded %.0f', nonce, sent, p.sent)
        else
          local r = p.rep
          -- (a grant took the client out of the queue, taken or not)
          if r.granted == 1 then e.queued = false end
          if r.rc == E.OK and C.too_late(s, us(sent), us(answered)) then
            if rc == E.OK then
              bad('attempt %d answered %.3f ms after its send, past its validity (%.3f ms): '
                .. 'taken', nonce, (answered - sent) / 1e6, (C.grant_valid(s, 0)) / 1000)
            end
            need_giveback(e, nonce)
          elseif r.rc == E.OK and rc ~= E.OK and stop == 0 then
            bad('attempt %d granted in time but not taken (rc %d)', nonce, rc)
          elseif r.rc ~= E.OK and rc == E.OK then
            bad('attempt %d failed (rc %d) but taken', nonce, r.rc)
          end
          -- (refused, written nowhere: granted 0, or EBUSY from an error
          -- reply, DLOCKMODE or a shared try on protocol 1's data, which
          -- the model reads as {0, -1}: sim/client.lua, C.try)
          local refused = r.granted == 0 or r.rc == E.EBUSY
          if r.rc ~= E.OK and r.sent and not refused and r.granted ~= -1 and
             rc ~= E.ESERVER then
            need_giveback(e, nonce) -- outcome unknown
          end
          if rc == E.OK and stop ~= 0 then need_giveback(e, nonce) end
          if rc == E.OK and stop == 0 then
            e.expect = {token = r.value, valid = C.grant_valid(s, us(sent)), direct = false,
                        tid = tid, proto = p.proto}
          end
          if refused and not e.once then
            e.try_nonce, e.try_sent = nonce, us(sent)
          end
        end
        -- the protocol of the try that queued the client: its leave's
        -- (poll_redis, dlock_acquire_run)
        if p and rc == E.EBUSY and not e.once then e.queue_proto, e.queued = p.proto, true end
        -- (and of a try sent that no answer came for: it may have queued
        -- the client, which leaves as after a refusal: poll_loop)
        if p and p.rep and p.rep.sent and p.rep.granted == -8 and not e.once then
          e.queue_proto, e.queued = p.proto, true
        end
      elseif kind == 'msg' then
        if f[8] == '1' then
          e.msg = {nonce = num(f[5]), token = num(f[6]), unclean = num(f[7]),
                   proto = proto_field(f[9], 'a message\'s protocol')}
        end
      elseif kind == 'dgrant' then
        stats.direct = stats.direct + 1
        local mn, mt, tn, ts, now, taken = num(f[5]), num(f[6]), num(f[7]), us(f[8]), us(f[9]),
          f[10] == '1'
        if tn ~= e.try_nonce or (tn ~= 0 and math.abs(ts - e.try_sent) > 0.0015) then
          bad('the poller of %s remembers try %d sent at %.0f; the model %d at %.0f', e.name, tn,
            ts * 1000, e.try_nonce, e.try_sent * 1000)
        elseif not e.msg or e.msg.nonce ~= mn or e.msg.token ~= mt then
          bad('a direct grant (attempt %d, token %.0f) that no stored message carried', mn, mt)
        end
        local want = C.direct_takes(s, mn, e.try_nonce, e.try_sent, now)
        if want ~= taken then
          bad('direct grant under attempt %d (last refused try %d): %s, the model %s', mn,
            e.try_nonce, taken and 'taken' or 'dropped', want and 'takes it' or 'drops it')
        end
        local proto = e.msg and e.msg.proto or 1
        e.msg = nil
        if taken then
          -- in the protocol of the release that made it, which its message
          -- names
          e.expect = {token = mt, valid = C.direct_valid(s, e.try_sent), direct = true, tid = tid,
                      proto = proto}
        end
      elseif kind == 'grant' then
        stats.grants = stats.grants + 1
        local token, valid, at, epoch = num(f[5]), num(f[7]), num(f[8]), num(f[9])
        local x = e.expect
        e.expect = nil
        if not x then
          bad('a grant of %s (token %.0f) that no answer or message made', e.name, token)
        elseif x.token ~= token then
          bad('a grant of %s with token %.0f; Redis gave %.0f', e.name, token, x.token)
        elseif not same_time(x.valid, valid) then
          bad('a grant of %s valid until %.0f; the model: %.0f (%s)', e.name, valid, x.valid * 1000,
            x.direct and 'the named try\'s send + min(waiter ttl, lease) - drift'
              or 'the send + lease - drift')
        end
        if epoch ~= e.epoch + 1 and epoch ~= 1 and not sem:epoch_before(e.name, epoch) then
          bad('grant epoch %d after %d', epoch, e.epoch)
        end
        e.state, e.grant_token, e.token, e.passes = 'HELD', token, token, 0
        e.gproto = x and x.proto
        e.valid_until, e.grant_at, e.provisional, e.epoch = us(valid), us(at), x and x.direct, epoch
        e.unconfirmed, e.unconfirmed_end = 0, 0
        uset[e.name] = nil
        e.owner, e.polling = tid, false
        e.queued = false -- (the acquire script took the client out of the queue)
      elseif kind == 'rdec' then
        local pass, now, waiters, passes, token, valid, prov, closing, ending =
          f[5] == '1', us(f[6]), num(f[14] or f[7]), num(f[8]), num(f[9]), num(f[10]),
          f[11] == '1', f[12] == '1', num(f[13]) -- (waiters: those waiting exclusively)
        if e.state ~= 'HELD' then
          bad('a release of %s whose lease is %s', e.name, e.state)
        elseif passes ~= e.passes or token ~= e.token then
          bad('a release of %s after %d passes at token %.0f; the model: %d at %.0f', e.name,
            passes, token, e.passes, e.token)
        elseif not same_time(e.valid_until, valid) then
          bad('%s valid until %.0f; the model: %.0f', e.name, valid, e.valid_until * 1000)
        elseif prov ~= (e.provisional and true or false) then
          bad('%s provisional %s; the model %s', e.name, tostring(prov), tostring(e.provisional))
        end
        local want = C.may_pass(s, e, now, waiters > 0, closing)
        if want ~= pass then
          bad('a release of %s with %d waiting, %d passes, %.3f ms of validity left, %.3f ms '
            .. 'after its grant: %s; the model %s', e.name, waiters, passes,
            (e.valid_until - now) / 1000, (now - e.grant_at) / 1000,
            pass and 'passed on' or 'given back', want and 'passes it on' or 'gives it back')
        end
        e.owner = nil
        if pass then
          stats.passes = stats.passes + 1
          e.passes, e.token = e.passes + 1, e.token + 1
        else
          e.state, e.ending = 'RELEASING', ending
        end
      elseif kind == 'take' or kind == 'dtake' then
        stats.takes = stats.takes + 1
        local token, now, ok = num(f[5]), us(f[6]), f[7] == '1'
        local lost = e.state == 'LOST'
        if e.state ~= 'HELD' and not lost then
          bad('%s of %s, whose lease is %s', kind, e.name, e.state)
        elseif token ~= e.token then
          bad('%s of %s at token %.0f; the model passed %.0f', kind, e.name, token, e.token)
        end
        local want = C.takes(e, now)
        if want ~= ok then
          bad('%s of %s with %.3f ms of validity left (%s): %s; the model %s', kind, e.name,
            (e.valid_until - now) / 1000, e.state, ok and 'taken' or 'refused',
            want and 'takes it' or 'refuses it')
        end
        if ok then
          e.owner = tid
        else
          if not lost then C.unconfirmed_end(e, e.token, 2) end
          e.state = 'NONE'
        end
      elseif kind == 'reent' then
        local token, now, ok = num(f[5]), us(f[6]), f[7] == '1'
        if e.owner ~= tid then bad('a reentrant acquire of %s by a thread that does not own it', e.name) end
        local want = C.takes(e, now)
        if want ~= ok then
          bad('a reentrant acquire of %s with %.3f ms of validity left: %s; the model %s', e.name,
            (e.valid_until - now) / 1000, ok and 'granted' or 'refused', want and 'grants' or 'refuses')
        end
      elseif kind == 'ok' then
        local token = num(f[5])
        if e.owner ~= tid then
          bad('DLOCK_OK for %s returned to a thread the model did not make its owner', e.name)
        elseif token ~= e.token then
          bad('DLOCK_OK for %s with token %.0f; the holder\'s token is %.0f', e.name, token, e.token)
        end
      elseif kind == 'rlost' then
        if e.state ~= 'LOST' then bad('a release of %s reported lost, which is %s', e.name, e.state) end
        e.state, e.owner = 'NONE', nil
      elseif kind == 'rel' and e.rel and e.rel.to then
        -- the release again, in the protocol its refusal named (relproto)
        local proto = proto_field(f[22], 'the release\'s protocol')
        if e.state ~= 'RELEASING' then bad('a release script for %s, which is %s', e.name, e.state) end
        if proto ~= e.rel.to then
          bad('the release of %s, refused as protocol %d\'s data, sent again in protocol %d', e.name,
            e.rel.to, proto)
        elseif table.concat(f, ' ', 5, 21) ~= e.rel.args then
          bad('the release of %s sent again with other keys or arguments', e.name)
        end
        e.rel.proto, e.rel.to = proto, nil
      elseif kind == 'rel' then
        stats.releases = stats.releases + 1
        if e.state ~= 'RELEASING' then bad('a release script for %s, which is %s', e.name, e.state) end
        local k, a = {}, {}
        for i = 5, 11 do k[#k + 1] = unesc(f[i]) end
        for i = 12, 21 do a[#a + 1] = unesc(f[i]) end
        same_list(keys(e.name), k, 1, 'key')
        same_list(C.release_argv(c, e, (e.ending or 0) > 0 and 1 or 0), a, 1, 'release argument')
        local proto = proto_field(f[22], 'the release\'s protocol')
        if e.gproto and proto ~= e.gproto then
          bad('the release of %s (token %.0f) sent in protocol %d; its grant is protocol %d\'s',
            e.name, e.grant_token, proto, e.gproto)
        end
        e.rel = {proto = proto, args = table.concat(f, ' ', 5, 21)}
      elseif kind == 'relproto' then
        -- the release refused as protocol TO's data: sent again in TO, once
        local from, to = num(f[5]), num(f[6])
        if e.state ~= 'RELEASING' or not e.rel then
          bad('a release of %s refused, which sent none', e.name)
        elseif e.rel.resent then
          bad('the release of %s refused again and sent a third time: the rule sends it again once',
            e.name)
        elseif from ~= e.rel.proto then
          bad('the release of %s refused in protocol %d; it was sent in %d', e.name, from, e.rel.proto)
        elseif (to ~= 1 and to ~= 2) or to == from then
          bad('the release of %s, sent in protocol %d, to be sent again in protocol %d', e.name, from,
            to)
        else
          e.rel.to, e.rel.resent = to, true
        end
      elseif kind == 'released' then
        local rc = num(f[5])
        if e.state ~= 'RELEASING' then bad('a release of %s ended, which is %s', e.name, e.state) end
        if e.rel and e.rel.to then
          bad('the release of %s ended after its refusal, before it was sent again', e.name)
        end
        RL.released(X, e, rc)
        e.rel = nil
        if rc ~= E.OK then
          e.expect_unconf = {e.token, rc == E.ELOST and 2 or (e.ending or 0)}
        end
        e.state = 'NONE'
      elseif kind == 'verdict' then
        stats.verdicts = stats.verdicts + 1
        local epoch, v, sent, now, valid = num(f[5]), num(f[6]), us(f[7]), us(f[8]), num(f[9])
        if e.state ~= 'HELD' or epoch ~= e.epoch then
          bad('a renewal verdict on %s for grant epoch %d; the model has epoch %d, %s', e.name,
            epoch, e.epoch, e.state)
        elseif not same_time(e.valid_until, valid) then
          bad('%s valid until %.0f before its renewal; the model: %.0f', e.name, valid,
            e.valid_until * 1000)
        end
        local verdict, nv = C.verdict(s, e, v, sent, now)
        if verdict == 'renewed' then
          e.valid_until, e.provisional = nv, false
        elseif verdict == 'lost' then
          C.unconfirmed_end(e, e.token, 2)
          e.state = 'LOST'
        end
      elseif kind == 'unconf' then
        local last, end_ = num(f[5]), num(f[6])
        local x = e.expect_unconf
        e.expect_unconf = nil
        if x and (x[1] ~= last or x[2] ~= end_) then
          bad('the failed release of %s recorded as token %.0f end %d; the model: %.0f end %d',
            e.name, last, end_, x[1], x[2])
        end
        C.unconfirmed_end(e, last, end_)
        uset[e.name] = {token = e.unconfirmed, end_ = e.unconfirmed_end,
                        until_ns = stamp + c.s.keep_ms * 1e6}
      elseif kind == 'giveback' then
        local nonce = num(f[5])
        local proto = proto_field(f[6], 'the give-back\'s protocol')
        e.givebacks[nonce] = true
        -- (a direct grant the client could not take goes back in the
        -- protocol of its message: take_direct_grant)
        local want = e.expect and e.expect.direct and e.expect.proto or e.protos[nonce]
        if want and proto ~= want then
          bad('the give-back of attempt %d of %s in protocol %d; the attempt was last sent in %d',
            nonce, e.name, proto, want)
        end
      elseif kind == 'leave' then
        -- in the protocol of the try that queued the client, or, after a
        -- refusal (leaveproto), again in the one it named, once
        e.queued = false
        local proto = proto_field(f[18], 'the leave\'s protocol')
        local number, args = f[16], table.concat(f, ' ', 5, 17)
        local lv = e.lv
        if lv and lv.to then
          if proto ~= lv.to then
            bad('the leave of %s, refused as protocol %d\'s data, sent again in protocol %d', e.name,
              lv.to, proto)
          elseif args ~= lv.args then
            bad('the leave of %s sent again with other keys or arguments', e.name)
          end
          lv.proto, lv.to = proto, nil
        else
          if e.queue_proto and proto ~= e.queue_proto then
            bad('a leave of %s in protocol %d; the try that queued the client was sent in %d',
              e.name, proto, e.queue_proto)
          end
          e.lv = {number = number, proto = proto, args = args}
        end
      elseif kind == 'gaveup' then
        local waiters, poller, held, lease, passing = num(f[6]), num(f[7]), num(f[8]), num(f[9]),
          num(f[10])
        if e.queued and waiters == 1 and poller == 0 and held == 0 and lease == 0 and passing == 0 then
          e.leave_due = tid
          stats.leaves_due = stats.leaves_due + 1
        end
      elseif kind == 'leaveproto' then
        local from, to = num(f[5]), num(f[6])
        local lv = e.lv
        if not lv or lv.to then
          bad('a leave of %s refused, which sent none', e.name)
        elseif lv.resent then
          bad('the leave of %s refused again and sent a third time: the rule sends it again once',
            e.name)
        elseif from ~= lv.proto then
          bad('the leave of %s refused in protocol %d; it was sent in %d', e.name, from, lv.proto)
        elseif (to ~= 1 and to ~= 2) or to == from then
          bad('the leave of %s, sent in protocol %d, to be sent again in protocol %d', e.name, from, to)
        else
          lv.to, lv.resent = to, true
        end
      elseif kind == 'leavebg' then
        -- the protocol of the leave of that number last sent, or (none sent)
        -- of the try that queued the client
        e.queued = false
        local proto = proto_field(f[6], 'the leave\'s protocol')
        local want = e.lv and e.lv.number == f[5] and e.lv.proto or e.queue_proto
        if want and proto ~= want then
          bad('a background leave of %s in protocol %d; the rule sends it in %d', e.name, proto, want)
        end
      end
      SH.after(X, e, kind, f, tid, stamp)
      if e.expect_unconf and kind ~= 'released' and kind ~= 'unconf' then
        bad('the failed release of %s left no record of its tokens (unconfirmed.h)', e.name)
      end
    end
  end
  fh:close()
  return fail, stats
end

return T
