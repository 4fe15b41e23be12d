-- Mixed-protocol worlds (sim --protocol mixed): both script sets loaded,
-- protocol 1's (lua/) and protocol 2's (lua/p2/), and each client with a
-- setting of its own (dlock_config.protocol), which a client that restarts
-- (a crash, or a host switching the setting: a roll) may change. The
-- clients follow the C client's rule for two protocols (sim/client.lua, its
-- head): an attempt goes first in the setting's protocol and, refused as
-- the other protocol's data (DLOCKPROTOCOL), again in that one (twice at
-- most); a grant is renewed, released and handed off in its own protocol. Every invariant
-- of sim/world.lua holds as in a world of one protocol (a grant, a record
-- and a hash's lifetime are read in the layout the name's data is in), and
-- two more are checked here:
--   layout  a name's data is one protocol's at a time: after every script
--           its lease key, if live, is protocol 1's (a hash without pv or
--           with pv 1, of protocol 1's fields) or protocol 2's (pv 2, the
--           fields of lua/p2/LAYOUT.txt in their forms); a script that finds
--           the other protocol's data (protocol 2's: a live lease key with
--           pv 2; protocol 1's: a live lease key without it) refuses it
--           (DLOCKPROTOCOL naming that protocol; renew: 0 for that key)
--           and changes nothing at all (no key of its KEYS, no message),
--           and refuses nothing else; protocol 2's scripts never change
--           protocol 1's fence, turn or record keys (they only read them,
--           to take a name over).
--   proto   a client addresses a grant of its own in the protocol of the
--           data that holds it: a renewal and a release (by token) in the
--           layout Redis has that grant in, unless a fault that loses or
--           brings back data came since that grant (as for excl). A grant's
--           layout is fixed when it is made, so a call in the other protocol
--           is one the client's rule got wrong; it is refused, and the grant
--           then expires unrenewed or unreleased. (A direct grant is the
--           protocol of the release that made it, which its message names:
--           the wait queue is both protocols', so a waiter queued by a
--           protocol 1 try may be granted by a protocol 2 release once the
--           name moved.) And a background give-back (an attempt of unknown
--           outcome, whose grant may be in either protocol's data: a direct
--           grant under its queue entry) is done on Redis's answer only when
--           no grant of its attempt stood right after its last call
--           (P.gave_back).
-- The draws of a mixed world's settings (which protocol each client
-- speaks, the rolls) come from a third random stream, so that a mixed
-- world whose clients all speak one protocol runs, event for event, that
-- protocol's schedule of the same seed (sim/test-determinism checks it).
local R = require('redis')
local C = require('client')

local P = {}

local floor = math.floor
local M31 = 2147483647

local function rand3(w)
  w.rs3 = (w.rs3 * 16807) % M31
  return w.rs3 / M31
end

local function rint3(w, a, b)
  if b <= a then return a end
  return a + floor(rand3(w) * (b - a + 1))
end

