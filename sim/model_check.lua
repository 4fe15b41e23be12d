-- Checks sim's model of Redis (sim/redis.lua) against a real redis-server:
-- random programs of the commands dlock's scripts call, each run as one
-- script by the real server (EVAL) and by the model, must give the same
-- text. The program serializes its own replies, so both sides encode them
-- with the same code. Also: expiry in time, and the conversions of a
-- script's return value.
--   lua5.1 sim/model_check.lua REDIS_CLI_ARGS... (sim/test-model runs it)
-- Prints one line per failure and a summary; exits 1 on any difference.
local dir = arg[0]:match('^(.*)/[^/]*$') or '.'
package.path = dir .. '/?.lua;' .. package.path
local R = require('redis')

local cli = {}
for i = 1, #arg do cli[#cli + 1] = "'" .. arg[i]:gsub("'", "'\\''") .. "'" end
cli = 'redis-cli ' .. table.concat(cli, ' ')

local function sh(cmd)
  local f = assert(io.popen(cmd, 'r'))
  local out = f:read('*a')
  f:close()
  return out
end

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- The real server's answer to EVAL of text (redis-cli --raw prints a
-- string reply as it is).
local function real(text)
  return (sh(cli .. ' --raw EVAL ' .. quote(text) .. ' 0'):gsub('\n$', ''))
end

-- real(text), and the server's time (us) as the script ran: the model
-- runs the same text at that time (a time read by another call would be a
-- process start later, which on a loaded machine is enough to move a
-- pttl() across a whole second). text returns a string.
local function real_at(text)
  local out = real('local t_ = redis.call("TIME") local r_ = (function() ' .. text ..
    '\nend)() return t_[1] .. " " .. t_[2] .. "|" .. r_')
  local s, us, r = out:match('^(%d+) (%d+)|(.*)$')
  if not s then return out, 0 end
  return r, tonumber(s) * 1000000 + tonumber(us)
end

local function model(srv, text, now_us)
  local f = R.compile(text, '=program')
  local rep = R.run(srv, f, {}, {}, now_us)
  if type(rep) == 'table' and rep.err then return '(error) ' .. rep.err end
  return rep
end

