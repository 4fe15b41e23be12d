-- Protocol 2's mark write-back, for a lock over several independent
-- masters (Redlock, docs/design.md "Redlock"): raises the slot's mark on
-- this node to at least the token a client names, and says what the mark
-- was before; and, with a run id, marks this node seeded. Proven by the
-- simulator (sim/sim --redlock: sim/redlock.lua).
--
-- KEYS[1] the slot's mark (lua/keys.lua, HW; lua/p2/LAYOUT.txt): "<token>
--         <clock> <pass limit>"; every grant of this node hands out a token
--         above <token> (above <token> + <pass limit> while the server's
--         clock is behind max(<clock>, <token>)).
-- KEYS[2] the node's seed key: the run id of the server whose marks were
--         seeded (docs/design.md, "Redlock": a server that lost its data,
--         or restarted at all, has another run id, so its old value no
--         longer matches and its votes do not count until seeded anew).
-- ARGV[1] T, the token: the mark is raised to T if it is below T; '0'
--         reads the mark and writes nothing.
-- ARGV[2] '' or a run id: once the mark is at least T, KEYS[2] takes it.
--
-- Reply: {before, seeded}: before, the mark this node held before the
-- call, as a grant reads it (<token>, plus <pass limit> while the clock is
-- behind the mark), so that a caller finding before >= T knows that
-- another token at least as high was written here, and does not hand T
-- out; seeded, the value of KEYS[2] after the call ('' if none).
local t = redis.call('TIME')
local us6 = string.rep('0', 6 - #t[2]) .. t[2] -- microseconds, 6 digits
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local mtok, mclk, mpl = string.match(redis.call('GET', KEYS[1]) or '', '^(%d+) (%d+) (%d+)$')
local before = tonumber(mtok) or 0
if now_us < math.max(tonumber(mclk) or 0, before) then
  before = before + tonumber(mpl) -- (as lua/p2/acquire.lua reads it)
end
local want = tonumber(ARGV[1]) or 0
if want > before then
  -- The pass limit stays the highest any grant of the slot asked for (as
  -- the grants write it); the clock is now's.
  redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. t[1] .. us6 .. ' ' .. (mpl or '0'))
end
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[2], ARGV[2])
end
return {string.format('%.0f', before), redis.call('GET', KEYS[2]) or ''}
