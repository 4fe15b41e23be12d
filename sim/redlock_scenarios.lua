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
-- lease, timeouts, pass limit 0 unless it says), loses or delays chosen
-- messages (net_hook), and runs its own clients. Three more write out the
-- cases of rules that random schedules rarely reach: the drift allowance,
-- a renewal's validity from its first send, and the write-back of T + the
-- pass limit; and one the split votes of the wait queues (--wait), in a
-- cycle of queue orders.
local S = {}

local function setup(w, lease_ms)
  local cfg = w.cfg
  cfg.lease_ms, cfg.L = lease_ms, lease_ms * 1000
  cfg.drift_us = lease_ms * 10 + 2000
  cfg.keep_ms = 4 * lease_ms
  cfg.timeout_us = 50000
  cfg.pl = 0
  for _, nd in ipairs(w.nodes) do nd.off, nd.rate = 1700000000e6, 1 end
  w.clients, w.events = {}, {}
end

-- c's clock, in us.
local function cnow(w, c) return math.floor(w.now * c.rate) end

-- Holds h until c's clock says its validity ended.
local function hold_to_validity(w, c, h)
  c.hold = h
  while cnow(w, c) < h.valid do w:sleep(c, 500) end
  c.hold = nil
end

-- Acquires name, trying every 500 us up to n times: the hold, or nil.
local function acquire_soon(w, c, name, n)
  for _ = 1, n do
    local h = w:acquire(c, name)
    if h then return h end
    w:sleep(c, 500)
  end
end

