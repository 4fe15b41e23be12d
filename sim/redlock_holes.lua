-- Schedules of the Redlock world (sim/redlock.lua) that step outside what
-- its random schedules draw, to test the claims of docs/design.md
-- "Redlock" at their edges. Unlike sim/redlock_scenarios.lua these are
-- expected to end in a violation (named by kind) where the stated rule
-- has a hole, and without one in the same schedule brought back within
-- the assumption it steps out of (its control): sim/test-redlock-holes.
local H = {}

local function setup(w, lease_ms)
  local cfg = w.cfg
  cfg.lease_ms, cfg.L = lease_ms, lease_ms * 1000
  cfg.drift_us = lease_ms * 10 + 2000
  cfg.keep_ms = 4 * lease_ms
  cfg.timeout_us = 50000
  for _, nd in ipairs(w.nodes) do
    nd.off, nd.rate = 1700000000e6, 1
    nd.start_wall = nd.off - 3600e6
  end
  w.clients, w.events = {}, {}
end

H.list = {
  {
    -- "Sequential order, whatever the clocks do" rests on the client's
    -- clock too: the seeding's wait (a lease + drift of uptime) is long
    -- enough only if a hand-out comes within a lease + drift, in real
    -- time, of its acquire's first send. A's clock runs at a tenth of real
    -- time (or steps back; the effect is the same) and its command timeout
    -- is 100 ms by that clock. Node 1, its clock a minute ahead, gives
    -- A's highest vote; it acks A's write-back and restarts
    -- empty; A's write-back to node 2 is late (700 ms), to node 3 lost.
    -- B, a lease + drift after node 1 came back, seeds node 1 from nodes
    -- 2 and 3, which do not hold T_A yet. Node 2 then acks A, whose clock
    -- says its validity is not over: A hands T_A out. C, begun after
    -- that and cut from node 2, is voted by nodes 1 and 3 and confirmed
    -- below T_A.
    name = 'client_clock_slow',
    kind = 'order',
    run = function(w, control)
      setup(w, 500)
      w.nodes[1].off = w.nodes[1].off + 60e6
      w.net_hook = function(c, i, script, leg)
        if c.name == 'A' and script == 'mark' and leg == 'request' then
          if i == 2 then return 700000 end
          if i == 3 then return 'lose' end
        end
        if c.name == 'C' and i == 2 then return 'lose' end
        return 200
      end
      local A = w:add_client(1, false, function(w, c)
        local h = w:acquire(c, 'r1')
        if h then
          w:hand_out(c, h)
          w:release_all(c, 'r1', h.att, '0')
        end
      end)
      A.name, A.rate, A.timeout_us = 'A', control and 1 or 0.1, 100000
      w:at(1000, function()
        w:restart(w.nodes[1], 'empty', 10000)
        w.nodes[1].off, w.nodes[1].last = w.nodes[1].off - 60e6, 0 -- (its clock set right)
      end)
      local B = w:add_client(2, false, function(w, c)
        w:sleep(c, 540000)
        local h = w:acquire(c, 'r1')
        if h then
          w:hand_out(c, h)
          w:release_all(c, 'r1', h.att, '0')
        end
      end)
      B.name = 'B'
      local C = w:add_client(3, false, function(w, c)
        w:sleep(c, 1100000)
        local h = w:acquire(c, 'r1')
        if h then w:hand_out(c, h) end
      end)
      C.name = 'C'
    end,
  },
  {
    -- The Redlock section says a forward jump of a node's clock beyond the
    -- allowance breaks mutual exclusion only, sequential order holding;
    -- so it does in the world, whose uptime is a monotonic clock. Redis's
    -- uptime_in_seconds is its wall clock now less its wall clock at start
    -- (server.unixtime - server.stat_starttime), so a jump moves it too
    -- (wall_uptime). Node 1, its clock a minute ahead, gives A's highest
    -- vote, acks A's write-back and restarts empty, its clock set right;
    -- 1 ms after it is up, its clock steps forward 600 ms: its uptime
    -- reads a lease + drift at once. B (refused: A's lease) seeds node 1
    -- from nodes 2 and 3 before A's write-back, late by 30 ms, reaches
    -- node 2. A hands T_A out; C, begun after that and cut from node 2, is
    -- voted by nodes 1 and 3 and confirmed below T_A.
    name = 'uptime_by_wall_clock',
    kind = 'order',
    run = function(w, control)
      setup(w, 500)
      w.wall_uptime = not control
      w.nodes[1].off = w.nodes[1].off + 60e6
      w.net_hook = function(c, i, script, leg)
        if c.name == 'A' and script == 'mark' and leg == 'request' then
          if i == 2 then return 30000 end
          if i == 3 then return 'lose' end
        end
        if c.name == 'C' and i == 2 then return 'lose' end
        return 200
      end
      local A = w:add_client(1, false, function(w, c)
        local h = w:acquire(c, 'r1')
        if h then
          w:hand_out(c, h)
          w:release_all(c, 'r1', h.att, '0')
        end
      end)
      A.name, A.timeout_us = 'A', 50000
      w:at(1000, function()
        w:restart(w.nodes[1], 'empty', 10000)
        w.nodes[1].off, w.nodes[1].last = w.nodes[1].off - 60e6, 0 -- (its clock set right)
      end)
      w:at(12000, function() w.nodes[1].off = w.nodes[1].off + 600000 end)
      local B = w:add_client(2, false, function(w, c)
        w:sleep(c, 15000)
        local h = w:acquire(c, 'r1')
        if h then
          w:hand_out(c, h)
          w:release_all(c, 'r1', h.att, '0')
        end
      end)
      B.name = 'B'
      local C = w:add_client(3, false, function(w, c)
        w:sleep(c, 100000)
        local h = w:acquire(c, 'r1')
        if h then w:hand_out(c, h) end
      end)
      C.name = 'C'
    end,
  },
  {
    -- Marks are per hash slot (lua/keys.lua, HW: up to 16384 per prefix),
    -- the seed key per node and prefix (lua/p2/LAYOUT.txt): a seeding that
    -- copies the mark of the slot of the name being acquired, then writes
    -- the run id, leaves every other slot's mark as the restart left it,
    -- and the node votes for their names. docs/design.md says "the marks
    -- ... are read, and their highest is written", which does not say
    -- every slot's. (The world gives every name one slot: per_slot gives
    -- each its own.) Node 1, its clock a minute ahead, gives A's token
    -- for r1; A's write-back misses node 3; node 2 restarts empty; B's
    -- acquire of r2 (another slot) seeds node 2 with r2's slot only; C,
    -- cut from node 1, is voted by nodes 2 and 3 for r1 and confirmed
    -- below T_A. The control seeds every slot, the run id last.
    name = 'seed_one_slot',
    kind = 'order',
    run = function(w, control)
      setup(w, 500)
      w.per_slot, w.seed_all_slots = true, control
      w.names = {'r1', 'r2'}
      for _, n in ipairs(w.names) do
        w.store[n] = {high = -1, max_first = -math.huge}
        w.handed[n] = {}
      end
      w.nodes[1].off = w.nodes[1].off + 60e6
      w.net_hook = function(c, i, script, leg)
        if c.name == 'A' and i == 3 and script == 'mark' and leg == 'request' then return 'lose' end
        if c.name == 'C' and i == 1 then return 'lose' end
        return 200
      end
      local A = w:add_client(1, false, function(w, c)
        local h = w:acquire(c, 'r1')
        if h then
          w:hand_out(c, h)
          w:release_all(c, 'r1', h.att, '0')
        end
      end)
      A.name, A.timeout_us = 'A', 20000
      w:at(100000, function() w:restart(w.nodes[2], 'empty', 10000) end)
      local B = w:add_client(2, false, function(w, c)
        w:sleep(c, 640000)
        local h = w:acquire(c, 'r2')
        if h then
          w:hand_out(c, h)
          w:release_all(c, 'r2', h.att, '0')
        end
      end)
      B.name = 'B'
      local C = w:add_client(3, false, function(w, c)
        w:sleep(c, 700000)
        local h = w:acquire(c, 'r1')
        if h then w:hand_out(c, h) end
      end)
      C.name = 'C'
    end,
  },
}

-- control: the same schedule within the assumption the hole steps out of
-- (the client's clock at real rate; uptime by a monotonic clock; every
-- slot seeded), which
-- must end without a violation.
function H.run(W, fns, s, control)
  local w = W.new(1, {faults = {}, trace = true}, fns)
  s.run(w, control)
  return w:run()
end

return H
