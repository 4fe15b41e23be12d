-- One simulated world: a Redis server (sim/redis.lua running the real
-- lua/*.lua), dlock clients (sim/client.lua), the network between them, an
-- operator with dlockctl, and a seeded scheduler that injects faults. Time is
-- virtual (microseconds); the same seed gives the same run, event for event.
--
-- Invariants, checked after every event (docs/simulation.md says why each
-- holds and under which assumptions):
--   valid   an acquire returns a lease, or a thread takes a lease passed to
--           it, only while it is valid by the holder's clock.
--   bound   when it does, Redis has the grant, and the holder's validity ends
--           before the grant ends there (its exp), unless a clock stepped or
--           the data was lost or forced since the grant.
--   reserve a local handoff's token stays within its grant's reservation
--           (grant token + pass limit).
--   ahead   a local handoff's token is no further above its grant's than
--           server time has run since the grant, unless a clock stepped.
--   excl    at most one client holds a name with a grant that is valid by its
--           own clock (a thread holding it, before its validity deadline),
--           unless the other holder's grant was revoked: Redis lost it in a
--           restart or a failover, an operator released it by force, or a
--           server clock step forward expired it early. Within a client one
--           thread at most owns an entry: that is structural here (one owner
--           field) and checked by the C tests.
--   order   the tokens of a name strictly increase in the order they are
--           issued: by Redis (any grant, direct ones included, at the
--           script's instant) or by a client (a local handoff), across
--           restarts, failovers and server clock steps back of up to
--           cfg.step_back_ms; a handoff of a revoked grant (the holder does
--           not know yet) is exempt from the order but must not repeat a
--           token.
--   stale   a grant is never made to an attempt older than one whose record
--           Redis still keeps for that client and name; a release, renewal
--           or leave never changes another client's grant, or the caller's
--           other grant.
--   expiry  every key a script writes has an expiry.
--   live    (fault-free schedules) a name is never free in Redis for longer
--           than a bound while a live client waits for it.
--   keys    (at the end) no key outlives the last client's last call by more
--           than its stated lifetime.
--   unclean the first grant made after a release for a holder thread that
--           exited (or its client closed) or an operator's forced release,
--           within a lease time of it and with no data lost since, reports
--           that end (field u, acquire.lua "End": dlock_unclean).
--   layout  (protocol 2) after every script, a name's hash carries pv = 2
--           and only the fields of lua/p2/LAYOUT.txt, each in its form and
--           at most 64 bytes, and protocol 1's fence, turn and record keys
--           were not written. (A mixed world: a name's data is one
--           protocol's at a time, and a script refuses the other's,
--           changing nothing: sim/protocols.lua.)
--   proto   (a mixed world) a client addresses a grant of its own in the
--           protocol it is in (sim/protocols.lua).
--
-- Protocol 2 (sim --protocol 2) runs lua/p2/*.lua instead, which keep a
-- name's data in one hash (lua/p2/LAYOUT.txt): the checker reads a grant
-- through grant_in, and a client's record and the hash's lifetime by that
-- layout; every invariant is the same. A mixed world (sim --protocol
-- mixed) loads both, each client with its own setting: sim/protocols.lua,
-- which adapts layout and adds proto.
local R = require('redis')
local C = require('client')
local P = require('protocols')

local W = {}
W.__index = W

local floor = math.floor

------------------------------------------------------------------------
-- A seeded generator (Park-Miller, exact in doubles, sim/rng.lua): the
-- same on every machine, unlike math.random.
local rng = require('rng')
local M31 = rng.M31
local new_rng = rng.seed
rng.mixin(W)

function W:pick(list) return list[self:rint(1, #list)] end

-- The shared worlds' stream (W.new): the modes of the acquires.
function W:rand4()
  self.rs4 = (self.rs4 * 16807) % M31
  return self.rs4 / M31
end

-- A second stream, for the faults added after the first (`stall`): a
-- schedule that draws none of them is the same event for event as before
-- they came, so seeds found earlier (sim/replays.txt, the mutants' budgets)
-- keep their meaning.
function W:rand2()
  self.rs2 = (self.rs2 * 16807) % M31
  return self.rs2 / M31
end

function W:rint2(a, b)
  if b <= a then return a end
  return a + floor(self:rand2() * (b - a + 1))
end

------------------------------------------------------------------------
-- Events: a 4-ary heap on (time, sequence) (half the levels of a binary
-- one; sequences are unique, so any heap pops the same order). (Sift with
-- a hole: the moving event is written once, at its place.)
local function heap_push(h, ev)
  local n = #h + 1
  local t, seq = ev.t, ev.seq
  while n > 1 do
    local p = floor((n + 2) / 4)
    local a = h[p]
    local at = a.t
    if at < t or (at == t and a.seq < seq) then break end
    h[n] = a
    n = p
  end
  h[n] = ev
end

local function heap_pop(h)
  local top = h[1]
  local n = #h
  local last = h[n]
  h[n] = nil
  n = n - 1
  if n == 0 then return top end
  local lt, ls = last.t, last.seq
  local i = 1
  while true do
    local l = 4 * i - 2 -- the first child
    if l > n then break end
    local c = h[l]
    local ct, cs = c.t, c.seq
    local m = l + 3
    if m > n then m = n end
    for k = l + 1, m do
      local d = h[k]
      local dt = d.t
      if dt < ct or (dt == ct and d.seq < cs) then
        l, c, ct, cs = k, d, dt, d.seq
      end
    end
    if lt < ct or (lt == ct and ls < cs) then break end
    h[i] = c
    i = l
  end
  h[i] = last
  return top
end

function W:at(t, fn, c)
  self.seq = self.seq + 1
  if t < self.now then t = self.now end
  heap_push(self.events, {t = t, seq = self.seq, fn = fn, c = c})
end

-- An event at time t as W:at(t, fn, c) makes it, in queue q, whose first
-- event alone is in the heap: for events that come in the order of their
-- times, and that are many at once, most of them void by their time. A
-- client's command timeouts (each is now plus its fixed timeout on its
-- clock: every step of that sum is monotonic in floating point; most are
-- void, the reply came first) and a replica's writes (each arrives after
-- the one before) are such: the heap holds one of each instead of hundreds.
-- (An event earlier than the queue's last goes to the heap itself: the
-- order holds whatever the caller does.)
local function new_queue() return {first = 1, last = 0, tail = -math.huge} end

function W:at_queued(q, t, fn, c)
  local seq = self.seq + 1
  self.seq = seq
  if t < self.now then t = self.now end
  if t < q.tail then
    heap_push(self.events, {t = t, seq = seq, fn = fn, c = c})
    return
  end
  q.tail = t
  local ev = {t = t, seq = seq, fn = fn, c = c, q = q}
  if q.head then
    q.last = q.last + 1
    q[q.last] = ev
  else
    q.head = ev
    heap_push(self.events, ev)
  end
end

-- (The loop took q's first event from the heap: the next goes in.)
local function next_queued(h, q)
  local i = q.first
  if i > q.last then
    q.head, q.first, q.last, q.tail = nil, 1, 0, -math.huge
    return
  end
  local ev = q[i]
  q[i] = nil
  q.first = i + 1
  q.head = ev
  heap_push(h, ev)
end

-- A client's event: dropped if the client died, put off while it is paused.
function W:after_client(c, dt, fn)
  self:at(self.now + dt / c.rate, fn, c)
end

-- Whether an entry nobody uses is freed now (sim/client.lua, maybe_free).
function W:frees(c)
  return self:rand2() < 0.5
end

-- How long a thread of client c takes to run once woken (a lease passed to
-- it, a renewal round due): `us` at most, or, under the `stall` fault, now
-- and then much longer (that thread alone descheduled: up to 2 leases).
function W:thread_delay(c, us)
  if self.cfg.faults.stall and self:rand2() < 0.02 then
    self.faults.stall = (self.faults.stall or 0) + 1
    self:disturbed()
    local d = self:rint2(1000, 2 * self.cfg.lease_ms * 1000)
    if self.tracing then self:trace(string.format('FAULT a thread of %s stalls %.1f ms', c.name, d / 1000)) end
    return d
  end
  return us
end

-- At time t of the client's boot clock.
function W:at_client_clock(c, t, fn)
  local real = c.t0 + (t - c.coff) / c.rate
  self:at(real, fn, c)
end

function W:clock(c)
  return c.coff + (self.now - c.t0) * c.rate
end

function W:trace(line)
  local tr = self.tr
  tr[#tr + 1] = string.format('%10.3f ms  %s', self.now / 1000, line)
end

------------------------------------------------------------------------
-- The scripts.

local function read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end

-- The scripts' texts: lua/*.lua, dlockctl's forced release among them
-- (lua/force.lua, whose line "--@release.lua" stands for release.lua's
-- text, as dlockctl puts it there). mutate(texts) may change a text.
-- protocol 2: lua/p2/*.lua, the same names (lua/p2/force.lua wraps
-- lua/p2/release.lua); the scripts carry their protocol (fns.protocol),
-- so that a world runs the checks of the layout its scripts write.
-- protocol 'mixed': both, {protocol = 'mixed', by = {[1] = .., [2] = ..}}
-- (mutate(texts, protocol) is called for each).
function W.load_scripts(root, mutate, protocol)
  protocol = protocol or 1
  if protocol == 'mixed' then
    return {protocol = 'mixed', by = {W.load_scripts(root, mutate, 1), W.load_scripts(root, mutate, 2)}}
  end
  local dir = protocol == 2 and 'lua/p2/' or 'lua/'
  local texts = {}
  -- (protocol 2: its shared mode's scripts too, lua/p2/LAYOUT.txt)
  local names = {'acquire', 'release', 'renew', 'leave', 'force'}
  if protocol == 2 then names[#names + 1], names[#names + 2] = 'acquire_shared', 'release_shared' end
  for _, n in ipairs(names) do
    texts[n] = read(root .. '/' .. dir .. n .. '.lua')
  end
  if mutate then mutate(texts, protocol) end
  local fns = {protocol = protocol}
  for _, n in ipairs(names) do
    if n ~= 'force' then fns[n] = R.compile(texts[n], '@' .. dir .. n .. '.lua') end
  end
  local i, j = texts.force:find('--@release.lua\n', 1, true)
  assert(i, dir .. 'force.lua has no line --@release.lua')
  fns.force = R.compile(texts.force:sub(1, i - 1) .. texts.release .. '\n' .. texts.force:sub(j + 1),
    '@dlockctl-force')
  return fns
end

------------------------------------------------------------------------
-- A schedule's settings, drawn from its seed.

-- The names of a schedule, in pairs that share a hash slot (n1 and m155
-- both fall in slot 3671, and so on), so that two names of a schedule
-- share their slot's mark of tokens (lua/acquire.lua, Tokens).
local NAMES = {'n1', 'm155', 'n2', 'm156', 'n3', 'm157', 'n4', 'm150'}

local ALL_FAULTS = {'net', 'msg', 'crash', 'pause', 'restart', 'failover', 'clock', 'drift', 'force',
                    'life', 'stall', 'fast'}
W.ALL_FAULTS = ALL_FAULTS

function W.new(seed, opts, scripts)
  local self = setmetatable({}, W)
  self.seed = seed
  self.rs = new_rng(seed)
  self.rs2 = new_rng(seed + 7777777)
  self.opts = opts
  self.fns = scripts
  -- protocol 2's layout (lua/p2/LAYOUT.txt): every read of the data below
  -- asks this
  self.p2 = scripts.protocol == 2
  -- a mixed world (sim/protocols.lua): both scripts, each client its own
  -- setting; a name's data read in the layout it is in (grant_in)
  self.mixed = scripts.protocol == 'mixed'
  self.fns_by = self.mixed and scripts.by or {[scripts.protocol] = scripts}
  self.protocol = not self.mixed and scripts.protocol or nil -- every client's, in a world of one
  self.layout = self.mixed and 'mixed' or self.p2
  self.tracing = opts.trace
  self.tr = {}
  self.events = {}
  self.seq = 0
  self.now = 0
  self.srv = R.new()
  self.srv_off = 1700000000 * 1000000 + self:rint(0, 999999) -- server clock - real time, us
  self.srv_last = 0
  self.srv_high = 0 -- the latest server time shown so far
  self.behind_until = 0 -- after a step back: the server time the clock must pass
  self.up = true
  self.violations = {}
  self.steps = 0
  self.faults = {}
  self.clients = {}
  self.by_channel = {}
  self.tok = {}    -- name -> {max =, issued = {token = true}}
  self.era = {}    -- name -> its era: a value changed by each revoking fault
  self.era_seq = 0 -- the eras handed out so far: each era value is used once,
                   -- so a record written during a forced release that was
                   -- then undone (fault_force) never matches a later era
  self.grant_era = {} -- name -> token -> {era =, idx =, ...} at its issue
  self.grants_made = {} -- name -> grants issued so far
  self.any_made = {} -- name -> grants and (the shared worlds) runs of shared grants so far
  self.free_since = {}
  self.pending_end = {} -- name -> {code, srv_ms, era}: an unclean end not yet told
  self.step_back_total = 0
  self.backs, self.fwds = 0, 0 -- server clock steps back and forward so far
  self.dirty = {} -- names to look at in the next exclusion check
  self.aof = {}    -- snapshots of the data, newest last, for restarts and failovers
  self.reps = {}   -- the replicas (cfg.replicas): {db =, last = arrival of the newest write}
  self.rep_gen = 0 -- bumped at each failover: writes still on their way to a replica are void

  local cfg = {}
  cfg.clients = opts.clients or self:rint(2, 4)
  cfg.threads = self:rint(1, 3)
  cfg.names = opts.names or self:rint(1, 2)
  cfg.lease_ms = self:pick({100, 200, 500, 1000})
  cfg.waiter_ttl_ms = self:pick({100, 200, 500, 2000})
  local pls = {1, 4, 128, cfg.lease_ms * 1000 - 1}
  cfg.pass_limit = math.min(self:pick(pls), cfg.lease_ms * 1000 - 1)
  cfg.cmd_timeout_ms = self:pick({20, 50, 200})
  cfg.pool_size = self:rint(1, 4)
  cfg.think_us = self:pick({100, 2000, 20000})
  cfg.hold_us = self:pick({50, 2000, cfg.lease_ms * 1500})
  cfg.pass_us = self:pick({0, 2, 30})
  cfg.max_wait_ms = self:pick({10, cfg.lease_ms, 3 * cfg.lease_ms})
  cfg.local_rule = opts.local_rule or 'clock'
  cfg.step_back_ms = opts.step_back_ms or
    (opts.step_back_leases and floor(opts.step_back_leases * cfg.lease_ms)) or 86400000 -- a day
  cfg.steps = opts.steps or self:rint(200, 600)
  -- Faults: each enabled kind is injected in this schedule with probability
  -- 1/2 (a fifth of the schedules have none at all: the liveness check).
  local on = {}
  local nofault = self:rand() < 0.2
  for _, f in ipairs(opts.faults or ALL_FAULTS) do
    if f == 'stall' or f == 'fast' then
      if not nofault and self:rand2() < 0.5 then on[f] = true end -- the second stream
    elseif not nofault and self:rand() < 0.5 then
      on[f] = true
    end
  end
  cfg.faults = on
  -- Swarm (from the second stream too): a quarter of the schedules have
  -- many clients (5 to 16) and names (3 to 8), and a quarter a length of
  -- their own, from a few steps to thousands.
  if self:rand2() < 0.25 then
    if not opts.clients then cfg.clients = self:rint2(5, 16) end
    if not opts.names then cfg.names = self:rint2(3, 8) end
  end
  if not opts.steps and self:rand2() < 0.25 then
    local lengths = {20, 50, 100, 1000, 2000}
    cfg.steps = lengths[self:rint2(1, #lengths)]
  end
  -- Replicas (the second stream too): in half of the schedules with
  -- failovers, 1 or 2 replicas that receive each script's writes after a
  -- lag, and clients that WAIT for min_replicas of them after each grant
  -- and renewal (0 to all); a failover then promotes the replica that has
  -- the most of the master's writes.
  cfg.replicas, cfg.min_replicas = 0, 0
  if on.failover and self:rand2() < 0.5 then
    cfg.replicas = self:rint2(1, 2)
    cfg.min_replicas = self:rint2(0, cfg.replicas)
  end
  if on.fast then
    -- threads that hold and think for no time at all: local handoffs
    -- as fast as the clock rule lets them go (excl.c, handoff_in_time)
    cfg.hold_us, cfg.think_us, cfg.pass_us = 0, 0, 0
  end
  cfg.nofault = next(on) == nil
  -- The shared worlds (sim --shared): each acquire's mode is drawn from a
  -- stream of its own (W:rand4), so that --shared 0 runs protocol 2's
  -- schedules event for event.
  if opts.shared ~= nil then
    self.shared = true
    self.rs4 = new_rng(seed + 5555555)
  end
  self.cfg = cfg
  if self.mixed then P.init(self, seed) end
  self.names = {}
  self.released_last = {} -- by name: whether its last grant was released
  self.lease_keys = {} -- by the name's index, and by name (lease_key)
  self.lease_key = {}
  -- the script that last set the expiry of a name's lease or fence key
  -- (check_keys: a direct grant's key and a leave's fence live longer)
  self.key_origin = {}
  self.q_until = {} -- by name: server ms until which a queue its hash carried needed it
  for i = 1, cfg.names do
    self.names[i] = NAMES[i]
    self.lease_keys[i] = 'dlock:{' .. NAMES[i] .. '}'
    self.lease_key[NAMES[i]] = self.lease_keys[i]
  end
  for _, n in ipairs(self.names) do
    self.grant_era[n] = {}
    self.tok[n] = {max = -1, issued = {}}
    self.era[n] = 0
  end
  return self
end

function W:hexid()
  local parts = {}
  for i = 1, 4 do parts[i] = string.format('%08x', self:rint(0, 2147483646) * 2 % 4294967296) end
  return table.concat(parts)
end

-- A client starts (protocol: its setting; by default the world's, or in
-- a mixed world drawn: sim/protocols.lua).
function W:add_client(protocol)
  local cfg = self.cfg
  local idx = #self.clients + 1
  protocol = protocol or self.protocol or P.draw_protocol(self)
  local c = C.new(self, idx, self:hexid(), {
    lease_ms = cfg.lease_ms, pass_limit = cfg.pass_limit, waiter_ttl_ms = cfg.waiter_ttl_ms,
    pool_size = cfg.pool_size, local_rule = cfg.local_rule, cmd_timeout_ms = cfg.cmd_timeout_ms,
    min_replicas = cfg.min_replicas, protocol = protocol})
  c.rate = 1
  if self.shared then
    -- the share of its acquires that are shared (--shared F, or mix: its own)
    local f = self.opts.shared
    if f == 'mix' then
      local fs = {0, 0.5, 0.9, 1}
      f = fs[1 + floor(self:rand4() * #fs)]
    end
    c.shared_frac = f
  end
  if not self.reps_made then
    self.reps_made = true
    for i = 1, cfg.replicas do self.reps[i] = {db = {}, last = 0, q = new_queue()} end
  end
  if cfg.faults.drift then
    -- within +-0.5%, or (half the time, from the second stream) up to the
    -- bound the drift margin assumes: +-0.99%
    local u = self:rand() - 0.5
    c.rate = 1 + u * (self:rand2() < 0.5 and 0.0198 or 0.01)
  end
  c.t0 = self.now
  c.coff = self:rint(0, 1000000000)
  c.conns = {}
  c.tq = new_queue() -- its command timeouts (W:at_queued)
  c.conn_serial = 0
  c.sub_last = 0
  self.clients[idx] = c
  self.by_channel['dlock:wake:' .. c.id] = c
  for t = 1, cfg.threads do C.start_thread(c, t) end
  C.start_renewal(c)
  if self.tracing then
    self:trace(string.format('%s starts: id %s, clock rate %.4f%s', c.name, c.id, c.rate,
      self.mixed and ', protocol ' .. protocol or ''))
  end
  return c
end

------------------------------------------------------------------------
-- The network and the server.

local function describe(v)
  if type(v) == 'table' then
    if v.err then return 'ERR(' .. v.err .. ')' end
    if v.ok then return v.ok end
    local parts = {}
    for i = 1, (v.n or #v) do parts[i] = describe(v[i]) end
    return '{' .. table.concat(parts, ', ') .. '}'
  end
  if type(v) == 'number' then return string.format('%.0f', v) end
  return tostring(v)
end
W.describe = describe

-- The server's clock for the script that runs now: real time plus the
-- offset, and at least 1 us after the previous script's (a script takes
-- longer than that), except across a step back.
function W:srv_time()
  local t = self.now + self.srv_off
  t = floor(t)
  if t <= self.srv_last and not self.stepped_back then t = self.srv_last + 1 end
  self.stepped_back = false
  self.srv_last = t
  if t > self.srv_high then self.srv_high = t end
  return t
end

-- The grant in a name's hash o (a live key), or nil: {owner, token,
-- nonce, pl, exp = the key's expiry, gexp = the grant's end (server ms),
-- live = false once that end has passed, u = the end it reported, stamp =
-- what changes whenever the grant does}. The one reader of a grant, for
-- either layout:
-- - protocol 1: the fields of the lease key, which stays a while past the
--   grant's end, as a fence, and is deleted when it is released; the
--   key's expiry moves with every change of the grant (the stamp);
-- - protocol 2 (p2): the hash's field g, "<token> <nonce> <pl> <exp>
--   <dur> <u> <tell>", and its owner in field o, which stay past its end until a
--   new grant replaces them, g '' once released. The hash holds every
--   record too, so its expiry moves when other clients write theirs: the
--   stamp is g and o themselves.
local function grant_in(o, p2, now_ms)
  if o.type ~= 'hash' then return nil end
  local v = o.v
  if p2 == 'mixed' then p2 = v.pv == '2' end -- (a mixed world: the layout the data is in)
  if p2 then
    local tok, nonce, pl, e, _, u = string.match(v.g or '', '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) %d+$')
    if not tok then return nil end -- (as the scripts read it: no grant)
    e = tonumber(e)
    return {owner = v.o, token = tonumber(tok), nonce = tonumber(nonce), pl = tonumber(pl),
            exp = o.exp, gexp = e, live = now_ms <= e, u = tonumber(u),
            stamp = v.g .. ' ' .. (v.o or '')}
  end
  local e = tonumber(v.exp)
  return {owner = v.owner, token = tonumber(v.token), nonce = tonumber(v.nonce), pl = tonumber(v.pl),
          exp = o.exp, gexp = e, live = not e or now_ms <= e, u = tonumber(v.u or '0') or 0,
          stamp = o.exp}
end

-- Protocol 2's fields of a name's hash (lua/p2/LAYOUT.txt), each in its
-- form; a record is c:<client id>. Every value is at most 64 bytes.
local P2_FIELDS = {pv = '^2$', g = '^%d+ %d+ %d+ %d+ %d+ %d+ %d+$', o = '^%x+$', n = '^%S*$',
                   u = '^%d+ %d+$', t = '^%x+ %d+$', q = '^1$', r = '^%d+$'}

-- What breaks protocol 2's layout in a name's hash o (a live key), or nil:
-- not a hash, no pv 2, a field the layout does not have or not in its form
-- (the first in the order of their names: one message whatever pairs() did).
local function layout_fault(o)
  if o.type ~= 'hash' then return 'is a ' .. o.type end
  local v = o.v
  if v.pv ~= '2' then return 'has no pv 2' end
  local bad
  for f, x in pairs(v) do
    local form = P2_FIELDS[f] or (f:match('^c:%x+$') and '^%d+ %d+ %d+ %d+$')
      or (f:match('^s:%x+$') and '^%d+ %d+ %d+ %d+ %d+$')
    if not form or #x > 64 or not (x:match(form) or (f == 'g' and x == '')) then
      if not bad or f < bad then bad = f end
    end
  end
  return bad and string.format('has a field %s = %q', bad, v[bad])
end
W.grant_in, W.layout_fault = grant_in, layout_fault

-- The shared leases in a name's hash o (a live key; protocol 2, Shared
-- mode of lua/p2/LAYOUT.txt), as the scripts read the fields s:<id>
-- "<token> <attempt> <dur> <end> <exp>": client id -> {token, nonce, endw,
-- gexp, live = the clock has not passed exp}. (Read in the order of
-- sorted ids by whoever iterates: W.sorted_ids.)
local function shared_in(o, now_ms)
  local out = {}
  if not o or o.type ~= 'hash' then return out end
  for f, x in pairs(o.v) do
    local id = f:match('^s:(%x+)$')
    if id then
      local tok, nonce, _, ew, e = x:match('^(%d+) (%d+) (%d+) (%d+) (%d+)$')
      if tok then
        out[id] = {token = tonumber(tok), nonce = tonumber(nonce), endw = tonumber(ew),
                   gexp = tonumber(e), live = tonumber(e) >= now_ms}
      end
    end
  end
  return out
end
W.shared_in = shared_in

local function sorted_ids(t)
  local ids = {}
  for id in pairs(t) do ids[#ids + 1] = id end
  table.sort(ids)
  return ids
end
W.sorted_ids = sorted_ids

-- A name's shared leases now (shared_in).
function W:shared_of(name)
  self.srv.now_ms = floor((self.now + self.srv_off) / 1000)
  return shared_in(R.live(self.srv, self.lease_key[name]), self.srv.now_ms)
end

-- Whether a name is held in Redis now: a live exclusive grant, or (the
-- shared worlds) a live shared lease.
function W:held_in_redis(name)
  if self:live_lease(name) then return true end
  if self.shared then
    for _, s in pairs(self:shared_of(name)) do
      if s.live then return true end
    end
  end
  return false
end

-- The grant in a name's hash (key), or nil; with live = false when it has
-- expired (grant_in).
local function names_of(w, c) return c and c.name or 'dlockctl' end

local function lease_of(srv, key, p2)
  local o = R.live(srv, key)
  return o and grant_in(o, p2, srv.now_ms)
end

-- The live grant of a name, or nil.
function W:live_lease(name)
  self.srv.now_ms = floor((self.now + self.srv_off) / 1000)
  local l = lease_of(self.srv, self.lease_key[name], self.layout)
  return l and l.live and l or nil
end

function W:violation(kind, msg)
  self.violations[#self.violations + 1] = {kind = kind, msg = msg, t = self.now}
  if self.tracing then self:trace('VIOLATION ' .. kind .. ': ' .. msg) end
end

-- A token issued for name now, by Redis or by a client's handoff (who: a
-- function that names the issuer, called for a violation only).
function W:issue(name, token, who, stale)
  local tk = self.tok[name]
  if stale then
    if tk.issued[token] then
      self:violation('order', string.format('%s: token %.0f issued again by %s (a revoked grant)',
        name, token, who()))
    end
  elseif token <= tk.max then
    self:violation('order', string.format('%s: token %.0f issued by %s after token %.0f',
      name, token, who(), tk.max))
  end
  tk.issued[token] = true
  if not stale and token > tk.max then tk.max = token end
  -- after a step back of the server's clock, tokens go on above it (last
  -- + 1, and up to a pass limit above an expired grant's): until the clock
  -- has caught up with them, a data loss is the double fault that is not
  -- promised (fault_restart)
  if self.stepped_ever and token > self.behind_until then
    self.behind_until = token
  end
end

-- After a script: what it changed, checked.
function W:after_script(c, script, names, keys, argv, before, rep, meta, all_keys)
  local srv = self.srv
  for i, name in ipairs(names) do
    local k = self.lease_key[name]
    local b = before[i]
    local a = lease_of(srv, k, self.layout)
    local same = b and a and b.owner == a.owner and b.token == a.token and b.nonce == a.nonce
    -- how a used grant ended (first: the same script may grant the next): a release by its holder, for a thread that
    -- exited, or by an operator
    if b and script == 'release' and argv[2] == 'token' and b.owner == argv[1]
       and string.format('%.0f', b.token) == argv[3] and (rep == 1 or rep == 2) then
      local code = meta.force and 3 or tonumber(argv[10] or '0') or 0
      self.pending_end[name] = code > 0 and {code = code, srv_ms = srv.now_ms, era = self.era[name]}
        or nil
    end
    if b and not a and script ~= 'acquire' then
      -- a release (by its holder, an operator, or a leave of an unused
      -- grant) took the grant away: its tokens are in the fence and the
      -- mark (in_mark_window)
      self.released_last[name] = true
    end
    if a and not same and not (b and a.token == b.token) then
      self.released_last[name] = false
      -- a new grant: its token is issued now
      self.grants_made[name] = (self.grants_made[name] or 0) + 1
      self.any_made[name] = (self.any_made[name] or 0) + 1
      self.grant_era[name][a.token] =
        {era = self.era[name], idx = self.grants_made[name], backs = self.backs, fwds = self.fwds,
         srv = srv.now_us, any = self.any_made[name]}
      self:issue(name, a.token, function()
        return string.format('redis %s of %s (attempt %s)', script,
          (self.by_id[a.owner] or {name = a.owner}).name, describe(a.nonce))
      end, false)
      -- unclean: the first grant after a release for a thread that exited
      -- or an operator's, within a lease time of it (the fence's life), on
      -- the same data, is told (acquire.lua, "End")
      local p = self.pending_end[name]
      if p and p.era == self.era[name] and srv.now_ms <= p.srv_ms + self.cfg.lease_ms
         and a.u ~= p.code then
        self:violation('unclean', string.format('%s: the grant of %s (token %.0f) says end %d, '
          .. 'after an end %d', name, (self.by_id[a.owner] or {name = a.owner}).name, a.token,
          a.u, p.code))
      end
      self.pending_end[name] = nil
    end
    -- stale: a release, renewal or leave never changes another grant.
    -- (The shared scripts: W:after_shared.)
    if b and script ~= 'acquire' and meta.force == nil and script ~= 'acquire_shared'
       and script ~= 'release_shared' then
      local mine
      if script == 'renew' then
        mine = b.owner == argv[1] and string.format('%.0f', b.token) == argv[i + 2]
      elseif script == 'release' then
        if argv[2] == 'token' then
          mine = b.owner == argv[1] and string.format('%.0f', b.token) == argv[3]
        else
          mine = b.owner == argv[1] and b.nonce == tonumber(argv[3])
        end
      elseif script == 'leave' then
        mine = b.owner == argv[1] and (b.nonce or 0) < tonumber(argv[5])
      end
      if not mine and not (same and a.stamp == b.stamp) then
        self:violation('stale', string.format('%s by %s changed the grant of %s it does not own '
          .. '(%s token %.0f attempt %s)', script, c and c.name or '?', name,
          (self.by_id[b.owner] or {name = b.owner}).name, b.token, describe(b.nonce)))
      end
      -- and, by what the client holds rather than by the scripts' own rule:
      -- a leave or a background release (of an attempt whose outcome was
      -- unknown) never takes away a grant its client holds at that moment
      local e = c and c.alive and c.entries[name]
      if (script == 'leave' or (script == 'release' and argv[2] == 'nonce')) and e and
         b.owner == c.id and b.live and e.state == 'HELD' and e.grant_token == b.token and
         not (same and a.stamp == b.stamp) then
        self:violation('stale', string.format('%s by %s took away %s, which it holds (token %.0f)',
          script, c.name, name, b.token))
      end
    end
  end
  -- stale: no grant to an attempt older than the newest that the client's
  -- record named when the script ran (a record Redis no longer keeps, lost
  -- or expired, proves nothing)
  if (script == 'acquire' or script == 'acquire_shared') and c then
    local name = names[1]
    local r = self.rec_before
    local n = tonumber(argv[3])
    if type(rep) == 'table' and rep[1] == 1 and r and r > n then
      self:violation('stale', string.format('%s: attempt %d of %s granted after Redis recorded '
        .. 'its attempt %d', name, n, c.name, r))
    end
  end
  -- expiry: every key has one (a script writes only the keys it is given),
  -- but a slot's mark of tokens, which has none (at most one a slot).
  for _, k in ipairs(all_keys) do
    local o = srv.db[k]
    if o and not o.exp and not k:find('^dlock:hw:{') then
      self:violation('expiry', 'key ' .. k .. ' has no expiry after ' .. script)
      R.writable(srv, k, o).exp = srv.now_ms + 1000000 -- report it once
    end
  end
  -- layout (protocol 2): a name's hash carries pv = 2 whenever it exists
  -- (the mark by which another protocol's scripts refuse it), and protocol
  -- 1's fence, turn and record keys (KEYS[2], [5], [6]) are only read: in
  -- the simulator no protocol 1 data exists, so one that does was written.
  if self.p2 then
    for _, name in ipairs(names) do
      local o = R.live(srv, self.lease_key[name])
      local fault = o and layout_fault(o)
      if fault then
        self:violation('layout', string.format('%s: after %s the hash %s %s', name, script,
          self.lease_key[name], fault))
      end
    end
    if script ~= 'renew' then
      for _, j in ipairs({2, 5, 6}) do
        local o = keys[j] and srv.db[keys[j]] -- (only looked at)
        if o and not (o.exp and srv.now_ms > o.exp) then
          self:violation('layout', string.format('%s wrote %s, a key protocol 2 only reads', script,
            keys[j]))
        end
      end
    end
  end
end

------------------------------------------------------------------------
-- The shared mode (sim --shared; lua/p2/LAYOUT.txt, "Shared mode").

-- Before a script: each name's exclusive grant and shared leases, and
-- (a script of one name) its wait queue in order, the waiters' liveness
-- values and the turn's client, as the script will read them.
function W:shared_before(names, keys, script)
  local srv, now_ms = self.srv, self.srv.now_ms
  local sb, qb = {}, {}
  for i, name in ipairs(names) do
    local o = R.live(srv, self.lease_key[name])
    sb[i] = {g = o and grant_in(o, true, now_ms), s = shared_in(o, now_ms)}
    if script ~= 'renew' then
      local z, lv = R.live(srv, keys[3]), R.live(srv, keys[4])
      local vals = {}
      if lv and lv.type == 'hash' then
        for k, v in pairs(lv.v) do vals[k] = v end
      end
      local turn = o and o.type == 'hash' and o.v.t
      local tid, tu = (turn or ''):match('^(%x+) (%d+)$')
      qb[i] = {list = z and z.type == 'zset' and R.zsorted(z.v) or {}, vals = vals,
               turn = tid and tonumber(tu) >= now_ms and tid or nil}
    end
  end
  return sb, qb
end

-- A DLOCKMODE refusal (an acquire in one mode by a client holding a live
-- lease of the other) is a reply, not a failure, when it is right: the
-- caller holds the live exclusive grant (a shared acquire), or a live
-- shared lease beside no live exclusive grant (an exclusive acquire).
function W:mode_refusal(c, script, argv, sb, rep)
  if not rep.err:find('^DLOCKMODE') then return false end
  local g, mine = sb[1].g, sb[1].s[argv[1]]
  local right
  if script == 'acquire_shared' then
    right = g and g.live and g.owner == argv[1]
  elseif script == 'acquire' then
    right = mine and mine.live and not (g and g.live)
  end
  if not right then
    self:violation('mode', string.format('%s of %s refused %s: %s', script, names_of(self, c),
      'without a live lease of the other mode', rep.err))
  end
  return true
end

-- The shared mode's invariants, after each script of a shared world
-- (besides excl and shared, checked on the holders: W:check_exclusion):
--   sorder  a shared grant's token is above every token handed out before
--           it (exclusive grants, their local handoffs, earlier shared
--           grants), strictly; the shared grants of one script (a run of
--           direct grants) may share one token. It is issued as any token
--           (W:issue), so that every token after it, exclusive ones and
--           their handoffs, is above it, and exclusive tokens strictly
--           increase, whatever the clock does.
--   writer  a shared grant to a client without a live shared lease (its
--           field beside a live exclusive grant is none) is made only with
--           no live exclusive waiter ahead of it in the queue (a client not
--           queued is behind every waiter; a waiter is live while its
--           liveness deadline has not passed; the client whose live turn
--           it is comes first, as the turn was given to the head of the
--           queue), and, by a shared acquire, with no live turn of another
--           client (its waiter live).
--   stale   a shared script never changes a live exclusive grant, and a
--           shared acquire never makes one.
--   unclean a shared grant to a client without a live shared lease made
--           within a lease time of an unclean end (as for an exclusive
--           grant, W:after_script) is told that end.
function W:after_shared(c, script, names, argv, sb, qb, rep)
  local srv = self.srv
  local now_ms = srv.now_ms
  -- mode: an acquire by a client holding a live lease of the other mode
  -- (as W:mode_refusal reads it) is refused with DLOCKMODE, or as stale
  -- ({-1, 0}); it is never queued behind its own lease, nor granted
  if script == 'acquire' or script == 'acquire_shared' then
    local g, mine = sb[1].g, sb[1].s[argv[1]]
    local other
    if script == 'acquire_shared' then
      other = g and g.live and g.owner == argv[1]
    else
      other = mine and mine.live and not (g and g.live)
    end
    local refused = type(rep) == 'table' and (rep.err and rep.err:find('^DLOCKMODE') or rep[1] == -1)
    if other and not refused then
      self:violation('mode', string.format('%s: %s by %s, which holds a live lease of the other mode, '
        .. 'answered %s', names[1], script, c and c.name or '?', describe(rep)))
    end
  end
  for i, name in ipairs(names) do
    local o = R.live(srv, self.lease_key[name])
    local sa = shared_in(o, now_ms)
    local g = o and grant_in(o, true, now_ms)
    local gb = sb[i].g
    local glive = gb and gb.live
    local toks, seen = {}, {}
    for _, id in ipairs(sorted_ids(sa)) do
      local a, b = sa[id], sb[i].s[id]
      if not b or b.token ~= a.token then
        local who = (self.by_id[id] or {name = id}).name
        if not seen[a.token] then
          seen[a.token] = who
          toks[#toks + 1] = a.token
        end
        local had = b and b.live and not glive
        local q = qb[i]
        if not had and q and q.turn ~= id then
          for _, w in ipairs(q.list) do
            if w == id then break end
            local d = q.vals[w]
            local dl = d and tonumber(d:match('^%d+'))
            if dl and dl > now_ms and not d:match('^%d+ %d+ s ') then
              self:violation('writer', string.format('%s: %s granted %s shared (token %.0f) with '
                .. 'the exclusive waiter %s ahead of it', name, script, who, a.token,
                (self.by_id[w] or {name = w}).name))
              break
            end
          end
          local t = q.turn
          local td = t and q.vals[t]
          if script == 'acquire_shared' and t and t ~= id and td and tonumber(td:match('^%d+')) > now_ms then
            self:violation('writer', string.format('%s: %s granted %s shared (token %.0f) in the '
              .. 'turn of %s', name, script, who, a.token, (self.by_id[t] or {name = t}).name))
          end
        end
        local p = self.pending_end[name]
        if not had and p and p.era == self.era[name] and now_ms <= p.srv_ms + self.cfg.lease_ms
           and a.endw ~= p.code then
          self:violation('unclean', string.format('%s: the shared grant of %s (token %.0f) says end '
            .. '%d, after an end %d', name, who, a.token, a.endw, p.code))
        end
      end
    end
    table.sort(toks)
    for _, tk in ipairs(toks) do
      self.any_made[name] = (self.any_made[name] or 0) + 1
      self.grant_era[name][tk] = {era = self.era[name], idx = self.grants_made[name] or 0,
        backs = self.backs, fwds = self.fwds, srv = srv.now_us, shared = true,
        any = self.any_made[name]}
      self:issue(name, tk, function()
        return string.format('redis %s (a shared grant to %s)', script, seen[tk])
      end, false)
    end
    -- beside: no script makes or extends an exclusive grant while a
    -- shared lease lives, nor a shared lease while an exclusive grant
    -- lives (both may count again at once after a step back of the clock,
    -- each field past its time: then neither may be extended)
    if g and g.live and (not gb or gb.stamp ~= g.stamp or gb.gexp ~= g.gexp) then
      for _, id in ipairs(sorted_ids(sa)) do
        if sa[id].live then
          self:violation('beside', string.format('%s: %s by %s made or extended the exclusive grant '
            .. 'of %s (token %.0f, until %.0f) beside the live shared lease of %s (token %.0f)', name,
            script, c and c.name or '?', (self.by_id[g.owner] or {name = g.owner}).name, g.token,
            g.gexp, (self.by_id[id] or {name = id}).name, sa[id].token))
          break
        end
      end
    end
    if g and g.live then
      for _, id in ipairs(sorted_ids(sa)) do
        local a, b = sa[id], sb[i].s[id]
        if a.live and (not b or b.token ~= a.token or b.gexp ~= a.gexp) then
          self:violation('beside', string.format('%s: %s by %s made or extended the shared lease of '
            .. '%s (token %.0f) beside the live exclusive grant of %s (token %.0f)', name, script,
            c and c.name or '?', (self.by_id[id] or {name = id}).name, a.token,
            (self.by_id[g.owner] or {name = g.owner}).name, g.token))
          break
        end
      end
    end
    if script == 'acquire_shared' or script == 'release_shared' then
      local changed = (gb and gb.stamp) ~= (g and g.stamp)
      if changed and (glive or (script == 'acquire_shared' and g)) then
        self:violation('stale', string.format('%s by %s changed the exclusive grant of %s (%s token '
          .. '%.0f)', script, c and c.name or '?', name, gb and (self.by_id[gb.owner] or
          {name = gb.owner}).name or 'none', gb and gb.token or g.token))
      end
    end
  end
end

-- The newest attempt Redis records of client `me` for a name when a script
-- runs (keys: the script's), or nil: what the acquire counts, as it reads
-- it. Protocol 1: the record key KEYS[6], while it lives. Protocol 2: the
-- hash's field c:<id>, "<newest attempt> <tok> <att> <until ms>", while
-- until has not passed; without that field, protocol 1's key (which
-- lua/p2/acquire.lua reads for a name moved from protocol 1).
function W:record_of(keys, me)
  local srv = self.srv
  if self.mixed then return P.record_of(self, keys, me) end
  if self.p2 then
    local o = R.live(srv, keys[1])
    local f = o and o.type == 'hash' and o.v['c:' .. me]
    if f then
      local a, u = string.match(f, '^(%d+) %d+ %d+ (%d+)$')
      return a and tonumber(u) >= srv.now_ms and tonumber(a) or nil
    end
  end
  local o = R.live(srv, keys[6])
  return o and o.type == 'string' and tonumber(o.v:match('^(%d+)')) or nil
end

-- Runs a script on the server now. Returns its reply.
function W:run_script(c, script, names, keys, argv, meta)
  local srv = self.srv
  local now_us = self:srv_time()
  srv.now_us, srv.now_ms = now_us, floor(now_us / 1000)
  local before = {}
  local lk = self.lease_key
  local p2 = self.p2
  local layout = self.layout
  for i, name in ipairs(names) do before[i] = lease_of(srv, lk[name], layout) end
  self.rec_before = nil
  if script == 'acquire' or script == 'acquire_shared' then
    self.rec_before = self:record_of(keys, argv[1])
  end
  srv.published = {}
  local proto = meta.proto or self.protocol
  local f = self.fns_by[proto][script]
  local mixed = self.mixed and P.before(self, c, script, names, keys, argv, meta, proto)
  -- (which script set the expiry of a lease key or a fence: protocol 1's
  -- check_keys; protocol 2 bounds its hash by the fields in it)
  local exp_before = {}
  for i = 1, p2 and 0 or 2 do
    local o = keys[i] and srv.db[keys[i]]
    exp_before[i] = o and o.exp or false
  end
  local sb, qb
  if self.shared then sb, qb = self:shared_before(names, keys, script) end
  local rep = R.run(srv, f, keys, argv, now_us)
  for _, name in ipairs(names) do
    -- (a hash that carries the queue's field q lives 2 waiter ttls; the
    -- grant to the last waiter takes q away and leaves the time to live,
    -- which only grows: check_hashes)
    local o = R.live(srv, lk[name])
    if o and o.type == 'hash' and o.v.q then
      self.q_until[name] = math.max(self.q_until[name] or 0, srv.now_ms + 2 * self.cfg.waiter_ttl_ms)
    elseif not o then
      self.q_until[name] = nil -- (a hash made later owes that queue nothing)
    end
  end
  for i = 1, p2 and 0 or 2 do
    local o = keys[i] and srv.db[keys[i]]
    if o and o.exp ~= exp_before[i] then self.key_origin[keys[i]] = script end
  end
  if self.tracing then
    local a = {}
    for i = 1, #argv do a[i] = argv[i] end
    local shown = script == 'renew' and table.concat(keys, ' ') or names[1]
    self:trace(string.format('redis runs %s(%s %s) for %s -> %s', script, shown,
      table.concat(a, ' '):gsub(string.rep('%x', 32), function(h) return (self.by_id[h] or {name = h}).name end),
      c and c.name or 'dlockctl', describe(rep)))
    for _, line in ipairs(R.dump(srv)) do self:trace('    ' .. line) end
  end
  -- (a mixed world: a refusal of the other protocol's data is no error;
  -- layout checks it is right, P.after)
  if type(rep) == 'table' and rep.err and not (mixed and C.refused(rep))
     and not (self.shared and self:mode_refusal(c, script, argv, sb, rep)) then
    self:violation('error', script .. ' failed: ' .. rep.err)
  end
  self:after_script(c, script, names, script ~= 'renew' and keys or nil, argv, before, rep, meta,
    keys)
  if mixed then P.after(self, mixed, rep) end
  if sb then self:after_shared(c, script, names, argv, sb, qb, rep) end
  self.arrivals = self:replicate(keys)
  for _, name in ipairs(names) do self.dirty[name] = true end
  for _, p in ipairs(srv.published) do self:publish(p.channel, p.message) end
  self:snapshot()
  return rep
end

-- Replication: the keys a script wrote (a script writes only its KEYS) go
-- to each replica in order, after a lag (now and then a long one). Returns
-- when each replica will have the write, soonest first.
function W:replicate(keys)
  local reps = self.reps
  if #reps == 0 then return {} end
  local delta = {}
  for i, k in ipairs(keys) do
    local o = self.srv.db[k]
    delta[i] = {k, o and R.share(o) or false}
  end
  local arrivals = {}
  local gen = self.rep_gen
  for _, r in ipairs(reps) do
    local lag = self:rint2(20, 1500)
    local spike = self:rand2() < 0.05
    if spike then lag = self:rint2(10000, 2 * self.cfg.lease_ms * 1000) end
    local at = math.max(self.now + lag, r.last + 1)
    r.last = at
    if spike then
      -- a replica that lags holds up every WAIT: a fault, until it has caught up
      self.faults.replica_lag = (self.faults.replica_lag or 0) + 1
      self.last_fault = math.max(self.last_fault or 0, at)
    end
    arrivals[#arrivals + 1] = at
    self:at_queued(r.q, at, function()
      if self.rep_gen ~= gen then return end -- from before a failover
      for _, d in ipairs(delta) do
        r.db[d[1]] = d[2] or nil -- (shared: a replica's data is never changed in place)
      end
    end)
  end
  table.sort(arrivals)
  return arrivals
end

-- A client that WAITs for m replicas after its call (as every exchange of
-- a client with min_replicas ends): WAIT returns once m replicas have the
-- call's writes, or at its timeout (half the command timeout, as the
-- client's), with the count then. Returns how long it waited, and the count.
function W:wait_for(c, arrivals)
  local m = c.cfg.min_replicas or 0
  if m == 0 then return 0, 0 end
  local timeout = c.cfg.cmd_timeout_ms * 1000 / 2
  local waited = timeout
  if arrivals[m] and arrivals[m] - self.now <= timeout then waited = arrivals[m] - self.now end
  local acked = 0
  for _, at in ipairs(arrivals) do
    if at <= self.now + waited then acked = acked + 1 end
  end
  return waited, acked
end

-- The data as persisted or replicated: a copy now and then, newest last.
function W:snapshot()
  local f = self.cfg.faults
  if not (f.restart or f.failover) then return end
  if self:rand() < 0.3 then
    local aof = self.aof
    aof[#aof + 1] = {db = R.snapshot(self.srv), t = self.now}
    if #aof > 8 then table.remove(aof, 1) end
  end
end

function W:publish(channel, msg)
  local c = self.by_channel[channel]
  if not c or not c.alive then return end
  if self.cfg.faults.msg and self:rand() < 0.1 then
    if self.tracing then self:trace('message to ' .. c.name .. ' lost: ' .. msg) end
    self.faults.msg_lost = (self.faults.msg_lost or 0) + 1
    self:disturbed()
    if self:rand() < 0.3 then
      -- the subscriber noticed: it reconnects and wakes every poller
      self:at(self.now + self:rint(1000, 50000), function() C.resubscribed(c) end, c)
    end
    return
  end
  if self.cfg.faults.stall and self:rand2() < 0.03 then
    -- the subscriber thread stalls alone (descheduled, swapped out): this
    -- message and every later one wait behind it, in order, up to 3 leases
    local d = self:rint2(1000, 3 * self.cfg.lease_ms * 1000)
    c.sub_last = math.max(c.sub_last, self.now) + d
    self.faults.stall = (self.faults.stall or 0) + 1
    self:disturbed()
    if self.tracing then self:trace(string.format('FAULT %s subscriber stalls %.1f ms', c.name, d / 1000)) end
  end
  local t = math.max(self.now + self:rint(20, 300), c.sub_last + 1)
  c.sub_last = t
  self:at(t, function() C.message(c, msg) end, c)
  if self.cfg.faults.stall and self:rand2() < 0.02 then
    -- delivered twice (a resubscription that replays what it had)
    c.sub_last = c.sub_last + 1
    self:at(c.sub_last, function() C.message(c, msg) end, c)
  end
end

-- A script call from client c. cb(reply, how) once: how is 'reply',
-- 'timeout' (sent, outcome unknown), 'closed' (the connection broke after
-- sending; outcome unknown) or 'unsent'.
function W:request(c, script, name, keys, argv, meta, cb)
  local names = meta.renew and {} or {name}
  if meta.renew then
    for i, sn in ipairs(meta.renew) do names[i] = sn.e.name end
  end
  local lane = (script == 'renew' or meta.background) and 'r' or 'p'
  local tries = 0
  local done = false
  local function finish(rep, how, acked)
    if done then return end
    done = true
    cb(rep, how, acked)
  end
  local function send()
    tries = tries + 1
    local conn
    if lane == 'r' then
      conn = c.conns.r
      if not conn then
        c.conn_serial = c.conn_serial + 1
        conn = {last = 0, id = c.conn_serial}
        c.conns.r = conn
      end
    else
      local i = c.pool_next
      c.pool_next = c.pool_next % c.s.pool_size + 1
      conn = c.conns[i]
      if not conn then
        c.conn_serial = c.conn_serial + 1
        conn = {last = 0, id = c.conn_serial}
        c.conns[i] = conn
      end
    end
    local net = self.cfg.faults.net
    local d1, d2 = self:rint(20, 300), self:rint(20, 300)
    local fate = 'ok'
    if net then
      local r = self:rand()
      if r < 0.05 then
        d1 = self:rint(1000, 2 * c.cfg.cmd_timeout_ms * 1000 + 2000)
        fate = 'late request'
      elseif r < 0.10 then
        d2 = self:rint(1000, 2 * c.cfg.cmd_timeout_ms * 1000 + 2000)
        fate = 'late reply'
      elseif r < 0.14 then
        fate = 'request lost'
      elseif r < 0.18 then
        fate = 'reply lost, reset'
      elseif r < 0.20 then
        fate = 'reply lost'
      end
      if fate == 'ok' and self:rand2() < 0.005 then
        -- (the second stream) a request held up for seconds, as a network
        -- that buffers it: a late copy long after its caller gave up
        d1 = self:rint2(1000000, 5000000)
        fate = 'late request (seconds)'
      end
      if fate ~= 'ok' then self.faults.net = (self.faults.net or 0) + 1 end
    end
    local arrive = math.max(self.now + d1, conn.last + 1)
    conn.last = arrive
    local my_try = tries
    local timeout_t = c.t0 + (self:clock(c) + c.cfg.cmd_timeout_ms * 1000 - c.coff) / c.rate
    -- the caller's command timeout
    self:at_queued(c.tq, timeout_t, function()
      if tries == my_try then finish(nil, 'timeout') end
    end, c)
    local function broke(at)
      -- the connection is reset: the caller notices at `at`
      if lane == 'r' then c.conns.r = nil else
        for i, x in pairs(c.conns) do if x == conn then c.conns[i] = nil end end
      end
      self:at(at, function()
        if done or tries ~= my_try then return end
        if lane == 'p' and tries <= c.s.pool_size and not meta.renew then
          if self.tracing then self:trace(c.name .. ' connection reset: sends ' .. script .. ' again') end
          send() -- call_script: again on another connection, the same call
        else
          finish(nil, 'closed')
        end
      end, c)
    end
    if fate == 'request lost' then
      broke(self.now + self:rint(50, c.cfg.cmd_timeout_ms * 1500))
      return
    end
    self:at(arrive, function()
      if not self.up then
        broke(self.now + self:rint(20, 300))
        return
      end
      local rep = self:run_script(c, script, names, keys, argv, meta)
      local waited, acked = self:wait_for(c, self.arrivals)
      local ran, gen = self.now, self.rep_gen
      if fate == 'reply lost, reset' then
        broke(self.now + self:rint(50, 2000))
        return
      elseif fate == 'reply lost' then
        return
      end
      self:at(self.now + waited + d2, function()
        if waited > 0 and self.rep_gen ~= gen and self.failover_t < ran + waited then
          -- a failover came while WAIT waited: the old master's connection
          -- broke before its answer (the outcome is unknown to the client)
          if tries == my_try and c.alive then finish(nil, 'closed') end
          return
        end
        if tries == my_try and c.alive then finish(rep, 'reply', acked) end
      end, c)
    end)
  end
  send()
end

------------------------------------------------------------------------
-- What clients tell the checker.

-- Is grant `token` of name still the one Redis has for client c?
-- (mode 'S': a shared lease, its field s:<id>, beside no live exclusive
-- grant: a field that counts again beside one is nobody's lease)
function W:grant_in_redis(c, name, token, mode)
  local l = self:live_lease(name)
  if mode == 'S' then
    local s = self:shared_of(name)[c.id]
    return s and s.live and s.token == token and not l or false
  end
  return l and l.owner == c.id and l.token == token
end

-- Was client c's grant of e revoked by a fault since its issue? It was if
-- a fault that loses grants (a restart, a failover, a forced release, a
-- server clock step forward) came after it and the grant is gone from
-- Redis, or was superseded by a later grant (a failover to a replica that
-- missed the later grant brings an older one back: its holder goes on,
-- below the lost grant's tokens, until its next grant).
-- (The shared worlds: a shared grant supersedes the exclusive grants
-- before it, which it could be made beside only once Redis had ended them;
-- a shared lease is superseded by a later exclusive grant. With
-- --no-revival-excuse a grant Redis holds live now is never revoked, even
-- if a later grant superseded it before a fault brought it back.)
function W:revoked(c, e)
  local g = self.grant_era[e.name][e.grant_token]
  if g == nil or g.era >= self.era[e.name] then return false end
  local there = self:grant_in_redis(c, e.name, e.grant_token, e.mode)
  if there and self.opts.no_revival_excuse then return false end
  -- (superseded: an exclusive grant by any later grant, a shared one of
  -- the shared worlds by a later exclusive grant)
  if g.shared then return g.idx < (self.grants_made[e.name] or 0) or not there end
  return g.any < (self.any_made[e.name] or 0) or not there
end

function W:acquired(c, e, th, token, handoff)
  if self.tracing then
    self:trace(string.format('%s holds %s with token %.0f%s', th.name, e.name, token,
      handoff and ' (local handoff)' or ''))
  end
  self.acquisitions = (self.acquisitions or 0) + 1
  if e.mode == 'S' then self.shared_acquisitions = (self.shared_acquisitions or 0) + 1 end
  self.dirty[e.name] = true
  -- valid: an acquire returns a lease, or a thread takes one passed to it,
  -- only while the holder's own clock says it is valid
  if self:clock(c) >= e.valid_until then
    self:violation('valid', string.format('%s: %s got %s (token %.0f) %.3f ms after its validity '
      .. 'ran out', e.name, th.name, handoff and 'a local handoff' or 'a grant', token,
      (self:clock(c) - e.valid_until) / 1000))
  end
  local revoked = self:revoked(c, e)
  if handoff then
    self:issue(e.name, token, function() return th.name .. ' (local handoff)' end, revoked)
  end
  local g = self.grant_era[e.name][e.grant_token]
  if g and not revoked then
    -- reserve: a grant reserves its tokens up to its pass limit (the
    -- scripts bound the next token by them: acquire.lua, an expired grant)
    if token - e.grant_token > self.cfg.pass_limit then
      self:violation('reserve', string.format('%s: %s got token %.0f, %d above its grant\'s '
        .. '(pass limit %d)', e.name, th.name, token, token - e.grant_token, self.cfg.pass_limit))
    end
    -- ahead: a local handoff's token runs no further above its grant's
    -- than server time has since the grant (so that it is never ahead of
    -- the clock where the grant was not: a data loss would undercut it),
    -- the clock unstepped since
    local since = self.now + self.srv_off - g.srv
    if handoff and g.backs == self.backs and g.fwds == self.fwds and
       token - e.grant_token > since then
      self:violation('ahead', string.format('%s: %s got token %.0f, %.0f above its grant\'s, '
        .. '%.0f us of server time after it', e.name, th.name, token, token - e.grant_token, since))
    end
    -- bound: the holder's validity ends before its grant ends in Redis
    -- (the lease's exp, server time), clocks unstepped since the grant
    if g.backs == self.backs and g.fwds == self.fwds and g.era == self.era[e.name] then
      self.srv.now_ms = floor((self.now + self.srv_off) / 1000)
      local l = lease_of(self.srv, self.lease_key[e.name], self.layout)
      local exp = l and l.owner == c.id and l.token == e.grant_token and l.gexp
      if e.mode == 'S' then
        local sl = self:shared_of(e.name)[c.id]
        exp = sl and sl.token == e.grant_token and sl.gexp
      end
      local ends = c.t0 + (e.valid_until - c.coff) / c.rate + self.srv_off
      if not exp and not handoff then
        self:violation('bound', string.format('%s: %s takes grant %.0f, which Redis no longer has',
          e.name, th.name, e.grant_token))
      elseif exp and ends > exp * 1000 + 1000 then
        self:violation('bound', string.format('%s: %s holds until server time %.3f ms, %.3f ms '
          .. 'after the grant ends in Redis', e.name, th.name, ends / 1000, ends / 1000 - exp))
      end
    end
  end
end

function W:released(c, e, th) end

-- A background give-back of client c's attempt n of name is done (in a
-- mixed world: sim/protocols.lua).
function W:gave_back(c, name, n, meta) P.gave_back(self, c, name, n, meta) end

-- excl: at most one unrevoked valid holder per name.
--
-- Only the names something happened to since the last check are looked at
-- (W:touch): a second valid holder can appear only when a thread takes a
-- lease (W:acquired), a renewal extends one, or a script or a fault changes
-- what Redis holds (a grant revoked can come back); validity running out
-- only removes holders.
function W:touch(name) self.dirty[name] = true end

function W:check_exclusion()
  local clients = self.clients
  local dirty = self.dirty
  if next(dirty) == nil then return end
  self.dirty = {}
  for _, name in ipairs(self.names) do
    if dirty[name] then
      -- (whether a grant was revoked costs more: asked only of a second
      -- valid holder's name)
      local valid, now = 0, self.now
      for i = 1, #clients do
        local c = clients[i]
        local e = c.alive and c.entries[name]
        if e and e.owner and e.state == 'HELD' and c.coff + (now - c.t0) * c.rate < e.valid_until then
          valid = valid + 1
        end
      end
      -- (the shared worlds: any number of shared holders, or one
      -- exclusive holder, never both: a shared holder beside an exclusive
      -- one is the violation `shared`)
      local holder, reader
      for _, c in ipairs(valid > 1 and clients or {}) do
        local e = c.alive and c.entries[name]
        if e and e.owner and e.state == 'HELD' and self:clock(c) < e.valid_until
           and not self:revoked(c, e) then
          if e.mode == 'S' then
            reader = reader or e
          elseif holder then
            self:violation('excl', string.format('%s held by %s (token %.0f) and %s (token %.0f)',
              name, holder[1].owner.name, holder[1].token, e.owner.name, e.token))
            return
          else
            holder = {e}
          end
          if holder and reader then
            self:violation('shared', string.format('%s held exclusively by %s (token %.0f) and '
              .. 'shared by %s (token %.0f)', name, holder[1].owner.name, holder[1].token,
              reader.owner.name, reader.token))
            return
          end
        end
      end
    end
  end
end

-- live: in a schedule without faults, a free name with a live waiter does
-- not stay free longer than this bound. What may keep it free: a turn, or
-- the queue entry of a client that stopped waiting (its leave overtaken by
-- its own newer single try, which Redis then refuses as stale), each for a
-- waiter ttl from its last refresh, which came before the name was free;
-- then the waiter's next retry, a waiter ttl / 4 later at the latest
-- (client.c, fallback_ns); 50 ms for the round trips.
function W:check_liveness()
  local bound = (self.cfg.waiter_ttl_ms * 5 / 4 + 50) * 1000
  local clients, now = self.clients, self.now
  local db, now_ms = self.srv.db, floor((now + self.srv_off) / 1000)
  local keys = self.lease_keys
  for j, name in ipairs(self.names) do
    -- whether the name is held in Redis (a look that changes nothing: a
    -- held name needs no more), then a live client waiting long enough,
    -- then whether the name is free in Redis (W:live_lease)
    local o = db[keys[j]]
    local held = false
    if o and not (o.exp and now_ms > o.exp) then
      local l = grant_in(o, self.layout, now_ms)
      held = l and l.live or false
      if not held and self.shared then
        for _, sl in pairs(shared_in(o, now_ms)) do held = held or sl.live end
      end
    end
    local waiting = false
    for i = 1, held and 0 or #clients do
      local c = clients[i]
      local e = c.alive and not c.paused_until and c.entries[name]
      if e and not e.owner and (e.poller or e.queue[1]) then
        local th = e.poller or e.queue[1]
        if th.state == 'waiting' and (th.deadline == math.huge or
           th.deadline - (c.coff + (now - c.t0) * c.rate) > bound) then
          waiting = true
          break
        end
      end
    end
    if waiting and not (self.shared and self:held_in_redis(name) or self:live_lease(name)) then
      local since = self.free_since[name]
      if not since then
        self.free_since[name] = now
      elseif now - since > bound then
        self:violation('live', string.format('%s free for %.1f ms while a client waits', name,
          (now - since) / 1000))
        self.free_since[name] = nil
      end
    else
      self.free_since[name] = nil
    end
  end
end

------------------------------------------------------------------------
-- Faults.

-- A fault that can hold up progress just ended (a restart's server back, a
-- failover, a crash, a pause's end, a clock step, a forced release, a
-- shutdown): liveness is checked again once the recovery bound has passed
-- since the last one (W:run).
function W:disturbed() self.last_fault = math.max(self.last_fault or 0, self.now) end

-- Whether two copies of the data hold the same keys and values for name.
local function same_obj(a, b)
  if not a or not b then return a == b end
  if a.type ~= b.type or a.exp ~= b.exp then return false end
  if type(a.v) ~= 'table' then return a.v == b.v end
  for f, x in pairs(a.v) do if b.v[f] ~= x then return false end end
  for f in pairs(b.v) do if a.v[f] == nil then return false end end
  return true
end

function W:same_name_data(d1, d2, name)
  local tag = '{' .. name .. '}'
  for _, d in ipairs({d1, d2}) do
    for k in pairs(d) do
      if k:find(tag, 1, true) and not same_obj(d1[k], d2[k]) then return false end
    end
  end
  return true
end

function W:new_era(name)
  self.dirty[name] = true
  self.era_seq = self.era_seq + 1
  self.era[name] = self.era_seq
end

function W:revoke_all(why)
  for _, n in ipairs(self.names) do self:new_era(n) end
  self.faults[why] = (self.faults[why] or 0) + 1
end

function W:fault_restart(kind)
  -- kind: 'empty' (no persistence), 'aof' (loses the writes after a recent
  -- snapshot), 'failover' (a replica that missed the last writes), 'kept'
  -- (persistence that kept every write: appendfsync always).
  -- A loss of data not while the server's clock is behind a token it issued
  -- after a step back: a fence and a mark lost then cannot be made up for by
  -- the clock, and tokens go back (docs/guide.md, "Fencing tokens": the two
  -- faults together are outside what is promised). It comes once the clock
  -- has caught up. A restart that kept the data may come at any time.
  local top = self.behind_until
  local srv = self.now + self.srv_off
  if srv <= top and kind ~= 'kept' then
    self:at(self.now + (top - srv) + 1000, function() self:fault_restart(kind) end)
    return
  end
  local down = kind == 'failover' and self:rint(0, 2000) or self:rint(1000, 50000)
  self.up = false
  local db
  if kind == 'kept' then
    db = R.copy_db(self.srv.db)
  elseif kind == 'empty' or #self.aof == 0 then
    db = {}
  else
    local k = self:rint(1, #self.aof)
    db = R.copy_db(self.aof[k].db)
  end
  if kind ~= 'kept' then self.aof = {} end
  local old = self.srv.db
  if kind == 'failover' and #self.reps > 0 then
    -- the replica with the most of the master's writes (the one whose
    -- newest write came last) is promoted; writes still on their way are
    -- lost, and the other replicas resync from it
    local best = self.reps[1]
    for _, r in ipairs(self.reps) do if r.last > best.last then best = r end end
    db = R.copy_db(best.db)
    self.rep_gen = self.rep_gen + 1
    self.failover_t = self.now
    for _, r in ipairs(self.reps) do
      -- (writes on their way go on in their queue, void: later ones may
      -- come sooner, in a queue of their own)
      r.db, r.last, r.q = R.copy_db(db), self.now, new_queue()
    end
  end
  if self.tracing then self:trace('FAULT redis ' .. kind .. ' (down ' .. down .. ' us)') end
  self.srv.db = db
  if kind ~= 'kept' then self.loss_srv = self.now + self.srv_off end -- the server's clock at the loss
  if kind == 'failover' and #self.reps > 0 then
    -- A name whose keys all came through keeps its era: nothing of it was
    -- lost, nothing is excused. With min_replicas equal to the replicas,
    -- nothing is excused at all: every grant and renewal a client counts
    -- reached every replica, so the promoted one has it (what it may lack,
    -- a release or a leave, leaves nobody believing it holds a lease).
    self.faults.failover = (self.faults.failover or 0) + 1
    self.faults.failover_replica = (self.faults.failover_replica or 0) + 1
    for _, n in ipairs(self.names) do
      if not self:same_name_data(old, db, n) then
        if self.cfg.min_replicas < #self.reps then
          self:new_era(n)
        else
          -- a release is not WAITed for: the promoted replica may lack one,
          -- and with it the word of an unclean end it carried (the grant
          -- then expires, and the next holder is told so instead)
          self.pending_end[n] = nil
        end
      end
    end
  elseif kind == 'kept' then
    self.faults.restart_kept = (self.faults.restart_kept or 0) + 1 -- nothing lost, nothing excused
  else
    self:revoke_all(kind == 'failover' and 'failover' or 'restart')
  end
  self:at(self.now + down, function()
    self.up = true
    self:disturbed()
    -- every client's subscriber reconnects: it wakes its pollers and
    -- starts a renewal round (client.c: the subscriber's reconnect)
    for _, c in ipairs(self.clients) do
      if c.alive then
        self:at(self.now + self:rint(100, 5000), function() C.resubscribed(c) end, c)
      end
    end
  end)
end

function W:fault_force(name, tries)
  -- dlockctl release --force on a held name: reads the lease, then runs the
  -- forced release as its holder (again after the wait it asks for), and
  -- tells the holder.
  name = name or self:pick(self.names)
  tries = tries or 0
  local l = self:live_lease(name)
  if not l or not self.up then return end
  local keys = C.keys(name, l.owner)
  local argv = {l.owner, 'token', string.format('%.0f', l.token), '3600000',
                string.format('%.0f', l.token), 'dlock:wake:', name, '2000', '60000', '3'}
  if self.tracing then self:trace('FAULT dlockctl release --force ' .. name) end
  local era = self.era[name]
  self:new_era(name)
  -- (with the forced release of the protocol of the name's data, as
  -- dlockctl runs the script of the protocol whose read script read it)
  local proto = self.mixed and P.data_protocol(R.live(self.srv, self.lease_key[name])) or nil
  local rep = self:run_script(nil, 'force', {name}, keys, argv, {force = true, proto = proto})
  if type(rep) == 'number' and rep < 0 then
    self.era[name] = era -- nothing changed: wait as asked, then again
    if tries < 100 then
      self:at(self.now + math.min(-rep, 1000) * 1000, function() self:fault_force(name, tries + 1) end)
    end
    return
  end
  self.faults.force = (self.faults.force or 0) + 1
  self:disturbed()
  if rep == 1 or rep == 2 then
    self:publish('dlock:wake:' .. l.owner, 'f ' .. string.format('%.0f', l.token) .. ' ' .. name)
  end
end

-- Whether server time t lies in the window a slot's mark leaves open:
-- at or above the mark's clock (the time the slot's latest grant read)
-- and its token (none after a loss of the mark), and below the highest
-- token handed out to
-- a name of that slot whose last grant was not released (a release
-- reports its tokens to the mark) and whose lease key and fence are both
-- gone (a name's own keys bound its tokens while they live).
function W:in_mark_window(t)
  local high = {}
  local now_ms = floor((self.now + self.srv_off) / 1000)
  local function present(k)
    local o = self.srv.db[k] -- (only looked at)
    return o and not (o.exp and now_ms > o.exp)
  end
  for _, n in ipairs(self.names) do
    local ks = C.keys(n, '')
    -- (protocol 2: the hash bounds the tokens while its field g holds the
    -- grant, expired or not: lua/p2/acquire.lua, gone; its records, queue
    -- flag and turn do not)
    -- (a mixed world: the lease key in the layout it is in; protocol 2's
    -- reads protocol 1's fence only when it makes its hash)
    local own = present(ks[1])
    local hash2 = own and (self.p2 or (self.mixed and P.data_protocol(self.srv.db[ks[1]]) == 2))
    if hash2 then own = grant_in(self.srv.db[ks[1]], true, now_ms) end
    local fence = present(ks[2]) and not (self.mixed and hash2)
    if not self.released_last[n] and not own and not fence then
      high[ks[7]] = math.max(high[ks[7]] or 0, self.tok[n].max)
    end
  end
  for k, h in pairs(high) do
    local o = self.srv.db[k] -- (a mark has no expiry; only looked at)
    local tok, clk
    if o and type(o.v) == 'string' then tok, clk = o.v:match('^(%d+) (%d+) %d+$') end
    local from = math.max(tonumber(clk) or 0, tonumber(tok) or 0)
    if t >= from and t < h then return true end
  end
  return false
end

-- A step of the server's clock: forward (leases expire early) or back
-- (within the assumption: see below).
function W:fault_clock(forward_us, back_us)
  local lease = self.cfg.lease_ms * 1000
  local fwd = forward_us or (not back_us and self:rand() < 0.4)
  local d
  if fwd then
    d = forward_us or self:rint(1000, 2 * lease)
    self:revoke_all('clock_forward')
    self.fwds = self.fwds + 1
  else
    -- The assumption: the server's clock never reads more than
    -- step_back_ms below the latest time it has shown (steps back add
    -- up until the clock has caught up).
    local srv = self.now + self.srv_off
    if srv > self.srv_high then self.srv_high = srv end -- the clock's own latest reading
    local room = self.cfg.step_back_ms * 1000 - math.max(0, self.srv_high - srv)
    if room < 1000 then return end
    -- steps of up to two leases, a minute, or the whole room (a day)
    local cap = math.min(room, self:pick({2 * lease, 60000000, room}))
    if cap < 1000 then cap = 1000 end
    d = -self:rint(self:rand() < 0.5 and 1000 or floor(cap / 2), cap)
    if back_us then d = -math.min(back_us, room) end
    -- Not back to before the time Redis lost its data: tokens issued
    -- just before the loss would be ahead of the stepped-back clock, and
    -- their fences are gone (the two faults together are outside what
    -- is promised: docs/guide.md, "Fencing tokens"): skipped.
    if self.loss_srv and srv + d <= self.loss_srv then
      self.faults.clock_back_later = (self.faults.clock_back_later or 0) + 1
      return
    end
    -- Not into the one window the slot's mark leaves open (lua/acquire.lua,
    -- Tokens; docs/guide.md): at or above the server time the latest
    -- grant of a slot read, and below a token handed out in that slot (local
    -- handoffs above the grants' tokens, of a grant that may have expired
    -- unreleased): skipped.
    if self:in_mark_window(srv + d) then
      self.faults.clock_back_window = (self.faults.clock_back_window or 0) + 1
      return
    end
    self.faults.clock_back = (self.faults.clock_back or 0) + 1
    -- The word of an unclean end lives a lease time of server time (a
    -- fence key, field u); one whose time the clock has passed may be gone
    -- (Redis expires keys as it reads the clock): a step back does not
    -- make it due again.
    for n, p in pairs(self.pending_end) do
      if floor(srv / 1000) > p.srv_ms + self.cfg.lease_ms then self.pending_end[n] = nil end
    end
    self.backs = self.backs + 1
    self.stepped_back = true
    self.step_back_total = self.step_back_total - d
    self.behind_until = math.max(self.behind_until, self.srv_high)
    self.stepped_ever = true
    if -d > 2 * lease then
      -- A large step is set right again after a while (an operator, or
      -- the time service), as a step forward of the same size: until
      -- then a lease whose holder died lasts as much longer, and waiters
      -- wait for it.
      self:at(self.now + self:rint(lease, 4 * lease), function() self:fault_clock(-d) end)
    end
  end
  if self.tracing then self:trace(string.format('FAULT server clock steps %+.1f ms', d / 1000)) end
  self.srv_off = self.srv_off + d
  self:disturbed()
  for _, n in ipairs(self.names) do self.dirty[n] = true end
end

-- Every client stands still for longer than the names' keys live (their
-- grants expire unreleased, their fences go), and then the server's clock
-- steps back by more than that: only the slots' marks keep the tokens
-- going up (lua/acquire.lua, Tokens).
function W:fault_quiet_step()
  local lease = self.cfg.lease_ms * 1000
  local d = self:rint(floor(5 * lease / 2), 4 * lease)
  for _, c in ipairs(self.clients) do
    if c.alive and not c.paused_until then
      c.paused_until = self.now + d
      self:at(self.now + d, function()
        c.paused_until = nil
        self:disturbed()
      end)
    end
  end
  self.faults.quiet = (self.faults.quiet or 0) + 1
  if self.tracing then self:trace(string.format('FAULT every client stands still for %.1f ms', d / 1000)) end
  local at = self:rand() < 0.5 and self:rint(0, floor(lease / 2)) or self:rint(0, 100)
  self:at(self.now + d - at, function()
    local back = self:rint(d, d + 2 * lease)
    if self:rand() < 0.5 then
      -- to just after the time the latest grant of a name's slot read
      -- (the mark's clock), where only the mark and what releases told it
      -- keep tokens going up
      local o = self.srv.db[C.keys(self:pick(self.names), '')[7]] -- (only looked at)
      local clk = o and type(o.v) == 'string' and tonumber(o.v:match('^%d+ (%d+) %d+$'))
      local srv = self.now + self.srv_off
      if clk and clk + 1000 < srv then back = srv - (clk + self:rint(1, 1000)) end
    end
    self:fault_clock(nil, back)
  end)
end

function W:schedule_faults(horizon)
  local f = self.cfg.faults
  local lease = self.cfg.lease_ms * 1000
  local function when() return self:rint(1, horizon) end
  if f.crash then
    for _ = 1, self:rint(1, 2) do
      self:at(when(), function()
        local c = self:pick(self.clients)
        if not c.alive then return end
        if self.tracing then self:trace('FAULT ' .. c.name .. ' crashes') end
        c.alive = false
        self.faults.crash = (self.faults.crash or 0) + 1
        self:disturbed()
        self:add_client()
        if f.clock and self:rand() < 0.5 then
          -- its grants expire unreleased: a step of the clock around then
          self:at(self.now + self:rint(0, 2 * lease), function() self:fault_clock() end)
        end
      end)
    end
  end
  if f.pause then
    for _ = 1, self:rint(1, 2) do
      self:at(when(), function()
        local c = self:pick(self.clients)
        if not c.alive or c.paused_until then return end
        local d = self:rint(lease / 2, 2 * lease)
        if self.tracing then self:trace(string.format('FAULT %s paused for %.1f ms', c.name, d / 1000)) end
        c.paused_until = self.now + d
        self.faults.pause = (self.faults.pause or 0) + 1
        self:at(self.now + d, function()
          c.paused_until = nil
          self:disturbed()
        end)
      end)
    end
  end
  if f.restart then
    self:at(when(), function() self:fault_restart(self:pick({'empty', 'aof', 'kept'})) end)
  end
  if f.failover then
    self:at(when(), function() self:fault_restart('failover') end)
  end
  if f.clock then
    for _ = 1, self:rint(1, 3) do
      self:at(when(), function() self:fault_clock() end)
    end
    if self:rand() < 0.5 then
      self:at(when(), function() self:fault_quiet_step() end)
    end
  end
  if f.force then
    for _ = 1, self:rint(1, 2) do
      self:at(when(), function() self:fault_force() end)
    end
  end
  if f.life then
    -- (acquires are cancelled and holder threads exit in client.lua, C.want
    -- and C.release) and a client shuts down
    self:at(when(), function()
      local c = self:pick(self.clients)
      if not c.alive or c.closing then return end
      if self.tracing then self:trace('FAULT ' .. c.name .. ' shuts down') end
      self.faults.shutdown = (self.faults.shutdown or 0) + 1
      self:disturbed()
      C.shutdown(c)
    end)
  end
end

------------------------------------------------------------------------
-- A schedule.

function W:run()
  local cfg = self.cfg
  self.by_id = setmetatable({}, {__index = function(_, id)
    for _, c in ipairs(self.clients) do if c.id == id then return c end end
  end})
  for _ = 1, cfg.clients do self:add_client() end
  if self.tracing then
    local f = {}
    for k in pairs(cfg.faults) do f[#f + 1] = k end
    table.sort(f)
    self:trace(string.format('schedule %d: %d clients x %d threads, %d names, lease %d ms, '
      .. 'pass_limit %d, waiter ttl %d ms, command timeout %d ms, pool %d, rule %s, '
      .. 'replicas %d (min_replicas %d), faults: %s%s',
      self.seed, cfg.clients, cfg.threads, cfg.names, cfg.lease_ms, cfg.pass_limit,
      cfg.waiter_ttl_ms, cfg.cmd_timeout_ms, cfg.pool_size, cfg.local_rule, cfg.replicas,
      cfg.min_replicas, #f > 0 and table.concat(f, ',') or 'none', self.p2 and ', protocol 2' or
      self.mixed and string.format(', protocols mixed (a client speaks 2 with probability %.2f; '
        .. '%d rolls)', self.p2_share, self.rolls) or ''))
  end
  self:schedule_faults(cfg.lease_ms * 1000 * 6)
  if self.mixed then P.schedule_rolls(self, cfg.lease_ms * 1000 * 6) end
  local ev = self.events
  local limit = cfg.steps
  -- after a fault: a lease and a waiter ttl for what it left behind to
  -- expire (a dead holder's lease, a dead waiter's direct grant), and as
  -- much again for the waiters to notice
  local recovery = (2 * cfg.lease_ms + 2 * cfg.waiter_ttl_ms + 100) * 1000
  while #ev > 0 and #self.violations == 0 do
    local e = heap_pop(ev)
    local c = e.c
    local q = e.q
    if q then
      e.q = nil
      next_queued(ev, q)
    end
    if c and not c.alive then
      -- a dead client's events are gone
    elseif c and c.paused_until and e.t < c.paused_until then
      e.t = c.paused_until
      self.seq = self.seq + 1
      e.seq = self.seq
      heap_push(ev, e)
    else
      if e.t > self.now then self.now = e.t end
      e.fn()
      self.steps = self.steps + 1
      self:check_exclusion()
      if cfg.nofault then
        self:check_liveness()
      elseif not cfg.faults.net and self.now > (self.last_fault or 0) + recovery then
        -- live under faults: the same bound, once the recovery bound has
        -- passed since the last fault (docs/simulation.md)
        if not self.live_after then
          self.live_after = true
          self.faults.live_checked_after_faults = (self.faults.live_checked_after_faults or 0) + 1
        end
        self:check_liveness()
      end
      if self.steps == limit then self.stopping = true end
      if self.steps > limit + 20000 then
        self:violation('live', 'the clients did not come to rest after the schedule')
      end
    end
  end
  if #self.violations == 0 then self:check_keys() end
  return self
end

-- The slot's mark of a name (lua/acquire.lua, Tokens): its token and pass
-- limit, which bound every token a grant of the slot handed out (0, 0 if
-- none); only looked at.
function W:mark_of(name)
  local o = self.srv.db[C.keys(name, '')[7]]
  local tok, pl
  if o and type(o.v) == 'string' then tok, pl = o.v:match('^(%d+) %d+ (%d+)$') end
  return tonumber(tok) or 0, tonumber(pl) or 0
end

-- keys (protocol 2), when the last call is done: a name's hash holds every
-- piece of its data but the queue, each field with an end of its own
-- (lua/p2/LAYOUT.txt), and each script gives the hash the longest life its
-- writes need, its time to live only growing (PEXPIRE GT). So the hash
-- expires no later than the latest end its fields state: g, a lease time
-- past both its exp and the time its tokens stand for (token + pass
-- limit: ahead of the clock after a step back); a record (c:<id>), u and
-- t, their <until>; q, twice the waiter ttl from now (the queue's life
-- from its last refresh, which came before). A hash that lives longer
-- outlives what its data says. Allowed beyond that, each for a field a
-- later script took away or rewrote with an earlier end (the TTL stays):
-- 3 ms of rounding (a direct grant lives half a record lifetime past its
-- token, which the releaser's record, written with it, covers); any step
-- back of the server's clock (a record rewritten after one ends earlier);
-- after one, a lease time and a waiter ttl past the slot's mark (a grant
-- ahead of the clock, since released, whose tokens the mark keeps); the
-- 2 waiter ttls a queue's field q needed when a script last left it (the
-- grant to the last waiter takes q away); and an hour once an operator
-- forced a release (its u, taken by the next grant).
-- A hash whose fields are not the layout's breaks the layout (as after
-- every script).
function W:check_hashes()
  local cfg = self.cfg
  local now_ms = floor((self.now + self.srv_off) / 1000)
  local l = cfg.lease_ms
  local slack = 3 + self.step_back_total / 1000 + (self.faults.force and 3600000 or 0)
  for _, name in ipairs(self.names) do
    local k = self.lease_key[name]
    local o = self.srv.db[k] -- (only looked at)
    -- (a mixed world: protocol 2's hashes; protocol 1's lease keys as
    -- protocol 1's, check_keys)
    if o and self.mixed and P.data_protocol(o) ~= 2 then o = nil end
    if o and not (o.exp and now_ms > o.exp) then
      local fault = layout_fault(o)
      if fault then
        self:violation('layout', string.format('%s: at the end the hash %s %s', name, k, fault))
        return
      end
      local need = -math.huge -- server ms
      for f, v in pairs(o.v) do -- (the largest: the order does not matter)
        if f == 'g' then
          local g = grant_in(o, true, now_ms)
          if g then need = math.max(need, math.max(g.gexp, math.ceil((g.token + g.pl) / 1000)) + l + 1) end
        elseif f == 'q' then
          need = math.max(need, now_ms + 2 * cfg.waiter_ttl_ms)
        elseif f:sub(1, 2) == 's:' then
          -- a shared lease: a lease time past its exp and past its token
          local tok, e = v:match('^(%d+) %d+ %d+ %d+ (%d+)$')
          need = math.max(need, math.max(tonumber(e), math.ceil(tonumber(tok) / 1000)) + l + 1)
        elseif f == 'r' then
          need = math.max(need, tonumber(v) + l + 1)
        elseif f == 'u' or f == 't' or f:sub(1, 2) == 'c:' then
          need = math.max(need, tonumber(v:match(' (%d+)$')))
        end -- (pv, o and n have no end of their own)
      end
      need = math.max(need, self.q_until[name] or -math.huge)
      if self.stepped_ever then
        local mtok, mpl = self:mark_of(name)
        need = math.max(need, math.ceil((mtok + mpl) / 1000) + math.max(l, cfg.waiter_ttl_ms) + 1)
      end
      if not o.exp or o.exp > need + slack then
        self:violation('keys', string.format('%s: the hash %s lives %s ms more, %.0f ms past the '
          .. 'latest end of its fields', name, k, o.exp and string.format('%.0f', o.exp - now_ms) or
          'for ever', o.exp and o.exp - need or math.huge))
        return
      end
    end
  end
end

-- keys: once every client is done (released, left), every key is gone
-- after its stated lifetime: records keep_ms, the queue 2 x waiter ttl, the
-- fence a lease time (or until server time passes its token; a leave's,
-- the larger of the lease time and the waiter ttl), a lease key a lease
-- time past its grant, plus any server clock step back. (Protocol 2: the
-- name's hash first, by its fields (check_hashes); then the same, the hash
-- as long as a record, or longer only while the tokens of its grant, or of
-- its slot's mark (a release's u), are ahead of the clock.)
function W:check_keys()
  local cfg = self.cfg
  local keep = 2 * math.max(cfg.lease_ms, cfg.waiter_ttl_ms)
  -- a lease key lives a lease time past its grant (2 x lease, or waiter
  -- ttl + lease for a direct grant)
  local life = math.max(keep, 2 * cfg.waiter_ttl_ms, 2 * cfg.lease_ms, cfg.waiter_ttl_ms + cfg.lease_ms,
    3600000 * (self.faults.force and 1 or 0))
  local p2 = self.p2
  local hash_of = {} -- protocol 2: a name's hash key -> the name
  if p2 or self.mixed then
    self:check_hashes()
    if #self.violations > 0 then return end
    for _, n in ipairs(self.names) do
      local o = self.srv.db[self.lease_key[n]] -- (only looked at)
      if not self.mixed or (o and P.data_protocol(o) == 2) then hash_of[self.lease_key[n]] = n end
    end
  end
  local last = self.now
  self.now = self.now + (life + 3) * 1000 + self.step_back_total
  self.srv.now_ms = floor((self.now + self.srv_off) / 1000)
  local ks = {}
  for k in pairs(self.srv.db) do ks[#ks + 1] = k end
  table.sort(ks) -- (reported in one order, whatever the collector did)
  for _, k in ipairs(ks) do
    local o = self.srv.db[k]
    if R.live(self.srv, k) and not k:find('^dlock:hw:{') then -- (a slot's mark stays)
      -- a fence lives a lease time past the time its token stands for, and
      -- a lease key past its token + pass limit (tokens may be ahead of the
      -- clock after a step back: lua/acquire.lua, Tokens); a direct grant's
      -- key (set by a release), and the fence a leave makes of it, half the
      -- record lifetime (the larger of the lease time and the waiter ttl:
      -- lua/release.lua, lua/leave.lua)
      local origin = self.key_origin[k]
      local past = cfg.lease_ms
      if origin == 'leave' or (origin == 'release' and o.type == 'hash') then
        past = math.max(cfg.lease_ms, cfg.waiter_ttl_ms)
      end
      local top
      if hash_of[k] then
        -- (protocol 2: its g bounds tokens up to token + pass limit; a
        -- grant released (g '') or the u a release or a leave left, the
        -- tokens the slot's mark bounds (its token + pass limit); a forced
        -- release's u lives an hour)
        local g = grant_in(o, true, self.srv.now_ms)
        local mtok, mpl = self:mark_of(hash_of[k])
        top = (mtok + mpl) / 1000
        if g then top = math.max(top, (g.token + g.pl) / 1000) end
        past = math.max(cfg.lease_ms, cfg.waiter_ttl_ms, self.faults.force and 3600000 or 0)
      elseif k:match(':fence$') then
        top = (tonumber(o.v:match('^%d+') or '0') or 0) / 1000
      elseif o.type == 'hash' and o.v.token and not k:match(':qd$') then
        top = ((tonumber(o.v.token) or 0) + (tonumber(o.v.pl) or 0)) / 1000
      end
      local ahead = top and top + past + 2 >= self.srv.now_ms
      if not ahead then
        self:violation('keys', string.format('%s outlived the last call (%.1f ms ago) by more than '
          .. '%d ms', k, (self.now - last) / 1000, life))
      end
    end
  end
end

return W
