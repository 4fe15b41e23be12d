-- Trace conformance of the shared (read) mode (src/local/shared.h, S1 to
-- S8): the lines of a trace that the shared kind of the C client records,
-- replayed through the model's rules of it (sim/client.lua, "The shared
-- mode", which the simulator's shared worlds call too where they model
-- it). sim/trace.lua reads the trace and keeps the entry's lease (state,
-- tokens, passes, validity); it hands every line of an entry to S.line
-- first, and to S.after once its own rule for the line has run. This
-- module keeps, per entry, the mode of the wait (from `poll`) and of the
-- lease, the client's threads that hold a shared lease or a reader phase
-- (and the invitations not yet taken), and the join window, and checks:
--   - a try's first send is in C.first_protocol (protocol 2 for shared),
--     its give-back in its own mode, a release in its lease's mode;
--   - a direct grant of the other mode than its wait is not taken and is
--     given back (S7);
--   - a join (sjoin) is taken exactly when C.joins holds on the join's
--     reading: never while a thread waits exclusively, never past the join
--     window (join_ms from the grant or the phase's start: the bound on a
--     writer's wait behind the client's readers), never without the
--     validity's margin;
--   - an invitation (stake) is taken exactly when the lease is still held
--     and valid, and only while one is outstanding;
--   - every holder's DLOCK_OK carries the lease's token: the grant's for a
--     shared grant, the pass's (the writer's + 1) for a reader phase (S6);
--   - a reentrant shared acquire (sreent) is granted exactly when the
--     lease is held and valid, by a holder (nested: by the exclusive owner);
--   - the holders' count at each release (srel) is the model's; the last
--     one's gives a shared lease back to Redis; a phase's hands the lease
--     to the exclusive rules (rdec, the pass limit and the clock rule);
--   - after every exclusive release that keeps no handoff, the reader
--     phase (sphase) starts exactly when C.phase_may says so, with the
--     next token and one pass of the pass limit (S8).
-- Renewal verdicts and losses of a shared lease are sim/trace.lua's rules
-- (the same for both modes); a lost lease is released by each holder
-- (rlost), the last one freeing it (S5).
local C = require('client')

local S = {}

local function num(v) return tonumber(v) end
local function us(ns) return tonumber(ns) / 1000 end

-- The shared part of the entry, reset for a new lease.
local function reset(e)
  e.holders, e.nh, e.invited, e.phase = {}, 0, 0, false
end

-- The mode of a line's field: 's' shared, else exclusive (absent: a trace
-- before the field, exclusive).
local function mode_of(v) return v == 's' and 'S' or 'X' end

-- Lines the renewal thread writes for an entry without its mutex, at any
-- time (its background jobs in Redlock mode).
local BACKGROUND = {['rl.giveback'] = true, ['rl.leave'] = true}

