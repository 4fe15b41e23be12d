-- Scenarios of the Redlock world (sim/redlock.lua): schedules written out
-- event by event, for the two parts of the token rule that a second
-- defence covers in random schedules (docs/simulation.md, "The Redlock
-- world"), so that a bug in either is still caught: each scenario makes the
-- other defence miss, and states which invariant the bug then breaks.
-- sim/test-redlock-scenarios runs each on the world as it is (no violation,
-- and the scenario went as written) and with each of its mutants
-- (sim/mutants.lua; a violation of the kind named).
--
-- A scenario gets a world with no random faults, sets it up (clocks,
-- lease, timeouts), loses or delays chosen messages (net_hook), and runs
-- its own clients.
local S = {}

local function setup(w, lease_ms)
  local cfg = w.cfg
  cfg.lease_ms, cfg.L = lease_ms, lease_ms * 1000
  cfg.drift_us = lease_ms * 10 + 2000
  cfg.keep_ms = 4 * lease_ms
  cfg.timeout_us = 50000
  for _, nd in ipairs(w.nodes) do nd.off, nd.rate = 1700000000e6, 1 end
  w.clients, w.events = {}, {}
end

-- The hand-outs of name, in order: their tokens.
local function tokens(w, name)
  local out = {}
  for _, h in ipairs(w.handed[name]) do out[#out + 1] = h.c .. '=' .. string.format('%.0f', h.token) end
  return out
end

S.list = {
  {
    -- A node that restarted empty votes with the marks it lost: its vote
    -- must wait for its seeding. A's write-back misses node 3 (node 1, its
    -- clock a minute ahead, gave A's token); node 2, which took it,
    -- restarts empty; B, cut from node 1, is voted by nodes 2 and 3 with
    -- tokens a minute below A's, and its write-back meets no mark above.
    name = 'unseeded_node_votes',
    mutants = {'redlock_unseeded_node_votes', 'redlock_restarted_node_votes_at_once'},
    kind = 'order',
    run = function(w)
      setup(w, 500)
      w.nodes[1].off = w.nodes[1].off + 60e6
      w.net_hook = function(c, i, script, leg)
        if c.name == 'A' and i == 3 and script == 'mark' and leg == 'request' then return 'lose' end
        if c.name == 'B' and i == 1 then return 'lose' end
        return 200
      end
      local A = w:add_client(1, false, function(w, c)
        local h = w:acquire(c, 'r1')
        if h then
          w:hand_out(c, h)
          w:release_all(c, 'r1', h.att, '0')
        end
      end)
      A.name = 'A'
      w:at(100000, function() w:restart(w.nodes[2], 'empty', 10000) end)
      local B = w:add_client(2, false, function(w, c)
        w:sleep(c, 110000 + w.cfg.L + 20000) -- node 2 up a lease, not a lease + drift
        local h = w:acquire(c, 'r1')
        if h then w:hand_out(c, h) end
      end)
      B.name = 'B'
      w.scenario_check = function()
        local t = tokens(w, 'r1')
        -- A got its token; B was refused (the probe then acquires)
        if not (t[1] and t[1]:match('^A=') and not (t[2] and t[2]:match('^B='))) then
          return 'the hand-outs were ' .. table.concat(t, ' ') .. ', not A alone before the probe'
        end
      end
    end,
  },
  {
    -- Two acquires overlap: B's vote on node 3 comes before A's write-back
    -- there, its vote on node 1 after A's release, A's write-back missed
    -- node 1; node 2 (a minute ahead) gave A's token, and B's request to it
    -- is lost. B's highest vote + 1 is below A's token: only its
    -- write-back, meeting A's token on nodes 2 and 3, finds it (clients
    -- with command timeouts of their own: A 20 ms, B 45 ms).
    name = 'overlapping_acquires',
    mutants = {'redlock_conflict_ignored'},
    kind = 'order',
    run = function(w)
      setup(w, 500)
      w.nodes[2].off = w.nodes[2].off + 60e6
      local b_sent -- B's first send
      w.net_hook = function(c, i, script, leg)
        if c.name == 'A' then
          if script == 'acquire' and i == 3 and leg == 'request' then return 3000 end
          if script == 'mark' and i == 1 and leg == 'request' then return 'lose' end
        elseif c.name == 'B' and script == 'acquire' then
          if i == 2 then return 'lose' end
          if i == 1 and leg == 'request' then return 30000 end
        end
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
      local B = w:add_client(2, false, function(w, c)
        w:sleep(c, 1000)
        local h = w:acquire(c, 'r1')
        if h then w:hand_out(c, h) end
      end)
      B.name, B.timeout_us = 'B', 45000
      w.scenario_check = function()
        local t = tokens(w, 'r1')
        if not (t[1] and t[1]:match('^A=') and t[2] and t[2]:match('^B=')) then
          return 'the hand-outs were ' .. table.concat(t, ' ') .. ', not A then B'
        end
        local h = w.handed.r1
        if h[2].first >= h[1].handout then return 'B began after A\'s hand-out: no overlap' end
      end
    end,
  },
}

-- Runs scenario s on a world of module W with scripts fns: the world.
function S.run(W, fns, s)
  local w = W.new(1, {faults = {}, trace = true}, fns)
  s.run(w)
  return w:run()
end

return S
