-- Trace conformance of the counting semaphore's C tier (src/local/sem.c,
-- sem_rpc.c; its renewal verdicts and background give-backs in
-- src/global/renew_*.c): replays the semaphore's lines of a trace (kinds
-- "sem.*"; sim/trace.lua hands them here) through the rules of the
-- simulator's model of that tier (sim/sem.lua, S.rule: the functions its
-- world calls too) and reports the first one the model would not have
-- written. Per client and name it keeps the model's entry (lease, permits
-- held and in use, generation, passes, validity, grant epoch, the attempt
-- in doubt, whether the client is queued, the call out) and each thread's
-- record of its permits, and checks:
--   - every try's keys and arguments are the model's for that state (the
--     attempt in doubt named, ARGV[10]); a client's calls on a name go one
--     at a time (M2), their numbers rising, an attempt number never used
--     twice but by the one resend of a try whose outcome was unknown;
--   - a try's outcome: granted, refused, in doubt, as the reply and the
--     answered-too-late rule make it; the attempt in doubt and the queue
--     flag it leaves;
--   - a grant: the permits counted are Redis's total (the reply), their
--     validity the send + lease - drift, the generation and epoch the
--     model's;
--   - a permit taken: a spare one only while the model has one spare with
--     the handoff margin left, every one only while the lease is HELD and
--     valid (sem.lua's invariant `valid`), and never more in use than held;
--   - a release: the thread's record as the model keeps it (M4, M8: a
--     permit of an older generation is released as lost), passed on
--     exactly when the rule allows (waiters, passes vs pass_limit, margin),
--     reported run out exactly when its validity has; the spare permits
--     given back are the model's count; a release answered 0 marks the
--     permits lost;
--   - renewal verdicts: the validity or loss the rule gives (a 1 answered
--     after the validity ran out is a loss: commit 879a122);
--   - lost permits settled only when lost, into the model's generation;
--   - a leave names the attempt in doubt; an attempt in doubt that nobody
--     will name is given back in the background (checked where a thread
--     leaves the entry); a give-back names an attempt in doubt; a "P"
--     message names an attempt this client queued.
--
-- In Redlock mode a try's lines are sem.rltry and sem.rlgranted, and a
-- renewal's sem.rlverdict (TS:redlock, below, with their checks).
-- The lines (times on the boot clock, ns), by kind:
--   sem.try    NAME SENT MADE KEYS(7) ARGV(12)   the acquire script sent (sem_rpc.c), by
--                                             the entry MADE (a name's entry made anew
--                                             starts its generation and epoch at 0)
--   sem.rep    NAME NONCE SENT ANSWERED K V ACKED RC   its outcome: SENT 1 if it may have
--                                             run, ANSWERED 1 if Redis answered, the reply's
--                                             two integers K V (K -9: none), the call's rc
--   sem.tried  NAME NONCE RC NOW IN_DOUBT DOUBT QUEUED   the poller's verdict on the try
--                                             (NOW: the answered-too-late rule's reading)
--   sem.grant  NAME HELD IN_USE GEN VALID EPOCH   apply_grant's outcome
--   sem.take   NAME HOW NOW GEN HELD IN_USE   a thread takes a permit: HOW s a spare one,
--                                             g its try's grant, q passed to it in the queue
--   sem.rec    NAME PERMITS LOST GEN          a releasing thread's record, before M8
--   sem.give   NAME HOW NOW WAITING PASSES RANOUT HELD IN_USE   a release decides: HOW l
--                                             lost, q passed to the queue's head, p to the
--                                             poller, b given back (IN_USE after its own)
--   sem.back   NAME N HELD                    give_back: N spare permits go back
--   sem.rel    NAME NUMBER COUNT              the release script sent (sem_rpc.c)
--   sem.backrc NAME RC                        its outcome, for give_back
--   sem.ranout NAME NOW                       a permit passed in the queue found run out
--                                             when its thread ran: the lease is lost (M8)
--   sem.settle NAME GEN                       lost permits settled (M8): the new generation
--   sem.verdict NAME EPOCH V SENT NOW VALID   a renewal's verdict (V 1, 0, -1 no answer)
--   sem.leave  NAME NUMBER GAVE_UP            the leave script sent (sem_rpc.c)
--   sem.giveback NAME NONCE NUMBER            a background give-back of attempt NONCE
--   sem.left   NAME WAITING CALLING           a thread leaves the entry (sem.c, leave)
--   sem.msg    NAME ATTEMPT DOUBT             a "P" message: a direct grant to ATTEMPT
--   sem.handle NAME take|release ID GEN       a permit of generation GEN moves from the
--                                             thread's record to handle ID's
--                                             (src/api/handle.c), or the thread gives
--                                             handle ID's back: its next sem.rec and
--                                             sem.give are the handle's
local S = require('sem')
local SLOT = require('slot')
local rule = S.rule

local TS = {}
TS.__index = TS

local OK, EBUSY, ELOST = 0, -2, -5

local function unesc(s)
  if s == '\\x00' then return '' end
  return (s:gsub('\\x(%x%x)', function(h) return string.char(tonumber(h, 16)) end))
end

local num = tonumber

-- stats: trace.lua's counts, to which the semaphore's are added.
function TS.new(stats)
  for _, k in ipairs({'sem_tries', 'sem_grants', 'permits', 'sem_passes', 'sem_releases',
                      'sem_verdicts', 'sem_givebacks', 'sem_direct'}) do
    stats[k] = stats[k] or 0
  end
  return setmetatable({entries = {}, recs = {}, numbers = {}, by_handle = {}, stats = stats}, TS)
end

function TS:entry(name)
  local e = self.entries[name]
  if not e then
    e = {name = name, lease = 'NONE', held = 0, in_use = 0, gen = 0, passes = 0, doubt = 0,
         queued = false, valid = 0, epoch = 0, last_number = 0, qpass = 0, queued_tries = {}}
    self.entries[name] = e
  end
  return e
end

-- The client's settings, as the model derives them (trace.lua's open line
-- checked them against the C client's).
function TS:setup(c)
  if self.r then return end
  local s = c.s
  self.r = {lease = num(c.args.lease) * 1e6, drift = math.floor(s.drift_us * 1000 + 0.5),
            margin = math.floor(s.handoff_margin_us * 1000 + 0.5), pass_limit = num(c.args.pl)}
  self.k = {id = c.id, lease_ms = c.args.lease, wttl_ms = c.args.ttl, keep_ms = c.args.keep,
            client_name = c.name, wake = c.wake}
  self.min_replicas = c.min_replicas or 0
  self.prefix = c.prefix
end

function TS:keys(name)
  local k = self.prefix .. '{' .. name .. '}'
  return {k, k .. ':fence', k .. ':q', k .. ':qd', k .. ':turn', k .. ':c:' .. self.k.id,
          self.prefix .. 'hw:{' .. SLOT.tag(SLOT.of(k)) .. '}'}
end

-- A call number (try, release, leave) of e: unique in the client, and
-- rising per name (M2). A resend of a try in doubt is not one.
function TS:number(e, n, what)
  if self.numbers[n] then return string.format('%s number %d used twice', what, n) end
  self.numbers[n] = true
  if n <= e.last_number then
    return string.format('%s %d of %s after call %d: Redis would refuse it as stale (M2)', what, n,
      e.name, e.last_number)
  end
  e.last_number = n
end

-- The model's entry is at rest: nothing counted, no record of it. A C entry
-- freed and made anew starts its generation and epoch again.
function TS:at_rest(e)
  if e.lease ~= 'NONE' or e.held ~= 0 or e.in_use ~= 0 or e.doubt ~= 0 or e.queued then
    return false
  end
  for key, h in pairs(self.recs) do
    if key:sub(-#e.name - 1) == ' ' .. e.name and (h.permits > 0 or h.lost > 0) then
      return false
    end
  end
  return true
end

function TS:counts(e, held, in_use, gen, what)
  if held ~= e.held or in_use ~= e.in_use or gen ~= e.gen then
    return string.format('%s of %s: %d held, %d in use, generation %d; the model: %d, %d, %d',
      what, e.name, held, in_use, gen, e.held, e.in_use, e.gen)
  end
  if e.in_use > e.held then
    return string.format('%s of %s: %d permits in use, more than the %d Redis granted', what,
      e.name, e.in_use, e.held)
  end
end

-- Whether a grant epoch of the entry of `name` follows the semaphore's
-- last (a lock's grant on an entry a semaphore used before: M1).
function TS:epoch_before(name, epoch)
  local e = self.entries[name]
  return e ~= nil and epoch == e.epoch + 1
end

-- A try numbered nonce of the entry made `made` begins (sem.try, sem.rltry):
-- one call at a time (M2), a new number; an entry made anew only at rest
-- (its last user gone, M1), its generation and epoch starting again.
function TS:begin_try(e, nonce, made)
  if e.pending or e.rel then
    return string.format('attempt %d of %s sent while %s is out: one call at a time (M2)', nonce,
      e.name, e.pending and 'attempt ' .. e.pending.nonce or 'a release')
  end
  if e.made and made ~= e.made then
    if not self:at_rest(e) then
      return string.format('the entry of %s made anew while the model counts %d permits held, '
        .. '%d in use, attempt %d in doubt', e.name, e.held, e.in_use, e.doubt)
    end
    e.gen, e.epoch = 0, 0
  end
  e.made = made
  local why = self:number(e, nonce, 'attempt')
  if why then return why end
  self.stats.sem_tries = self.stats.sem_tries + 1
end

-- The fields of each kind (with time, thread, kind and name).
local FIELDS = {['sem.try'] = 25, ['sem.rep'] = 11, ['sem.tried'] = 10, ['sem.grant'] = 9,
                ['sem.take'] = 9, ['sem.rec'] = 7, ['sem.give'] = 11, ['sem.back'] = 6,
                ['sem.rel'] = 6, ['sem.backrc'] = 5, ['sem.settle'] = 5, ['sem.verdict'] = 9,
                ['sem.leave'] = 6, ['sem.giveback'] = 6, ['sem.left'] = 6, ['sem.msg'] = 6,
                ['sem.ranout'] = 5, ['sem.handle'] = 7, ['sem.rltry'] = 16,
                ['sem.rlgranted'] = 9, ['sem.rlverdict'] = 17}

-- One line (fields f: f[1] time, f[2] thread, f[3] kind, f[4] name, ...) of
-- client c (sim/trace.lua's). Returns why it does not conform, or nil.
function TS:line(c, f)
  self:setup(c)
  local r, st = self.r, self.stats
  local tid, kind = f[2], f[3]
  if not FIELDS[kind] then return 'a line of an unknown kind ' .. kind end
  if #f ~= FIELDS[kind] then
    return string.format('%d fields; a %s line has %d', #f, kind, FIELDS[kind])
  end
  local e = self:entry(unesc(f[4]))
  local key = tid .. ' ' .. e.name
  local hk = self.by_handle[key]
  if hk and (kind == 'sem.rec' or kind == 'sem.give') then
    key = hk -- a handle's permit, given back by this thread (sem.handle)
    if kind == 'sem.give' then self.by_handle[tid .. ' ' .. e.name] = nil end
  end
  if kind == 'sem.handle' then
    -- a permit moves from the thread's record to handle ID's, or this
    -- thread gives handle ID's back (src/api/handle.c)
    local how, hkey, gen = f[5], 'handle ' .. f[6] .. ' ' .. e.name, num(f[7])
    if how == 'take' then
      local h = self.recs[key]
      if not h or h.permits == 0 or h.gen ~= gen then
        return string.format('a permit of %s of generation %d given to a handle by a thread the '
          .. 'model gave none of it', e.name, gen)
      end
      h.permits = h.permits - 1
      self.recs[hkey] = {permits = 1, lost = 0, gen = gen}
    else
      local h = self.recs[hkey]
      if not h or h.permits + h.lost == 0 then
        return string.format('a release of handle %s of %s, which holds no permit', f[6], e.name)
      end
      self.by_handle[key] = hkey
    end
    return
  end
  if kind == 'sem.try' then
    local sent, made, nonce = num(f[5]), num(f[6]), num(f[16])
    local p = e.pending
    if p and p.nonce == nonce then
      -- the same attempt again: only once, after a send of unknown outcome
      if not (p.rep and p.rep.sent and not p.rep.answered) or p.resent then
        return string.format('attempt %d of %s sent again, after %s', nonce, e.name,
          p.resent and 'its resend' or 'an answer or a send that never left')
      end
      if table.concat(f, ' ', 6, 25) ~= p.args then
        return string.format('attempt %d of %s sent again with other keys or arguments', nonce,
          e.name)
      end
      p.resent, p.sent, p.rep = true, sent, nil
      return
    end
    local why = self:begin_try(e, nonce, made)
    if why then return why end
    local k, a = {}, {}
    for i = 7, 13 do k[#k + 1] = unesc(f[i]) end
    for i = 14, 25 do a[#a + 1] = unesc(f[i]) end
    local once = a[6] == '0'
    local want = rule.acquire_argv(self.k, nonce, once, a[9], e.doubt, e.name)
    for i, w in ipairs(self:keys(e.name)) do
      if k[i] ~= w then return string.format('key %d is %q, the model sends %q', i, k[i], w) end
    end
    for i, w in ipairs(want) do
      if a[i] ~= w then
        return string.format('attempt %d of %s: argument %d is %q, the model sends %q%s', nonce,
          e.name, i, tostring(a[i]), w, i == 10 and ' (the attempt in doubt, M7)' or '')
      end
    end
    e.pending = {nonce = nonce, sent = sent, once = once, args = table.concat(f, ' ', 6, 25)}
  elseif kind == 'sem.rltry' or kind == 'sem.rlgranted' or kind == 'sem.rlverdict' then
    if not c.rl then return string.format('a %s line of %s by a client not in Redlock mode', kind,
      e.name) end
    return self:redlock(e, kind, f)
  elseif kind == 'sem.rep' then
    local nonce, sent, answered, k, v, acked, rc = num(f[5]), f[6] == '1', f[7] == '1', num(f[8]),
      num(f[9]), num(f[10]), num(f[11])
    local p = e.pending
    if not p or p.nonce ~= nonce or p.rep then
      return string.format('a reply to attempt %d of %s, which is not the one out', nonce, e.name)
    end
    local short = k == 1 and self.min_replicas > 0 and acked < self.min_replicas
    if k == 1 and v >= 1 and not short and rc ~= OK then
      return string.format('attempt %d granted (%d permits) but reported %d', nonce, v, rc)
    elseif short and rc == OK then
      return string.format('attempt %d granted with %d of the %d replicas WAIT asks for: taken',
        nonce, acked, self.min_replicas)
    elseif k == 0 and rc ~= EBUSY then
      return string.format('attempt %d refused but reported %d', nonce, rc)
    elseif rc == OK and not (k == 1 and v >= 1) then
      return string.format('attempt %d answered {%d, %d} but reported granted', nonce, k, v)
    end
    p.rep = {sent = sent, answered = answered, k = k, v = v, rc = rc,
             in_doubt = (sent and not answered) or short}
  elseif kind == 'sem.tried' then
    local nonce, rc, now, in_doubt, doubt, queued = num(f[5]), num(f[6]), num(f[7]),
      f[8] == '1', num(f[9]), f[10] == '1'
    local p = e.pending
    e.pending = nil
    if not p or p.nonce ~= nonce or not p.rep then
      return string.format('the outcome of attempt %d of %s, which was not sent or not answered',
        nonce, e.name)
    end
    local want_rc, want_doubt = p.rep.rc, p.rep.in_doubt
    if not p.rl and want_rc == OK and rule.too_late(r, p.sent, now) then
      want_rc, want_doubt = -6, true -- answered after the permits could have ended
    end
    -- (Redlock mode: the take-up's own check of the slots' validity, by a
    -- later reading of the clock, is sem.rlgranted's; a renewal may have
    -- extended the fresh slot meanwhile)
    if (rc == OK) ~= (want_rc == OK) or (rc == EBUSY) ~= (want_rc == EBUSY) then
      return string.format('attempt %d of %s answered %.3f ms after its send (reply rc %d): rc %d; '
        .. 'the model %s', nonce, e.name, (now - p.sent) / 1e6, p.rep.rc, rc,
        want_rc == OK and 'takes the grant' or 'does not take it')
    end
    if in_doubt ~= (want_doubt and true or false) then
      return string.format('attempt %d of %s %s in doubt; the model %s', nonce, e.name,
        in_doubt and 'counted' or 'not counted', want_doubt and 'counts it' or 'does not')
    end
    -- (Redlock mode: a try whose fresh slot went with permits found lost
    -- neither queues nor names an attempt: src/local/sem.c, fresh_lost)
    if not p.fresh_lost and (in_doubt or (rc == EBUSY and not p.once)) then e.doubt = nonce end
    if rc == EBUSY and not p.once and not p.fresh_lost then
      e.queued = true
      e.queued_tries[nonce] = true
    end
    if doubt ~= e.doubt or queued ~= e.queued then
      return string.format('after attempt %d of %s: attempt in doubt %d, queued %s; the model %d, %s',
        nonce, e.name, doubt, tostring(queued), e.doubt, tostring(e.queued))
    end
    if rc == OK then e.expect_grant = {held = p.rep.v, sent = p.sent, tid = tid} end
  elseif kind == 'sem.grant' then
    local held, in_use, gen, valid, epoch = num(f[5]), num(f[6]), num(f[7]), num(f[8]), num(f[9])
    local x = e.expect_grant
    e.expect_grant = nil
    if not x or x.tid ~= tid then
      return string.format('a grant of %s that no answered try of this thread made', e.name)
    end
    st.sem_grants = st.sem_grants + 1
    if epoch ~= e.epoch + 1 and self:at_rest(e) then
      -- (the entry was used as a lock meanwhile: M1)
      e.epoch = epoch - 1
    end
    local gen0 = e.gen
    rule.apply_grant(r, e, x.held, x.sent)
    if c.rl then
      -- Redlock mode: the permits' validity is their slots' earliest, which
      -- a renewal may have set below this grant's own (src/local/sem.c)
      e.valid = rule.grant_valid(r, x.sent)
    end
    if e.gen ~= gen0 then e.qpass = 0 end -- (permits passed in the queue: lost in passing)
    if held ~= x.held then
      return string.format('%s counts %d permits after a grant; Redis granted %d in all', e.name,
        held, x.held)
    end
    local why = self:counts(e, held, in_use, gen, 'a grant')
    if why then return why end
    if valid ~= e.valid then
      return string.format('%s valid until %.0f after a grant; the model: %.0f (the send + lease - '
        .. 'drift, or the later)', e.name, valid, e.valid)
    elseif epoch ~= e.epoch then
      return string.format('%s: grant epoch %d; the model %d', e.name, epoch, e.epoch)
    end
    e.expect_take = tid
  elseif kind == 'sem.take' then
    local how, now, gen, held, in_use = f[5], num(f[6]), num(f[7]), num(f[8]), num(f[9])
    local x = e.expect_take
    e.expect_take = nil
    if how == 's' then
      if rule.spare(r, e, now) <= 0 then
        return string.format('a spare permit of %s taken with none spare (lease %s, %d held, %d in '
          .. 'use, %.3f ms of validity left, margin %.3f ms)', e.name, e.lease, e.held, e.in_use,
          (e.valid - now) / 1e6, r.margin / 1e6)
      end
      e.in_use = e.in_use + 1
    elseif how == 'g' then
      if x ~= tid then return string.format('a grant of %s taken by a thread whose try made none', e.name) end
      e.in_use = e.in_use + 1
    elseif how == 'q' then
      if e.qpass <= 0 then
        return string.format('a permit of %s taken as passed in the queue; the model passed none '
          .. '(or it was lost since)', e.name)
      end
      e.qpass = e.qpass - 1
    else
      return 'a take of an unknown kind ' .. how
    end
    if not rule.valid(e, now) then
      return string.format('a permit of %s taken (%s) while the model counts it not valid (lease %s, '
        .. '%.3f ms of validity left)', e.name, how, e.lease, (e.valid - now) / 1e6)
    end
    local why = self:counts(e, held, in_use, gen, 'a take')
    if why then return why end
    local h = self.recs[key]
    if not h then
      h = {permits = 0, lost = 0, gen = 0}
      self.recs[key] = h
    end
    rule.record(h, e.gen)
    st.permits = st.permits + 1
  elseif kind == 'sem.rec' then
    local permits, lost, gen = num(f[5]), num(f[6]), num(f[7])
    local h = self.recs[key]
    if not h or h.permits + h.lost == 0 then
      return string.format('a release of %s by a thread the model gave no permit of it', e.name)
    end
    if permits ~= h.permits or lost ~= h.lost or gen ~= h.gen then
      return string.format('the record of %s: %d permits of generation %d, %d lost; the model %d '
        .. 'of %d, %d lost', e.name, permits, gen, lost, h.permits, h.gen, h.lost)
    end
    rule.record_settle(h, e.gen)
    e.giving = tid
  elseif kind == 'sem.give' then
    local how, now, waiting, passes, ranout, held, in_use = f[5], num(f[6]), f[7] == '1',
      num(f[8]), f[9] == '1', num(f[10]), num(f[11])
    local h = self.recs[key]
    if e.giving ~= tid or not h then
      return string.format('a release of %s without its record', e.name)
    end
    e.giving = nil
    st.sem_releases = st.sem_releases + 1
    if h.lost > 0 then
      if how ~= 'l' then
        return string.format('a permit of %s of generation %d released as valid; the model: lost '
          .. '(generation %d)', e.name, h.gen, e.gen)
      end
      h.lost = h.lost - 1
      return
    elseif how == 'l' then
      return string.format('a permit of %s of generation %d released as lost; the model counts it',
        e.name, e.gen)
    end
    h.permits = h.permits - 1
    e.in_use = e.in_use - 1
    if e.in_use < 0 then return string.format('%s: more permits released than in use', e.name) end
    local why = self:counts(e, held, in_use, e.gen, 'a release')
    if why then return why end
    if passes ~= e.passes then
      return string.format('a release of %s after %d passes; the model %d', e.name, passes, e.passes)
    end
    if ranout ~= (now >= e.valid) then
      return string.format('a release of %s with %.3f ms of validity left reported %s', e.name,
        (e.valid - now) / 1e6, ranout and 'run out' or 'in time')
    end
    local want = rule.may_pass(r, e, now, waiting)
    if want ~= (how ~= 'b') then
      return string.format('a release of %s with %s waiting, %d passes (pass limit %d), %.3f ms of '
        .. 'validity left (margin %.3f ms), %d held, %d in use: %s; the model %s', e.name,
        waiting and 'a thread' or 'nobody', passes, r.pass_limit, (e.valid - now) / 1e6,
        r.margin / 1e6, e.held, e.in_use, how == 'b' and 'given back' or 'passed on',
        want and 'passes it on' or 'gives it back')
    end
    if how ~= 'b' then
      st.sem_passes = st.sem_passes + 1
      e.passes = e.passes + 1
      if how == 'q' then
        e.in_use = e.in_use + 1
        e.qpass = e.qpass + 1
      end
    end
  elseif kind == 'sem.back' then
    local n, held = num(f[5]), num(f[6])
    if e.pending or e.rel then
      return string.format('spare permits of %s given back while a call is out (M2)', e.name)
    end
    local want = e.lease == 'HELD' and e.held - e.in_use or 0
    if n ~= want or n <= 0 then
      return string.format('%d permits of %s given back; the model has %d spare (%s, %d held, %d in '
        .. 'use)', n, e.name, want, e.lease, e.held, e.in_use)
    end
    e.held = e.held - n
    if e.held == 0 then e.lease = 'NONE' end
    if held ~= e.held then
      return string.format('%s counts %d permits after a give-back; the model %d', e.name, held,
        e.held)
    end
    e.rel = {n = n, gen = e.gen}
  elseif kind == 'sem.rel' then
    local number, count = num(f[5]), num(f[6])
    if not e.rel or e.rel.sent then
      return string.format('a release of %s that no give-back made', e.name)
    end
    e.rel.sent = true
    local why = self:number(e, number, 'release')
    if why then return why end
    if count ~= e.rel.n then
      return string.format('a release of %d permits of %s; %d were given back', count, e.name,
        e.rel.n)
    end
  elseif kind == 'sem.backrc' then
    local rc = num(f[5])
    local x = e.rel
    e.rel = nil
    if not x or not x.sent then
      return string.format('the outcome of a release of %s that was not sent', e.name)
    end
    if rc == ELOST and x.gen == e.gen and e.lease == 'HELD' then
      e.lease = 'LOST' -- Redis had fewer: every permit of the client ended (M8)
    end
  elseif kind == 'sem.ranout' then
    -- a permit passed in the queue, found run out when its thread ran:
    -- every permit of the lease with it (M5, M8)
    local now = num(f[5])
    if e.qpass <= 0 then
      return string.format('a permit of %s found run out as passed in the queue; the model passed '
        .. 'none (or it was lost since)', e.name)
    elseif rule.valid(e, now) then
      return string.format('a permit of %s passed in the queue refused as run out with %.3f ms of '
        .. 'validity left; the model takes it', e.name, (e.valid - now) / 1e6)
    end
    e.qpass = e.qpass - 1
    e.lease = 'LOST'
  elseif kind == 'sem.settle' then
    local gen = num(f[5])
    if not rule.settle(e) then
      return string.format('permits of %s settled as lost; the model counts them %s', e.name,
        e.lease)
    end
    e.qpass = 0
    if gen ~= e.gen then
      return string.format('%s settled into generation %d; the model %d', e.name, gen, e.gen)
    end
  elseif kind == 'sem.verdict' then
    local epoch, v, sent, now, valid = num(f[5]), num(f[6]), num(f[7]), num(f[8]), num(f[9])
    st.sem_verdicts = st.sem_verdicts + 1
    if e.lease ~= 'HELD' or epoch ~= e.epoch then
      return string.format('a renewal verdict on %s for grant epoch %d; the model has epoch %d, %s',
        e.name, epoch, e.epoch, e.lease)
    elseif valid ~= e.valid then
      return string.format('%s valid until %.0f before its renewal; the model %.0f', e.name, valid,
        e.valid)
    end
    local verdict, x = rule.verdict(r, e, v >= 0 and v or nil, sent, now)
    if verdict == 'renewed' then
      e.valid = x
    elseif verdict == 'lost' then
      e.lease = 'LOST'
    end
  elseif kind == 'sem.leave' then
    local number, gave_up = num(f[5]), num(f[6])
    if e.pending or e.rel then
      return string.format('a leave of %s while a call is out (M2)', e.name)
    end
    local why = self:number(e, number, 'leave')
    if why then return why end
    if not e.queued then
      return string.format('a leave of %s, whose client the model has not queued', e.name)
    elseif gave_up ~= e.doubt then
      return string.format('a leave of %s giving up attempt %d; the attempt in doubt is %d', e.name,
        gave_up, e.doubt)
    end
    e.queued, e.doubt, e.left_attempt = false, 0, gave_up
  elseif kind == 'sem.giveback' then
    local nonce, number = num(f[5]), num(f[6])
    st.sem_givebacks = st.sem_givebacks + 1
    if self.numbers[number] then return string.format('give-back number %d used twice', number) end
    self.numbers[number] = true
    if nonce ~= 0 and nonce == e.doubt then
      e.doubt = 0
    elseif nonce ~= 0 and nonce ~= e.left_attempt then
      return string.format('a give-back of attempt %d of %s, which is not in doubt (the model: %d)',
        nonce, e.name, e.doubt)
    end
  elseif kind == 'sem.left' then
    local waiting, calling = f[5] == '1', f[6] == '1'
    if e.doubt ~= 0 and not waiting and not calling then
      return string.format('attempt %d of %s is in doubt, nobody waits to name it, and it was not '
        .. 'given back (M7)', e.doubt, e.name)
    end
  elseif kind == 'sem.msg' then
    -- (its DOUBT is not compared: a leave clears it under e->mu before its
    -- line, written in the call slot, tells the model)
    local attempt = num(f[5])
    st.sem_direct = st.sem_direct + 1
    if not e.queued_tries[attempt] and not (e.pending and e.pending.nonce == attempt) then
      return string.format('a direct grant of %s to attempt %d, which this client never queued '
        .. '(nor sent)', e.name, attempt)
    end
  else
    return 'a line of an unknown kind ' .. kind
  end
end

-- Redlock mode's lines (src/local/rlsem.c, src/global/renew_redlock.c; the
-- rules of docs/design.md "Redlock", Semaphores, and local/rlsem.h):
--   sem.rltry NAME NONCE SENT MADE LIMIT QUEUE RC SLOT FIRST VALID HOW CSENT CVALID
--       a try, in place of sem.try and sem.rep: its send, the entry, the
--       limit, whether it queued, what it returned, the slot granted (-1
--       none) with the grant's first send and validity, and the claim it
--       relied on (HOW c claimed now, r a live claim reused, f none
--       confirmed; the claim's first send, 0 if reused, and validity)
--   sem.rlgranted NAME NONCE RC HELD VALID SLOTS
--       a granted try taken up (dlock_rlsem_granted): the slots this
--       client holds, their earliest validity, and each (K:VALID,...; -
--       none); RC EBUSY if the renewal took the fresh slot out with
--       permits found lost, EREDIS if it came after the slot's validity
--   sem.rlverdict NAME EPOCH GONE LATE N RENEWED RSENT CSENT CVALID BEFORE AFTER SLOTS
--                 NOW JUDGED
--       a renewal round's verdict on the permits' slots: a slot gone (all
--       lost, M8), slots not confirmed yet, slots held, how many were
--       renewed and the latest of their sends, the claim the round took
--       (0 0 none), the permits' validity before and after, the slots,
--       the clock's reading the judgement used, and the round's slots it
--       did not renew (K:-1 not confirmed yet, K:0 gone; - none)
-- The checks: a grant is valid at most its first send + the lease - the
-- drift allowance, and at most its claim's validity (R4); a claim made is
-- valid at most its send + the lease - the drift allowance; a claim
-- reused is one this client's tries or renewals were shown, with two
-- thirds of a lease left at the try's send; each slot held is one a
-- try was granted, valid until its grant's validity or a renewal's
-- (within that renewal's send + the lease - the drift allowance and its
-- claim's validity); a granted try's permits are those held before (none
-- unless HELD) and its slot, valid until the earliest of their slots; a
-- round that loses nothing leaves no slot it did not renew past its
-- validity (one is gone then: M8).

-- "k:valid,..." (or "-") as a list of {k, valid}.
local function slot_list(s)
  local l = {}
  if s ~= '-' then
    for k, v in s:gmatch('(%d+):(%d+)') do l[#l + 1] = {num(k), num(v)} end
  end
  return l
end

function TS:redlock(e, kind, f)
  local r = self.r
  local span = r.lease - r.drift -- (ns: a grant's validity after its first send)
  e.slots = e.slots or {}
  if kind == 'sem.rltry' then
    local nonce, sent, made, limit, queue, rc = num(f[5]), num(f[6]), num(f[7]), num(f[8]),
      f[9] == '1', num(f[10])
    local slot, first, valid, how, csent, cvalid = num(f[11]), num(f[12]), num(f[13]), f[14],
      num(f[15]), num(f[16])
    local why = self:begin_try(e, nonce, made)
    if why then return why end
    if e.limit ~= limit then e.limit, e.claim = limit, 0 end
    if how == 'c' then
      if csent < sent or cvalid > csent + span then
        return string.format('attempt %d of %s: a claim sent %.3f ms after the try, valid %.3f ms '
          .. 'after its send; at most %.3f ms (the lease - the drift allowance)', nonce, e.name,
          (csent - sent) / 1e6, (cvalid - csent) / 1e6, span / 1e6)
      end
      if cvalid > e.claim then e.claim = cvalid end
    elseif how == 'r' then
      if cvalid > e.claim then
        return string.format('attempt %d of %s relied on a claim valid until %.0f; this client\'s '
          .. 'claims were valid until %.0f at most', nonce, e.name, cvalid, e.claim)
      elseif cvalid - sent <= r.lease * 2 / 3 then
        return string.format('attempt %d of %s reused a claim with %.3f ms left; it needs two thirds '
          .. 'of a lease (R4)', nonce, e.name, (cvalid - sent) / 1e6)
      end
    elseif how ~= 'f' then
      return 'a claim of an unknown kind ' .. how
    end
    if rc == OK then
      if how == 'f' then
        return string.format('attempt %d of %s granted with no claim confirmed (R4)', nonce, e.name)
      elseif slot < 0 or slot >= limit then
        return string.format('attempt %d of %s granted slot %d of a limit of %d', nonce, e.name,
          slot, limit)
      elseif first < sent or valid > first + span then
        return string.format('attempt %d of %s: its slot valid %.3f ms after the votes\' send; at '
          .. 'most %.3f ms', nonce, e.name, (valid - first) / 1e6, span / 1e6)
      elseif valid > cvalid then
        return string.format('attempt %d of %s: its slot valid %.3f ms past its claim (R4)', nonce,
          e.name, (valid - cvalid) / 1e6)
      end
      e.slots[slot] = valid
    elseif slot ~= -1 then
      return string.format('attempt %d of %s refused (rc %d) with slot %d', nonce, e.name, rc, slot)
    end
    e.pending = {nonce = nonce, sent = sent, once = not queue, rl = {valid = valid, slot = slot}}
    if rc ~= OK then
      e.pending.rep = {sent = true, answered = true, k = rc == EBUSY and 0 or -9, v = 0, rc = rc,
                       in_doubt = false}
    end
    return
  end
  -- the slots listed: each one granted, valid until its grant's or a
  -- renewal's validity; their earliest
  local list = slot_list(kind == 'sem.rlgranted' and f[9] or f[15])
  local renew = kind == 'sem.rlverdict' and {sent = num(f[10]), n = num(f[9]),
                                              csent = num(f[11]), cvalid = num(f[12])}
  if renew and renew.csent > 0 then
    if renew.cvalid > renew.csent + span then
      return string.format('a renewal\'s claim of %s valid %.3f ms after its send; at most %.3f ms',
        e.name, (renew.cvalid - renew.csent) / 1e6, span / 1e6)
    end
    if renew.cvalid > e.claim then e.claim = renew.cvalid end
  end
  if renew and (f[6] == '1' or e.lease ~= 'HELD' or num(f[5]) ~= e.epoch) then
    -- (a slot gone: every permit lost, M8; checked below for the rest)
    if e.lease ~= 'HELD' or num(f[5]) ~= e.epoch then
      return string.format('a renewal verdict on %s for grant epoch %s; the model has epoch %d, %s',
        e.name, f[5], e.epoch, e.lease)
    end
    self.stats.sem_verdicts = self.stats.sem_verdicts + 1
    e.lease = 'LOST'
    local p = e.pending
    if p and p.rl and p.rl.slot >= 0 and not p.rep then
      p.lost_round = true -- (its fresh slot, registered, went with them)
    end
    return
  end
  if renew then
    -- R1: the slots held are the permits counted, but for a granted try
    -- not taken up yet and a give-back's slots not yet taken out
    local n = num(f[8])
    local extra = (e.pending and e.pending.rl and e.pending.rl.slot >= 0 and 1 or 0) +
      (e.rel and e.rel.n or 0)
    if n < e.held or n > e.held + extra then
      return string.format('%s: %d slots held at a renewal; the model counts %d permits (%d more '
        .. 'at most in flight)', e.name, n, e.held, extra)
    end
  end
  local low
  for _, kv in ipairs(list) do
    local k, v = kv[1], kv[2]
    local known = e.slots[k]
    if not known then
      return string.format('%s: slot %d held, which no try of this client was granted', e.name, k)
    elseif v ~= known then
      if not renew or renew.n == 0 or v < known or v > renew.sent + span or v > e.claim then
        return string.format('%s: slot %d valid until %.0f; its grant or last renewal said %.0f%s',
          e.name, k, v, known, renew and renew.n > 0 and string.format(' (this renewal, sent '
          .. 'at %.0f, allows %.0f at most, its claims %.0f)', renew.sent, renew.sent + span,
          e.claim) or '')
      end
      e.slots[k] = v
    end
    if not low or v < low then low = v end
  end
  if kind == 'sem.rlgranted' then
    local nonce, rc, held, valid = num(f[5]), num(f[6]), num(f[7]), num(f[8])
    local p = e.pending
    if not p or not p.rl or p.nonce ~= nonce or p.rep then
      return string.format('attempt %d of %s taken up, which no granted try made', nonce, e.name)
    end
    if rc == OK then
      local want_held, fresh = e.lease == 'HELD' and e.held + 1 or 1, false
      for _, kv in ipairs(list) do fresh = fresh or kv[1] == p.rl.slot end
      if held ~= want_held or #list ~= held or not fresh or valid ~= low then
        return string.format('attempt %d of %s taken up: %d permits valid until %.0f, slots %s; the '
          .. 'model %d (the permits %s before, and slot %d) until their earliest, %.0f', nonce,
          e.name, held, valid, f[9], want_held, e.lease, p.rl.slot, low or 0)
      end
      p.sent = valid - r.lease + r.drift -- (the local tier's validity: send + lease - drift)
    elseif rc == EBUSY then
      -- (the lease LOST, or settled since by another thread: NONE)
      if not p.lost_round then
        return string.format('attempt %d of %s: its slot taken out as lost, but no renewal found '
          .. 'the permits gone since the try', nonce, e.name)
      end
      p.fresh_lost = true
    elseif rc ~= -6 then
      return string.format('attempt %d of %s taken up with rc %d', nonce, e.name, rc)
    end
    p.rep = {sent = true, answered = true, k = rc == OK and 1 or 0, v = held, rc = rc,
             in_doubt = false}
  else -- sem.rlverdict, no slot gone
    local before, after, now = num(f[13]), num(f[14]), num(f[16])
    self.stats.sem_verdicts = self.stats.sem_verdicts + 1
    -- (a slot not renewed is gone once its validity passed: M8)
    if string.find(f[17], ':0', 1, true) then
      return string.format('%s: a slot judged gone, and the permits kept', e.name)
    end
    local valid_of, late = {}, false
    for _, kv in ipairs(list) do valid_of[kv[1]] = kv[2] end
    for _, kv in ipairs(slot_list((f[17]:gsub(':%-1', ':1')))) do
      local k = kv[1]
      late = true
      if not valid_of[k] then
        return string.format('%s: slot %d judged by a renewal that keeps the permits, and not held',
          e.name, k)
      elseif valid_of[k] <= now then
        return string.format('%s: slot %d not confirmed by its renewal and %.3f ms past its '
          .. 'validity, and the permits kept; one slot unconfirmed past its validity loses them '
          .. '(M8)', e.name, k, (now - valid_of[k]) / 1e6)
      end
    end
    if late ~= (f[7] == '1') then
      return string.format('%s: a renewal says LATE %s; its slots not confirmed: %s', e.name, f[7],
        f[17])
    end
    if before ~= e.valid then
      return string.format('%s valid until %.0f before its renewal; the model %.0f', e.name, before,
        e.valid)
    elseif #list > 0 and after ~= low then
      return string.format('%s valid until %.0f after its renewal; its slots\' earliest %.0f',
        e.name, after, low)
    end
    e.valid = after
  end
end

return TS
