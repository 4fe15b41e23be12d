-- The keys of one lock name, in the order every script of lua/ takes them
-- (KEYS[1] .. KEYS[7]): each of the first six is "<prefix>{<name>}"
-- followed by its suffix, CLIENT's by the client's id too; HW is
-- "<prefix>hw:{<tag>}", the high-water mark of the fencing tokens of every
-- name in the name's hash slot, where tag is the slot's tag (the smallest
-- decimal number whose CRC16 falls in that slot: src/common/slot.h). It
-- has no expiry: at most 16384 per prefix. The one table of them: the library
-- and dlockctl take theirs from it at build time (cmake/embed_lua.cmake
-- generates keys_gen.h: DLOCK_KEY_* and DLOCK_KEY_SUFFIXES), the simulator
-- reads it (sim/client.lua). Changing it changes the protocol
-- (docs/design.md, "Protocol versions").
return {
  {'LEASE', ''},       -- hash: the grant (owner, token, nonce, pl, exp, pv, ...)
  {'FENCE', ':fence'}, -- the last token a released grant handed out
  {'QUEUE', ':q'},     -- zset: the waiting clients by arrival
  {'LIVE', ':qd'},     -- hash: per waiting client, its liveness deadline and grant fields
  {'TURN', ':turn'},   -- the client whose turn it is
  {'CLIENT', ':c:'},   -- + client id: what Redis remembers of one client for the name
  {'HW', 'hw:'},       -- <prefix>hw:{<tag>}: no grant in the slot hands out a token above it
}
