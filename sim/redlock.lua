-- The Redlock world (sim --redlock): one lock over N independent Redis
-- masters, each its own model of Redis (sim/redis.lua) with its own clock,
-- running protocol 2's real scripts (lua/p2/acquire.lua, release.lua, and
-- the write-back of the slot's mark, lua/p2/mark.lua), driven by a model of
-- the quorum client (docs/design.md, "Redlock"): the rule for fencing
-- tokens across majorities is proven here before any C is written.
--
-- The quorum acquire of a client (acquire below):
--   G  acquire.lua on every node with one attempt number; a node's grant is
--      a vote if the node counts (counts below); granted when a majority
--      voted within validity = first send + lease - drift (1% of the lease
--      + 2 ms), by the client's clock. Else every node is sent a release
--      (by attempt) and the acquire failed.
--   T  = the highest token of the votes + 1.
--   W  mark.lua(T + pass limit) on every node: a reply whose mark before was >= T
--      (another token at least as high was written there) makes T = that
--      mark + 1 and W runs again (3 rounds at most); else T is confirmed
--      once a majority of nodes that count replied below T. Then, if the
--      validity has not run out, T is handed out; else released.
--   A node counts if its seed key holds its run id (it keeps every mark
--   written since it was seeded, and has been up a lease: a restarted
--   node may have lost a live grant, and is seeded only a lease + drift
--   after its run began). A node that does not hold its run id there and
--   has been up a lease + drift is seeded: the marks
--   of a majority of the other nodes that count are read (mark.lua 0), and
--   their highest written to it with its run id (mark.lua T run_id).
--   R  a holder renews every third of a lease: renew.lua on every node by
--      that node's own grant, and on a node that granted none (it was down
--      or cut off at the acquire, or refused then) acquire.lua under the
--      hold's attempt, which grants it there if the name is free (a
--      re-grant); confirmed by a majority of nodes that count renewed or
--      re-granted it within the validity, which is then the renewal's
--      first send + lease - drift; not confirmed by the end of the
--      validity, the hold is lost.
--   P  local handoffs: the acquire sends the schedule's pass limit (0 to
--      3), the write-back writes T + pass limit, and the holder may hand
--      out T + 1 .. T + pass limit to its other threads while the validity
--      lasts (passes below).
--   Q  with cfg.wait (sim --redlock --wait): waiting (acquire_waiting).
--      Every try queues the client where it is refused (the queue flag;
--      its name sent as <name>@<ticket>, the ticket its clock when the
--      wait began); a direct grant's message (release.lua) from any node
--      wakes it for its next try, whose new attempt takes that node's
--      grant afresh; without one it polls (the refusing pttl, 5 ms .. a
--      third of a lease). A split vote (some votes, fewer than m) is
--      kept if no refusing node is held by a client with an earlier
--      ticket, else given back. Without cfg.wait a refused client retries
--      after a pause, and the schedules are drawn as before.
--
-- Invariants (a violation ends the schedule; its kind names it):
--   order  every token handed out for a name is above every token handed
--          out for it before that acquire's first send (always); and above
--          the last token handed out for it at all (strict hand-out order),
--          until the schedule's first clock jump (jump below).
--   mutex  no two clients count a lease of one name valid at one instant
--          (held, not released, client clock before the validity), until
--          the schedule's first clock jump.
--   fence  a fenced store per name, which refuses a write whose token is
--          below the highest it took, never takes a write of a holder
--          after a write of a holder whose acquire began after the first
--          holder's token was handed out (always).
--   stuck  once the faults are over and a bound has passed (leases, steps
--          back of clocks, restarts), a fresh client acquires each name.
--   error  no script raises an error.
--   fifo   (cfg.wait) every node whose vote a hand-out counted granted the
--          client while no live waiter was queued ahead of it there
--          (W:queue_before), or by a turn given it while none was,
--          unless its clock was behind a time it read before (a step
--          back).
--   starve (cfg.wait) without faults, a wait ends within 5 leases per
--          client.
--   release a release by attempt leaves no live grant of that attempt to
--          its client on the node, exclusive or shared.
-- Shared mode (opts.shared, sim --redlock --shared F|mix): acquires drawn
-- shared run acquire_shared.lua, are released and given back by
-- release_shared.lua, renewed by renew.lua and re-granted by
-- acquire_shared.lua, with the same quorum and token rule (no local
-- passes: the write-back writes T alone); a shared try that a node refused
-- naming no holder gives its split vote back. The invariants then: mutex
-- allows shared leases side by side; order holds a shared token above the
-- last exclusive one (an exclusive one above the highest since the last
-- exclusive one); a shared holder's store accesses are fenced reads; fifo
-- lets a shared grant pass over live shared waiters, and checks a
-- release's direct grants to a run of shared waiters.
--
-- Semaphores (opts.rsem, sim --redlock --sem): each name is a counting
-- semaphore of limit L (1 to 3, drawn per schedule), its permits L slots,
-- slot k an exclusive quorum lock of its own ("<name>#<k>": its keys
-- "dlock:{<name>}:s<k>" + the lock's suffixes, the name's slot mark) under
-- the same scripts and rule. A permit is a slot held: tried in an order
-- that starts at a drawn slot and skips those the client holds already;
-- with --wait a client's wait queues on every slot of that order, woken
-- as a lock's waiter by a release of any of them; it keeps a split vote
-- only on its home (the first of the order, which each try asks first; a
-- split vote elsewhere is given back at once, not where refused), and a
-- permit ends the wait with a leave (leave.lua) of every other slot's
-- queue. A client may hold two permits at once (as
-- two threads of one process). Each try first claims the name for its
-- limit (lua/p2/sem_claim.lua on every node, counted by a majority), unless
-- the client's own claim lives a lease more; the renewals claim it again,
-- and a permit is valid at most while its claim surely lives. In a
-- schedule of three, client c1 uses the names otherwise: as locks, or as
-- semaphores of limit L + 1. The invariants then: limit and kind (below),
-- mutex and order per slot; no fenced store (a semaphore hands out no
-- token).
--   limit  no more than L permits of a name are held at one instant (held,
--          not released, client clock before their validity), until the
--          schedule's first clock jump.
--   kind   no lock of a name is held beside a permit of it, and no permits
--          of two limits at once (the claims), as limit.
--
-- Faults (each drawn per schedule, in four schedules of five):
--   net     requests and replies lost per client-node link (cuts lasting up
--           to 2 leases, and single losses), requests late past the command
--           timeout (they run after the client gave up)
--   restart a node restarts (down up to 2 leases): empty (no persistence),
--           its data as of a recent snapshot, or all of it; a new run id
--           either way (one node at a time without its seed)
--   clock   a node's clock steps back (up to 2 leases, a minute or a day)
--           or forward by up to 0.3% of a lease + 1 ms (at most once in
--           2 leases); the clients' and the nodes' clocks run up to 0.3%
--           fast or slow (all together less than the drift allowance)
--   jump    a node's clock steps forward by more than the drift allowance
--           (up to 3 leases): outside the clock assumption
--   pause   a client pauses (up to 3 leases) before handing a token out,
--           or while holding, then writes to the fenced store
--   crash   a client dies, holding or not
local R = require('redis')

local W = {}
W.__index = W

local floor, ceil = math.floor, math.ceil

W.ALL_FAULTS = {'net', 'restart', 'clock', 'jump', 'pause', 'crash'}

local rng = require('rng')
local new_rng = rng.seed
rng.mixin(W)

------------------------------------------------------------------------
-- The scripts.

local NAMES = {'acquire', 'release', 'mark', 'renew', 'acquire_shared', 'release_shared', 'leave',
  'sem_claim'}

local function read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end

function W.load_scripts(root, mutate)
  local texts = {}
  for _, n in ipairs(NAMES) do texts[n] = read(root .. '/lua/p2/' .. n .. '.lua') end
  if mutate then mutate(texts, 2) end
  local fns = {}
  for _, n in ipairs(NAMES) do fns[n] = R.compile(texts[n], '@lua/p2/' .. n .. '.lua') end
  fns.keys = assert(loadstring(read(root .. '/lua/keys.lua'), '@lua/keys.lua'))()
  return fns
end

------------------------------------------------------------------------
-- Events: a binary heap on (time, sequence).

local function before(a, b) return a.t < b.t or (a.t == b.t and a.seq < b.seq) end

local function heap_push(h, ev)
  local n = #h + 1
  h[n] = ev
  while n > 1 do
    local p = floor(n / 2)
    if before(h[p], ev) then break end
    h[n], h[p] = h[p], ev
    n = p
  end
end

local function heap_pop(h)
  local top, n = h[1], #h
  h[1] = h[n]
  h[n] = nil
  n = n - 1
  local i = 1
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= n and before(h[l], h[m]) then m = l end
    if r <= n and before(h[r], h[m]) then m = r end
    if m == i then break end
    h[i], h[m] = h[m], h[i]
    i = m
  end
  return top
end

-- fn at real time t (us); c: a client whose death drops the event
function W:at(t, fn, c)
  self.seq = self.seq + 1
  if t < self.now then t = self.now end
  heap_push(self.events, {t = t, seq = self.seq, fn = fn, c = c})
end

