#!/usr/bin/env lua5.1
-- sim: dlock's protocol simulator (run it as sim/sim, which picks the Lua:
-- LuaJIT's interpreter if installed, else lua5.1). Runs the real lua/*.lua against a model
-- of Redis, with clients that follow dlock's protocol, under seeded hostile
-- schedules; checks the invariants after every event (sim/world.lua).
--   sim [--seconds S | --schedules N] [--seed N] [--clients C] [--names K]
--       [--faults LIST] [--steps N] [--local-rule passes|clock]
--       [--step-back-ms MS | --step-back-leases F] [--mutant NAME]
--       [--replay SEED] [--coverage] [--quiet] [--protocol 1|2|mixed]
--       [--p2-share F] [--shared F|mix] [--no-revival-excuse]
--   sim --sem [--seconds S | --schedules N] [--seed N] [--faults LIST]
--       [--mutant NAME] [--replay SEED] [--quiet]
--   sim --redlock [--nodes 3|5] [--wait] [--hot] [--shared F|mix | --sem] [--seconds S | --schedules N]
--       [--seed N] [--faults LIST] [--mutant NAME] [--replay SEED] [--quiet]
-- Prints progress on stderr and, last on stdout, one JSON line. On a
-- violation: exits 1 after printing the schedule's seed and its trace (the
-- same seed replays it exactly: sim --replay SEED with the same options).
-- --coverage: also prints how often each branch of each script ran (lines
-- "coverage: ...", sim/coverage.lua), and each script's count in the JSON.
-- --protocol 2: runs lua/p2/*.lua (protocol 2's layout: lua/p2/LAYOUT.txt)
-- instead of lua/*.lua, with the same invariants (1, the default, is
-- protocol 1's scripts). A mutant of the scripts runs with the protocol it
-- names (sim/mutants.lua); the client model's run with either. --coverage
-- counts the scripts of the protocols run (sim/coverage.lua).
-- --protocol mixed: both scripts, lua/ and lua/p2/, and each client a
-- setting of its own, 1 or 2 (sim/protocols.lua: drawn per schedule, and
-- changed by clients that restart or roll), under the client's rule for two
-- protocols (sim/client.lua); a mutant of either protocol's scripts runs in
-- it too. --p2-share F (with mixed): every client speaks 2 with probability
-- F, no rolls (0: protocol 1's schedules, 1: protocol 2's, event for event).
-- --shared F (with --protocol 2): the shared worlds. Each acquire of a
-- client's thread is shared (lua/p2/acquire_shared.lua, release_shared.lua)
-- with probability F, else exclusive, drawn from a stream of its own (so
-- --shared 0 runs protocol 2's schedules event for event); --shared mix:
-- each client draws its own F, from 0, 0.5, 0.9 and 1 (writers, readers and
-- both side by side). The invariants of the shared mode are checked too
-- (sim/world.lua, shared, sorder, writer). --no-revival-excuse: a holder
-- whose grant Redis holds live at the check is never excused as revoked
-- (the default excuses one that a later grant superseded before a fault
-- brought it back).
-- --sem (or --protocol sem): the semaphore world instead (sim/sem.lua:
-- lua/p2/sem_*.lua driven by a model of the C client's local tier, its
-- own faults and invariants; a mutant with run = 'sem' runs there).
-- --redlock (or --protocol redlock): the Redlock world (sim/redlock.lua: a
-- lock over --nodes independent masters, 3 unless told, each running
-- lua/p2/acquire.lua, release.lua and mark.lua; the quorum client's token
-- rule, docs/design.md "Redlock"; a mutant with run = 'redlock' runs there).
-- --wait (with --redlock): its clients wait in every node's queue, woken by
-- direct grants' messages, with the split-vote rule and the fifo and
-- starve invariants (docs/design.md "Redlock", "Waiting"); a mutant with
-- wait = true runs so. Its JSON adds the waits' counts and, over the
-- schedules of one name without faults, the mean Jain index of the
-- clients' acquisitions (either way) and how many clients got no token.
-- --hot (with --redlock): a client acquires again at once after a hold,
-- not after a pause of up to half a lease (a busy process's threads).
-- --shared F|mix (with --redlock): shared mode over the nodes, each
-- acquire shared with probability F (mix: each client its own, as
-- without --redlock), drawn from a stream of its own (--shared 0 runs the
-- schedules without it event for event): acquire_shared.lua and
-- release_shared.lua on every node, the same quorum and token rule, and
-- the invariants with shared leases side by side (sim/redlock.lua).
-- --sem (with --redlock): counting semaphores over the nodes, each permit
-- one of `limit` slots, each slot an exclusive quorum lock of its own; the
-- limit invariant (sim/redlock.lua, "Semaphores").
local dir = arg[0]:match('^(.*)/[^/]*$') or '.'
package.path = dir .. '/?.lua;' .. package.path
local root = dir .. '/..'
-- (--sem, or --protocol sem as sim/test-mutants passes a mutant's run: the
-- semaphore world, sim/sem.lua, in place of sim/world.lua)
local sem_world, redlock_world = false, false
for k = 1, #arg do
  if arg[k] == '--sem' or (arg[k] == '--protocol' and arg[k + 1] == 'sem') then sem_world = true end
  if arg[k] == '--redlock' or (arg[k] == '--protocol' and arg[k + 1] == 'redlock') then
    redlock_world = true
  end
end
-- (--redlock --sem: the Redlock world's semaphores, opts.rsem)
local W = require(redlock_world and 'redlock' or sem_world and 'sem' or 'world')


local function usage(msg)
  io.stderr:write('sim: ' .. msg .. '\n(see the head of sim/main.lua for the options)\n')
  os.exit(2)
end

local opts = {seconds = nil, schedules = nil, seed = nil}
local i = 1
while i <= #arg do
  local a, v = arg[i], arg[i + 1]
  local function num()
    local n = tonumber(v)
    if not n then usage(a .. ' takes a number') end
    i = i + 1
    return n
  end
  if a == '--seconds' then opts.seconds = num()
  elseif a == '--schedules' then opts.schedules = num()
  elseif a == '--seed' then opts.seed = num()
  elseif a == '--clients' then opts.clients = num()
  elseif a == '--names' then opts.names = num()
  elseif a == '--steps' then opts.steps = num()
  elseif a == '--step-back-ms' then opts.step_back_ms = num()
  elseif a == '--step-back-leases' then opts.step_back_leases = num()
  elseif a == '--replay' then opts.replay = num()
  elseif a == '--sem' then opts.sem = true
  elseif a == '--protocol' and v == 'sem' then
    opts.sem = true
    i = i + 1
  elseif a == '--redlock' then opts.redlock = true
  elseif a == '--protocol' and v == 'redlock' then
    opts.redlock = true
    i = i + 1
  elseif a == '--wait' then opts.wait = true
  elseif a == '--hot' then opts.hot = true
  elseif a == '--nodes' then
    opts.nodes = num()
    if opts.nodes ~= 3 and opts.nodes ~= 5 then usage('--nodes is 3 or 5') end
  elseif a == '--protocol' then
    if v ~= '1' and v ~= '2' and v ~= 'mixed' then usage('--protocol is 1, 2, mixed or sem') end
    opts.protocol = tonumber(v) or v
    i = i + 1
  elseif a == '--p2-share' then opts.p2_share = num()
  elseif a == '--shared' then
    if v == 'mix' then opts.shared = 'mix' i = i + 1 else opts.shared = num() end
  elseif a == '--no-revival-excuse' then opts.no_revival_excuse = true
  elseif a == '--local-rule' then
    if v ~= 'passes' and v ~= 'clock' then usage('--local-rule is passes or clock') end
    opts.local_rule = v
    i = i + 1
  elseif a == '--faults' then
    if not v then usage('--faults takes a list') end
    opts.faults = {}
    if v ~= 'none' then
      local known = {}
      for _, f in ipairs(W.ALL_FAULTS) do known[f] = true end
      for f in v:gmatch('[^,]+') do
        if not known[f] then usage('unknown fault ' .. f .. ' (' .. table.concat(W.ALL_FAULTS, ',') .. ')') end
        opts.faults[#opts.faults + 1] = f
      end
    end
    i = i + 1
  elseif a == '--mutant' then
    if not v then usage('--mutant takes a name') end
    opts.mutant = v
    i = i + 1
  elseif a == '--quiet' then opts.quiet = true
  elseif a == '--coverage' then opts.coverage = true
  else usage('unknown option ' .. a) end
  i = i + 1
end

if opts.redlock and opts.sem then
  -- semaphores over the nodes (sim/redlock.lua, opts.rsem)
  if opts.shared ~= nil then usage('--redlock --sem takes no --shared') end
  opts.sem, opts.rsem = nil, true
end
if opts.p2_share and opts.protocol ~= 'mixed' then usage('--p2-share goes with --protocol mixed') end
local mutate
if opts.mutant then
  local mutants = require('mutants')
  local m = mutants.find(opts.mutant)
  if not m then usage('unknown mutant ' .. opts.mutant) end
  -- (a mutant of the shared mode runs in the shared worlds it names)
  if m.shared and opts.shared == nil then opts.shared = m.shared end
  if (m.run == 'redlock') ~= (opts.redlock == true) then
    usage('mutant ' .. m.name .. (m.run == 'redlock' and ' is of the Redlock world: run it with --redlock'
      or ' is not of the Redlock world: run it without --redlock'))
  end
  if m.run == 'redlock' then
    if m.wait then opts.wait = true end -- (a mutant of the wait queues runs with them)
    if m.hot then opts.hot = true end -- (and of a busy name, --hot)
    if m.rsem then opts.rsem = true end -- (and of its semaphores, --sem)
    if m.file == 'redlock_model' then
      W = mutants.load_world(m, dir, 'redlock') -- the quorum client's model
    else
      mutate = function(texts) mutants.apply(m, texts) end
    end
  else
    if (m.run == 'sem') ~= (opts.sem == true) then
      usage('mutant ' .. m.name .. (m.run == 'sem' and ' is of the semaphore world: run it with --sem'
        or ' is not of the semaphore world: run it without --sem'))
    end
    if m.run == 'sem' then
      if m.file == 'sem_model' then
        W = mutants.load_sem(m, dir) -- the semaphore world's client model
      else
        mutate = function(texts) mutants.apply(m, texts) end
      end
    elseif m.file == 'client' then
      mutants.apply_client(m, dir) -- the client model
    elseif opts.protocol == 'mixed' then
      -- (its protocol's scripts, beside the other's unchanged)
      mutate = function(texts, p) if p == (m.protocol or 1) then mutants.apply(m, texts) end end
    elseif (m.protocol or 1) ~= (opts.protocol or 1) then
      usage('mutant ' .. m.name .. ' changes protocol ' .. (m.protocol or 1) .. '\'s scripts: run it with --protocol '
        .. (m.protocol or 1))
    else
      mutate = function(texts) mutants.apply(m, texts) end
    end
  end
end
if opts.sem and (opts.protocol or opts.shared ~= nil or opts.coverage or opts.clients or opts.names
    or opts.steps or opts.local_rule or opts.step_back_ms or opts.step_back_leases) then
  usage('--sem takes none of --protocol 1|2|mixed, --shared, --coverage, --clients, --names, '
    .. '--steps, --local-rule, --step-back-*')
end
if opts.redlock and (opts.sem or opts.protocol or opts.coverage or opts.clients
    or opts.names or opts.steps or opts.local_rule or opts.step_back_ms or opts.step_back_leases) then
  usage('--redlock takes none of --sem, --protocol 1|2|mixed, --coverage, --clients, '
    .. '--names, --steps, --local-rule, --step-back-*')
end
if opts.nodes and not opts.redlock then usage('--nodes goes with --redlock') end
if opts.wait and not opts.redlock then usage('--wait goes with --redlock') end
if opts.hot and not opts.redlock then usage('--hot goes with --redlock') end
if opts.shared ~= nil and opts.protocol ~= 2 and not opts.redlock then
  usage('--shared goes with --protocol 2 or --redlock')
end
if type(opts.shared) == 'number' and (opts.shared < 0 or opts.shared > 1) then
  usage('--shared is a fraction from 0 to 1, or mix')
end
local scripts = W.load_scripts(root, mutate, opts.protocol)

local function clock() return os.time() end
local t0 = os.clock()

local function run_one(seed, trace)
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.trace = trace
  local w = W.new(seed, o, scripts)
  return w:run()
end

local function report(w)
  io.stdout:write(string.format('violation in schedule %d: %s: %s\n', w.seed, w.violations[1].kind,
    w.violations[1].msg))
  local t = run_one(w.seed, true)
  local lines = t.tr
  local from = math.max(1, #lines - 600)
  if from > 1 then io.stdout:write(string.format('... (%d earlier trace lines)\n', from - 1)) end
  for j = from, #lines do io.stdout:write(lines[j], '\n') end
  io.stdout:write(string.format('replay: sim --replay %d%s%s%s', w.seed, opts.sem and ' --sem' or
    opts.redlock and ' --redlock' .. (opts.rsem and ' --sem' or '') .. (opts.nodes and ' --nodes ' .. opts.nodes or '')
      .. (opts.wait and ' --wait' or '') .. (opts.hot and ' --hot' or '') or '',
    opts.protocol and opts.protocol ~= 1 and ' --protocol ' .. opts.protocol or '',
    opts.shared ~= nil and ' --shared ' .. tostring(opts.shared) or ''))
  for _, a in ipairs(arg) do
    if a == '--replay' then break end
  end
  io.stdout:write('  (with the same --faults/--clients/--names/--mutant/--local-rule options)\n')
end

local sacq = 0 -- the shared worlds: acquisitions of shared leases
local rnw, rlost, rgr = 0, 0, 0 -- the Redlock world: renewals confirmed, holds lost, re-grants
local fhit, fmiss = 0, 0 -- and its exclusive grants confirmed by the floor, or written back
local wst, jain, jn, starved = {}, 0, 0, 0 -- with --wait: its counts; Jain's index summed,
-- schedules, clients without a token

local function add_wait(w)
  for k, v in pairs(w.wstats or {}) do
    wst[k] = k == 'wait_max_us' and math.max(wst[k] or 0, v) or (wst[k] or 0) + v
  end
  if w.jain then jain, jn, starved = jain + w.jain, jn + 1, starved + w.starved end
end

local function wait_json()
  local js = jn > 0 and string.format(',"jain_calm_one_name":%.3f,"calm_one_name_schedules":%d,'
    .. '"clients_without_token":%d', jain / jn, jn, starved) or ''
  if not opts.wait then return js end
  return string.format(',"wait":{"waits":%d,"wakeups":%d,"polls":%d,"splits":%d,"kept":%d,'
    .. '"longest_wait_ms":%.0f}', wst.waits or 0, wst.wakeups or 0, wst.polls or 0, wst.splits or 0,
    wst.kept or 0, (wst.wait_max_us or 0) / 1000) .. js
end

-- (the JSON's "protocol", for any but 1)
local function protocol_json()
  if opts.sem then return ',"world":"sem"' end
  if opts.redlock then
    return string.format(',"world":"redlock","nodes":%d,"renewals":%d,"holds_lost":%d,"regrants":%d,'
      .. '"floor_grants":%d,"written_back":%d', opts.nodes or 3, rnw, rlost, rgr, fhit, fmiss) .. (opts.rsem and ',"sem":true' or '') .. (opts.shared ~= nil and string.format(
      ',"shared":%s,"shared_acquisitions":%d', opts.shared == 'mix' and '"mix"' or tostring(opts.shared),
      sacq) or '') .. wait_json()
  end
  if opts.protocol == 2 and opts.shared ~= nil then
    return ',"protocol":2,"shared":' .. (opts.shared == 'mix' and '"mix"' or tostring(opts.shared))
      .. string.format(',"shared_acquisitions":%d', sacq)
  end
  if opts.protocol == 2 then return ',"protocol":2' end
  if opts.protocol == 'mixed' then return ',"protocol":"mixed"' end
  return ''
end

if opts.replay then
  local w = run_one(opts.replay, true)
  sacq = w.shared_acquisitions or 0
  rnw, rlost, rgr = w.renewals or 0, w.holds_lost or 0, w.regrants or 0
  fhit, fmiss = w.floor_stats and w.floor_stats.hits or 0, w.floor_stats and w.floor_stats.misses or 0
  add_wait(w)
  for _, l in ipairs(w.tr) do io.stdout:write(l, '\n') end
  local v = #w.violations
  io.stdout:write(string.format('{"schedules":1,"steps":%d,"violations":%d,"seed":%d%s}\n', w.steps, v,
    opts.replay, protocol_json()))
  os.exit(v > 0 and 1 or 0)
end

local seed = opts.seed or (os.time() % 1000000) * 1000 + math.floor((os.clock() * 1e6) % 1000)
local limit_s = opts.seconds or (opts.schedules and math.huge or 10)
local max_sched = opts.schedules or math.huge
local n, steps, acq, viol = 0, 0, 0, 0
local cov = opts.coverage and require('coverage')
if cov then cov.start() end
local faults = {}
local last_progress = os.clock()
local failed
while n < max_sched and os.clock() - t0 < limit_s do
  -- schedule n of seed: far from the schedules of the next seeds
  local w = run_one((seed * 1000003 + n) % 2147483647, false)
  n = n + 1
  steps = steps + w.steps
  acq = acq + (w.acquisitions or 0)
  sacq = sacq + (w.shared_acquisitions or 0)
  rnw, rlost, rgr = rnw + (w.renewals or 0), rlost + (w.holds_lost or 0), rgr + (w.regrants or 0)
  if w.floor_stats then fhit, fmiss = fhit + w.floor_stats.hits, fmiss + w.floor_stats.misses end
  add_wait(w)
  for k, v in pairs(w.faults) do faults[k] = (faults[k] or 0) + v end
  if #w.violations > 0 then
    viol = viol + 1
    failed = w
    break
  end
  if not opts.quiet and os.clock() - last_progress >= 5 then
    last_progress = os.clock()
    io.stderr:write(string.format('sim: %d schedules, %d steps, %.0f s\n', n, steps, os.clock() - t0))
  end
end
local secs = os.clock() - t0
local covered = ''
if cov then
  cov.stop()
  local parts = {}
  for name, c in pairs(cov.report(root, io.stdout, opts.protocol)) do
    parts[#parts + 1] = string.format('"%s":[%d,%d]', name, c.run, c.total)
  end
  table.sort(parts)
  covered = ',"coverage":{' .. table.concat(parts, ',') .. '}'
end
if failed then report(failed) end
local fk = {}
for k in pairs(faults) do fk[#fk + 1] = k end
table.sort(fk)
local fparts = {}
for _, k in ipairs(fk) do fparts[#fparts + 1] = string.format('"%s":%d', k, faults[k]) end
io.stdout:write(string.format('{"schedules":%d,"steps":%d,"acquisitions":%d,"violations":%d,"seed":%d,'
  .. '"cpu_seconds":%.1f,"schedules_per_second":%.0f,"lua":"%s","faults":{%s}%s%s}\n',
  n, steps, acq, viol, seed, secs, n / math.max(secs, 1e-6),
  jit and (jit.version .. (jit.status() and '' or ', interpreter')) or _VERSION, table.concat(fparts, ','),
  (opts.mutant and string.format(',"mutant":"%s"', opts.mutant) or '') .. protocol_json(),
  covered .. (failed and string.format(',"failed_seed":%d,"kind":"%s"', failed.seed,
    failed.violations[1].kind) or '')))
os.exit(failed and 1 or 0)
