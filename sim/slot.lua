-- Hash slots as Redis Cluster computes them (CRC16/XMODEM of the key's hash
-- tag), and a slot's tag: the smallest decimal number whose CRC16 falls in
-- it, as src/common/slot.c computes them for the high-water key
-- "<prefix>hw:{<tag>}" (lua/keys.lua, HW). Plain arithmetic, so that
-- lua5.1 and LuaJIT agree.
local S = {}
local floor = math.floor

-- XOR of two bytes, from a table built once.
local X = {}
for a = 0, 255 do
  for b = 0, 255 do
    local r, bit, x, y = 0, 1, a, b
    for _ = 1, 8 do
      if x % 2 ~= y % 2 then r = r + bit end
      x, y, bit = floor(x / 2), floor(y / 2), bit * 2
    end
    X[a * 256 + b] = r
  end
end
local function xor16(a, b)
  return X[floor(a / 256) * 256 + floor(b / 256)] * 256 + X[(a % 256) * 256 + b % 256]
end

local T = {} -- CRC16 of each byte value, MSB first, polynomial 0x1021
for i = 0, 255 do
  local crc = i * 256
  for _ = 1, 8 do
    if crc >= 32768 then crc = xor16((crc * 2) % 65536, 0x1021) else crc = (crc * 2) % 65536 end
  end
  T[i] = crc
end

function S.crc16(s)
  local crc = 0
  for i = 1, #s do
    crc = xor16((crc * 256) % 65536, T[X[floor(crc / 256) * 256 + s:byte(i)]])
  end
  return crc
end

-- The hash slot of key (Redis' keyHashSlot).
function S.of(key)
  local open = key:find('{', 1, true)
  if open then
    local close = key:find('}', open + 1, true)
    if close and close > open + 1 then return S.crc16(key:sub(open + 1, close - 1)) % 16384 end
  end
  return S.crc16(key) % 16384
end

-- The tag of a slot, found by counting up once for all slots asked for.
local tags, next_n = {}, 0
function S.tag(slot)
  while not tags[slot] do
    local s = tostring(next_n)
    local k = S.crc16(s) % 16384
    if not tags[k] then tags[k] = s end
    next_n = next_n + 1
  end
  return tags[slot]
end

return S