-- A program: commands on a few keys, every reply recorded (errors by
-- their first word, since the texts differ between versions).
local SER = [[
local out = {}
local function ser(v)
  local t = type(v)
  if t == 'table' then
    if v.ok then return '+' .. v.ok end
    if v.err then return '-' .. v.err end
    local p = {}
    for i = 1, #v do p[i] = ser(v[i]) end
    return '[' .. table.concat(p, ',') .. ']'
  elseif t == 'boolean' then
    return v and 'T' or 'F'
  elseif t == 'number' then
    return string.format('%.17g', v)
  end
  return '"' .. tostring(v) .. '"'
end
local function rec(...)
  local ok, r = pcall(redis.call, ...)
  if ok then out[#out + 1] = ser(r) else
    local m = type(r) == 'table' and r.err or tostring(r)
    out[#out + 1] = '!' .. (string.match(m, '^(%u+)') or m)
  end
end
local function pttl(k)
  local r = redis.call('PTTL', k)
  if r < 0 then out[#out + 1] = 'P' .. r else out[#out + 1] = 'P~' .. math.floor((r + 500) / 1000) end
end
-- HGETALL compared as a set: the model gives the fields in another order
-- than Redis's hash (sorted by name, where a small hash in Redis keeps the
-- order they came in), so its pairs are sorted before they are recorded
-- (and their count, to see an odd array).
local function hgetall(k)
  local ok, r = pcall(redis.call, 'HGETALL', k)
  if ok and type(r) == 'table' and not r.ok and not r.err then
    local p = {}
    for i = 1, #r, 2 do p[#p + 1] = ser(r[i]) .. '=' .. ser(r[i + 1]) end
    table.sort(p)
    out[#out + 1] = '{' .. #r .. ':' .. table.concat(p, ',') .. '}'
  elseif ok then
    out[#out + 1] = ser(r)
  else
    local m = type(r) == 'table' and r.err or tostring(r)
    out[#out + 1] = '!' .. (string.match(m, '^(%u+)') or m)
  end
end
]]

local seed = 12345
local function rand(n)
  seed = (seed * 16807) % 2147483647
  return 1 + seed % n
end

local keys = {'k1', 'k2', 'k3', 'k4'}
local function key() return keys[rand(#keys)] end
local function val() return ({'a', 'b', '0', '17', '1700000000123456', 'x y'})[rand(6)] end
local function field() return ({'owner', 'token', 'nonce', 'pl'})[rand(4)] end
local function lit(s) return string.format('%q', s) end

-- PEXPIRE with options. Redis takes a new expiry's base from its clock as
-- each command runs, not from the script's instant: two expiries of the same
-- ms set by one script may be a ms apart, and GT or LT between them would
-- depend on it. So the ms given with options are unlike all others and each
-- other (5000 + 10000 i + 10 c, c counting them in the program: 10 ms apart
-- at least, and 400 ms or less from a whole second for pttl()); an expiry
-- equal to the key's is a fixed case below.
local nopts = 0
local function pexpire_opts()
  local ms
  local r = rand(8)
  if r <= 4 then
    ms = tostring(5000 + 10000 * (r - 1) + 10 * (nopts % 40))
    nopts = nopts + 1
  else
    ms = ({'0', '-1', 'z', '2.5'})[r - 4]
  end
  local arg = tonumber(ms) and rand(2) == 1 and ms or lit(ms)
  local opts = ({
    {'NX'}, {'XX'}, {'GT'}, {'LT'}, {'NX'}, {'XX'}, {'GT'}, {'LT'}, {'gt'}, {'lt'},
    {'XX', 'GT'}, {'lt', 'xx'}, {'GT', 'GT'}, {'NX', 'XX'}, {'NX', 'GT'}, {'GT', 'LT'},
    {'LT', 'NX'}, {'FOO'},
  })[rand(18)]
  local a = {}
  for i, o in ipairs(opts) do a[i] = lit(o) end
  local k = lit(key())
  -- most often on a key just set, with an expiry or without one
  local set = ({'rec("SET", ' .. k .. ', "v", "PX", "' .. 10000 * rand(4) .. '") ',
    'rec("SET", ' .. k .. ', "v") ', ''})[rand(3)]
  return set .. 'rec("PEXPIRE", ' .. k .. ', ' .. arg .. ', ' .. table.concat(a, ', ') .. ')'
end

local gens = {
  function() return 'rec("GET", ' .. lit(key()) .. ')' end,
  function() return 'rec("SET", ' .. lit(key()) .. ', ' .. lit(val()) .. ')' end,
  function()
    local px = ({'10000', '20000', '0', '-5', '1.5', 'x'})[rand(6)]
    if rand(3) == 1 then px = tostring(10000 * rand(4)) end
    local arg = rand(2) == 1 and lit(px) or (tonumber(px) and px or lit(px))
    return 'rec("SET", ' .. lit(key()) .. ', ' .. lit(val()) .. ', "PX", ' .. arg .. ')'
  end,
  function() return 'rec("MGET", ' .. lit(key()) .. ', ' .. lit(key()) .. ', ' .. lit(key()) .. ')' end,
  function() return 'rec("DEL", ' .. lit(key()) .. ')' end,
  function() return 'rec("DEL", ' .. lit(key()) .. ', ' .. lit(key()) .. ')' end,
  function() return 'rec("EXISTS", ' .. lit(key()) .. ', ' .. lit(key()) .. ')' end,
  function() return 'pttl(' .. lit(key()) .. ')' end,
  function()
    local ms = ({'10000', '30000', '0', '-1', 'z', '2.5'})[rand(6)]
    local arg = tonumber(ms) and rand(2) == 1 and ms or lit(ms)
    return 'rec("PEXPIRE", ' .. lit(key()) .. ', ' .. arg .. ')'
  end,
  pexpire_opts,
  pexpire_opts,
  function() return 'rec("HGET", ' .. lit(key()) .. ', ' .. lit(field()) .. ')' end,
  function() return 'rec("HMGET", ' .. lit(key()) .. ', ' .. lit(field()) .. ', ' .. lit(field()) .. ')' end,
  function()
    return 'rec("HSET", ' .. lit(key()) .. ', ' .. lit(field()) .. ', ' .. lit(val()) .. ', '
      .. lit(field()) .. ', ' .. lit(val()) .. ')'
  end,
  function() return 'rec("HSET", ' .. lit(key()) .. ', ' .. lit(field()) .. ')' end,
  function() return 'rec("HDEL", ' .. lit(key()) .. ', ' .. lit(field()) .. ')' end,
  function() return 'rec("HLEN", ' .. lit(key()) .. ')' end,
  function() return 'hgetall(' .. lit(key()) .. ')' end,
  function()
    local sc = ({'1700000000123456', '5', '5', '-3', '2.5', 'nan?'})[rand(6)]
    return 'rec("ZADD", ' .. lit(key()) .. ', "NX", ' .. lit(sc) .. ', ' .. lit(val()) .. ')'
  end,
  function() return 'rec("ZADD", ' .. lit(key()) .. ', ' .. rand(9) .. ', ' .. lit(val()) .. ')' end,
  function()
    local a, b = ({'0', '1', '-1', '-2'})[rand(4)], ({'0', '-1', '2', 'q'})[rand(4)]
    return 'rec("ZRANGE", ' .. lit(key()) .. ', ' .. lit(a) .. ', ' .. lit(b) .. ')'
  end,
  function() return 'rec("ZREM", ' .. lit(key()) .. ', ' .. lit(val()) .. ')' end,
  function() return 'rec("ZCARD", ' .. lit(key()) .. ')' end,
  function() return 'rec("PUBLISH", "sim-model-check", ' .. lit(val()) .. ')' end,
  function() return 'rec("TYPE", ' .. lit(key()) .. ')' end,
}

local failures, programs = 0, 0
local function check(name, text, want_real, got_model)
  programs = programs + 1
  if want_real ~= got_model then
    failures = failures + 1
    io.stdout:write('DIFFERENT: ' .. name .. '\n  program: ' .. text:gsub('\n', '\n           ')
      .. '\n  redis:   ' .. tostring(want_real) .. '\n  model:   ' .. tostring(got_model) .. '\n')
  end
end

-- The model needs TYPE only for this check (no script calls it).
R.commands.TYPE = function(s, a)
  local o = R.live(s, a[1])
  return {ok = o and o.type or 'none'}
end

-- The server's time, to run the model at it.
local function server_us()
  local out = sh(cli .. ' --raw TIME')
  local s, us = out:match('(%d+)\n(%d+)')
  return tonumber(s) * 1000000 + tonumber(us)
end

local N = tonumber(os.getenv('SIM_MODEL_PROGRAMS') or '300')
for p = 1, N do
  sh(cli .. ' FLUSHALL')
  local srv = R.new()
  local lines = {SER}
  nopts = 0
  for _ = 1, 10 + rand(30) do lines[#lines + 1] = gens[rand(#gens)]() end
  lines[#lines + 1] = "return table.concat(out, ' ')"
  local text = table.concat(lines, '\n')
  local want, at = real_at(text)
  local got = model(srv, text, at)
  check('program ' .. p, text, want, got)
  -- the data left behind, key by key
  local dump = SER .. [[
for _, k in ipairs({'k1', 'k2', 'k3', 'k4'}) do
  local t = redis.call('TYPE', k).ok
  if t == 'string' then rec('GET', k)
  elseif t == 'hash' then rec('HMGET', k, 'owner', 'token', 'nonce', 'pl') rec('HLEN', k) hgetall(k)
  elseif t == 'zset' then rec('ZRANGE', k, 0, -1) end
  out[#out + 1] = t
  pttl(k)
end
return table.concat(out, ' ')]]
  local left, at2 = real_at(dump)
  check('data after program ' .. p, text, left, model(srv, dump, at2))
end

-- Expiry in time: a key set to live 50 ms is there at once and gone 150 ms
-- later, on both.
do
  sh(cli .. ' FLUSHALL')
  local srv = R.new()
  local set = SER .. [[rec('SET', 'k1', 'v', 'PX', 50) rec('HSET', 'k2', 'f', 'v')
rec('PEXPIRE', 'k2', 50) rec('EXISTS', 'k1', 'k2') return table.concat(out, ' ')]]
  local t0 = server_us()
  check('expiry: set', set, real(set), model(srv, set, t0))
  sh('sleep 0.15')
  local look = SER .. [[rec('EXISTS', 'k1', 'k2') rec('GET', 'k1') pttl('k2') return table.concat(out, ' ')]]
  check('expiry: 150 ms later', look, real(look), model(srv, look, t0 + 150000))
end

-- PEXPIRE's options where the random programs do not look: an expiry equal
-- to the key's (GT and LT both refuse it), and the errors' whole texts
-- (Redis 7.0's), with HLEN and HGETALL on a missing key and on other types.
-- Two expiries are equal on the real server only if its clock stays in one
-- ms (see pexpire_opts): the program says 'again' if TIME moved to another
-- ms meanwhile, and is run again.
do
  local text = SER .. [[
local function ms() local t = redis.call('TIME') return t[1] .. math.floor(t[2] / 1000) end
local function all(...)
  local ok, r = pcall(redis.call, ...)
  if ok then out[#out + 1] = ser(r) else out[#out + 1] = '!' .. (type(r) == 'table' and r.err or tostring(r)) end
end
local t0 = ms()
redis.call('SET', 'k1', 'v', 'PX', 10000)
rec('PEXPIRE', 'k1', 10000, 'GT') rec('PEXPIRE', 'k1', 10000, 'LT') rec('PEXPIRE', 'k1', '10000', 'xx', 'gt')
redis.call('HSET', 'k2', 'f', 'v')
rec('PEXPIRE', 'k2', 20000) rec('PEXPIRE', 'k2', 20000, 'GT') rec('PEXPIRE', 'k2', 20000, 'LT')
rec('PEXPIRE', 'k2', 20000, 'NX') rec('PEXPIRE', 'k2', 20000, 'XX')
if ms() ~= t0 then return 'again' end
pttl('k1') pttl('k2')
all('PEXPIRE', 'k1', 10, 'NX', 'XX') all('PEXPIRE', 'k1', 10, 'gt', 'nx') all('PEXPIRE', 'k1', 10, 'LT', 'GT')
all('PEXPIRE', 'k1', 10, 'GT', 'LT', 'NX') all('PEXPIRE', 'k1', 10, 'Foo') all('PEXPIRE', 'nope', 'x', 'bar')
all('PEXPIRE', 'k1', 'x', 'nx', 'xx') all('PEXPIRE', 'k1', 'x', 'XX') all('PEXPIRE', 'nope', 10, 'XX')
redis.call('SET', 'k3', 'v') redis.call('ZADD', 'k4', 1, 'm')
all('PEXPIRE', 'k3', 0, 'GT') all('PEXPIRE', 'k3', 0, 'XX') all('EXISTS', 'k3')
all('PEXPIRE', 'k3', -1, 'LT') all('EXISTS', 'k3') redis.call('SET', 'k3', 'v')
all('HLEN', 'k3') all('HLEN', 'k4') all('HLEN', 'nope') all('HGETALL', 'k3') all('HGETALL', 'k4') all('HGETALL', 'nope')
all('HLEN', 'k2') all('HGETALL', 'k2')
return table.concat(out, ' ')]]
  local want
  for _ = 1, 50 do
    sh(cli .. ' FLUSHALL')
    want = real(text)
    if want ~= 'again' then break end
  end
  check('PEXPIRE options, HLEN, HGETALL', text, want, model(R.new(), text, server_us()))
end

-- A script's return value, converted: numbers truncated to integers, an
-- array up to its first nil, false as a nil reply, true as 1.
do
  local text = "return {1, 2.7, -2.7, 'x', {3, 'y'}, true, false, 9}"
  local srv = R.new()
  local r = R.run(srv, R.compile(text, '=ret'), {}, {}, server_us())
  local function flat(v)
    if type(v) == 'table' then
      local p = {}
      for i = 1, v.n or #v do p[i] = flat(v[i]) end
      return table.concat(p, '\n')
    end
    return tostring(v == nil and '' or v)
  end
  check('return conversions', text, real(text), flat(r))
end

io.stdout:write(string.format('model check: %d comparisons, %d different\n', programs, failures))
os.exit(failures == 0 and 0 or 1)