function W:trace(line)
  if self.tracing then
    self.tr[#self.tr + 1] = string.format('%10.3f ms  %s', self.now / 1000, line)
  end
end

function W:violation(kind, msg)
  if #self.violations == 0 then
    self.violations[1] = {kind = kind, msg = msg}
    self:trace('VIOLATION ' .. kind .. ': ' .. msg)
  end
end

function W:fault(kind)
  self.faults[kind] = (self.faults[kind] or 0) + 1
end

------------------------------------------------------------------------
-- A schedule.

function W.new(seed, opts, scripts)
  local self = setmetatable({}, W)
  self.seed, self.opts, self.fns = seed, opts, scripts
  self.rs = new_rng(seed)
  self.tracing = opts.trace
  self.tr = {}
  self.events, self.seq, self.now, self.steps = {}, 0, 0, 0
  self.violations, self.faults = {}, {}
  self.acquisitions = 0
  self.renewals, self.holds_lost = 0, 0 -- renewals confirmed; holds lost (hold_renewed)
  self.regrants = 0 -- grants a renewal made on nodes that had not granted the hold
  local cfg = {}
  self.cfg = cfg
  cfg.n = opts.nodes or 3
  cfg.m = floor(cfg.n / 2) + 1
  cfg.lease_ms = self:rint(100, 1000)
  cfg.L = cfg.lease_ms * 1000
  cfg.drift_us = cfg.lease_ms * 10 + 2000
  cfg.timeout_us = self:rint(10, 50) * 1000 -- the longest; each client draws its own up to it
  cfg.keep_ms = 4 * cfg.lease_ms
  cfg.pl = self:rint(0, 3) -- the pass limit: local handoffs of one grant (passes below)
  cfg.horizon_us = self:rint(10, 40) * cfg.L
  -- A forward jump excuses mutual exclusion and hand-out order only for
  -- the leases it can shorten (jump_window), and restarts may leave up to
  -- N - m nodes unseeded, a node restarting again before it was seeded
  -- (unseeded_max): what docs/design.md, "Redlock", allows. A scenario
  -- may set either otherwise.
  self.jump_window = true
  self.unseeded_max = cfg.n - cfg.m
  cfg.faults = {}
  local allowed = opts.faults or W.ALL_FAULTS
  if self:rand() >= 0.2 then
    for _, f in ipairs(allowed) do
      if self:rand() < 0.5 then cfg.faults[f] = true end
    end
  end
  self.nodes = {}
  local rates = cfg.faults.clock
  for i = 1, cfg.n do
    local nd = {i = i, srv = R.new(), off = 1700000000e6 + self:rint(-5e6, 5e6), last = 0, k = 0,
      down = false, back = 0, snap = {}, snap_t = 0,
      rate = 1 + (rates and self:rint(-30, 30) / 10000 or 0)}
    self.nodes[i] = nd
    nd.run = 'run' .. i .. '.0'
    -- (real time, as its monotonic clock counts: up an hour before the first call)
    nd.start = -3600e6
    nd.start_wall = nd.off - 3600e6
    -- deployed seeded: an empty node given its run id (docs/design.md, "Redlock")
    nd.srv.db['dlock:redlock:seed'] = {type = 'string', v = nd.run}
  end
  self.names = {}
  for i = 1, self:rint(1, 2) do self.names[i] = 'r' .. i end
  self.store = {}
  self.handed = {}
  for _, n in ipairs(self.names) do
    self.store[n] = {high = -1, max_first = -math.huge}
    self.handed[n] = {}
  end
  self.clients, self.by_id = {}, {}
  -- wait queues and wake-ups (docs/design.md "Redlock", "Waiting"): with
  -- --wait only, drawing nothing more from the schedule's stream when off
  cfg.wait = opts.wait
  self.wstats = {wakeups = 0, polls = 0, splits = 0, kept = 0, waits = 0, wait_max_us = 0}
  self.floor_stats = {hits = 0, misses = 0} -- exclusive grants by the floor, or written back
  -- the floors' own stream (W:acquire), so that a floor drawn changes no
  -- other draw
  self.rs5 = new_rng(seed + 3333333)
  -- shared mode (sim --redlock --shared F|mix): each acquire's mode drawn
  -- from a stream of its own (W:rand4), so that --shared 0 runs the
  -- schedules without it event for event
  if opts.shared ~= nil then
    self.rs4 = new_rng(seed + 5555555)
    self.shared_acquisitions = 0
  end
  -- semaphores (sim --redlock --sem): the limit drawn from a stream of
  -- their own (opts.shared and opts.rsem do not go together)
  if opts.rsem then
    self.rs4 = new_rng(seed + 7777777)
    cfg.limit = 1 + floor(self:rand4() * 3)
    -- in a schedule of three, the first client uses the names otherwise:
    -- as locks, or as semaphores of the next limit (the claims, below)
    local r = self:rand4()
    cfg.other = r < 1 / 6 and 'lock' or r < 1 / 3 and 'limit' or nil
  end
  for i = 1, self:rint(2, 4) do self:add_client(i) end
  self:trace(string.format('schedule %d: %d nodes, lease %d ms, command timeouts up to %d ms, '
    .. '%d clients, %d names, faults %s', seed, cfg.n, cfg.lease_ms, cfg.timeout_us / 1000, #self.clients,
    #self.names, self:faults_text()) .. (cfg.limit and ', semaphores of limit ' .. cfg.limit or '')
    .. (cfg.other == 'lock' and ', c1 locks them' or cfg.other == 'limit' and
      ', c1 with limit ' .. cfg.limit + 1 or ''))
  return self
end

-- The shared mode's stream (opts.shared).
function W:rand5()
  self.rs5 = (self.rs5 * 16807) % rng.M31
  return self.rs5 / rng.M31
end

function W:rand4()
  self.rs4 = (self.rs4 * 16807) % rng.M31
  return self.rs4 / rng.M31
end

function W:faults_text()
  local p = {}
  for _, f in ipairs(W.ALL_FAULTS) do
    if self.cfg.faults[f] then p[#p + 1] = f end
  end
  return #p > 0 and table.concat(p, ',') or 'none'
end

-- probe: the client that comes once the faults are over; main: a
-- scenario's own (sim/redlock_scenarios.lua), instead of client_main.
function W:add_client(i, probe, main)
  local c = {name = 'c' .. i, id = string.format('%032x', i * 7919), number = 0, seeding = {},
    cut = {}, probe = probe, over = {}, got = 0,
    -- (its wall clock, which waits' tickets read, up to 5 leases off the
    -- others' either way: a fixed offset per client, drawing nothing)
    skew = ((i * 7919) % 11 - 5) * self.cfg.L}
  self.by_id[c.id] = c
  if self.opts.rsem then
    c.limit, c.claims = self.cfg.limit, {}
    if i == 1 and not probe and not main and self.cfg.other == 'limit' then c.limit = c.limit + 1 end
    c.locks = i == 1 and not probe and not main and self.cfg.other == 'lock'
  end
  if self.rs4 and not probe and not self.opts.rsem then
    -- the share of its acquires that are shared (--shared F, or mix: its own)
    local f = self.opts.shared
    if f == 'mix' then
      local fs = {0, 0.5, 0.9, 1}
      f = fs[1 + floor(self:rand4() * #fs)]
    end
    c.shared_frac = f
  end
  -- (c2 is an older client in a schedule of an even lease: it proposes no
  -- floor, its every exclusive grant written back, as before the floor)
  c.no_floor = i == 2 and not probe and not main and self.cfg.lease_ms % 2 == 0
  -- (clients configured apart: a command timeout of their own)
  c.timeout_us = probe and self.cfg.timeout_us or self:rint(7000, self.cfg.timeout_us)
  c.rate = 1 + ((self.cfg.faults.clock and not probe) and self:rint(-30, 30) / 10000 or 0)
  self.clients[#self.clients + 1] = c
  c.co = coroutine.create(function()
    if main then main(self, c)
    elseif probe then self:probe_main(c)
    elseif self.opts.rsem then self:sem_main(c)
    else self:client_main(c) end
  end)
  self:at(self.now + (main and 0 or self:rint(0, 20000)), function() self:resume(c) end, c)
  return c
end

local function cnow(self, c) return floor(self.now * c.rate) end

-- Real time when c's clock reads t.
function W:real_at(c, t) return math.max(self.now, t / c.rate) end

function W:resume(c)
  if c.dead or c.finished then return end
  local ok, err = coroutine.resume(c.co)
  if not ok then error(err, 0) end
  if coroutine.status(c.co) == 'dead' then c.finished = true end
end

function W:sleep(c, us)
  self:at(self.now + us, function() self:resume(c) end, c)
  coroutine.yield()
end

-- (a semaphore's slot k, "<name>#<k>": keys of its own under the name's
-- hash tag, and the name's slot mark)
function W:keys_of(name, c)
  local out = {}
  local sem, k = string.match(name, '^(.-)#(%d+)$')
  local base = sem and 'dlock:{' .. sem .. '}:s' .. k or 'dlock:{' .. name .. '}'
  for i, key in ipairs(self.fns.keys) do
    if key[1] == 'HW' then
      out[i] = self:hw(sem or name)
    else
      out[i] = base .. key[2] .. (key[1] == 'CLIENT' and c.id or '')
    end
  end
  return out
end

------------------------------------------------------------------------
-- The nodes and the network.

-- Node nd's clock, in whole us, at least 1 us after its last reading
-- (unless stepped back since).
function W:srv_time(nd)
  local t = math.max(floor(self.now * nd.rate + nd.off), nd.last + 1)
  nd.last = t
  return t
end

-- Runs a script on node nd now: its reply, and what the client's pipeline
-- reads beside it (INFO's run_id and uptime, GET of the seed key). (The C
-- reads the run id when its connection to the node opens, which reaches
-- that run until it closes: the same run as the script's, as here.)
function W:run_on(nd, c, script, keys, argv)
  local high = nd.high or 0
  local now_us = self:srv_time(nd)
  nd.high = math.max(high, now_us)
  local q = self.cfg.wait and script ~= 'mark' and script ~= 'renew' and self:queue_before(nd, keys,
    now_us)
  nd.srv.published = {}
  local rep = R.run(nd.srv, self.fns[script], keys, argv, now_us)
  self.steps = self.steps + 1
  if q then
    q.behind = now_us < high
    self:queue_after(nd, c, script, keys, q, rep)
  end
  for _, p in ipairs(nd.srv.published) do self:wake(nd, p.channel, p.message) end
  -- release: a release by attempt leaves no live grant of that attempt to
  -- its client on the node, exclusive or shared (a client that releases
  -- with the other mode's script would keep it for a lease)
  if (script == 'release' or script == 'release_shared') and argv[2] == 'nonce' then
    local g = R.live(nd.srv, keys[1])
    local now_ms = floor(now_us / 1000)
    if g then
      local sa, sx = string.match(g.v['s:' .. c.id] or '', '^%d+ (%d+) %d+ %d+ (%d+)$')
      local ga, gx = string.match(g.v.g or '', '^%d+ (%d+) %d+ (%d+) ')
      if (sa == argv[3] and tonumber(sx) >= now_ms) or
         (g.v.o == c.id and ga == argv[3] and tonumber(gx) >= now_ms) then
        self:violation('release', string.format('%s by attempt %s of %s left its live %s grant on '
          .. 'node %d', script, argv[3], c.name, sa == argv[3] and 'shared' or 'exclusive', nd.i))
      end
    end
  end
  -- (shared mode: an acquire of the other mode than the client's own live
  -- lease there, one whose release was lost, is refused with DLOCKMODE:
  -- no vote, until that lease ends; semaphores, c1 using their names as
  -- locks: a lock's script refuses a semaphore's claim with DLOCKKIND, no
  -- vote either)
  if type(rep) == 'table' and rep.err and not (self.opts.shared ~= nil and string.match(rep.err, '^DLOCKMODE '))
      and not (self.cfg.other == 'lock' and string.match(rep.err, '^DLOCKKIND ')) then
    self:violation('error', script .. ' failed on node ' .. nd.i .. ': ' .. rep.err)
  end
  local seed = R.live(nd.srv, 'dlock:redlock:seed')
  -- (uptime by the node's monotonic clock; with wall_uptime, as Redis's
  -- INFO computes uptime_in_seconds: its wall clock now less its wall
  -- clock at start, so a step of its clock moves it)
  local up = self.wall_uptime and floor((now_us - nd.start_wall) / 1000)
    or floor((self.now - nd.start) / 1000)
  local meta = {run = nd.run, up = up, seed = seed and seed.v or ''}
  if self.tracing then
    self:trace(string.format('node %d runs %s(%s) for %s -> %s  [%s up %d ms seed %s]', nd.i, script,
      table.concat(argv, ' ', script == 'mark' and 1 or 2), c.name, self:describe(rep), meta.run,
      meta.up, meta.seed))
  end
  return rep, meta
end

function W:describe(v)
  if type(v) == 'number' and v == floor(v) then return string.format('%.0f', v) end
  if type(v) ~= 'table' then return tostring(v) end
  if v.err then return 'ERR ' .. v.err end
  local p = {}
  for i, x in ipairs(v) do p[i] = self:describe(x) end
  return '{' .. table.concat(p, ', ') .. '}'
end

function W:link_up(c, i) return not (c.cut[i] and c.cut[i] > self.now) end

-- A one-way delay on the link c - node i: up to the command timeout while
-- the link is slow.
function W:delay(c, i)
  if c.slow and c.slow[i] and c.slow[i] > self.now then
    return self:rint(floor(c.timeout_us / 4), c.timeout_us)
  end
  return self:rand() < 0.8 and self:rint(50, 500) or self:rint(500, 3000)
end

-- Sends a script to node i for client c; cb(reply, meta) when the reply
-- comes back, never if the request or the reply is lost.
function W:send(c, i, script, keys, argv, cb)
  local f = self.cfg.faults
  local calm = self.calm or c.probe
  local lossy = f.net and not calm
  -- (a scenario, sim/redlock_scenarios.lua, may lose or delay a message
  -- by its own choice: net_hook returns 'lose', a delay in us, or nil)
  local hook = self.net_hook and self.net_hook(c, i, script, 'request')
  if hook == 'lose' or not self:link_up(c, i) or (lossy and self:rand() < 0.08) then return end
  local d = hook or self:delay(c, i)
  if lossy and self:rand() < 0.03 then d = self:rint(c.timeout_us, 3 * c.timeout_us) end
  self:at(self.now + d, function()
    local nd = self.nodes[i]
    if nd.down then return end
    local rep, meta = self:run_on(nd, c, script, keys, argv)
    local back = self.net_hook and self.net_hook(c, i, script, 'reply')
    if back == 'lose' or not self:link_up(c, i) or (lossy and self:rand() < 0.08) then return end
    self:at(self.now + (back or self:delay(c, i)), function() cb(rep, meta) end, c)
  end)
end

-- Sends to every node of list, and blocks c until each replied or the
-- command timeout passed (by c's clock): the replies by node, {rep, meta}.
-- argv: the arguments, or a function of the node giving them.
-- (script may be a function of the node: its script, keys and arguments)
function W:gather(c, list, script, keys, argv)
  local out, left, tok = {}, #list, {}
  c.gtok = tok
  for _, i in ipairs(list) do
    local sc, k, a = script, keys, type(argv) == 'function' and argv(i) or argv
    if type(script) == 'function' then sc, k, a = script(i) end
    self:send(c, i, sc, k, a, function(rep, meta)
      if c.gtok ~= tok then return end
      out[i] = {rep = rep, meta = meta}
      left = left - 1
      if left == 0 then
        c.gtok = nil
        self:resume(c)
      end
    end)
  end
  self:at(self:real_at(c, cnow(self, c) + c.timeout_us), function()
    if c.gtok == tok then
      c.gtok = nil
      self:resume(c)
    end
  end, c)
  coroutine.yield()
  return out
end

function W:all_nodes()
  local l = {}
  for i = 1, self.cfg.n do l[i] = i end
  return l
end

------------------------------------------------------------------------
-- The quorum client.

-- Does node's vote count: seeded in this run? (A seeding comes a lease
-- + drift after the run began, maybe_seed below, and a fresh deployment
-- has no grant to lose: a seeded node has been up a lease, whoever asks.)
function W:counts(meta)
  return meta.seed == meta.run
end

-- A node not seeded in this run and up a lease + drift: seed it (in the
-- background) from a majority of the other nodes that count. hw: the mark
-- of the slot of the name acquired. Every name shares one slot's mark
-- unless per_slot (each name its own slot); then the seeding copies hw
-- only, unless seed_all_slots (every slot's mark, then the run id last,
-- once every mark is written).
function W:maybe_seed(c, i, meta, hw)
  local cfg = self.cfg
  if meta.seed == meta.run or meta.up * 1000 < cfg.L + cfg.drift_us or c.seeding[i] then return end
  c.seeding[i] = true
  local list = self.seed_all_slots and self:slot_marks() or {hw}
  local got, top, done = {}, {}, false
  for k = 1, #list do got[k], top[k] = 0, 0 end
  local function all_got()
    for k = 1, #list do if got[k] < cfg.m then return false end end
    return true
  end
  local function write(k)
    self:send(c, i, 'mark', {list[k], 'dlock:redlock:seed'},
      {string.format('%.0f', top[k]), k == #list and meta.run or ''}, function(rep)
        if k < #list and type(rep) == 'table' and not rep.err then write(k + 1) end
      end)
  end
  local function finish()
    if done then return end
    done = true
    c.seeding[i] = nil
    if all_got() then
      for k = 1, #list do
        self:trace(string.format('%s seeds node %d (%s) with mark %.0f', c.name, i, meta.run, top[k])
          .. (self.per_slot and ' (' .. list[k] .. ')' or ''))
      end
      write(1)
    end
  end
  for j = 1, cfg.n do
    if j ~= i then
      for k = 1, #list do
        self:send(c, j, 'mark', {list[k], 'dlock:redlock:seed'}, {'0', ''}, function(rep, m)
          if type(rep) == 'table' and not rep.err and self:counts(m) then
            got[k] = got[k] + 1
            top[k] = math.max(top[k], tonumber(rep[1]))
            if all_got() then finish() end
          end
        end)
      end
    end
  end
  self:at(self:real_at(c, cnow(self, c) + c.timeout_us), finish, c)
end

-- The slots' marks of the world's names (one unless per_slot).
function W:slot_marks()
  local out, seen = {}, {}
  for _, n in ipairs(self.names) do
    local k = self:hw(n)
    if not seen[k] then seen[k], out[#out + 1] = true, k end
  end
  return out
end

function W:hw(name) return self.per_slot and 'dlock:hw:{' .. name .. '}' or 'dlock:hw:{0}' end

-- Releases attempt att of name on every node, or those of list some (fire
-- and forget); last: the
-- token handed out under it for release.lua to raise the mark to, always
-- '0' here: the rule must not rely on a release's write-back (a holder
-- that crashes or pauses past its lease sends none). shared: the attempt
-- was a shared acquire's (release_shared.lua).
function W:release_all(c, name, att, last, some, shared)
  local cfg = self.cfg
  for _, i in ipairs(some or self:all_nodes()) do
    self:send(c, i, shared and 'release_shared' or 'release', self:keys_of(name, c), {c.id, 'nonce', tostring(att),
      tostring(cfg.lease_ms), last, 'dlock:wake:', name, tostring(cfg.lease_ms),
      tostring(cfg.keep_ms), '0'}, function() end)
  end
end

-- The quorum acquire: a hold {name, token, att, first, valid, handout} or nil.
-- shared: a shared lease (acquire_shared.lua on every node, the same rule:
-- any two majorities share a node, which grants no exclusive lease beside a
-- shared one; no local passes, so the write-back writes T alone).
-- single: a try outside the client's wait: not queued, no split vote
-- kept, whatever cfg.wait. nokeep: a try of a wait that keeps no split
-- vote (a semaphore's slot other than its wait's home): queued where
-- refused, a split vote given back as a wait's (not where refused).
-- The floor's least margin (us; docs/design.md "Redlock", Tokens).
W.FLOOR_MIN = 1000

function W:acquire(c, name, shared, single, nokeep)
  local cfg = self.cfg
  local wait = cfg.wait and not single
  local pl = shared and 0 or c.pl or cfg.pl -- (a scenario may give a client a pass limit of its own)
  c.number = c.number + 1
  local att = c.number
  local first_real, first = self.now, cnow(self, c)
  local valid = first + cfg.L - cfg.drift_us
  local keys = self:keys_of(name, c)
  -- (waiting: queued on every node that refuses, under the client's name
  -- and the ticket of its wait, its clock when the wait began)
  -- (a try outside a wait is a wait of its own)
  if wait and not c.waiting then c.ticket = self:ticket(c) end
  local cname = wait and c.name .. '@' .. string.format('%.0f', c.ticket) or c.name
  local args = {c.id, tostring(cfg.lease_ms), tostring(att), tostring(pl), tostring(cfg.lease_ms),
    wait and '1' or '0', tostring(cfg.keep_ms), cname}
  -- The floor (docs/design.md "Redlock", Tokens): an exclusive try
  -- proposes the highest of the nodes' clocks as this client last read
  -- them (off[i]: node i's clock less c's, from its last grant's reply),
  -- plus a margin; 0 while it has read none. The rule must hold whatever
  -- the floor, so half the tries propose another: 0, or the client's
  -- guess less up to a lease (a guess gone stale), which leave the token
  -- to the votes and the write-back.
  local F
  if not shared and not c.no_floor then
    c.off, c.margin = c.off or {}, c.margin or W.FLOOR_MIN
    F = 0
    for i = 1, cfg.n do
      if c.off[i] then F = math.max(F, first + c.off[i] + c.margin) end
    end
    local r = self:rand5()
    if r < 0.25 then
      F = 0
    elseif r < 0.5 then
      F = math.max(0, F - floor(self:rand5() * cfg.L))
    end
    args[9], args[10], args[11] = '0', '0', string.format('%.0f', F)
  end
  local reps = self:gather(c, self:all_nodes(), shared and 'acquire_shared' or 'acquire', keys, args)
  local votes, tokens, node_tok, voted = 0, {}, {}, {}
  -- (each counting node's clock, as its grant's reply tells it, less c's
  -- at the send; late: a node's clock had passed a floor proposed)
  local late = false
  for i = 1, cfg.n do
    local r = reps[i]
    if F and r and type(r.rep) == 'table' and r.rep[1] == 1 and r.rep[4] and self:counts(r.meta) then
      c.off[i] = r.rep[4] - first
      late = late or (F > 0 and r.rep[4] >= F)
    end
  end
  local kind = 0 -- counting nodes that refused it as a semaphore's (a claim)
  local older -- a node that refused it is held by a client waiting since before it
  c.pttl = nil
  for i = 1, cfg.n do
    local r = reps[i]
    if r then
      if type(r.rep) == 'table' and r.rep[1] == 1 then node_tok[i] = r.rep[2] end
      if type(r.rep) == 'table' and r.rep.err and string.match(r.rep.err, '^DLOCKKIND ')
          and self:counts(r.meta) then
        kind = kind + 1
      end
      if type(r.rep) == 'table' and r.rep[1] == 1 and self:counts(r.meta) then
        votes = votes + 1
        tokens[#tokens + 1] = r.rep[2]
        voted[#voted + 1] = {i = i, run = r.meta.run}
      elseif type(r.rep) == 'table' and r.rep[1] == 0 and r.rep[2] > 0 then
        c.pttl = math.max(c.pttl or 0, r.rep[2])
        if wait and self:ahead_of(r.rep[3], c) then older = true end
      end
      -- (shared: a refusal that names no holder, a waiter ahead there or
      -- shared leases, counts as older: readers keep a split vote only
      -- against named, younger holders, else writers and readers that
      -- hold each other's nodes wait on one another unnamed)
      if shared and wait and type(r.rep) == 'table' and r.rep[1] == 0 and r.rep[3] == '' then
        older = true
      end
      self:maybe_seed(c, i, r.meta, keys[7])
    end
  end
  if kind > cfg.n - cfg.m then
    -- a semaphore's name on a majority (src/route/redlock_grant.c:
    -- DLOCK_ESERVER): the call ends, a wait too (c.kind_refused)
    self:trace(string.format('%s: %s refused as a semaphore\'s by %d nodes', c.name, name, kind))
    self:release_all(c, name, att, '0', nil, shared)
    c.kind_refused = true
    return nil
  end
  if votes < cfg.m or cnow(self, c) >= valid then
    self:trace(string.format('%s: %s refused (%d votes)%s', c.name, name, votes, shared and ' shared' or ''))
    if wait and votes > 0 then
      self.wstats.splits = self.wstats.splits + 1
      -- A split vote: the client waiting longest keeps its grants (its
      -- next try, within a third of a lease, renews them); any other gives
      -- them back, so that those nodes pass to their next waiter.
      if not older and not nokeep and cnow(self, c) < valid then
        self.wstats.kept = self.wstats.kept + 1
        self:trace(string.format('%s keeps its %d votes for %s (ticket %.0f)', c.name, votes, name,
          c.ticket))
        return nil, att
      end
    end
    if wait then
      -- (not where it was refused: it holds nothing there under this
      -- attempt, and a direct grant made there since is its turn)
      local some = {}
      for i = 1, cfg.n do
        local r = reps[i]
        if not (r and type(r.rep) == 'table' and r.rep[1] == 0) then some[#some + 1] = i end
      end
      self:release_all(c, name, att, '0', some, shared)
    else
      self:release_all(c, name, att, '0', nil, shared)
    end
    return nil
  end
  local T = 0
  for _, t in ipairs(tokens) do T = math.max(T, t) end
  -- Votes of one token T from every node, each counting and each having
  -- taken the floor, wrote T + the pass limit as their marks with the
  -- votes: the write-back's work is done. (Every node, not a majority:
  -- an acquire whose write-back its votes overlapped may have been
  -- confirmed by nodes that refused it, and handed out before a vote
  -- here; one of every node is then a node that granted it, whose vote
  -- here came after its lease there, so after its write-back:
  -- docs/design.md "Redlock", hand-out order.) Else the write-back, from
  -- above the marks this client's own votes wrote (vote + pl, read +
  -- another pl while the node's clock is behind).
  local same = 0
  for _, t in ipairs(tokens) do
    if t == T then same = same + 1 end
  end
  local floored = F and same >= cfg.n
  if F then
    c.margin = late and math.min(2 * c.margin, floor(cfg.L / 8))
      or math.max(W.FLOOR_MIN, c.margin - floor(c.margin / 32))
    self.floor_stats[floored and 'hits' or 'misses'] = self.floor_stats[floored and 'hits' or 'misses'] + 1
  end
  if not floored then T = T + (F and 2 * pl or 0) + 1 end
  local ok = false
  for _ = 1, 3 do
    if floored then
      ok = true
      break
    end
    local wr = self:gather(c, self:all_nodes(), 'mark', {keys[7], 'dlock:redlock:seed'},
      {string.format('%.0f', T + pl), ''})
    local acks, top = 0, nil
    for i = 1, cfg.n do
      local w = wr[i]
      if w and type(w.rep) == 'table' and not w.rep.err then
        local b = tonumber(w.rep[1])
        if b >= T then
          top = math.max(top or 0, b)
        elseif self:counts(w.meta) then
          acks = acks + 1
        end
      end
    end
    if top then
      self:trace(string.format('%s: %s token %.0f met mark %.0f', c.name, name, T, top))
      T = top + 1
    else
      ok = acks >= cfg.m
      break
    end
  end
  if ok and cfg.faults.pause and not c.probe and self:rand() < 0.05 then
    self:fault('pause')
    local d = self:rint(1, 3 * cfg.L)
    self:trace(string.format('FAULT %s pauses %.3f ms before handing out %.0f', c.name, d / 1000, T))
    self:sleep(c, d)
  end
  if not ok or cnow(self, c) >= valid then
    self:trace(string.format('%s: %s not confirmed (token %.0f)', c.name, name, T))
    self:release_all(c, name, att, '0', nil, shared)
    return nil
  end
  return {name = name, token = T, att = att, first = first_real, valid = valid, handout = self.now,
    node_tok = node_tok, voted = voted, shared = shared}
end

-- Waiting (cfg.wait): quorum tries of name until one is granted or the
-- client's clock passes deadline (then it gives up: its queue places and
-- any direct grant to it end with the waiter ttl, a lease). Between tries
-- it waits for a wake-up from any node, or polls: after the refusing
-- lease's pttl (5 ms .. a third of a lease, as without queues), a third of
-- a lease when no node told one. Its ticket is its clock at the first try.
function W:acquire_waiting(c, name, deadline, shared)
  local cfg = self.cfg
  c.ticket, c.waiting, c.woken = self:ticket(c), name, nil
  local start = self.now
  local h, kept
  while true do
    local before = kept
    c.kind_refused = nil
    h, kept = self:acquire(c, name, shared)
    -- (grants an earlier try kept, on nodes this try did not reach: a
    -- release by that attempt leaves a newer grant of the client alone)
    if before and before ~= kept then self:release_all(c, name, before, '0', nil, shared) end
    if h or c.kind_refused or cnow(self, c) >= deadline then break end
    local p = c.pttl and c.pttl * 1000 or floor(cfg.L / 3)
    self:await(c, math.max(5000, math.min(p, floor(cfg.L / 3))) + self:rint(0, 2000))
  end
  c.waiting, c.wtok, c.woken = nil, nil, nil
  if kept then self:release_all(c, name, kept, '0', nil, shared) end
  local waited = self.now - start
  local ws = self.wstats
  ws.waits = ws.waits + 1
  ws.wait_max_us = math.max(ws.wait_max_us, waited)
  -- starve: without faults, a waiter is served within a bound: each
  -- client ahead of it holds up to 3 leases renewed and a third of a
  -- lease more, and the rest comes to less than one more each
  local bound = #self.clients * 5 * cfg.L
  if not next(cfg.faults) and not c.probe and waited > bound then
    self:violation('starve', string.format('%s waited %.3f ms for %s without faults (bound %.3f ms)',
      c.name, waited / 1000, name, bound / 1000))
  end
  return h
end

-- A wait's ticket: c's wall clock, set apart from the others' by its skew
-- (never below 0: a ticket is digits).
function W:ticket(c)
  return math.max(0, cnow(self, c) + c.skew)
end

-- Does holder (a refusal's holder name, "<client>@<ticket>") wait since
-- before client c (tickets, then names, in order)?
function W:ahead_of(holder, c)
  local n, t = string.match(holder or '', '^(.-)@(%d+)$')
  if not n or n == c.name then return false end
  t = tonumber(t)
  return t < c.ticket or (t == c.ticket and n < c.name)
end

-- A renewal of hold h: renew.lua on every node that granted it, naming
-- that node's grant (its own token), and acquire.lua under the hold's
-- attempt on every node that did not (a re-grant: without it, a hold
-- granted while a node was down would be lost once another node failed,
-- with a majority up); confirmed when a majority of nodes that count
-- renewed or re-granted it while the validity lasts, and then the
-- validity is the renewal's first send + the lease - the drift allowance,
-- by the client's clock (a node's renewal or grant runs after that send,
-- and lasts a lease from then by its clock). True if confirmed.
function W:renew(c, h)
  local cfg = self.cfg
  local first = cnow(self, c)
  local pl = c.pl or cfg.pl
  local keys = self:keys_of(h.name, c)
  local reps = self:gather(c, self:all_nodes(), function(i)
    if h.node_tok[i] then
      return 'renew', {keys[1]}, {c.id, tostring(cfg.lease_ms), string.format('%.0f', h.node_tok[i])}
    end
    return h.shared and 'acquire_shared' or 'acquire', keys, {c.id, tostring(cfg.lease_ms), tostring(h.att), tostring(h.shared and 0 or pl),
      tostring(cfg.lease_ms), '0', tostring(cfg.keep_ms), c.name}
  end)
  local acks = 0
  for i = 1, cfg.n do
    local r = reps[i]
    if r and type(r.rep) == 'table' and r.rep[1] == 1 then
      if not h.node_tok[i] then
        h.node_tok[i] = r.rep[2] -- re-granted: renewed by its token from now on
        self.regrants = self.regrants + 1
      end
      if self:counts(r.meta) then acks = acks + 1 end
    end
  end
  if acks >= cfg.m and cnow(self, c) < h.valid then
    h.valid = first + cfg.L - cfg.drift_us
    self.renewals = self.renewals + 1
    self:trace(string.format('%s renewed %s (%d acks, valid %.3f ms more)', c.name, h.name, acks,
      (h.valid - cnow(self, c)) / 1000 / c.rate))
    return true
  end
  self:trace(string.format('%s: renewal of %s not confirmed (%d acks)', c.name, h.name, acks))
  return false
end

-- Holds h for about hold us (real time), renewing it every third of a
-- lease, as the renewal thread does; a renewal not confirmed is tried
-- again while the validity lasts, and past it the hold is lost (the holder
-- knows: it writes no more). Writes to the fenced store at a point of the
-- hold and at its end, a pause possibly before either. False if lost.
function W:hold_renewed(c, h, hold)
  local cfg = self.cfg
  local start, part = self.now, self:rint(0, hold)
  local writes = {start + part, start + hold}
  local k = 1
  while k <= 2 do
    local step = math.min(writes[k] - self.now, floor(cfg.L / 3))
    if step > 0 then self:sleep(c, step) end
    if self.now >= writes[k] then
      self:maybe_pause(c, h.name)
      self:store_write(c, h)
      k = k + 1
    elseif not self:renew(c, h) and cnow(self, c) >= h.valid then
      self:trace(string.format('%s lost %s', c.name, h.name))
      self.holds_lost = self.holds_lost + 1
      return false
    end
  end
  return true
end

-- A pause of holder c (faults.pause: one time in 20, up to 3 leases),
-- holding `what`, before its next step.
function W:maybe_pause(c, what)
  if self.cfg.faults.pause and self:rand() < 0.05 then
    self:fault('pause')
    local d = self:rint(1, 3 * self.cfg.L)
    self:trace(string.format('FAULT %s pauses %.3f ms holding %s', c.name, d / 1000, what))
    self:sleep(c, d)
  end
end

-- A token handed out: the order invariant. (Shared mode: a shared token
-- need not be above one of another shared lease that overlapped its
-- acquire; it is above the last exclusive token, and the next exclusive
-- token above it.)
function W:hand_out(c, h)
  local list = self.handed[h.name]
  if not list then -- (a semaphore's slot)
    list = {}
    self.handed[h.name] = list
  end
  local prior, last = nil, nil
  -- (the last exclusive token, for a shared one; for an exclusive one the
  -- highest since the last exclusive token, that one included: shared
  -- tokens after it need not be in order among themselves)
  for k = #list, 1, -1 do
    if not h.shared and (not last or list[k].token > last.token) then last = list[k] end
    if not list[k].shared then
      if h.shared then last = list[k] end
      break
    end
  end
  for _, x in ipairs(list) do
    if x.handout < h.first and (not prior or x.token > prior.token) then prior = x end
  end
  if prior and h.token <= prior.token then
    self:violation('order', string.format('%s got token %.0f of %s, not above %.0f, handed out to %s '
      .. 'before its acquire began', c.name, h.token, h.name, prior.token, prior.c))
  elseif last and h.token <= last.token and not self:excused() then
    self:violation('order', string.format('%s got token %.0f of %s, not above %.0f, handed out '
      .. 'before (to %s)', c.name, h.token, h.name, last.token, last.c))
  end
  local lease_key = self:keys_of(h.name, c)[1]
  for _, v in ipairs(h.voted or {}) do
    local o = c.over[v.i .. ' ' .. lease_key]
    if o and o.run == v.run and #o.ids > 0 then
      local w = self.by_id[o.ids[1]]
      self:violation('fifo', string.format('%s got %s (token %.0f) with the vote of node %d, whose grant '
        .. 'passed over %s, a live waiter queued ahead of it there', c.name, h.name, h.token, v.i,
        w and w.name or o.ids[1]))
    end
  end
  h.c = c.name
  c.got = c.got + 1
  list[#list + 1] = h
  self.acquisitions = self.acquisitions + 1
  if h.shared then self.shared_acquisitions = self.shared_acquisitions + 1 end
  self:trace(string.format('%s holds %s%s with token %.0f (valid %.3f ms more)', c.name, h.name,
    h.shared and ' shared' or '', h.token, (h.valid - cnow(self, c)) / 1000 / c.rate))
end

-- A holder's write to the fenced store of its name (a shared holder's is
-- a fenced read: the store refuses it as a write, and it raises the
-- store's highest token as a write does, so that no write of an older
-- token lands after it; so two readers whose acquires overlapped may
-- refuse each other's reads: conservative, a refused access is not
-- checked).
function W:store_write(c, h)
  local s = self.store[h.name]
  local what = h.shared and 'read' or 'write'
  if h.token < s.high then
    self:trace(string.format('store of %s refuses the %s of %s (token %.0f < %.0f)', h.name, what,
      c.name, h.token, s.high))
    return
  end
  if s.max_first > h.handout then
    self:violation('fence', string.format('the store of %s took a %s of %s (token %.0f) after an '
      .. 'access of an acquire that began after that token was handed out', h.name, what, c.name,
      h.token))
  end
  s.high = h.token
  s.max_first = math.max(s.max_first, h.first)
  self:trace(string.format('store of %s takes the %s of %s (token %.0f)', h.name, what, c.name,
    h.token))
end

function W:client_main(c)
  local cfg = self.cfg
  while self.now < cfg.horizon_us do
    -- (hot: at once again, as a thread of a busy process would)
    self:sleep(c, self.opts.hot and 0 or self:rint(0, floor(cfg.L / 2)))
    local name = self.names[self:rint(1, #self.names)]
    local shared = c.shared_frac and self:rand4() < c.shared_frac or nil
    local h
    if cfg.wait then
      h = self:acquire_waiting(c, name, cfg.horizon_us * c.rate, shared)
    else
      h = self:acquire(c, name, shared)
    end
    if h then
      self:hand_out(c, h)
      c.hold = h
      -- held briefly, a while, or to the end of its validity, writing to
      -- the fenced store at a point of it and at its end; a pause may come
      -- before either write
      -- (or, one hold in ten, for up to 3 leases, renewed: hold_renewed)
      local left = math.max(0, floor((h.valid - cnow(self, c)) / c.rate))
      local r = self:rand()
      if r >= 0.9 then
        self:hold_renewed(c, h, self:rint(0, 3 * cfg.L))
      else
        local hold = r < 0.3 and self:rint(0, 2000) or r < 0.8 and self:rint(0, floor(left * 0.8))
          or math.max(0, left - self:rint(0, 200))
        local part = self:rint(0, hold)
        for k = 1, 2 do
          self:sleep(c, k == 1 and part or hold - part)
          self:maybe_pause(c, name)
          self:store_write(c, h)
        end
      end
      if not shared then self:passes(c, h) end
      c.hold = nil
      self:trace(string.format('%s releases %s', c.name, name))
      self:release_all(c, name, h.att, '0', nil, shared)
    elseif cfg.wait then
      self:sleep(c, self:rint(1000, floor(cfg.L / 4)))
    elseif c.pttl and self:rand() < 0.5 then
      self:sleep(c, c.pttl * 1000 + self:rint(0, 2000)) -- when the lease that refused it ends
    else
      self:sleep(c, self:rint(1000, floor(cfg.L / 4)))
    end
  end
end

-- Local handoffs of hold h to other threads of c, while its validity
-- lasts: at most the pass limit, each handing out the next token (T + k,
-- which the write-back covered), held briefly and written to the store.
function W:passes(c, h)
  local cfg = self.cfg
  for k = 1, c.pl or cfg.pl do
    if self:rand() >= 0.5 or cnow(self, c) >= h.valid then return end
    local p = {name = h.name, token = h.token + k, att = h.att, first = h.first, valid = h.valid,
      handout = self.now, node_tok = h.node_tok}
    self:trace(string.format('%s passes %s locally', c.name, h.name))
    self:hand_out(c, p)
    c.hold = p
    self:sleep(c, self:rint(0, 2000))
    self:maybe_pause(c, h.name)
    self:store_write(c, p)
  end
end

-- After the faults: a fresh client must acquire every name (take a permit
-- of every semaphore, opts.rsem).
function W:probe_main(c)
  local cfg, sem = self.cfg, self.opts.rsem
  for _, name in ipairs(self.names) do
    local h
    if cfg.wait and sem then
      h = self:permit_waiting(c, name, cnow(self, c) + 4 * cfg.L)
    elseif cfg.wait then
      h = self:acquire_waiting(c, name, cnow(self, c) + 4 * cfg.L)
    else
      for _ = 1, 4 do
        if sem then h = self:permit(c, name) else h = self:acquire(c, name) end
        if h then break end
        self:sleep(c, cfg.L)
      end
    end
    if not h then
      self:violation('stuck', string.format('a fresh client could not %s once the faults were over',
        (sem and 'take a permit of ' or 'acquire ') .. name))
      return
    end
    self:hand_out(c, h)
    self:release_all(c, h.name, h.att, '0')
  end
end

------------------------------------------------------------------------
-- Semaphores (opts.rsem): permits as slots, each an exclusive quorum lock.

-- The slots of sem for c to try, in order: from a drawn one on, less those
-- c holds.
function W:slot_order(c, sem)
  local L, held = self.cfg.limit, {}
  for _, h in ipairs(c.holds or {}) do held[h.name] = true end
  local out, from = {}, self:rint(0, L - 1)
  for j = 0, L - 1 do
    local s = sem .. '#' .. ((from + j) % L)
    if not held[s] then out[#out + 1] = s end
  end
  return out
end

-- The name's claim for c's limit (lua/p2/sem_claim.lua on every node, as
-- src/route/redlock_claim.c): its validity on c's clock (the first send + a
-- lease - the drift allowance, as a grant's: a node restarted without it
-- counts again a lease + the drift allowance later; its time to live is 2
-- leases) if a majority of counting nodes claimed it, else nil and whether
-- more than n - m counting nodes refused it (another limit, or a lock's
-- data: no majority can claim it).
function W:claim(c, sem)
  local cfg = self.cfg
  local first = cnow(self, c)
  local valid = first + (cfg.L - cfg.drift_us) -- (a lease, as a grant's)
  local reps = self:gather(c, self:all_nodes(), 'sem_claim', {'dlock:{' .. sem .. '}'},
    {tostring(2 * cfg.lease_ms), tostring(c.limit)})
  local ok, no = 0, 0
  for i = 1, cfg.n do
    local r = reps[i]
    if r and type(r.rep) == 'table' and not r.rep.err and self:counts(r.meta) then
      if r.rep[1] == 0 then ok = ok + 1 else no = no + 1 end
    end
    -- (a node seen unseeded is seeded, as after any call: the C's renewal
    -- thread seeds the nodes due whatever calls run)
    if r then self:maybe_seed(c, i, r.meta, self:hw(sem)) end
  end
  local refused = no > cfg.n - cfg.m
  if ok >= cfg.m and cnow(self, c) < valid then
    c.claims[sem] = math.max(c.claims[sem] or 0, valid)
    return valid
  end
  self:trace(string.format('%s: claim of %s for limit %d not made (%d of %d)%s', c.name, sem,
    c.limit, ok, cfg.n, refused and ', refused' or ''))
  return nil, refused
end

-- A try's claim (src/local/rlsem.c, R4): c's own, if it holds two thirds
-- of a lease more, else a new one (as W:claim).
function W:claimed(c, sem)
  local v = c.claims[sem]
  if v and v > cnow(self, c) + 2 * self.cfg.L / 3 then return v end
  return self:claim(c, sem)
end

-- One permit of sem, the name claimed and each slot tried once: a hold
-- (its name the slot's, h.sem the semaphore's, its validity within the
-- claim's) or nil.
function W:permit(c, sem)
  local cv = self:claimed(c, sem)
  if not cv then return nil end
  for _, s in ipairs(self:slot_order(c, sem)) do
    local h = self:acquire(c, s)
    if h then
      h.sem, h.limit, h.valid = sem, c.limit, math.min(h.valid, cv)
      return h
    end
  end
end

-- A waiting client's leave of slot s's queue on every node (fire and
-- forget), under a number of its own: a direct grant there to an older
-- attempt of its own, never taken, is given up.
function W:leave_all(c, s)
  local number = c.number + 1
  c.number = number
  for _, i in ipairs(self:all_nodes()) do
    self:send(c, i, 'leave', self:keys_of(s, c), {c.id, 'dlock:wake:', s,
      tostring(self.cfg.lease_ms), tostring(number), tostring(self.cfg.keep_ms)}, function() end)
  end
end

-- A permit of sem, waiting (cfg.wait) until c's clock passes deadline: as
-- acquire_waiting on every slot of c's order, each try asking the first
-- (its home, the only slot where a split vote is kept) before the others;
-- a wake-up from any of them ends the pause between tries. A split vote
-- kept at home is given back once a later try ended, or the wait did (a
-- permit got on another slot: src/local/rlsem.c, R3).
function W:permit_waiting(c, sem, deadline)
  local cfg = self.cfg
  local order = self:slot_order(c, sem)
  local home = order[1]
  local waiting = {}
  for _, s in ipairs(order) do waiting[s] = true end
  c.ticket, c.waiting, c.woken = self:ticket(c), waiting, nil
  local start = self.now
  local h, kept, cv, refused
  while true do
    -- (each try claims the name first: refused, the wait ends; not
    -- confirmed, the try asks no slot)
    cv, refused = self:claimed(c, sem)
    if refused then break end
    if not cv and kept then
      -- (a try that asks no slot keeps no split vote: the one kept goes
      -- back, as rlsem.c's R3)
      self:release_all(c, home, kept, '0')
      kept = nil
    end
    local before = kept
    if cv then h, kept = self:acquire(c, home) end
    for j = 2, (cv and not h) and #order or 0 do
      h = self:acquire(c, order[j], nil, nil, true)
      if h then break end
    end
    -- (the try before's kept vote, once this try ended: rlsem.c, R3)
    if before and before ~= kept then self:release_all(c, home, before, '0') end
    if h or cnow(self, c) >= deadline then break end
    self:renew_due(c)
    local p = c.pttl and c.pttl * 1000 or floor(cfg.L / 3)
    self:await(c, math.max(5000, math.min(p, floor(cfg.L / 3))) + self:rint(0, 2000))
  end
  c.waiting, c.wtok, c.woken = nil, nil, nil
  if kept then self:release_all(c, home, kept, '0') end
  -- (out of every queue but the granted slot's: src/local/rlsem.c leaves
  -- the slots its wait asked)
  for _, s in ipairs(order) do
    if not h or h.name ~= s then self:leave_all(c, s) end
  end
  local waited = self.now - start
  local ws = self.wstats
  ws.waits = ws.waits + 1
  ws.wait_max_us = math.max(ws.wait_max_us, waited)
  -- starve: as a lock's wait (acquire_waiting), a client ahead of it on
  -- its home slot holding up to 3 leases renewed, and the rest
  local bound = #self.clients * 5 * cfg.L
  if not next(cfg.faults) and not c.probe and waited > bound then
    self:violation('starve', string.format('%s waited %.3f ms for a permit of %s without faults '
      .. '(bound %.3f ms)', c.name, waited / 1000, sem, bound / 1000))
  end
  if h then h.sem, h.limit, h.valid = sem, c.limit, math.min(h.valid, cv) end
  return h
end

-- The permits c holds while it waits for another (as the renewal thread
-- renews them meanwhile): each renewed once less than two thirds of a
-- lease of its validity is left; one not confirmed past its validity is
-- lost.
-- The renewals claim the name again after them (src/global/
-- renew_redlock.c): a renewed permit's validity is at most the claim's,
-- and a claim not made confirms none (their validity stands).
function W:renew_due(c)
  local renewed, sem = {}, nil
  for _, h in ipairs(c.holds or {}) do
    if not h.lost and h.valid - cnow(self, c) < 2 * self.cfg.L / 3 then
      sem = sem or h.sem
      local old = h.valid
      if self:renew(c, h) then renewed[#renewed + 1] = {h = h, old = old} end
    end
  end
  -- (the round claims a name whose permits it renewed, whatever their
  -- renewals answered, as the C's claim_all)
  if sem then
    local cv = self:claim(c, sem)
    for _, x in ipairs(renewed) do x.h.valid = cv and math.min(x.h.valid, cv) or x.old end
  end
  for _, h in ipairs(c.holds or {}) do
    if not h.lost and cnow(self, c) >= h.valid then
      self:trace(string.format('%s lost %s', c.name, h.name))
      self.holds_lost = self.holds_lost + 1
      h.lost = true
    end
  end
end

-- A semaphore client: one or two permits of a name (as two threads of
-- one process; the second waited for a lease at most), held briefly, a
-- while or renewed for up to 3 leases, then given back.
function W:sem_main(c)
  local cfg = self.cfg
  while self.now < cfg.horizon_us do
    self:sleep(c, self.opts.hot and 0 or self:rint(0, floor(cfg.L / 2)))
    local sem = self.names[self:rint(1, #self.names)]
    local want = (cfg.limit > 1 and self:rand() < 0.3) and 2 or 1
    if c.locks then want = 1 end
    c.holds = {}
    for k = 1, want do
      local h
      -- (the second permit's wait is a lease at most: a client that holds
      -- one and waits for another for good may wait on others that do
      -- the same, a deadlock of the callers' making, not the rule's)
      if c.locks then
        -- (the name as a lock: refused while a claim of it lives on a
        -- majority, as a claim is while the lock's data lives)
        if cfg.wait then h = self:acquire_waiting(c, sem, cnow(self, c) + cfg.L)
        else h = self:acquire(c, sem) end
        if h then h.lock = true end
      elseif cfg.wait then
        h = self:permit_waiting(c, sem, k == 1 and cfg.horizon_us * c.rate or cnow(self, c) + cfg.L)
      else
        h = self:permit(c, sem)
      end
      if not h then break end
      self:hand_out(c, h)
      c.holds[#c.holds + 1] = h
    end
    if #c.holds > 0 then
      local r = self:rand()
      local until_t = self.now + (r >= 0.9 and self:rint(0, 3 * cfg.L) or self:rint(0, floor(cfg.L / 2)))
      while self.now < until_t do
        self:sleep(c, math.min(until_t - self.now, floor(cfg.L / 3)))
        self:maybe_pause(c, (c.locks and 'the lock ' or 'permits of ') .. sem)
        if self.now < until_t then self:renew_due(c) end
      end
      local holds = c.holds
      c.holds = nil
      for _, h in ipairs(holds) do
        self:trace(string.format('%s releases %s', c.name, h.name))
        self:release_all(c, h.name, h.att, '0')
      end
    else
      c.holds = nil
      self:sleep(c, self:rint(1000, floor(cfg.L / 4)))
    end
  end
end

------------------------------------------------------------------------
-- Faults.

function W:schedule_faults()
  local f, cfg = self.cfg.faults, self.cfg
  local h, L = cfg.horizon_us, cfg.L
  if f.net then
    -- cuts and slow links between a client and some nodes
    for _ = 1, self:rint(2, 12) do
      self:at(self:rint(0, h), function()
        local c = self.clients[self:rint(1, #self.clients)]
        local slow = self:rand() < 0.4
        local d = self:rint(1000, 2 * L)
        local which = {}
        for i = 1, cfg.n do
          if self:rand() < 0.4 then
            which[#which + 1] = i
            if slow then
              c.slow = c.slow or {}
              c.slow[i] = math.max(c.slow[i] or 0, self.now + d)
            else
              c.cut[i] = math.max(c.cut[i] or 0, self.now + d)
            end
          end
        end
        self:fault(slow and 'slow' or 'cut')
        self:trace(string.format('FAULT the links %s - nodes %s are %s for %.3f ms', c.name,
          table.concat(which, ','), slow and 'slow' or 'cut', d / 1000))
      end)
    end
  end
  if f.restart then
    for _ = 1, self:rint(1, 5) do
      self:at(self:rint(0, h), function() self:restart(self.nodes[self:rint(1, cfg.n)]) end)
    end
    for _, nd in ipairs(self.nodes) do self:at(self:rint(0, L), function() self:snapshot(nd) end) end
  end
  if f.clock then
    for _ = 1, self:rint(1, 8) do
      self:at(self:rint(0, h), function()
        local nd = self.nodes[self:rint(1, cfg.n)]
        local r = self:rand()
        if r < 0.5 then
          local x = r < 0.3 and self:rint(1, 2 * L) or r < 0.4 and self:rint(1, 60e6) or self:rint(1, 86400e6)
          nd.off = nd.off - x
          nd.last = floor(self.now * nd.rate + nd.off) - 1
          nd.back = nd.back + x
          self:fault('clock_back')
          self:trace(string.format('FAULT node %d clock steps back %.3f ms', nd.i, x / 1000))
        else
          if self.now - (nd.last_fwd or -math.huge) < 2 * L then return end
          nd.last_fwd = self.now
          local x = self:rint(1, floor(L * 0.003) + 1000)
          nd.off = nd.off + x
          self:fault('clock_forward')
          self:trace(string.format('FAULT node %d clock steps forward %.3f ms', nd.i, x / 1000))
        end
      end)
    end
  end
  if f.jump then
    self:at(self:rint(0, h), function()
      local nd = self.nodes[self:rint(1, cfg.n)]
      local x = self:rint(cfg.drift_us, 3 * L)
      nd.off = nd.off + x
      self.jumped = self.now
      self:fault('jump')
      self:trace(string.format('FAULT node %d clock jumps forward %.3f ms', nd.i, x / 1000))
    end)
  end
  if f.crash and self:rand() < 0.7 then
    self:at(self:rint(0, h), function()
      local c = self.clients[self:rint(1, #self.clients)]
      if c.dead then return end
      c.dead, c.hold = true, nil
      self:fault('crash')
      self:trace('FAULT ' .. c.name .. ' crashes')
    end)
  end
end

-- What a restart from a recent snapshot finds: the data now and then.
function W:snapshot(nd)
  if self.now > self.cfg.horizon_us then return end
  if not nd.down then
    nd.snap = R.copy_db(nd.srv.db)
    nd.snap_t = self.now
  end
  self:at(self.now + self:rint(1000, self.cfg.L), function() self:snapshot(nd) end)
end

-- kind ('empty', 'snapshot', 'kept') and d (us down): drawn unless given.
function W:restart(nd, kind, d)
  -- (one node at a time without its seed: else no majority of seeded
  -- nodes may be left to seed the others, docs/design.md "Redlock"; with
  -- unseeded_max, up to that many, and a node restarts again before it
  -- is seeded)
  local unseeded = 0
  for _, o in ipairs(self.nodes) do
    local s = R.live(o.srv, 'dlock:redlock:seed')
    if o ~= nd and (o.down or not (s and s.v == o.run)) then unseeded = unseeded + 1 end
    if not self.unseeded_max and (o.down or not (s and s.v == o.run)) then return end
  end
  if nd.down or unseeded >= (self.unseeded_max or 1) then return end
  kind = kind or (self:rand() < 0.4 and 'empty' or self:rand() < 0.5 and 'snapshot' or 'kept')
  d = d or (self:rand() < 0.5 and self:rint(100, 20000) or self:rint(1000, 2 * self.cfg.L))
  nd.down = true
  self:fault('restart_' .. kind)
  self:trace(string.format('FAULT node %d restarts (%s), down %.3f ms', nd.i, kind, d / 1000))
  local db = kind == 'kept' and nd.srv.db or kind == 'snapshot' and R.copy_db(nd.snap) or {}
  self:at(self.now + d, function()
    nd.down = false
    nd.k = nd.k + 1
    nd.run = 'run' .. nd.i .. '.' .. nd.k
    nd.srv = R.new()
    nd.srv.db = db
    nd.start = self.now
    nd.start_wall = floor(self.now * nd.rate + nd.off)
    self:trace(string.format('node %d is up again (%s)', nd.i, nd.run))
  end)
end

------------------------------------------------------------------------
-- The invariants checked after every event (order and fence: as tokens
-- are handed out and written).

-- Wait queues (cfg.wait, sim --redlock --wait; docs/design.md "Redlock",
-- "Waiting"): what each node's queue held before a script, and whom its
-- grant passed over. A grant to client B at node k passes over every live
-- waiter queued ahead of B there (B not queued: every live waiter); an
-- acquire that finds B's own grant standing inherits what that grant
-- passed over. The fifo invariant (hand_out) reads it at B's hand-out.
function W:queue_before(nd, keys, now_us)
  local z = R.live(nd.srv, keys[3])
  local lv = R.live(nd.srv, keys[4])
  local g = R.live(nd.srv, keys[1])
  local now_ms = floor(now_us / 1000)
  local live, score, sh = {}, {}, {} -- (copies: the script changes the objects)
  if z then
    for id, sc in pairs(z.v) do
      score[id] = sc
      local d = lv and lv.v[id] and tonumber(string.match(lv.v[id], '^%d+'))
      if d and d > now_ms then live[id] = sc end
      -- (a shared waiter: its liveness value's third field is 's')
      if lv and lv.v[id] and string.match(lv.v[id], '^%d+ %d+ s ') then sh[id] = true end
    end
  end
  local owner = g and g.v.o
  local exp = g and g.v.g and tonumber(string.match(g.v.g, '^%d+ %d+ %d+ (%d+)'))
  -- (shared mode: the clients whose shared lease lives, s:<id> "token
  -- attempt dur end exp")
  local sown = {}
  if g and self.rs4 then
    for f, v in pairs(g.v) do
      local id, sx = string.match(f, '^s:(.*)$'), tonumber(string.match(v, '^%d+ %d+ %d+ %d+ (%d+)$') or '')
      if id and sx and sx >= now_ms then sown[id] = true end
    end
  end
  -- (the turn, field t "<id> <until>": passed to the first live waiter
  -- when a leave frees the name, first there until then)
  local tid, tu = string.match(g and g.v.t or '', '^(%x+) (%d+)$')
  return {live = live, score = score, owner = exp and exp >= now_ms and owner, sh = sh, sown = sown,
    turn = tid and tonumber(tu) >= now_ms and tid, turn_raw = g and g.v.t}
end

-- (shared: a shared grant, which live shared waiters ahead do not refuse)
function W:passed_over(q, id, shared)
  local out, mine = {}, q.score[id]
  -- (a node whose clock is behind a time it read before, after a step
  -- back, counts grants past their time again, and turns: its order is
  -- excused until its clock is past that time, docs/design.md "Waiting")
  if q.behind then return out end
  for w, sc in pairs(q.live) do
    if w ~= id and (not mine or sc < mine or (sc == mine and w < id)) and not (shared and q.sh[w]) then
      out[#out + 1] = w
    end
  end
  return out
end

function W:queue_after(nd, c, script, keys, q, rep)
  local by = self.by_id
  -- (records per node and name: c.over[<node> <lease key>])
  local at = nd.i .. ' ' .. keys[1]
  if script == 'acquire' and type(rep) == 'table' and rep[1] == 1 then
    if q.turn == c.id then
      -- its turn: what it passed over was recorded when the turn was
      -- given (below); whoever queued since is behind it, even with an
      -- earlier score after a step back of the node's clock
      c.over[at] = c.over[at] or {run = nd.run, ids = {}}
    elseif q.owner ~= c.id or q.score[c.id] then
      c.over[at] = {run = nd.run, ids = self:passed_over(q, c.id)}
    end
  elseif script == 'acquire_shared' and type(rep) == 'table' and rep[1] == 1 then
    -- (its own live shared lease there is kept whoever queued since)
    if not q.sown[c.id] or q.score[c.id] then
      c.over[at] = {run = nd.run, ids = self:passed_over(q, c.id, true)}
    end
  elseif (script == 'release' or script == 'release_shared') and rep == 2 then
    -- (a direct grant to an exclusive waiter; or to a run of shared
    -- waiters, each one of them a shared waiter live before, now out of
    -- the queue with a shared lease: it passed over the live exclusive
    -- waiters ahead of it)
    local g = R.live(nd.srv, keys[1])
    local w = g and g.v.g and g.v.g ~= '' and by[g.v.o]
    if w then w.over[at] = {run = nd.run, ids = self:passed_over(q, w.id)} end
    if g and self.rs4 then
      local z = R.live(nd.srv, keys[3])
      for id in pairs(q.sh) do
        local sw = by[id]
        if sw and q.live[id] and g.v['s:' .. id] and not (z and z.v[id]) then
          sw.over[at] = {run = nd.run, ids = self:passed_over(q, id, true)}
        end
      end
    end
  end
  -- A turn given by this script (field t naming another waiter than
  -- before: a leave's, a release's or an acquire's that found the name
  -- free): its waiter passes over the live waiters queued ahead of it,
  -- but for this script's caller (leaving, releasing or refused).
  local g = R.live(nd.srv, keys[1])
  local t = g and g.v.t
  local tid = t and string.match(t, '^(%x+) ')
  if tid and t ~= q.turn_raw and by[tid] then
    local ids = {}
    for _, id in ipairs(self:passed_over(q, tid)) do
      if id ~= c.id then ids[#ids + 1] = id end
    end
    by[tid].over[at] = {run = nd.run, ids = ids}
  end
end

-- A message a script published: a direct grant's on the channel of its
-- waiter, who takes it as a wake-up if it is waiting for that name (the
-- message comes over the link node - client, lost as a reply is).
function W:wake(nd, chan, msg)
  local c = self.by_id[string.sub(chan, #'dlock:wake:' + 1)]
  if not c or c.dead then return end
  local lossy = self.cfg.faults.net and not (self.calm or c.probe)
  if not self:link_up(c, nd.i) or (lossy and self:rand() < 0.08) then return end
  self:at(self.now + self:delay(c, nd.i), function()
    local name = string.match(msg, '(%S+)$')
    local w = c.waiting
    if w ~= name and not (type(w) == 'table' and w[name]) then return end
    self.wstats.wakeups = self.wstats.wakeups + 1
    self:trace(string.format('%s woken for %s by node %d (%s)', c.name, name, nd.i, msg))
    if c.wtok then
      local tok = c.wtok
      c.wtok = nil
      tok.woken = true
      self:resume(c)
    else
      c.woken = true -- (during a try: the next wait ends at once)
    end
  end, c)
end

-- Blocks c until a wake-up or us (by its clock) have passed: true if woken.
function W:await(c, us)
  if c.woken then
    c.woken = nil
    return true
  end
  local tok = {}
  c.wtok = tok
  self:at(self:real_at(c, cnow(self, c) + us), function()
    if c.wtok == tok then
      c.wtok = nil
      self.wstats.polls = self.wstats.polls + 1
      self:resume(c)
    end
  end, c)
  coroutine.yield()
  return tok.woken == true
end

-- Are hand-out order and mutual exclusion excused (a jump broke the lease
-- assumption)? From the jump on; with jump_window, only until 3 leases +
-- 2 drifts after it: a lease the jump shortened was granted before it and
-- its validity ends within a lease, and an acquire overlapping that one
-- hands out within a lease of its first send.
function W:excused()
  if not self.jumped then return false end
  return not self.jump_window or self.now < self.jumped + 3 * self.cfg.L + 2 * self.cfg.drift_us
end

function W:check()
  if self:excused() then return end
  if self.opts.rsem then return self:check_sem() end
  for _, name in ipairs(self.names) do
    local who
    for _, c in ipairs(self.clients) do
      local h = c.hold
      if h and h.name == name and not c.dead and cnow(self, c) < h.valid then
        -- (shared mode: shared leases side by side are no violation)
        if who and not (who.shared and h.shared) then
          self:violation('mutex', string.format('%s and %s both hold %s (tokens %.0f%s, %.0f%s)', who.c,
            c.name, name, who.token, who.shared and ' shared' or '', h.token, h.shared and ' shared' or ''))
        end
        if not who or who.shared then who = h end
      end
    end
  end
end

-- Semaphores: limit, and mutex per slot; and a name used one way at a
-- time (its claim): never a lock beside permits, nor permits of two
-- limits ('kind').
function W:check_sem()
  for _, sem in ipairs(self.names) do
    local n, by, L, lock = 0, {}, nil, nil
    for _, c in ipairs(self.clients) do
      for _, h in ipairs(c.holds or {}) do
        if not c.dead and cnow(self, c) < h.valid then
          if h.lock and h.name == sem then lock = c.name end
          if h.sem == sem then
            n = n + 1
            if by[h.name] then
              self:violation('mutex', string.format('%s and %s both hold slot %s (tokens %.0f, %.0f)',
                by[h.name].c, c.name, h.name, by[h.name].token, h.token))
            end
            by[h.name] = h
            if L and L ~= h.limit then
              self:violation('kind', string.format('permits of %s held with limits %d and %d at once',
                sem, L, h.limit))
            end
            L = math.min(L or h.limit, h.limit)
          end
        end
      end
    end
    if lock and n > 0 then
      self:violation('kind', string.format('%s holds %s as a lock beside %d permits of it', lock,
        sem, n))
    end
    if L and n > L then
      self:violation('limit', string.format('%d permits of %s held at once, above its limit %d', n, sem, L))
    end
  end
end

------------------------------------------------------------------------

function W:run()
  self:schedule_faults()
  local h = self.events
  local probed = false
  while #self.violations == 0 do
    if not h[1] then
      if probed then break end
      probed = true
      -- The faults are over: every cut heals (they last 2 leases at most),
      -- every node is up; a fresh client comes once the leases, the steps
      -- back of the clocks and the restarts' wait have run out.
      local back = 0
      for _, nd in ipairs(self.nodes) do back = math.max(back, nd.back) end
      self.calm = true
      -- (and, where c1 used the semaphores' names as locks, their locks'
      -- data, which a claim must wait out: on each node until its clock
      -- passes the record lifetime and every token's time, lua/p2/
      -- acquire.lua)
      local data = 0
      for _, nd in ipairs(self.cfg.other == 'lock' and self.nodes or {}) do
        local now_ms = floor((self.now * nd.rate + nd.off) / 1000)
        for _, nm in ipairs(self.names) do
          local o = nd.srv and nd.srv.db['dlock:{' .. nm .. '}']
          if o and o.exp and o.exp > now_ms then
            data = math.max(data, ceil((o.exp - now_ms) * 1000 / nd.rate))
          end
        end
      end
      self.now = self.now + 4 * self.cfg.L + 2 * self.cfg.drift_us + back + data
      self:add_client(#self.clients + 1, true)
    else
      local ev = heap_pop(h)
      self.now = ev.t
      if not (ev.c and ev.c.dead) then
        ev.fn()
        self:check()
      end
    end
  end
  -- fairness: Jain's index of the clients' acquisitions in a schedule of
  -- one name without faults whose clients all lived
  -- (and how many of them got no token)
  if #self.names == 1 and not next(self.cfg.faults) then
    local s, s2, n = 0, 0, 0
    self.starved = 0
    for _, c in ipairs(self.clients) do
      if not c.probe then s, s2, n = s + c.got, s2 + c.got * c.got, n + 1 end
      if not c.probe and c.got == 0 then self.starved = self.starved + 1 end
    end
    if s2 > 0 then self.jain = s * s / (n * s2) end
  end
  return self
end

return W
