-- The worlds' random streams (sim/world.lua, sim/sem.lua,
-- sim/redlock.lua): a Park-Miller generator, the same on every machine
-- and interpreter, unlike math.random. rng.seed(n) is a stream's first
-- state; rng.mixin(W) gives a world's class W:rand() (in [0, 1), from
-- self.rs) and W:rint(a, b) (an integer in a..b).
local floor = math.floor
local M31 = 2147483647

local rng = {M31 = M31}

function rng.seed(seed)
  local s = (seed * 48271 + 12345) % M31
  if s == 0 then s = 1 end
  for _ = 1, 3 do s = (s * 16807) % M31 end
  return s
end

function rng.mixin(W)
  function W:rand()
    self.rs = (self.rs * 16807) % M31
    return self.rs / M31
  end
  function W:rint(a, b)
    if b <= a then return a end
    return a + floor(self:rand() * (b - a + 1))
  end
end

return rng