-- A mixed world's settings: the share of clients that speak protocol 2
-- (0: all 1, as at the start of the roll's second step; 1: all 2; between:
-- hosts switched one by one) and the rolls (hosts that switch the setting:
-- a client shuts down, and one with the other setting starts).
function P.init(w, seed)
  local s = (seed * 69621 + 4242) % M31
  if s == 0 then s = 1 end
  for _ = 1, 3 do s = (s * 16807) % M31 end
  w.rs3 = s
  local shares = {0, 0.25, 0.5, 0.75, 1}
  w.p2_share = w.opts.p2_share or shares[rint3(w, 1, #shares)]
  w.rolls = w.opts.p2_share and 0 or rint3(w, 0, 3)
end

-- The setting of a client that starts (a new host, or one restarting).
function P.draw_protocol(w)
  return rand3(w) < w.p2_share and 2 or 1
end

-- The rolls: at a time of the schedule, a live client shuts down
-- (dlock_client_shutdown: its waiters stop, its holders release) and a
-- client with the other setting starts in its place.
function P.schedule_rolls(w, horizon)
  for _ = 1, w.rolls do
    local at = rint3(w, 1, horizon)
    local pick = rand3(w)
    w:at(at, function()
      local live = {}
      for _, c in ipairs(w.clients) do
        if c.alive and not c.closing then live[#live + 1] = c end
      end
      if #live == 0 then return end
      local c = live[1 + floor(pick * #live)]
      if w.tracing then
        w:trace(string.format('ROLL %s (protocol %d) shuts down; a client with protocol %d starts',
          c.name, c.protocol, 3 - c.protocol))
      end
      w.faults.roll = (w.faults.roll or 0) + 1
      C.shutdown(c)
      w:add_client(3 - c.protocol)
    end)
  end
end

-- The protocol whose data a name's lease key o (live) is: 2 for a hash
-- with pv 2, else 1 (a hash without pv is protocol 1's, as its scripts
-- read it; anything else, too: protocol 2's refuse it).
local function data_protocol(o)
  if not o then return nil end
  return o.type == 'hash' and o.v.pv == '2' and 2 or 1
end
P.data_protocol = data_protocol

-- Protocol 1's fields of a name's lease key (lua/acquire.lua, KEYS[1]; a
-- direct grant's, lua/release.lua), each in its form.
local P1_FIELDS = {owner = '^%x+$', token = '^%d+$', nonce = '^%d+$', pl = '^%d+$', exp = '^%d+$',
                   since = '^%d+$', name = '^%S*$', u = '^%d$', pv = '^1$'}

-- What breaks protocol 1's layout in a lease key o (live), or nil.
local function p1_fault(o)
  if o.type ~= 'hash' then return 'is a ' .. o.type end
  local bad
  for f, x in pairs(o.v) do
    local form = P1_FIELDS[f]
    if not form or not x:match(form) then
      if not bad or f < bad then bad = f end
    end
  end
  return bad and string.format('has a field %s = %q (protocol 1\'s lease)', bad, o.v[bad])
end

-- What a key holds now, as one string ('' if absent or expired): a
-- script changed a key if this differs after it. (Only looks: an expired
-- key is not deleted.)
local function fingerprint(srv, k)
  local o = srv.db[k]
  if not o or (o.exp and srv.now_ms > o.exp) then return '' end
  local v = o.v
  if type(v) == 'table' then
    local fs = {}
    for f in pairs(v) do fs[#fs + 1] = f end
    table.sort(fs)
    local parts = {}
    for i, f in ipairs(fs) do parts[i] = f .. '=' .. tostring(v[f]) end
    v = table.concat(parts, ' ')
  end
  return o.type .. ' ' .. tostring(o.exp) .. ' ' .. v
end

-- The newest attempt Redis records of client `me` for a name (keys: the
-- script's), in either layout (the larger): the hash's field c:<id> while
-- its <until> has not passed, and protocol 1's key KEYS[6] while it lives.
-- (Each protocol's acquire reads its own, protocol 2's also protocol 1's
-- when its hash has none; the stale check asks more: that no grant goes
-- to an attempt older than either.)
function P.record_of(w, keys, me)
  local srv = w.srv
  local best
  local o = R.live(srv, keys[1])
  local f = o and o.type == 'hash' and o.v.pv == '2' and o.v['c:' .. me]
  if f then
    local a, u = string.match(f, '^(%d+) %d+ %d+ (%d+)$')
    if a and tonumber(u) >= srv.now_ms then best = tonumber(a) end
  end
  local r = R.live(srv, keys[6])
  local a1 = r and r.type == 'string' and tonumber(r.v:match('^(%d+)'))
  if a1 and (not best or a1 > best) then best = a1 end
  return best
end

-- The grant of client c a call addresses (renew: key i's token; release:
-- by token or by attempt number), if Redis holds it in the layout of the
-- protocol other than `proto` the call is sent in: that grant, else nil.
local function misaddressed(w, c, script, o, argv, i, proto)
  local dp = data_protocol(o)
  if not dp or dp == proto then return nil end
  local g = w.grant_in(o, dp == 2, w.srv.now_ms)
  if not g or g.owner ~= c.id then return nil end
  if script == 'renew' then
    return string.format('%.0f', g.token) == argv[i + 2] and g or nil
  end
  return string.format('%.0f', g.token) == argv[3] and g or nil
end

-- Before a script of protocol `proto` runs (keys: its KEYS; for renew the
-- lease keys of `names`): the `proto` check, and what the `layout` check
-- after it needs (the protocol of each name's data, the keys as they are).
function P.before(w, c, script, names, keys, argv, meta, proto)
  local srv = w.srv
  local st = {proto = proto, script = script, names = names, keys = keys, argv = argv, data = {},
              fp = {}, c = c, meta = meta}
  for i, k in ipairs(keys) do st.fp[i] = fingerprint(srv, k) end
  for i, name in ipairs(names) do
    local o = srv.db[w.lease_key[name]]
    if o and o.exp and srv.now_ms > o.exp then o = nil end
    st.data[i] = data_protocol(o)
    -- proto: a grant addressed in the protocol it is not in
    if c and (script == 'renew' or (script == 'release' and argv[2] == 'token')) and o then
      local g = misaddressed(w, c, script, o, argv, i, proto)
      local made = g and w.grant_era[name][g.token]
      if made and made.era < w.era[name] then
        -- (a fault that loses or brings back data came since the grant: what
        -- Redis holds need not be what the client saw, as for excl)
        g = nil
      end
      if g then
        w:violation('proto', string.format('%s sends %s of its grant of %s (token %.0f, attempt '
          .. '%s) in protocol %d; Redis has that grant in protocol %d\'s layout', c.name,
          script == 'renew' and 'a renewal' or 'the release', name, g.token, tostring(g.nonce),
          proto, 3 - proto))
      end
    end
  end
  return st
end

-- A background give-back of attempt n of client c (the job of an attempt
-- whose outcome it never learned) is done, on Redis's answer to its last
-- call (meta): `proto` asks that no grant of that attempt stood in Redis,
-- in either protocol's data, right after that call ran (P.after notes it:
-- meta.left). (A grant made since, by a late copy of the attempt, is the
-- protocol's accepted cost: it expires; so is one a failover brings back.)
function P.gave_back(w, c, name, n, meta)
  local g = meta.left
  if not g then return end
  w:violation('proto', string.format('%s gave its attempt %d of %s up as given back (its last '
    .. 'call in protocol %d); Redis had its grant in protocol %d\'s data then (token %.0f)', c.name,
    n, name, meta.proto, g.proto, g.token))
end

-- After it ran: the `layout` check (see the head).
function P.after(w, st, rep)
  local srv = w.srv
  local proto, script, keys = st.proto, st.script, st.keys
  local refusal = C.refusal_protocol(rep)
  local function bad(fmt, ...)
    w:violation('layout', string.format(fmt, ...))
  end
  if script == 'renew' then
    -- one lease key per name: another protocol's is left as it is, and
    -- not renewed
    for i, name in ipairs(st.names) do
      if st.data[i] and st.data[i] ~= proto then
        if fingerprint(srv, keys[i]) ~= st.fp[i] then
          bad('%s: protocol %d\'s renew changed %s, which holds protocol %d\'s data', name, proto,
            keys[i], st.data[i])
        elseif type(rep) == 'table' and not rep.err and rep[i] ~= 0 then
          bad('%s: protocol %d\'s renew answered %s for protocol %d\'s data', name, proto,
            tostring(rep[i]), st.data[i])
        end
      end
    end
  else
    local name = st.names[1]
    local dp = st.data[1]
    if dp and dp ~= proto then
      if refusal ~= dp then
        bad('%s: protocol %d\'s %s found protocol %d\'s data and answered %s', name, proto, script,
          dp, w.describe(rep))
      end
      for i, k in ipairs(keys) do
        if fingerprint(srv, k) ~= st.fp[i] then
          bad('%s: protocol %d\'s %s changed %s, refusing protocol %d\'s data', name, proto, script,
            k, dp)
          break
        end
      end
      if #srv.published > 0 then
        bad('%s: protocol %d\'s %s published %q, refusing protocol %d\'s data', name, proto, script,
          srv.published[1].message, dp)
      end
    elseif refusal or C.refused(rep) then
      bad('%s: protocol %d\'s %s refused the data of protocol %s (%s)', name, proto, script,
        tostring(dp or 'none'), rep.err)
    end
    if proto == 2 then
      for _, j in ipairs({2, 5, 6}) do
        if keys[j] and fingerprint(srv, keys[j]) ~= st.fp[j] then
          bad('%s: protocol 2\'s %s changed %s, a key of protocol 1 it only reads', name, script,
            keys[j])
        end
      end
    end
  end
  -- one protocol's data at a time, in its layout
  for _, name in ipairs(st.names) do
    local k = w.lease_key[name]
    -- (R.live, as the layout check of a world of protocol 2 reads it: it
    -- deletes the key if expired, which a failover's comparison of the
    -- data sees, so that a mixed world of one protocol stays that world)
    local o = R.live(srv, k)
    if o then
      local fault
      if data_protocol(o) == 2 then fault = w.layout_fault(o) else fault = p1_fault(o) end
      if fault then bad('%s: after protocol %d\'s %s the lease key %s %s', name, proto, script, k, fault) end
    end
  end
  if C.refused(rep) and script == 'leave' then
    w.faults.proto_leave_refused = (w.faults.proto_leave_refused or 0) + 1
  end
  -- a give-back (release by attempt number): whether a grant of its
  -- attempt stands in Redis right after it (P.gave_back)
  if st.c and script == 'release' and st.argv[2] == 'nonce' then
    local o = srv.db[keys[1]] -- (only looked at)
    local g = o and not (o.exp and srv.now_ms > o.exp) and
      w.grant_in(o, data_protocol(o) == 2, srv.now_ms)
    if g and g.live and g.owner == st.c.id and g.nonce == tonumber(st.argv[3]) then
      st.meta.left = {token = g.token, proto = data_protocol(o)}
    else
      st.meta.left = nil
    end
  end
end

return P
