-- An in-memory model of the Redis commands that dlock's scripts call, and a
-- runner that executes the real lua/*.lua under Lua 5.1 against it, the way
-- Redis's scripting engine does (or under LuaJIT's interpreter, which runs
-- them the same: sim/test-interpreters).
--
-- What it models, and what a test on a real server shows of each
-- (sim/model_check.lua, run by sim/test-model, runs the same command
-- sequences on a real redis-server and compares every reply; see
-- docs/simulation.md):
--   - keys of three types: string, hash, zset; WRONGTYPE on a mismatch;
--   - expiry by the server clock in ms (an absolute time per key, as Redis
--     keeps it): a key is gone once the clock is past its expiry time, so a
--     clock step forward expires keys early and a step back keeps them;
--   - the commands GET SET(PX) MGET DEL EXISTS PTTL PEXPIRE(NX XX GT LT)
--     HGET HMGET HLEN HGETALL HSET HDEL ZADD(NX) ZRANGE ZREM ZCARD TIME
--     PUBLISH, with Redis's replies (as 7.0 gives them);
--   - Redis's conversions between Lua and replies: a number becomes an
--     integer reply (truncated), a table an array up to its first nil,
--     false a nil reply, true the integer 1; a nil bulk becomes false in Lua;
--   - a script runs alone and at one instant of the server clock (TIME
--     inside it, and key expiry, read that instant); it cannot create
--     globals.
-- It does not model persistence or replication by itself: the world
-- (sim/world.lua) snapshots and restores the data for restarts and
-- failovers, and delivers PUBLISH messages.
local M = {}

local floor = math.floor

local function numstr(n)
  -- How Redis turns a Lua number passed to redis.call into an argument.
  if n == floor(n) and n > -1e15 and n < 1e15 then
    if n > -1e14 and n < 1e14 then return tostring(n) end -- the same digits, sooner
    return string.format('%.0f', n)
  end
  return string.format('%.17g', n)
end

local function toint(s)
  if type(s) == 'number' then
    if s ~= floor(s) then return nil end
    return s
  end
  if type(s) ~= 'string' or not string.find(s, '^%-?%d+$') or #s > 18 then
    return nil
  end
  return tonumber(s)
end

local function err(msg)
  error({err = msg}, 0)
end

local WRONGTYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value'
local NOTINT = 'ERR value is not an integer or out of range'

-- A new, empty server. now_ms and now_us are set by run() for each script.
-- gen: the data's generation. A copy of the data (M.snapshot) shares its
-- objects (a key's type, value and expiry) with the server: an object whose
-- gen is not the server's may be shared, and a command that changes one
-- changes a copy of it instead (writable).
function M.new()
  return {db = {}, now_ms = 0, now_us = 0, published = {}, gen = 1}
end

-- The live key k (nil if absent or expired; an expired key is deleted).
local function live(s, k)
  local o = s.db[k]
  if o and o.exp and s.now_ms > o.exp then
    s.db[k] = nil
    return nil
  end
  return o
end
M.live = live

-- A copy of object o (its own value table).
local function copy_obj(o)
  local v = o.v
  if type(v) == 'table' then
    local c = {}
    for f, x in pairs(v) do c[f] = x end
    v = c
  end
  return {type = o.type, v = v, exp = o.exp}
end
M.copy_obj = copy_obj

-- Key k's object o, made the server's own before a change: copied if a
-- copy of the data may share it.
local function writable(s, k, o)
  if o.gen ~= s.gen then
    o = copy_obj(o)
    o.gen = s.gen
    s.db[k] = o
  end
  return o
end
M.writable = writable

-- The data as it is now, for a restart or a replica to take later: a
-- table of the objects, which from now on the server changes only by
-- copies (writable). Cheap: the data is not copied.
function M.snapshot(s)
  s.gen = s.gen + 1
  local out = {}
  for k, o in pairs(s.db) do out[k] = o end
  return out
end

-- Object o as it is now, shared with whoever keeps it (a replica's
-- write on its way): the server changes it only by a copy from now on.
function M.share(o)
  o.gen = nil
  return o
end

local function typed(s, k, ty)
  local o = live(s, k)
  if o and o.type ~= ty then err(WRONGTYPE) end
  return o
end

local function zsorted(z)
  -- members ordered by score, then member, as Redis orders a zset
  local list = {}
  for m, sc in pairs(z) do list[#list + 1] = m end
  table.sort(list, function(a, b)
    if z[a] ~= z[b] then return z[a] < z[b] end
    return a < b
  end)
  return list
end
M.zsorted = zsorted

local cmd = {}

function cmd.GET(s, a)
  local o = typed(s, a[1], 'string')
  return o and o.v or false
end

function cmd.MGET(s, a)
  local out = {}
  for i = 1, #a do
    local o = live(s, a[i])
    out[i] = (o and o.type == 'string') and o.v or false
  end
  return out
end

function cmd.SET(s, a)
  local k, v = a[1], a[2]
  local exp
  local i = 3
  while a[i] do
    local opt = string.upper(a[i])
    if opt == 'PX' or opt == 'EX' then
      local n = toint(a[i + 1])
      if not n then err(NOTINT) end
      if n <= 0 then err("ERR invalid expire time in 'set' command") end
      exp = s.now_ms + (opt == 'PX' and n or n * 1000)
      i = i + 2
    else
      err('ERR syntax error')
    end
  end
  s.db[k] = {type = 'string', v = v, exp = exp, gen = s.gen}
  return {ok = 'OK'}
end

function cmd.DEL(s, a)
  local n = 0
  for i = 1, #a do
    if live(s, a[i]) then
      s.db[a[i]] = nil
      n = n + 1
    end
  end
  return n
end

function cmd.EXISTS(s, a)
  local n = 0
  for i = 1, #a do
    if live(s, a[i]) then n = n + 1 end
  end
  return n
end

function cmd.PTTL(s, a)
  local o = live(s, a[1])
  if not o then return -2 end
  if not o.exp then return -1 end
  return o.exp - s.now_ms
end

-- PEXPIRE key ms [NX|XX|GT|LT] (the options of Redis 7.0; more than one,
-- in any case, as Redis takes them): the options are read first, then ms,
-- then the key. A key without an expiry counts as one that never expires:
-- GT never sets it, LT always does. A condition that does not hold: 0, and
-- nothing changes; one that holds with ms <= 0 deletes the key.
function cmd.PEXPIRE(s, a)
  local nx, xx, gt, lt = false, false, false, false
  for i = 3, #a do
    local opt = string.upper(a[i])
    if opt == 'NX' then nx = true
    elseif opt == 'XX' then xx = true
    elseif opt == 'GT' then gt = true
    elseif opt == 'LT' then lt = true
    else err('ERR Unsupported option ' .. a[i]) end
  end
  if nx and (xx or gt or lt) then
    err('ERR NX and XX, GT or LT options at the same time are not compatible')
  end
  if gt and lt then err('ERR GT and LT options at the same time are not compatible') end
  local o = live(s, a[1])
  local n = toint(a[2])
  if not n then err(NOTINT) end
  if not o then return 0 end
  local exp = s.now_ms + n
  if nx and o.exp then return 0 end
  if xx and not o.exp then return 0 end
  if gt and (not o.exp or exp <= o.exp) then return 0 end
  if lt and o.exp and exp >= o.exp then return 0 end
  if n <= 0 then
    s.db[a[1]] = nil
  else
    writable(s, a[1], o).exp = exp
  end
  return 1
end

function cmd.HGET(s, a)
  local o = typed(s, a[1], 'hash')
  return o and o.v[a[2]] or false
end

function cmd.HMGET(s, a)
  local o = typed(s, a[1], 'hash')
  local out = {}
  for i = 2, #a do
    out[i - 1] = o and o.v[a[i]] or false
  end
  return out
end

function cmd.HLEN(s, a)
  local o = typed(s, a[1], 'hash')
  if not o then return 0 end
  local n = 0
  for _ in pairs(o.v) do n = n + 1 end
  return n
end

-- field, value, field, value...: in the order of the fields' names, the
-- same in every run and interpreter (pairs() is not). Redis gives its
-- hash's own order (a small hash's: the order the fields came in), so a
-- script must not depend on the order.
function cmd.HGETALL(s, a)
  local o = typed(s, a[1], 'hash')
  if not o then return {} end
  local fs = {}
  for f in pairs(o.v) do fs[#fs + 1] = f end
  table.sort(fs)
  local out = {}
  for i, f in ipairs(fs) do
    out[2 * i - 1] = f
    out[2 * i] = o.v[f]
  end
  return out
end

function cmd.HSET(s, a)
  if #a < 3 or #a % 2 ~= 1 then
    err("ERR wrong number of arguments for 'hset' command")
  end
  local o = typed(s, a[1], 'hash')
  if not o then
    o = {type = 'hash', v = {}, gen = s.gen}
    s.db[a[1]] = o
  else
    o = writable(s, a[1], o)
  end
  local n = 0
  for i = 2, #a, 2 do
    if o.v[a[i]] == nil then n = n + 1 end
    o.v[a[i]] = a[i + 1]
  end
  return n
end

function cmd.HDEL(s, a)
  local o = typed(s, a[1], 'hash')
  if not o then return 0 end
  o = writable(s, a[1], o)
  local n = 0
  for i = 2, #a do
    if o.v[a[i]] ~= nil then
      o.v[a[i]] = nil
      n = n + 1
    end
  end
  if next(o.v) == nil then s.db[a[1]] = nil end
  return n
end

function cmd.ZADD(s, a)
  local i, nx = 2, false
  if string.upper(a[2]) == 'NX' then
    nx = true
    i = 3
  end
  for j = i, #a, 2 do -- the arguments first, then the key's type (as Redis)
    if not tonumber(a[j]) then err('ERR value is not a valid float') end
  end
  local o = typed(s, a[1], 'zset')
  if o then o = writable(s, a[1], o) end
  local n = 0
  for j = i, #a, 2 do
    local sc = tonumber(a[j])
    if not o then
      o = {type = 'zset', v = {}, gen = s.gen}
      s.db[a[1]] = o
    end
    if o.v[a[j + 1]] == nil then
      o.v[a[j + 1]] = sc
      n = n + 1
    elseif not nx then
      o.v[a[j + 1]] = sc
    end
  end
  return n
end

function cmd.ZRANGE(s, a)
  local from, to = toint(a[2]), toint(a[3])
  if not from or not to then err(NOTINT) end
  local o = typed(s, a[1], 'zset')
  if not o then return {} end
  local list = zsorted(o.v)
  local len = #list
  if from < 0 then from = len + from end
  if to < 0 then to = len + to end
  if from < 0 then from = 0 end
  local out = {}
  for j = from, math.min(to, len - 1) do out[#out + 1] = list[j + 1] end
  return out
end

function cmd.ZCARD(s, a)
  local o = typed(s, a[1], 'zset')
  if not o then return 0 end
  local n = 0
  for _ in pairs(o.v) do n = n + 1 end
  return n
end

function cmd.ZREM(s, a)
  local o = typed(s, a[1], 'zset')
  if not o then return 0 end
  o = writable(s, a[1], o)
  local n = 0
  for i = 2, #a do
    if o.v[a[i]] ~= nil then
      o.v[a[i]] = nil
      n = n + 1
    end
  end
  if next(o.v) == nil then s.db[a[1]] = nil end
  return n
end

function cmd.TIME(s, a)
  local us = s.now_us
  local sec = floor(us / 1000000)
  return {numstr(sec), numstr(us - sec * 1000000)}
end

function cmd.PUBLISH(s, a)
  local p = s.published
  p[#p + 1] = {channel = a[1], message = a[2]}
  return 0 -- receivers are not known to the model; no script reads it
end

M.commands = cmd

-- Runs one command: name and arguments as Lua values (numbers converted the
-- way Redis converts them). Returns the reply as Redis's Lua sees it, or
-- raises {err = message}.
-- (The arguments in a table a of n values.)
local function run_cmd(s, name, a, n)
  local f = cmd[name] -- (the scripts spell commands in capitals: no upper() then)
  if not f then
    f = type(name) == 'string' and cmd[string.upper(name)]
    if not f then err('ERR unknown command \'' .. tostring(name) .. '\'') end
  end
  for i = 1, n do
    local v = a[i]
    local t = type(v)
    if t ~= 'string' then
      if t == 'number' then
        a[i] = numstr(v)
      else
        err('ERR Lua redis lib command arguments must be strings or integers')
      end
    end
  end
  return f(s, a)
end

function M.call(s, name, ...)
  return run_cmd(s, name, {...}, select('#', ...))
end

-- A script's return value as the reply a client would read: integers,
-- strings, nil, arrays, {err=}, {ok=}.
local function to_reply(v)
  local t = type(v)
  if t == 'number' then
    if v >= 0 then return floor(v) end
    return -floor(-v)
  elseif t == 'string' then
    return v
  elseif t == 'boolean' then
    return v and 1 or nil
  elseif t == 'table' then
    if v.err then return {err = v.err} end
    if v.ok then return {ok = v.ok} end
    local out = {n = 0}
    local i = 1
    while v[i] ~= nil do
      out[i] = to_reply(v[i])
      out.n = i
      i = i + 1
    end
    return out
  end
  return nil
end
M.to_reply = to_reply

-- Scripts: compiled once from their text; run with a fresh environment.
local base = {
  string = string, math = math, table = table, tonumber = tonumber,
  tostring = tostring, type = type, pairs = pairs, ipairs = ipairs,
  select = select, unpack = unpack, error = error, pcall = pcall,
  next = next, assert = assert,
}

function M.compile(text, chunkname)
  local f, e = loadstring(text, chunkname)
  if not f then error('compiling ' .. chunkname .. ': ' .. e) end
  return f
end

-- Runs compiled script f on server s at server time now_us (microseconds),
-- with KEYS and ARGV (strings). Returns the reply (see to_reply); an error
-- inside the script is the reply {err = ...}, as EVALSHA returns it.
-- Redis runs no other command meanwhile; the script sees one instant.
function M.run(s, f, keys, argv, now_us)
  s.now_us = now_us
  s.now_ms = floor(now_us / 1000)
  local env = s.env
  if not env then
    -- made once per server: only KEYS and ARGV change from one run to the next
    local redis = {
      call = function(name, ...) return run_cmd(s, name, {...}, select('#', ...)) end,
      pcall = function(...)
        local ok, r = pcall(M.call, s, ...)
        if ok then return r end
        if type(r) == 'table' then return r end
        return {err = tostring(r)}
      end,
      error_reply = function(m) return {err = m} end,
      status_reply = function(m) return {ok = m} end,
    }
    env = setmetatable({KEYS = false, ARGV = false, redis = redis}, {
      __index = base,
      __newindex = function(_, k)
        error('Script attempted to create global variable ' .. tostring(k), 2)
      end,
    })
    s.env = env
  end
  rawset(env, 'KEYS', keys)
  rawset(env, 'ARGV', argv)
  setfenv(f, env)
  local hook = M.line_hook -- sim --coverage: only while a script runs
  if hook then debug.sethook(hook, 'l') end
  local ok, r = pcall(f)
  if hook then debug.sethook() end
  if not ok then
    if type(r) == 'table' and r.err then return {err = r.err} end
    return {err = 'ERR user_script: ' .. tostring(r)}
  end
  return to_reply(r)
end

-- A deep copy of the data (for replicas and restarts with persistence).
function M.copy_db(db)
  local out = {}
  for k, o in pairs(db) do out[k] = copy_obj(o) end
  return out
end

-- The data in a readable form: one line per live key, sorted.
-- It only looks: an expired key stays until a command or the checker
-- reads it, as it would without a trace (a traced run is the same run).
function M.dump(s)
  local keys = {}
  for k, o in pairs(s.db) do
    if not (o.exp and s.now_ms > o.exp) then keys[#keys + 1] = k end
  end
  table.sort(keys)
  local lines = {}
  for _, k in ipairs(keys) do
    local o = s.db[k]
    local v
    if o.type == 'string' then
      v = o.v
    elseif o.type == 'hash' then
      local fs = {}
      for f in pairs(o.v) do fs[#fs + 1] = f end
      table.sort(fs)
      local parts = {}
      for _, f in ipairs(fs) do parts[#parts + 1] = f .. '=' .. o.v[f] end
      v = '{' .. table.concat(parts, ' ') .. '}'
    else
      local parts = {}
      for _, m in ipairs(zsorted(o.v)) do parts[#parts + 1] = m .. ':' .. numstr(o.v[m]) end
      v = '[' .. table.concat(parts, ' ') .. ']'
    end
    lines[#lines + 1] = string.format('%s = %s%s', k, v,
      o.exp and string.format(' (pttl %d)', o.exp - s.now_ms) or '')
  end
  return lines
end

M.numstr = numstr
return M