-- The hand-outs of name, in order: their tokens.
local function tokens(w, name)
  local out = {}
  for _, h in ipairs(w.handed[name]) do out[#out + 1] = h.c .. '=' .. string.format('%.0f', h.token) end
  return out
end

-- A semaphore scenario's world: one name x, limit 2, c1 the semaphore's
-- client A, c2 a lock's client B (sim/redlock.lua, "Semaphores").
local function sem_setup(w)
  setup(w, 500)
  local cfg = w.cfg
  cfg.keep_ms, cfg.timeout_us = 2000, 45000
  cfg.limit, cfg.other = 2, 'lock'
  cfg.horizon_us = 3e6
  w.names, w.handed = {'x'}, {x = {}}
  w.store = {x = {high = -1, max_first = -math.huge}}
  w.net_hook = function() return 200 end
end

-- B takes x as a lock as soon as it can after `from` (us), trying every
-- 500 us up to n times, and holds it 100 ms.
local function lock_when_free(w, from, n)
  local B = w:add_client(2, false, function(w, c)
    w:sleep(c, from)
    local h = acquire_soon(w, c, 'x', n)
    if h then
      h.lock = true
      w:hand_out(c, h)
      c.holds = {h}
      w:sleep(c, 100000)
      c.holds = nil
      w:release_all(c, 'x', h.att, '0')
    end
  end)
  B.name, B.timeout_us = 'B', 20000
end

-- The scenario floor_beside_writeback (below); older: A proposes no
-- floor.
local function floor_beside_writeback(w, older)
  setup(w, 500)
  w.nodes[2].off = w.nodes[2].off - 60e6
  w.rand5 = function() return 0.9 end -- every floor the client's own guess, as the C's
  w.net_hook = function(c, i, script, leg)
    if c.name == 'A' then
      if script == 'acquire' and i == 3 and leg == 'request' then return 3000 end
      if script == 'mark' and i == 2 and leg == 'request' then return 'lose' end
    elseif c.name == 'B' and script == 'acquire' and c.phase == 2 then
      if i == 2 and leg == 'request' then return 45000 end
    end
    return 200
  end
  local A = w:add_client(1, false, function(w, c)
    w:sleep(c, 10000)
    local h = w:acquire(c, 'r1')
    if h then
      w:hand_out(c, h)
      w:release_all(c, 'r1', h.att, '0')
    end
  end)
  A.name, A.timeout_us = 'A', 20000
  A.no_floor = older -- (a client of a release before the floor)
  local B = w:add_client(2, false, function(w, c)
    c.phase = 1
    local h0 = w:acquire(c, 'r2') -- (the nodes' clocks)
    if h0 then w:release_all(c, 'r2', h0.att, '0') end
    w:sleep(c, 11000 - w.now)
    c.phase = 2
    local h = w:acquire(c, 'r1')
    if h then w:hand_out(c, h) end
  end)
  B.name, B.timeout_us = 'B', 60000
  w.scenario_check = function()
    local t = tokens(w, 'r1')
    if not (t[1] and t[1]:match('^A=') and t[2] and t[2]:match('^B=')) then
      return 'the hand-outs were ' .. table.concat(t, ' ') .. ', not A then B'
    end
    local h = w.handed.r1
    if h[2].first >= h[1].handout then return 'B began after A\'s hand-out: no overlap' end
  end
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
  {
    -- The same with A a client of a release before the floor (it proposes
    -- none, and writes every token back).
    name = 'older_beside_floor',
    mutants = {'redlock_floor_majority'},
    kind = 'order',
    run = function(w) floor_beside_writeback(w, true) end,
  },
  {
    -- A written back, B confirmed by its floor, overlapping: B (which
    -- learned the nodes' clocks on another name) wins node 3 before A's
    -- delayed vote; A's votes on nodes 1 and 2 differ (node 2 a minute
    -- behind, A's first acquire: no floor), so A writes back, meets B's
    -- vote on node 3, goes above it, and is confirmed by nodes 1 and 3
    -- (its write-back to node 2 is lost), then released. B's vote on node
    -- 2 comes after that release, at B's floor: nodes 2 and 3 agree, a
    -- majority, but not every node; only B's write-back, meeting A's
    -- token on node 3, finds it.
    name = 'floor_beside_writeback',
    mutants = {'redlock_floor_majority'},
    kind = 'order',
    run = function(w) floor_beside_writeback(w, false) end,
  },
  {
    -- The nodes' clocks run 0.3% fast, A's 0.3% slow (within the drift
    -- allowance together): A's lease ends on the nodes, by their clocks,
    -- 3 ms before A's clock says 500 ms passed. B acquires just after it
    -- ends there; A must have counted its validity over by then.
    name = 'clocks_apart',
    mutants = {'redlock_validity_without_drift'},
    kind = 'mutex',
    run = function(w)
      setup(w, 500)
      for _, nd in ipairs(w.nodes) do nd.rate = 1.003 end
      w.net_hook = function() return 200 end
      local A = w:add_client(1, false, function(w, c)
        local h = w:acquire(c, 'r1')
        if h then
          w:hand_out(c, h)
          hold_to_validity(w, c, h)
        end
      end)
      A.name, A.rate = 'A', 0.997
      local B = w:add_client(2, false, function(w, c)
        w:sleep(c, 499000) -- the nodes' 500 ms have passed (498.7 ms real)
        local h = acquire_soon(w, c, 'r1', 20)
        if h then
          w:hand_out(c, h)
          c.hold = h
          w:sleep(c, 5000)
          c.hold = nil
          w:release_all(c, 'r1', h.att, '0')
        end
      end)
      B.name = 'B'
      w.scenario_check = function()
        local t = tokens(w, 'r1')
        if not (t[1] and t[1]:match('^A=') and t[2] and t[2]:match('^B=')) then
          return 'the hand-outs were ' .. table.concat(t, ' ') .. ', not A then B'
        end
        -- (before A's clock says 500 ms: 501.5 ms real)
        if w.handed.r1[2].handout > 501000 then return 'B held r1 only after 501 ms' end
      end
    end,
  },
  {
    -- A renews 100 ms into its lease; the renewal runs on the nodes at
    -- once, its replies come 40 ms late (A's command timeout is 50 ms).
    -- The nodes' leases end a lease after the renewal ran; B acquires just
    -- then. A's new validity must count from the renewal's first send.
    name = 'renewal_answered_late',
    mutants = {'redlock_renewal_validity_late'},
    kind = 'mutex',
    run = function(w)
      setup(w, 500)
      w.net_hook = function(c, _, script, leg)
        if c.name == 'A' and script == 'renew' and leg == 'reply' then return 40000 end
        return 200
      end
      local A = w:add_client(1, false, function(w, c)
        local h = w:acquire(c, 'r1')
        if h then
          w:hand_out(c, h)
          c.hold = h
          w:sleep(c, 100000)
          if w:renew(c, h) then hold_to_validity(w, c, h) end
          c.hold = nil
        end
      end)
      A.name, A.timeout_us = 'A', 50000
      local B = w:add_client(2, false, function(w, c)
        w:sleep(c, 601500) -- the renewal ran at 101 ms: the nodes' lease ends at 601
        local h = acquire_soon(w, c, 'r1', 20)
        if h then
          w:hand_out(c, h)
          c.hold = h
          w:sleep(c, 5000)
          c.hold = nil
          w:release_all(c, 'r1', h.att, '0')
        end
      end)
      B.name = 'B'
      w.scenario_check = function()
        local t = tokens(w, 'r1')
        if not (t[1] and t[1]:match('^A=') and t[2] and t[2]:match('^B=')) then
          return 'the hand-outs were ' .. table.concat(t, ' ') .. ', not A then B'
        end
        if w.renewals ~= 1 then return 'A renewed ' .. w.renewals .. ' times, not once' end
        if w.handed.r1[2].handout > 610000 then return 'B held r1 only after 610 ms' end
      end
    end,
  },
  {
    -- Pass limit 3. Node 1's clock is a minute ahead: A's token T is its
    -- vote + 1, and A passes T + 1 .. T + 3 to its threads. Node 3 never
    -- granted A (the request is lost), so its mark holds only what A's
    -- write-back wrote, with no pass limit of its own; node 2, which
    -- granted A, restarts empty and is seeded from nodes 1 and 3. B, cut
    -- from node 1, is voted by nodes 2 and 3, their clocks a minute behind
    -- T: only the marks the write-back left keep B's token above T + 3
    -- (B and S, with a pass limit of 0, reserve nothing above their votes).
    name = 'passes_after_writeback',
    mutants = {'redlock_writeback_without_passes'},
    kind = 'order',
    run = function(w)
      setup(w, 500)
      w.cfg.pl = 3
      w.nodes[1].off = w.nodes[1].off + 60e6
      w.net_hook = function(c, i, script)
        if c.name == 'A' and i == 3 and script == 'acquire' then return 'lose' end
        if c.name == 'B' and i == 1 and script == 'acquire' then return 'lose' end
        if c.name == 'S' and i ~= 2 and script == 'acquire' then return 'lose' end
        return 200
      end
      local A = w:add_client(1, false, function(w, c)
        local h = w:acquire(c, 'r1')
        if h then
          w:hand_out(c, h)
          for k = 1, 3 do
            w:sleep(c, 100)
            w:hand_out(c, {name = 'r1', token = h.token + k, att = h.att, first = h.first,
              valid = h.valid, handout = w.now, node_tok = h.node_tok})
          end
          w:release_all(c, 'r1', h.att, '0')
        end
      end)
      A.name = 'A'
      w:at(50000, function() w:restart(w.nodes[2], 'empty', 10000) end)
      -- S, with a pass limit of 0 and reaching node 2 alone, tries once
      -- when node 2 has been up a lease + drift: its reply seeds node 2
      local S = w:add_client(3, false, function(w, c)
        w:sleep(c, 575000)
        w:acquire(c, 'r1')
      end)
      S.name, S.pl = 'S', 0
      local B = w:add_client(2, false, function(w, c)
        w:sleep(c, 640000) -- after S's seeding (S waits out its timeout first)
        local h = acquire_soon(w, c, 'r1', 20)
        if h then w:hand_out(c, h) end
      end)
      B.name, B.pl = 'B', 0 -- (its own grants reserve no passes above its votes)
      w.scenario_check = function()
        local t = tokens(w, 'r1')
        if not (t[5] and t[4]:match('^A=') and t[5]:match('^B=')) then
          return 'the hand-outs were ' .. table.concat(t, ' ') .. ', not A four times, then B'
        end
      end
    end,
  },
  {
    -- Split votes in a cycle (wait queues, docs/design.md "Redlock",
    -- "Waiting"): H holds r1 while A, B and C queue, each node in another
    -- order (node 1: A B C, node 2: B C A, node 3: C A B: majorities put
    -- A before B, B before C and C before A). H's release grants each
    -- node directly to its head: A, B and C one vote each. A waits
    -- longest (its ticket is first) and keeps node 1; B, refused there by
    -- A, gives node 2 back, which passes to C: C holds nodes 2 and 3 and
    -- acquires, then A, then B (B before C on nodes 1 and 2, but node 2
    -- granted B first: the order promised). Kept by all three, the split
    -- deadlocks until the waits end (starve).
    name = 'split_cycle',
    mutants = {'redlock_split_keeps_votes'},
    kind = 'starve',
    run = function(w)
      setup(w, 600)
      w.cfg.wait = true
      local first = {A = {1000, 3000, 2000}, B = {2000, 1000, 3000}, C = {3000, 2000, 1000}}
      w.net_hook = function(c, i, script, leg)
        if first[c.name] and script == 'acquire' and leg == 'request' and w.now < 40000 then
          return first[c.name][i]
        end
        return 200
      end
      local H = w:add_client(4, false, function(w, c)
        local h = w:acquire(c, 'r1')
        if h then
          w:hand_out(c, h)
          w:sleep(c, 50000)
          w:release_all(c, 'r1', h.att, '0')
        end
      end)
      H.name = 'H'
      for k, n in ipairs({'A', 'B', 'C'}) do
        local c = w:add_client(k, false, function(w, c)
          w:sleep(c, 10000 + 100 * k)
          local h = w:acquire_waiting(c, 'r1', cnow(w, c) + 30 * w.cfg.L)
          if h then
            w:hand_out(c, h)
            w:sleep(c, 1000)
            w:release_all(c, 'r1', h.att, '0')
          end
        end)
        c.name, c.skew = n, 0 -- (tickets in the order they start)
      end
      w.scenario_check = function()
        local t = tokens(w, 'r1')
        local got = {}
        for k = 1, 4 do got[k] = t[k] and t[k]:match('^(%a+)=') or '-' end
        if table.concat(got, ' ') ~= 'H C A B' then
          return 'the hand-outs were ' .. table.concat(t, ' ') .. ', not H, C, A, B'
        end
      end
    end,
  },
  {
    -- A semaphore's claim is relied on for a lease, not its time to live
    -- (2 leases): a node restarted without it counts again a lease + the
    -- drift allowance later. A claims x on nodes 1 and 2 (cut from node
    -- 3), then is cut from node 2 too, which restarts empty; A's second
    -- try at 450 ms must claim again (nodes 1 and 3) rather than rely on
    -- the first; A is then cut off, its permit running to its validity;
    -- B's lock, once node 2 counts, must meet a claim on a majority until
    -- then.
    name = 'claim_restart',
    rsem = true,
    mutants = {'redlock_claim_two_leases'},
    kind = 'kind',
    run = function(w)
      sem_setup(w)
      local got = 0
      local A = w:add_client(1, false, function(w, c)
        c.cut[3] = 445000
        local h0 = w:permit(c, 'x')
        if not h0 then return end
        got = got + 1
        w:hand_out(c, h0)
        c.holds = {h0}
        c.cut[2] = 1e15 -- (its renewals' claims cannot mend node 2's loss)
        while w.now < 380000 do
          w:sleep(c, 160000)
          w:renew_due(c)
        end
        w:sleep(c, 450000 - w.now)
        local h1 = w:permit(c, 'x')
        if not h1 then return end
        got = got + 1
        w:hand_out(c, h1)
        c.holds[#c.holds + 1] = h1
        c.cut = {1e15, 1e15, 1e15}
        while cnow(w, c) < h1.valid do w:sleep(c, 1000) end
        c.holds = nil
      end)
      A.name, A.timeout_us = 'A', 20000
      w:at(100000, function() w:restart(w.nodes[2], 'empty', 10000) end)
      lock_when_free(w, 600000, 400)
      w.scenario_check = function()
        if got ~= 2 then return 'A took ' .. got .. ' permits, not 2' end
      end
    end,
  },
  {
    -- A claim's exchange waits a command timeout for a node it cannot
    -- reach (the one without the claim), and the slot is granted after
    -- it: the permit's validity is the claim's (from its first send), not
    -- the slot's. Every try claims (no claim of A's own reused); node 2
    -- restarts empty right after the claim; A is cut off once it holds.
    name = 'claim_slow',
    rsem = true,
    mutants = {'redlock_claim_two_leases'},
    kind = 'kind',
    run = function(w)
      sem_setup(w)
      w.claimed = function(self, c, sem) return self:claim(c, sem) end
      local got = 0
      local A = w:add_client(1, false, function(w, c)
        c.cut[3] = 44000
        local h = w:permit(c, 'x')
        if not h then return end
        got = 1
        w:hand_out(c, h)
        c.holds = {h}
        c.cut = {1e15, 1e15, 1e15}
        while cnow(w, c) < h.valid do w:sleep(c, 1000) end
        c.holds = nil
      end)
      A.name, A.timeout_us = 'A', 45000
      w:at(1000, function() w:restart(w.nodes[2], 'empty', 1000) end)
      lock_when_free(w, 505000, 200)
      w.scenario_check = function()
        if got ~= 1 then return 'A took no permit' end
      end
    end,
  },
}

-- Runs scenario s on a world of module W with scripts fns: the world.
function S.run(W, fns, s)
  local w = W.new(1, {faults = {}, trace = true, rsem = s.rsem}, fns)
  s.run(w)
  return w:run()
end

return S
