-- The semaphore world (sim --sem): protocol 2's counting semaphore, its
-- real scripts (lua/p2/sem_acquire.lua, sem_release.lua, sem_leave.lua,
-- sem_renew.lua: rules in lua/p2/SEM.txt) run on the model of Redis
-- (sim/redis.lua), driven by a model of the C client's local tier of a
-- semaphore (src/local/sem.h, rules M1 to M8; src/local/sem.c and
-- sem_rpc.c; its renewal rounds and background give-backs,
-- src/global/renew_round.c and renew_jobs.c), under seeded schedules and
-- faults. A world of its own: its clients, threads, network and faults are
-- not sim/world.lua's, but its conventions are (seeds, the trace, the
-- violations and their kinds, mutants: sim/main.lua runs it).
--
-- The client model makes the C client's decisions, function for function
-- (sem_run, poll_redis, apply_grant, give, give_back, leave, settle, spare):
-- one poller per client and name, which asks Redis for one permit (count 1)
-- even while the client holds some; the call slot (M2), so that a client's
-- calls on a name reach Redis one at a time, in the order of their numbers
-- from one sequence per client; a released permit passed to a waiting
-- thread of the client while fewer than pass_limit passes were made since
-- the last grant and the lease has handoff_margin (a third of a lease)
-- left, else given back with every other spare permit (sem_release with
-- count = the spare permits, no longer counted before the call); the reply
-- {1, held} of a granted try is the client's total in Redis; a refused
-- queued try becomes the attempt in doubt, named by the next try (ARGV[10])
-- to take a direct grant over; P messages are wake-ups only; the last thread
-- to give up leaves, naming the queued attempt; an attempt whose reply was
-- lost is in doubt too, given back in the background by attempt if nobody
-- names it; validity = send of the granted try or renewal + lease - drift
-- (1% of the lease + 2 ms), by the client's clock; a renewal verdict 0 (or
-- no answer past the validity) marks the permits lost (M8).
--
-- Invariants (a violation ends the schedule; its kind names it):
--   limit  at no instant do more threads hold a permit of a name whose
--          client still counts it valid (its generation, lease HELD, client
--          clock before the validity) than the name's limit; and after
--          every script and every step of the server's clock, the permits
--          Redis counts (the live n of the hash, by the server's clock at
--          that reading) are at most the limit (lua/p2/SEM.txt, CLOCK).
--   valid  a thread gets a permit (from Redis, or passed) only while its
--          client counts its permits valid.
--   count  a client's count never goes below what its threads use
--          (0 <= in_use <= held); and, until the schedule's first fault,
--          whenever a client has no call, renewal, give-back or message on
--          its way, no queued try and no attempt in doubt, the permits it
--          counts are the permits Redis counts for it (the live n of its
--          field).
--   leak   once the world has quiesced (every thread done, every call
--          answered or abandoned), no live client counts a permit, and
--          after the leases, waiter ttls and steps back of the clock have
--          run out, Redis counts none for anyone.
--   stuck  no thread waits longer than a bound while no thread holds a
--          permit of its name (2 leases + 2 waiter ttls + 3 command
--          timeouts, for a call whose reply was lost, + 200 ms), in
--          schedules without faults or once that bound (plus every step
--          back of the server's clock) has passed since the last fault.
--   error  no script raises an error.
--
-- Faults (each drawn per schedule, in four schedules of five):
--   net    a request lost (the script never runs; the client times out:
--          outcome unknown), a reply lost (the script ran; unknown), a reply
--          lost with the connection reset (the same call sent again: a
--          duplicate), a request late past the command timeout (a late
--          copy: it runs after the client gave it up), replies delayed up
--          to 20 ms
--   msg    a P message lost, or late by up to a waiter ttl
--   crash  a client dies: no more calls, renewals or threads (its requests
--          on the way still reach Redis); its permits must free after its
--          lease
--   clock  the server's clock steps back (up to 2 leases, a minute or a
--          day) or forward by less than the drift margin (0.4% of a lease
--          + 1 ms, at most once in 2 leases, while the clients' clocks run
--          up to 0.5% fast or slow: together less than the margin)
--   restart Redis restarts with its data (persistence): down up to 2
--          leases, the calls meanwhile reset and sent again (then given up:
--          outcome unknown), the subscribers reconnect and wake every poller
local R = require('redis')

local S = {}
S.__index = S

local floor = math.floor

S.ALL_FAULTS = {'net', 'msg', 'crash', 'clock', 'restart'}

local rng = require('rng')
local new_rng = rng.seed
rng.mixin(S)

------------------------------------------------------------------------
-- The scripts.

local NAMES = {'sem_acquire', 'sem_release', 'sem_leave', 'sem_renew'}

local function read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end

function S.load_scripts(root, mutate)
  local texts = {}
  for _, n in ipairs(NAMES) do texts[n] = read(root .. '/lua/p2/' .. n .. '.lua') end
  if mutate then mutate(texts, 2) end
  local fns = {}
  for _, n in ipairs(NAMES) do fns[n] = R.compile(texts[n], '@lua/p2/' .. n .. '.lua') end
  -- lua/keys.lua: the suffixes of a name's keys, in the scripts' order
  fns.keys = assert(loadstring(read(root .. '/lua/keys.lua'), '@lua/keys.lua'))()
  return fns
end

------------------------------------------------------------------------
-- Events: a binary heap on (time, sequence).

local function heap_push(h, ev)
  local n = #h + 1
  h[n] = ev
  while n > 1 do
    local p = floor(n / 2)
    local a = h[p]
    if a.t < ev.t or (a.t == ev.t and a.seq < ev.seq) then break end
    h[n], h[p] = a, ev
    n = p
  end
end

