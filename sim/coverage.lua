-- Coverage of the scripts by the simulator (sim --coverage): how often each
-- branch of each script of lua/ (and dlockctl's forced release) ran. A
-- line hook counts the lines run in chunks named '@lua/...'; a branch is the
-- body of an `if ... then`, `elseif ... then` or `else` that spans lines. A branch that
-- never ran is a path of the protocol no schedule reached. A branch counts
-- as run as often as the line of its body that ran most.
local M = {}

local hits = {} -- chunk name ('lua/acquire.lua') -> line -> count

local R = require('redis')

-- The hook runs only while a script runs (sim/redis.lua, M.run).
function M.start()
  R.line_hook = function(_, line)
    local src = debug.getinfo(2, 'S').source
    if src:sub(1, 5) == '@lua/' then
      local t = hits[src:sub(2)]
      if not t then
        t = {}
        hits[src:sub(2)] = t
      end
      t[line] = (t[line] or 0) + 1
    end
  end
end

function M.stop() R.line_hook = nil end

local function code(line)
  local l = line:gsub('%-%-.*$', ''):gsub('^%s+', ''):gsub('%s+$', '')
  return l ~= '' and l
end

-- The branches of a script's text: {line = of the if/elseif/else, from,
-- to = its body's lines (the lines below it indented deeper: the scripts
-- are indented two spaces a block), text = the branch's line}.
local function branches(text)
  local lines = {}
  for l in (text .. '\n'):gmatch('(.-)\n') do lines[#lines + 1] = l end
  local function indent(l) return #l:match('^%s*') end
  local out = {}
  for i, l in ipairs(lines) do
    local c = code(l)
    if c and (c:match('^if%s.*then$') or c:match('^elseif%s.*then$') or c == 'else') then
      local from, to = nil, nil
      for j = i + 1, #lines do
        if code(lines[j]) then
          if indent(lines[j]) <= indent(l) then break end
          from = from or j
          to = j
        end
      end
      if from then out[#out + 1] = {line = i, from = from, to = to, text = c} end
    end
  end
  return out
end

-- Prints, per script, its branches run and never run; returns a table
-- script -> {run =, total =} for the JSON line. The scripts of `protocol`
-- (1, the default: lua/; 2: lua/p2/, named p2/...; 'mixed': both).
function M.report(root, out, protocol)
  local summary = {}
  local scripts = {}
  for _, n in ipairs({'acquire', 'release', 'renew', 'leave'}) do
    if protocol ~= 2 then scripts[#scripts + 1] = n end
  end
  for _, n in ipairs({'acquire', 'release', 'renew', 'leave'}) do
    if protocol == 2 or protocol == 'mixed' then scripts[#scripts + 1] = 'p2/' .. n end
  end
  if protocol == 2 then -- (its shared mode: run by sim --shared)
    scripts[#scripts + 1], scripts[#scripts + 2] = 'p2/acquire_shared', 'p2/release_shared'
  end
  for _, n in ipairs(scripts) do
    local path = 'lua/' .. n .. '.lua'
    local f = assert(io.open(root .. '/' .. path))
    local text = f:read('*a')
    f:close()
    local t = hits[path] or {}
    local bs = branches(text)
    local run, never = 0, {}
    for _, b in ipairs(bs) do
      local k = 0
      for j = b.from, b.to do k = math.max(k, t[j] or 0) end
      b.count = k
      if k > 0 then run = run + 1 else never[#never + 1] = b end
    end
    summary[n] = {run = run, total = #bs}
    out:write(string.format('coverage: %s: %d of %d branches run\n', path, run, #bs))
    for _, b in ipairs(bs) do
      out:write(string.format('coverage:   %s:%d %8d  %s\n', path, b.line, b.count,
        b.text:sub(1, 80)))
    end
    for _, b in ipairs(never) do
      out:write(string.format('coverage: NEVER %s:%d  %s\n', path, b.line, b.text:sub(1, 80)))
    end
  end
  return summary
end

return M
