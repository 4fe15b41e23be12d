-- Prints one line per schedule of a seed: the schedule's seed and what it
-- ended with (events, acquisitions, the random streams' states, the last
-- event's time and sequence, the violations). Two runs that print the same
-- lines ran the same schedules, event for event (sim/test-interpreters).
--   lua sim/signatures.lua SEED SCHEDULES [MUTANT|-] [passes|-] [PROTOCOL]
-- (passes: the local handoff rule by passes, sim --local-rule passes;
-- PROTOCOL: 1, 2 or mixed, as sim --protocol)
local dir = arg[0]:match('^(.*)/[^/]*$') or '.'
package.path = dir .. '/?.lua;' .. package.path
local W = require('world')
local mutate
local protocol = tonumber(arg[5] or '1') or arg[5]
if arg[3] and arg[3] ~= '-' then
  local mutants = require('mutants')
  local m = assert(mutants.find(arg[3]), 'unknown mutant ' .. arg[3])
  if m.file == 'client' then
    mutants.apply_client(m, dir)
  else
    mutate = function(texts, p) if p == (m.protocol or 1) then mutants.apply(m, texts) end end
  end
end
local scripts = W.load_scripts(dir .. '/..', mutate, protocol)
local seed, n = tonumber(arg[1]), tonumber(arg[2])
for k = 0, n - 1 do
  local s = (seed * 1000003 + k) % 2147483647
  local w = W.new(s, {local_rule = arg[4] == 'passes' and 'passes' or nil, protocol = protocol}, scripts)
  w:run()
  io.write(string.format('%d: %d events, %d acquisitions, streams %d %d, last %.3f us #%d, %d violations%s\n',
    s, w.steps, w.acquisitions or 0, w.rs, w.rs2, w.now, w.seq, #w.violations,
    #w.violations > 0 and ' (' .. w.violations[1].kind .. ')' or ''))
end