-- The line before the rest of sim/trace.lua's rules: true if this module
-- took it whole (the exclusive rules do not apply to it).
function S.line(X, e, kind, f, tid, stamp)
  local bad, s = X.bad, X.c.s
  if not e.holders then reset(e) end
  -- (a background job's line may come in between)
  if e.need_sphase and kind ~= 'sphase' and not BACKGROUND[kind] then
    bad('the exclusive release of %s kept no handoff and no reader phase was decided '
      .. '(no sphase line)', e.name)
    e.need_sphase = nil
  end
  if kind == 'poll' then
    e.mode = mode_of(f[7])
    return false
  elseif kind == 'acq' then
    -- (sim/trace.lua checks the protocol against C.first_protocol(c, e.mode))
    e.amodes = e.amodes or {}
    e.amodes[num(f[15])] = e.mode
    return false
  elseif kind == 'dgrant' then
    e.last_msg_mode = e.msg and e.msg.mode -- (sim/trace.lua clears the message)
    return false
  elseif kind == 'sinv' then
    e.pending_inv = num(f[5]) - 1 -- the threads a new shared grant invited (S2)
    if e.pending_inv < 0 then bad('a shared grant of %s held by %d threads', e.name, num(f[5])) end
    return true
  elseif kind == 'sjoin' then
    X.stats.joins = (X.stats.joins or 0) + 1
    local token, now, ok, xw = num(f[5]), us(f[6]), f[7] == '1', num(f[8]) or 0
    local want = C.joins(s, e, now, xw)
    if ok and xw > 0 then
      bad('a thread joined the shared lease of %s while %d thread(s) of the client waited for '
        .. 'it exclusively (S3: writers first)', e.name, xw)
    elseif ok and e.join_until and now >= e.join_until then
      bad('a thread joined the shared lease of %s %.3f ms after its join window closed (join_ms '
        .. 'bounds a writer\'s wait)', e.name, (now - e.join_until) / 1000)
    elseif ok ~= want then
      bad('a join of %s (%s lease, %s, %.3f ms of validity left, window %.3f ms left, %d waiting '
        .. 'exclusively): %s; the model %s', e.name, e.phase and 'phase' or (e.lmode or '?'),
        e.state, (e.valid_until - now) / 1000, ((e.join_until or 0) - now) / 1000, xw,
        ok and 'joined' or 'refused', want and 'joins' or 'refuses')
    end
    if ok and token ~= e.token then
      bad('a join of %s at token %.0f; the lease\'s is %.0f', e.name, token, e.token)
    end
    if ok then
      e.holders[tid] = true
      e.nh = e.nh + 1
    end
    return true
  elseif kind == 'stake' then
    X.stats.invitations = (X.stats.invitations or 0) + 1
    local token, now, ok = num(f[5]), us(f[6]), f[7] == '1'
    if e.invited <= 0 then
      bad('an invitation to the shared lease of %s taken, which no grant or phase made', e.name)
      return true
    end
    e.invited = e.invited - 1
    local want = C.invited_takes(e, now)
    if ok ~= want then
      bad('an invitation to %s with %.3f ms of validity left (%s): %s; the model %s', e.name,
        (e.valid_until - now) / 1000, e.state, ok and 'taken' or 'refused',
        want and 'takes it' or 'refuses it')
    end
    if ok and token ~= e.token then
      bad('an invitation to %s at token %.0f; the lease\'s is %.0f', e.name, token, e.token)
    end
    if ok then
      e.holders[tid] = true
    else
      e.nh = e.nh - 1
      if e.nh == 0 and e.owner == nil and not C.takes(e, now) then
        -- the last holder of a lease that ran out or was lost drops it
        if e.state == 'HELD' then C.unconfirmed_end(e, e.token, 2) end
        e.state = 'NONE'
        e.phase = false
      end
    end
    return true
  elseif kind == 'sreent' then
    local token, now, ok, nested = num(f[5]), us(f[6]), f[7] == '1', f[8] == '1'
    if nested and e.owner ~= tid then
      bad('a shared acquire of %s nested in an exclusive hold by a thread that does not own it',
        e.name)
    elseif not nested and not e.holders[tid] then
      bad('a reentrant shared acquire of %s by a thread that does not hold it shared', e.name)
    end
    local want = C.takes(e, now)
    if want ~= ok then
      bad('a reentrant shared acquire of %s with %.3f ms of validity left (%s): %s; the model %s',
        e.name, (e.valid_until - now) / 1000, e.state, ok and 'granted' or 'refused',
        want and 'grants' or 'refuses')
    elseif ok and token ~= e.token then
      bad('a reentrant shared acquire of %s given token %.0f; the lease\'s is %.0f', e.name, token,
        e.token)
    end
    return true
  elseif kind == 'ok' and e.holders[tid] then
    -- S6: every holder of a shared grant gets the grant's token, every
    -- reader of a phase the pass's
    local token = num(f[5])
    if token ~= e.token then
      bad('DLOCK_OK for %s shared with token %.0f; the %s token is %.0f', e.name, token,
        e.phase and 'reader phase\'s (the writer\'s + 1)' or 'shared grant\'s', e.token)
    end
    return true
  elseif kind == 'shandle' then
    -- a hold moves between a thread and a handle (src/api/handle.c): the
    -- handle is a holder of its own, released by any thread
    local key = 'h' .. f[6]
    if f[5] == 'take' then
      if not e.holders[tid] then
        bad('a shared hold of %s given to a handle by a thread that does not hold it', e.name)
      end
      e.holders[tid], e.holders[key] = nil, true
    else
      if not e.holders[key] then
        bad('a release of handle %s of %s, which holds it not', f[6], e.name)
      end
      e.by_handle = {tid = tid, key = key}
    end
    return true
  elseif kind == 'srel' then
    local left, now = num(f[5]), us(f[6])
    if e.by_handle and e.by_handle.tid == tid then
      tid, e.by_handle = e.by_handle.key, nil -- the handle's release
    end
    if not e.holders[tid] then
      bad('a shared release of %s by a thread that does not hold it', e.name)
    end
    e.holders[tid] = nil
    e.nh = e.nh - 1
    if left ~= e.nh then
      bad('a shared release of %s leaves %d holders; the model %d', e.name, left, e.nh)
      e.nh = left
    end
    if e.state ~= 'HELD' then bad('a shared release of %s whose lease is %s', e.name, e.state) end
    if left == 0 and e.phase then
      -- the phase's last reader: the exclusive rules decide (rdec next)
      e.phase = false
    elseif left == 0 then
      e.state, e.ending = 'RELEASING', 0 -- back to Redis (release_shared.lua)
    end
    return true
  elseif kind == 'rlost' and ((e.by_handle and e.by_handle.tid == tid) or e.holders[tid] or
                               (e.lmode == 'S' and e.state == 'LOST')) then
    if e.by_handle and e.by_handle.tid == tid then
      tid, e.by_handle = e.by_handle.key, nil -- the handle's release, of a lost lease
    end
    if not e.holders[tid] then
      bad('a shared release of %s by a thread that does not hold it', e.name)
    end
    if e.state ~= 'LOST' then bad('a release of %s reported lost, which is %s', e.name, e.state) end
    e.holders[tid] = nil
    e.nh = e.nh - 1
    if e.nh <= 0 and e.owner == nil then
      e.state, e.phase = 'NONE', false
    end
    return true
  elseif kind == 'sphase' then
    local ok, held, token, now, sw, xw, closing = f[5] == '1', num(f[6]), num(f[7]), us(f[8]),
      num(f[9]), num(f[10]), f[11] == '1'
    if not e.need_sphase then
      bad('a reader phase of %s decided, with no exclusive release before it', e.name)
      return true
    end
    e.need_sphase = nil
    e.state = 'HELD' -- as it was when the exclusive release decided
    local want = C.phase_may(s, e, now, sw, xw, closing)
    if want ~= ok then
      bad('a reader phase of %s (%d waiting shared, %d exclusively, %d passes, %.3f ms of validity '
        .. 'left): %s; the model %s', e.name, sw, xw, e.passes, (e.valid_until - now) / 1000,
        ok and 'started' or 'not started', want and 'starts it' or 'gives the lease back')
    end
    if not ok then
      e.state = 'RELEASING'
      return true
    end
    X.stats.phases = (X.stats.phases or 0) + 1
    e.passes, e.token = e.passes + 1, e.token + 1
    if token ~= e.token then
      bad('a reader phase of %s at token %.0f; the pass\'s token is %.0f', e.name, token, e.token)
    end
    if held < 1 or held > sw then
      bad('a reader phase of %s held by %d of the %d threads waiting shared', e.name, held, sw)
    end
    e.holders, e.nh, e.invited, e.phase = {}, held, held, true
    e.join_until = now + s.join_us
    e.ending = nil
    return true
  elseif kind == 'rel' then
    local m = mode_of(f[23])
    if f[23] and m ~= (e.lmode or 'X') then
      bad('the release of %s runs the %s script; its lease is %s', e.name,
        m == 'S' and 'shared' or 'exclusive', e.lmode == 'S' and 'shared' or 'exclusive')
    end
    return false
  elseif kind == 'giveback' then
    local nonce, m = num(f[5]), f[7]
    local want = e.amodes and e.amodes[nonce]
    if m and want and mode_of(m) ~= want then
      bad('the give-back of attempt %d of %s in %s mode; the attempt was %s', nonce, e.name,
        mode_of(m) == 'S' and 'shared' or 'exclusive', want == 'S' and 'shared' or 'exclusive')
    end
    return false
  end
  return false
end

-- After sim/trace.lua's own rule for the line.
function S.after(X, e, kind, f, tid, stamp)
  if kind == 'msg' then
    if e.msg and f[8] == '1' then e.msg.mode = f[10] == '1' and 'S' or 'X' end
  elseif kind == 'dgrant' then
    -- S7: taken only in its wait's mode (C records the take rule's answer
    -- before it; a grant of the other mode goes back, as one of unknown
    -- outcome)
    local x = e.expect
    if x and x.direct and not C.direct_mode_ok(e.last_msg_mode, e.mode) then
      e.expect = nil
      X.need_giveback(e, num(f[5]))
    end
  elseif kind == 'grant' then
    reset(e)
    e.lmode = e.mode or 'X'
    if e.lmode == 'S' then
      e.holders[tid] = true
      e.invited = e.pending_inv or 0
      e.nh = 1 + e.invited
      e.join_until = us(f[8]) + X.c.s.join_us
      e.owner = nil -- (the exclusive rules: nobody owns it)
    end
    e.pending_inv = nil
  elseif kind == 'rdec' then
    -- an exclusive release kept no handoff: the reader phase is decided
    -- next (dlock_shared_phase), unless a phase's last reader released
    if f[5] ~= '1' and not e.phase_end then e.need_sphase = true end
    e.phase_end = nil
  elseif kind == 'srel' and e.state == 'HELD' and e.nh == 0 then
    e.phase_end = true
  end
end

return S