local function heap_pop(h)
  local top = h[1]
  local n = #h
  h[1] = h[n]
  h[n] = nil
  n = n - 1
  local i = 1
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= n and (h[l].t < h[m].t or (h[l].t == h[m].t and h[l].seq < h[m].seq)) then m = l end
    if r <= n and (h[r].t < h[m].t or (h[r].t == h[m].t and h[r].seq < h[m].seq)) then m = r end
    if m == i then break end
    h[i], h[m] = h[m], h[i]
    i = m
  end
  return top
end

-- fn at time t (us); c: a client whose death drops the event
function S:at(t, fn, c)
  self.seq = self.seq + 1
  if t < self.now then t = self.now end
  heap_push(self.events, {t = t, seq = self.seq, fn = fn, c = c})
end

function S:trace(line)
  if self.tracing then
    local tr = self.tr
    tr[#tr + 1] = string.format('%10.3f ms  %s', self.now / 1000, line)
  end
end

function S:violation(kind, msg)
  if #self.violations == 0 then
    self.violations[1] = {kind = kind, msg = msg}
    self:trace('VIOLATION ' .. kind .. ': ' .. msg)
  end
end

function S:fault(kind)
  self.faults[kind] = (self.faults[kind] or 0) + 1
  self.faulted = true
  self.last_fault = self.now
end

------------------------------------------------------------------------
-- A schedule.

function S.new(seed, opts, scripts)
  local self = setmetatable({}, S)
  self.seed, self.opts, self.fns = seed, opts, scripts
  self.rs = new_rng(seed)
  self.tracing = opts.trace
  self.tr = {}
  self.events, self.seq, self.now, self.steps = {}, 0, 0, 0
  self.violations, self.faults = {}, {}
  self.acquisitions = 0
  self.srv = R.new()
  self.off = 1700000000 * 1e6 -- the server's clock: real time + off (us)
  self.srv_last = 0
  self.back_total = 0 -- every step back of the server's clock, added up
  self.down_until = -1
  self.last_fault = -math.huge
  local cfg = {}
  self.cfg = cfg
  cfg.lease_ms = self:rint(100, 1000)
  cfg.wttl_ms = self:rint(100, 2000)
  cfg.keep_ms = 2 * math.max(cfg.lease_ms, cfg.wttl_ms)
  cfg.drift_us = cfg.lease_ms * 10 + 2000
  cfg.margin_us = floor(cfg.lease_ms * 1000 / 3)
  cfg.fallback_us = floor(cfg.wttl_ms * 1000 / 4)
  cfg.cmd_timeout_us = self:rint(20, 200) * 1000
  cfg.pass_limit = self:rint(0, 4)
  self.rules = {lease = cfg.lease_ms * 1000, drift = cfg.drift_us, margin = cfg.margin_us,
                pass_limit = cfg.pass_limit}
  cfg.horizon_us = self:rint(10, 40) * cfg.lease_ms * 1000
  cfg.faults = {}
  local allowed = opts.faults or S.ALL_FAULTS
  if self:rand() >= 0.2 then
    for _, f in ipairs(allowed) do
      if self:rand() < 0.5 then cfg.faults[f] = true end
    end
  end
  self.names, self.limit = {}, {}
  for i = 1, self:rint(1, 2) do
    local n = 's' .. i
    self.names[i] = n
    self.limit[n] = self:rint(1, 3)
  end
  self.clients, self.by_channel = {}, {}
  for i = 1, self:rint(2, 4) do self:add_client(i) end
  self:trace(string.format('schedule %d: lease %d ms, waiter ttl %d ms, pass limit %d, command timeout '
    .. '%d ms, %d clients, limits %s, faults %s', seed, cfg.lease_ms, cfg.wttl_ms, cfg.pass_limit,
    cfg.cmd_timeout_us / 1000, #self.clients, self:limits_text(), self:faults_text()))
  return self
end

function S:limits_text()
  local p = {}
  for _, n in ipairs(self.names) do p[#p + 1] = n .. '=' .. self.limit[n] end
  return table.concat(p, ' ')
end

function S:faults_text()
  local p = {}
  for _, f in ipairs(S.ALL_FAULTS) do
    if self.cfg.faults[f] then p[#p + 1] = f end
  end
  return #p > 0 and table.concat(p, ',') or 'none'
end

function S:add_client(i)
  local c = {name = 'c' .. i, id = string.format('%032x', i * 7919), threads = {}, entries = {},
    number = 0, jobs = 0, net = 0, msgs = 0, renewing = false}
  c.rate = 1 + (self.cfg.faults.clock and self:rint(-50, 50) / 10000 or 0)
  c.channel = 'dlock:wake:' .. c.id
  c.k = {id = c.id, lease_ms = self.cfg.lease_ms, wttl_ms = self.cfg.wttl_ms,
         keep_ms = self.cfg.keep_ms, client_name = c.name, wake = 'dlock:wake:'}
  self.by_channel[c.channel] = c
  self.clients[#self.clients + 1] = c
  for _, n in ipairs(self.names) do
    c.entries[#c.entries + 1] = {name = n, keys = self:keys_of(n, c), users = 0, held = 0,
      in_use = 0, gen = 0, passes = 0, doubt = 0, calling = false, poller = nil, queued = false,
      woken = false, lease = 'NONE', valid = 0, epoch = 0, wq = {}, pcv = {}, fail_seq = 0}
  end
  for t = 1, self:rint(1, 4) do
    local th = {c = c, name = c.name .. '.' .. t, rec = {}, ops = self:rint(1, 12)}
    c.threads[#c.threads + 1] = th
    th.co = coroutine.create(function() self:thread_main(th) end)
    self:at(self:rint(0, 20000), function() self:resume(th) end, c)
  end
  self:at(floor(self.cfg.lease_ms * 1000 / 3), function() self:renew_round(c) end, c)
end

function S:keys_of(name, c)
  local out = {}
  for i, k in ipairs(self.fns.keys) do
    if k[1] == 'HW' then
      out[i] = 'dlock:hw:{0}'
    else
      out[i] = 'dlock:{' .. name .. '}' .. k[2] .. (k[1] == 'CLIENT' and c.id or '')
    end
  end
  return out
end

function S:entry(c, name)
  for _, e in ipairs(c.entries) do
    if e.name == name then return e end
  end
end

-- The client's clocks (boot and monotonic alike), us: real time at its rate.
local function cnow(self, c) return floor(self.now * c.rate) end
S.cnow = cnow

-- Real time when c's clock reads t.
function S:real_at(c, t) return math.max(self.now, t / c.rate) end

-- The server's clock, in whole us (as TIME reads it), at least 1 us after
-- the last reading (unless stepped back since).
function S:srv_time()
  local t = math.max(floor(self.now + self.off), self.srv_last + 1)
  self.srv_last = t
  return t
end

function S:next_number(c)
  c.number = c.number + 1
  return c.number
end

------------------------------------------------------------------------
-- Threads: coroutines, resumed by events; each yield is where the C code
-- drops e->mu (a wait on a condition, a park, a Redis call).

function S:resume(th, val)
  if th.c.dead or th.finished then return end
  local ok, err = coroutine.resume(th.co, val)
  if not ok then error(err, 0) end
  if coroutine.status(th.co) == 'dead' then th.finished = true end
end

-- Blocks the calling thread until wake(th, tok) or real time `until_real`.
function S:block(th, until_real)
  local tok = {}
  th.tok = tok
  if until_real and until_real < math.huge then
    self:at(until_real, function() self:wake(th, tok) end, th.c)
  end
  return coroutine.yield(tok)
end

function S:wake(th, tok, val)
  if th.tok ~= tok then return end
  th.tok = nil
  self:at(self.now + self:rint(5, 200), function() self:resume(th, val) end, th.c)
end

function S:sleep(th, us) self:block(th, self.now + us) end

-- pthread_cond_timedwait(&e->pcv, &e->mu, until (client clock))
function S:cond_wait(th, e, until_c)
  local tok = {}
  th.tok = tok
  e.pcv[#e.pcv + 1] = {th, tok}
  if until_c < math.huge then
    self:at(self:real_at(th.c, until_c), function() self:wake(th, tok) end, th.c)
  end
  coroutine.yield(tok)
end

function S:broadcast(e)
  local l = e.pcv
  e.pcv = {}
  for _, p in ipairs(l) do self:wake(p[1], p[2]) end
end

-- The local queue (dlock_waitq): FIFO of waiters.
local function wq_remove(e, w)
  for i, x in ipairs(e.wq) do
    if x == w then
      table.remove(e.wq, i)
      w.queued = false
      return
    end
  end
end

function S:park(w, deadline_c)
  local th = w.th
  local tok = {}
  th.tok = tok
  w.parked = tok
  if deadline_c < math.huge then
    self:at(self:real_at(th.c, deadline_c), function() self:wake(th, tok) end, th.c)
  end
  coroutine.yield(tok)
  w.parked = nil
end

function S:unpark(w)
  if w and w.parked then self:wake(w.th, w.parked) end
end

------------------------------------------------------------------------
-- The network and the server.

-- Runs a script on the server now. Returns its reply.
function S:run_script(c, script, name, keys, argv)
  local srv = self.srv
  srv.published = {}
  local now_us = self:srv_time()
  local rep = R.run(srv, self.fns[script], keys, argv, now_us)
  self.steps = self.steps + 1
  if self.tracing then
    self:trace(string.format('redis runs %s(%s) for %s -> %s', script,
      script == 'sem_renew' and table.concat(keys, ' ') or name .. ' ' .. table.concat(argv, ' ', 2),
      c.name, self:describe(rep)))
    for _, l in ipairs(R.dump(srv)) do self:trace('    ' .. l) end
  end
  if type(rep) == 'table' and rep.err then
    self:violation('error', script .. ' failed: ' .. rep.err)
  end
  for _, p in ipairs(srv.published) do self:publish(p.channel, p.message) end
  self:check_redis_limit()
  return rep
end

function S:describe(rep)
  if type(rep) ~= 'table' then return tostring(rep) end
  if rep.err then return 'ERR ' .. rep.err end
  local p = {}
  for i = 1, rep.n or #rep do p[i] = tostring(rep[i]) end
  return '{' .. table.concat(p, ', ') .. '}'
end

-- A script call from client c: cb(reply, how) once, how 'reply' or
-- 'unknown' (timed out, or reset past the pool's retries: it may have run).
function S:request(c, script, name, keys, argv, cb)
  local f = self.cfg.faults
  local cur, tries, done = 0, 0, false
  c.net = c.net + 1
  local function finish(sid, rep, how)
    if done or sid ~= cur then return end
    done = true
    c.net = c.net - 1
    cb(rep, how)
  end
  local send
  send = function()
    tries = tries + 1
    cur = cur + 1
    local sid = cur
    self:at(self.now + self.cfg.cmd_timeout_us, function() finish(sid, nil, 'unknown') end, c)
    local d = self:rint(30, 1500)
    if f.net and self:rand() < 0.03 then
      self:fault('request_lost')
      self:trace(string.format('FAULT %s of %s by %s lost on its way', script, name, c.name))
      return
    end
    if f.net and self:rand() < 0.03 then
      self:fault('late_copy')
      d = self.cfg.cmd_timeout_us + self:rint(0, 2 * self.cfg.cmd_timeout_us)
      self:trace(string.format('FAULT %s of %s by %s held up %.1f ms', script, name, c.name, d / 1000))
    end
    self:at(self.now + d, function()
      local function reset()
        self:at(self.now + self:rint(30, 1500), function()
          if sid ~= cur or done then return end
          if tries <= 2 then send() else finish(sid, nil, 'unknown') end
        end, c)
      end
      if self.now < self.down_until then
        reset() -- the server restarts: the connection is reset
        return
      end
      local rep = self:run_script(c, script, name, keys, argv)
      local back = self:rint(30, 1500)
      if f.net and self:rand() < 0.05 then
        back = self:rint(1000, 20000)
        self:fault('reply_late')
      end
      if f.net and self:rand() < 0.03 then
        self:fault('reply_lost')
        self:trace(string.format('FAULT the reply to %s of %s by %s lost', script, name, c.name))
        return
      end
      if f.net and self:rand() < 0.02 then
        self:fault('reply_reset')
        self:trace(string.format('FAULT the reply to %s of %s by %s lost, connection reset', script,
          name, c.name))
        reset()
        return
      end
      self:at(self.now + back, function() finish(sid, rep, 'reply') end, c)
    end)
  end
  send()
end

-- From a thread: the call, blocking until its outcome.
function S:call(th, script, name, keys, argv)
  local tok = {}
  th.tok = tok
  self:request(th.c, script, name, keys, argv, function(rep, how)
    if th.tok == tok then
      th.tok = nil
      self:at(self.now + self:rint(5, 200), function() self:resume(th, {rep, how}) end, th.c)
    end
  end)
  local r = coroutine.yield(tok)
  return r[1], r[2]
end

function S:publish(channel, msg)
  local c = self.by_channel[channel]
  if not c or c.dead then return end
  local f = self.cfg.faults
  local d = self:rint(20, 3000)
  if f.msg and self:rand() < 0.15 then
    self:fault('msg_lost')
    self:trace('FAULT message to ' .. c.name .. ' lost: ' .. msg)
    return
  end
  if f.msg and self:rand() < 0.15 then
    self:fault('msg_late')
    d = self:rint(1000, self.cfg.wttl_ms * 1000)
  end
  c.msgs = c.msgs + 1
  self:at(self.now + d, function()
    c.msgs = c.msgs - 1
    self:message(c, msg)
  end, c)
end

-- The subscriber (src/local/client.c, wake_one): "P <attempt> <count>
-- <name>" wakes the name's poller; nothing more.
function S:message(c, msg)
  local name = string.match(msg, '^P %d+ %d+ (%S+)$')
  local e = name and self:entry(c, name)
  self:trace(string.format('%s reads %s', c.name, msg))
  if e then
    e.woken = true
    self:broadcast(e)
  end
end

------------------------------------------------------------------------
-- The client's rules (src/local/sem.c, sem.h's M1 to M8): pure functions
-- of an entry's state, in one unit of time, which this world (us) and the
-- trace checker (sim/trace_sem.lua, ns: the C client's decisions) both
-- call. r: {lease, drift, margin (times), pass_limit}. An entry: lease
-- ('NONE', 'HELD', 'LOST'), held, in_use, gen, passes, doubt, queued,
-- valid, epoch.
local rule = {}
S.rule = rule

-- M8: permits found lost are forgotten. Returns whether it settled.
function rule.settle(e)
  if e.lease ~= 'LOST' then return false end
  e.gen = e.gen + 1
  e.held, e.in_use = 0, 0
  e.passes = 0
  e.lease = 'NONE'
  return true
end

-- Spare permits (M3) with the handoff margin left at now.
function rule.spare(r, e, now)
  if e.lease ~= 'HELD' or now + r.margin >= e.valid then return 0 end
  return e.held - e.in_use
end

-- A permit is the thread's only while the lease is HELD and valid.
function rule.valid(e, now) return e.lease == 'HELD' and now < e.valid end

-- The validity of permits granted (or renewed) by a call sent at `sent`.
function rule.grant_valid(r, sent) return sent + r.lease - r.drift end

-- A granted try answered at `now` after its permits could have ended: in
-- doubt, given back.
function rule.too_late(r, sent, now) return now >= rule.grant_valid(r, sent) end

-- A granted try's reply: the client holds `held` permits in Redis (its
-- total), whose lease counts from `sent`.
function rule.apply_grant(r, e, held, sent)
  rule.settle(e)
  local valid = rule.grant_valid(r, sent)
  if e.lease == 'NONE' then
    e.lease = 'HELD'
    e.epoch = e.epoch + 1
    e.valid = valid
  elseif valid > e.valid then
    e.valid = valid
  end
  if held < e.in_use + 1 then
    e.gen = e.gen + 1
    e.in_use = 0
  end
  e.held = held
  e.passes = 0
  e.doubt = 0
  e.queued = false
end

-- M5: a released permit is passed on (not given back to Redis).
function rule.may_pass(r, e, now, waiting)
  return waiting and e.passes < r.pass_limit and rule.spare(r, e, now) > 0
end

-- A renewal sent at `sent`, answered v (1, 0, or nil: no answer) at `now`:
-- 'renewed' and the new validity, 'lost' and why, or nil (nothing
-- changes). A 1 answered once the validity ran out counts as lost (it may
-- have renewed other permits of the client's field: renew_round.c, apply).
function rule.verdict(r, e, v, sent, now)
  local late = v == 1 and now >= e.valid
  if v == 1 and not late then return 'renewed', rule.grant_valid(r, sent) end
  if v == 0 or now >= e.valid then
    return 'lost', v == 0 and 'renewal 0' or late and 'renewed too late'
      or 'unrenewed past their validity'
  end
  return nil
end

-- M4, M8: a thread's record of its permits (permits, of generation gen;
-- lost): permits of an older generation than gen are lost.
function rule.record_settle(h, gen)
  if h.permits > 0 and h.gen ~= gen then
    h.lost = h.lost + h.permits
    h.permits = 0
  end
end

function rule.record(h, gen)
  rule.record_settle(h, gen)
  h.gen = gen
  h.permits = h.permits + 1
end

-- The arguments of lua/p2/sem_acquire.lua for attempt num (sem_rpc.c). k:
-- the client's {id, lease_ms, wttl_ms, keep_ms, client_name, wake}.
function rule.acquire_argv(k, num, once, limit, doubt, name)
  return {k.id, tostring(k.lease_ms), tostring(num), '1', tostring(k.wttl_ms), once and '0' or '1',
    tostring(k.keep_ms), k.client_name, tostring(limit), tostring(doubt), k.wake, name}
end

------------------------------------------------------------------------
-- The client's local tier (src/local/sem.c).

local settle = rule.settle

function S:spare(c, e) return rule.spare(self.rules, e, cnow(self, c)) end

local function waiting(e) return e.poller ~= nil or e.wq[1] ~= nil end

function S:call_begin(th, e)
  while e.calling do self:cond_wait(th, e, math.huge) end
  e.calling = true
end

function S:call_end(e)
  e.calling = false
  self:broadcast(e)
end

function S:lose(c, e)
  e.lease = 'LOST'
  settle(e)
end

function S:apply_grant(c, e, held, sent) rule.apply_grant(self.rules, e, held, sent) end

-- sem_rpc.c: the release of n permits: 'OK', 'ELOST' (Redis had fewer)
-- or 'EREDIS'.
function S:rpc_release(th, e, n)
  local c = th.c
  local num = self:next_number(c)
  local rep, how = self:call(th, 'sem_release', e.name, e.keys, {c.id, tostring(num), tostring(n),
    '0', 'dlock:wake:', e.name, tostring(self.cfg.keep_ms)})
  if how ~= 'reply' then return 'EREDIS' end
  if rep == 1 or rep == 2 then return 'OK' end
  if rep == 0 then return 'ELOST' end
  return 'EREDIS'
end

-- M5: the spare permits go back to Redis, in the call slot, no longer
-- counted before the call.
function S:give_back(th, e)
  local c = th.c
  self:call_begin(th, e)
  settle(e)
  local n = e.lease == 'HELD' and e.held - e.in_use or 0
  if n == 0 then
    self:call_end(e)
    return 'OK'
  end
  e.held = e.held - n
  if e.held == 0 then e.lease = 'NONE' end
  local gen = e.gen
  local rc = self:rpc_release(th, e, n)
  self:call_end(e)
  if rc == 'ELOST' and gen == e.gen and e.lease == 'HELD' then self:lose(c, e) end
  return rc
end

-- The renewal thread's job: an attempt in doubt given back (sem_release
-- count 0 naming it, with a number of its own, drawn now), tried again
-- every 100 ms on no answer, for the record lifetime.
function S:bg_give_back(c, e, attempt)
  local num = self:next_number(c)
  local until_c = cnow(self, c) + self.cfg.keep_ms * 1000
  c.jobs = c.jobs + 1
  self:trace(string.format('%s gives back attempt %d of %s in the background (call %d)', c.name,
    attempt, e.name, num))
  local function try()
    self:request(c, 'sem_release', e.name, e.keys, {c.id, tostring(num), '0', tostring(attempt),
      'dlock:wake:', e.name, tostring(self.cfg.keep_ms)}, function(rep, how)
      if how == 'reply' and type(rep) == 'number' then
        c.jobs = c.jobs - 1
      elseif cnow(self, c) < until_c then
        self:at(self.now + 100000, try, c)
      else
        c.jobs = c.jobs - 1
      end
    end)
  end
  self:at(self.now + self:rint(10, 1000), try, c)
end

function S:rpc_leave(th, e, gave_up)
  local c = th.c
  local num = self:next_number(c)
  local rep, how = self:call(th, 'sem_leave', e.name, e.keys, {c.id, 'dlock:wake:', e.name,
    tostring(self.cfg.wttl_ms), tostring(num), tostring(self.cfg.keep_ms), tostring(gave_up)})
  if how ~= 'reply' or type(rep) ~= 'number' then self:bg_give_back(c, e, gave_up) end
end

-- A thread leaves e (M5, M6).
function S:leave(th, e)
  local c = th.c
  local rc = 'OK'
  if e.queued and not waiting(e) then
    self:call_begin(th, e)
    if e.queued and not waiting(e) then
      local gave_up = e.doubt
      e.queued = false
      e.doubt = 0
      self:rpc_leave(th, e, gave_up)
    end
    self:call_end(e)
  end
  if not waiting(e) and e.lease == 'HELD' and e.held > e.in_use then rc = self:give_back(th, e) end
  if e.doubt ~= 0 and not waiting(e) and not e.calling then
    self:bg_give_back(c, e, e.doubt)
    e.doubt = 0
  end
  if e.wq[1] and not e.poller then self:unpark(e.wq[1]) end
  return rc
end

-- One try: 'OK' (t.held, t.sent), 'EBUSY', or 'EREDIS' (t.in_doubt if it
-- may have run).
function S:rpc_acquire(th, e, num, once, doubt)
  local c = th.c
  local t = {sent = cnow(self, c), in_doubt = false}
  local rep, how = self:call(th, 'sem_acquire', e.name, e.keys, rule.acquire_argv(c.k, num, once,
    self.limit[e.name], doubt, e.name))
  if how ~= 'reply' then
    t.in_doubt = true
    t.rc = 'EREDIS'
  elseif type(rep) == 'table' and rep[1] == 1 and (rep[2] or 0) >= 1 then
    t.rc, t.held = 'OK', rep[2]
  elseif type(rep) == 'table' and rep[1] == 0 then
    t.rc = 'EBUSY'
  else
    t.rc = 'EREDIS'
  end
  return t
end

-- The poller (M6): 'OK' with the calling thread's permit counted in in_use.
function S:poll_redis(th, e, deadline, once)
  local c = th.c
  local cfg = self.cfg
  while true do
    settle(e)
    if self:spare(c, e) > 0 then
      e.in_use = e.in_use + 1
      return 'OK'
    end
    self:call_begin(th, e)
    settle(e)
    if self:spare(c, e) > 0 then
      self:call_end(e)
    else
      local num = self:next_number(c)
      e.woken = false
      local t = self:rpc_acquire(th, e, num, once, e.doubt)
      local rc = t.rc
      if rc == 'OK' and rule.too_late(self.rules, t.sent, cnow(self, c)) then
        t.in_doubt = true -- answered after the permit could have ended
        rc = 'EREDIS'
      end
      if t.in_doubt or (rc == 'EBUSY' and not once) then e.doubt = num end
      if rc == 'EBUSY' and not once then e.queued = true end
      if rc == 'OK' then self:apply_grant(c, e, t.held, t.sent) end
      self:call_end(e)
      if rc == 'OK' then
        e.in_use = e.in_use + 1
        return 'OK'
      end
      if rc ~= 'EBUSY' then return rc end
      if once then return 'EBUSY' end
      local now = cnow(self, c)
      if now >= deadline then return 'ETIMEDOUT' end
      local delay = cfg.fallback_us
      delay = delay - now % (floor(delay / 4) + 1)
      local wake = math.min(now + delay, deadline)
      while not e.woken and self:spare(c, e) == 0 and e.lease ~= 'LOST' and cnow(self, c) < wake do
        self:cond_wait(th, e, wake)
      end
      if self:spare(c, e) == 0 and cnow(self, c) >= deadline then return 'ETIMEDOUT' end
    end
  end
end

-- M4: the thread's record of its permit.
local function record(th, e)
  local h = th.rec[e.name]
  if not h then
    h = {permits = 0, lost = 0, gen = 0}
    th.rec[e.name] = h
  end
  rule.record(h, e.gen)
end

-- dlock_sem_run: one permit of e for thread th, waiting up to wait_ms
-- (-1: forever; 0: a single try).
function S:sem_run(th, e, wait_ms)
  local c = th.c
  local start = cnow(self, c)
  local deadline = wait_ms < 0 and math.huge or start + wait_ms * 1000
  e.users = e.users + 1
  local fail_seq = e.fail_seq
  local w = {th = th}
  th.waiting = {since = self.now, forever = wait_ms < 0, e = e}
  local rc
  while true do
    settle(e)
    if w.granted then
      if w.token == e.gen then
        if cnow(self, c) < e.valid then
          rc = 'OK'
          break
        end
        self:lose(c, e) -- it ran out before th ran: every permit with it (M8)
      end
      w = {th = th} -- lost in passing (M8): a new wait
    elseif self:spare(c, e) > 0 and not e.poller and (not e.wq[1] or e.wq[1] == w) then
      e.in_use = e.in_use + 1
      rc = 'OK'
      break
    elseif e.fail_seq ~= fail_seq then
      rc = e.fail_rc
      break
    elseif not e.poller then
      if wait_ms ~= 0 and cnow(self, c) >= deadline then
        rc = 'ETIMEDOUT'
        break
      end
      wq_remove(e, w)
      e.poller = th
      rc = self:poll_redis(th, e, deadline, wait_ms == 0)
      e.poller = nil
      if rc ~= 'OK' and rc ~= 'EBUSY' and rc ~= 'ETIMEDOUT' then
        e.fail_seq = e.fail_seq + 1
        e.fail_rc = rc
        for _, x in ipairs(e.wq) do self:unpark(x) end
      end
      break
    elseif wait_ms == 0 then
      rc = 'EBUSY'
      break
    elseif cnow(self, c) >= deadline then
      rc = 'ETIMEDOUT'
      break
    else
      if not w.queued then
        e.wq[#e.wq + 1] = w
        w.queued = true
      end
      self:park(w, deadline)
    end
  end
  wq_remove(e, w)
  th.waiting = nil
  if rc == 'OK' then
    if not rule.valid(e, cnow(self, c)) then
      self:violation('valid', string.format('%s got a permit of %s its client does not count valid '
        .. '(lease %s, clock %d, validity %d)', th.name, e.name, e.lease, cnow(self, c), e.valid))
    end
    record(th, e)
    self:leave(th, e)
  else
    self:leave(th, e)
    e.users = e.users - 1
  end
  return rc
end

-- dlock_sem_give: th gives its permit of e back.
function S:sem_give(th, e)
  local c = th.c
  settle(e)
  local h = th.rec[e.name]
  rule.record_settle(h, e.gen)
  local rc, wake = 'OK', nil
  if h.lost > 0 then
    h.lost = h.lost - 1
    rc = 'ELOST'
  else
    h.permits = h.permits - 1
    e.in_use = e.in_use - 1
    if cnow(self, c) >= e.valid then rc = 'ELOST' end
    if rule.may_pass(self.rules, e, cnow(self, c), waiting(e)) then
      e.passes = e.passes + 1 -- M5: passed, without Redis
      if e.wq[1] then
        e.in_use = e.in_use + 1
        wake = table.remove(e.wq, 1)
        wake.queued = false
        wake.granted, wake.token = true, e.gen
      else
        self:broadcast(e) -- the poller takes it
      end
    else
      local r = self:give_back(th, e)
      if rc == 'OK' then rc = r end
    end
  end
  self:leave(th, e)
  e.users = e.users - 1
  self:unpark(wake)
  return rc
end

------------------------------------------------------------------------
-- The renewal thread: a round every third of a lease (after a round
-- without an answer, every 100 ms), over the names whose permits are HELD.

function S:renew_round(c)
  local cfg = self.cfg
  local period = floor(cfg.lease_ms * 1000 / 3)
  local items, keys = {}, {}
  for _, e in ipairs(c.entries) do
    if e.lease == 'HELD' then
      items[#items + 1] = {e = e, epoch = e.epoch}
      keys[#keys + 1] = e.keys[1]
    end
  end
  if #items == 0 then
    self:at(self.now + period / c.rate, function() self:renew_round(c) end, c)
    return
  end
  local sent = cnow(self, c)
  c.renewing = true
  self:request(c, 'sem_renew', 'renew', keys, {c.id, tostring(cfg.lease_ms)}, function(rep, how)
    c.renewing = false
    local now = cnow(self, c)
    local ok = how == 'reply' and type(rep) == 'table' and not rep.err
    for i, it in ipairs(items) do
      local e = it.e
      if e.lease == 'HELD' and e.epoch == it.epoch then
        local v = ok and rep[i]
        local verdict, x = rule.verdict(self.rules, e, v or nil, sent, now)
        if verdict == 'renewed' then
          e.valid = x
        elseif verdict == 'lost' then
          self:trace(string.format('%s: the permits of %s are lost (%s)', c.name, e.name, x))
          e.lease = 'LOST'
        end
      end
    end
    local next = ok and sent + period or math.min(now + 100000, sent + period)
    if not ok then next = math.max(next, now + 100000) end
    self:at(self:real_at(c, next), function() self:renew_round(c) end, c)
  end)
end

------------------------------------------------------------------------
-- The threads' work.

function S:thread_main(th)
  local c = th.c
  local cfg = self.cfg
  for _ = 1, th.ops do
    self:sleep(th, self:rint(0, floor(cfg.lease_ms * 1000 / 2)))
    if self.now >= cfg.horizon_us then break end
    local e = self:entry(c, self.names[self:rint(1, #self.names)])
    local r = self:rand()
    local wait = r < 0.3 and -1 or r < 0.45 and 0 or self:rint(1, 2 * cfg.lease_ms + cfg.wttl_ms)
    local rc = self:sem_run(th, e, wait)
    self:trace(string.format('%s acquire %s (wait %s) -> %s', th.name, e.name,
      wait < 0 and 'forever' or wait .. ' ms', rc))
    if rc == 'OK' then
      self.acquisitions = self.acquisitions + 1
      self:sleep(th, self:rint(0, floor(cfg.lease_ms * 1200)))
      local exiting = self:rand() < 0.1
      local g = self:sem_give(th, e)
      self:trace(string.format('%s %s %s -> %s', th.name, exiting and 'exits holding' or 'releases',
        e.name, g))
      if exiting then break end
    end
  end
end

------------------------------------------------------------------------
-- Faults.

function S:schedule_faults()
  local f = self.cfg.faults
  local h = self.cfg.horizon_us
  local L = self.cfg.lease_ms * 1000
  if f.crash and self:rand() < 0.7 then
    local c = self.clients[self:rint(1, #self.clients)]
    self:at(self:rint(0, h), function()
      if c.dead then return end
      c.dead = true
      self:fault('crash')
      self:trace('FAULT ' .. c.name .. ' crashes')
    end)
  end
  if f.clock then
    for _ = 1, self:rint(1, 4) do
      self:at(self:rint(0, h), function()
        local r = self:rand()
        if r < 0.5 then
          local x = r < 0.3 and self:rint(1, 2 * L) or r < 0.4 and self:rint(1, 60e6) or self:rint(1, 86400e6)
          self.off = self.off - x
          self.srv_last = floor(self.now + self.off) - 1
          self.back_total = self.back_total + x
          self:fault('clock_back')
          self:trace(string.format('FAULT the server clock steps back %.3f ms', x / 1000))
        else
          if self.now - (self.last_fwd or -math.huge) < 2 * L then return end
          self.last_fwd = self.now
          local x = self:rint(1, floor(L * 0.004) + 1000)
          self.off = self.off + x
          self:fault('clock_forward')
          self:trace(string.format('FAULT the server clock steps forward %.3f ms', x / 1000))
        end
        self:check_redis_limit()
      end)
    end
  end
  if f.restart then
    for _ = 1, self:rint(1, 2) do
      self:at(self:rint(0, h), function()
        local d = self:rint(1000, 2 * L)
        self.down_until = math.max(self.down_until, self.now + d)
        self:fault('restart')
        self:trace(string.format('FAULT redis restarts (data kept), down %.1f ms', d / 1000))
        self:at(self.down_until + self:rint(100, 5000), function()
          -- the subscribers reconnect: every poller is woken
          for _, c in ipairs(self.clients) do
            if not c.dead then
              for _, e in ipairs(c.entries) do
                e.woken = true
                self:broadcast(e)
              end
            end
          end
        end)
      end)
    end
  end
end

------------------------------------------------------------------------
-- The invariants.

-- The permits Redis counts for each client of a name (by the server's clock
-- now), and their sum.
function S:redis_permits(name, now_ms)
  local o = self.srv.db['dlock:{' .. name .. '}']
  local by, sum = {}, 0
  if not o or o.type ~= 'hash' or (o.exp and now_ms > o.exp) then return by, sum, nil end
  for k, v in pairs(o.v) do
    local id = string.match(k, '^c:(.+)$')
    if id then
      local n, e, u = string.match(v, '^(%d+) (%d+) %d+ %a %d+ %d+ (%d+)$')
      if n and tonumber(e) >= now_ms and tonumber(u) >= now_ms then
        by[id] = tonumber(n)
        sum = sum + tonumber(n)
      end
    end
  end
  return by, sum, tonumber(o.v.l)
end

function S:check_redis_limit()
  local now_ms = floor(math.max(self.now + self.off, self.srv_last) / 1000)
  for _, name in ipairs(self.names) do
    local _, sum, l = self:redis_permits(name, now_ms)
    if l and sum > l then
      self:violation('limit', string.format('redis counts %d permits of %s (limit %d) at server '
        .. 'time %d ms', sum, name, l, now_ms))
    end
  end
end

function S:check()
  local cfg = self.cfg
  for _, name in ipairs(self.names) do
    local holders, who = 0, {}
    for _, c in ipairs(self.clients) do
      if not c.dead then
        local e = self:entry(c, name)
        if e.in_use < 0 or e.in_use > e.held then
          self:violation('count', string.format('%s counts %d permits of %s, its threads use %d',
            c.name, e.held, name, e.in_use))
        end
        if e.lease == 'HELD' and cnow(self, c) < e.valid then
          for _, th in ipairs(c.threads) do
            local h = th.rec[name]
            if h and h.permits > 0 and h.gen == e.gen then
              holders = holders + h.permits
              who[#who + 1] = th.name
            end
          end
        end
      end
    end
    if holders > self.limit[name] then
      self:violation('limit', string.format('%d threads hold a valid permit of %s (limit %d): %s',
        holders, name, self.limit[name], table.concat(who, ' ')))
    end
  end
  if not self.faulted then self:check_count() end
  self:check_stuck()
end

-- Until the first fault: a client at rest counts what Redis counts for it.
function S:check_count()
  local now_ms = floor(math.max(self.now + self.off, self.srv_last) / 1000)
  for _, name in ipairs(self.names) do
    local by
    for _, c in ipairs(self.clients) do
      local e = self:entry(c, name)
      if c.net == 0 and c.msgs == 0 and c.jobs == 0 and not c.renewing and not e.calling
          and not e.queued and e.doubt == 0 and e.lease ~= 'LOST' then
        by = by or self:redis_permits(name, now_ms)
        local mine = e.lease == 'HELD' and e.held or 0
        if (by[c.id] or 0) ~= mine then
          self:violation('count', string.format('%s counts %d permits of %s, redis %d', c.name, mine,
            name, by[c.id] or 0))
        end
      end
    end
  end
end

function S:stuck_bound()
  local cfg = self.cfg
  return 2 * cfg.lease_ms * 1000 + 2 * cfg.wttl_ms * 1000 + 3 * cfg.cmd_timeout_us + 200000
end

function S:check_stuck()
  local bound = self:stuck_bound()
  self.idle = self.idle or {}
  for _, name in ipairs(self.names) do
    local held = false
    local oldest
    for _, c in ipairs(self.clients) do
      if not c.dead then
        for _, th in ipairs(c.threads) do
          local h = th.rec[name]
          if h and h.permits > 0 then held = true end
          local w = th.waiting
          if w and w.forever and w.e.name == name and (not oldest or w.since < oldest) then
            oldest = w.since
          end
        end
      end
    end
    if held or not oldest then
      self.idle[name] = nil
    else
      self.idle[name] = self.idle[name] or self.now
      local from = math.max(self.idle[name], oldest, self.last_fault + self.back_total)
      if self.now - from > bound then
        self:violation('stuck', string.format('a thread waits for %s since %.3f ms, and no thread '
          .. 'has held a permit of it since %.3f ms', name, oldest / 1000, self.idle[name] / 1000))
      end
    end
  end
end

function S:check_leak()
  for _, c in ipairs(self.clients) do
    if not c.dead then
      for _, e in ipairs(c.entries) do
        local held = e.lease == 'HELD' and e.held or 0
        if held > 0 or e.in_use > 0 then
          self:violation('leak', string.format('%s still counts %d permits of %s (%d in use) once '
            .. 'every thread is done', c.name, held, e.name, e.in_use))
        end
      end
    end
  end
  local cfg = self.cfg
  self.now = self.now + 2 * (cfg.lease_ms + cfg.wttl_ms + cfg.keep_ms) * 1000 + self.back_total
  local now_ms = floor((self.now + self.off) / 1000)
  for _, name in ipairs(self.names) do
    local by, sum = self:redis_permits(name, now_ms)
    if sum > 0 then
      local who = {}
      for _, c in ipairs(self.clients) do
        if by[c.id] then who[#who + 1] = c.name .. '=' .. by[c.id] end
      end
      self:violation('leak', string.format('redis counts %d permits of %s once the world quiesced: %s',
        sum, name, table.concat(who, ' ')))
    end
  end
end

------------------------------------------------------------------------

function S:run()
  self:schedule_faults()
  local h = self.events
  local cap = 60000
  local n = 0
  while h[1] and #self.violations == 0 do
    local ev = heap_pop(h)
    self.now = ev.t
    if not (ev.c and ev.c.dead) then
      ev.fn()
      n = n + 1
      self:check()
    end
    -- (quiesced: every thread done; what is left are idle renewal rounds)
    if self.now > self.cfg.horizon_us then
      local busy = false
      for _, c in ipairs(self.clients) do
        if not c.dead then
          if c.net > 0 or c.jobs > 0 or c.msgs > 0 then busy = true end
          for _, th in ipairs(c.threads) do
            if not th.finished then busy = true end
          end
        end
      end
      if not busy then break end
      if n > cap then
        -- (a step back of the server's clock makes what was written last
        -- that much longer: a permit whose holder no longer counts it, a
        -- dead waiter's place; within that excuse the world may wait on)
        if self.now - self.last_fault < self:stuck_bound() + self.back_total then
          self.faults.unquiesced = (self.faults.unquiesced or 0) + 1
          return self
        end
        self:violation('stuck', 'the world never quiesced (threads still running at the cap of events)')
      end
    end
  end
  if #self.violations == 0 then self:check_leak() end
  return self
end

return S
