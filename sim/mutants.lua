-- Mutants of the scripts (protocol 1's lua/, or with protocol = 2
-- lua/p2/, which sim runs with --protocol 2), and of the client model
-- (file 'client': sim/client.lua): each one a small change that brings back a bug
-- this project had, or could have. sim --mutant NAME runs the simulator on
-- the mutated scripts; sim/test-mutants checks that every one is caught
-- (a violation) within its budget of schedules from seed 1 (or `seed`). A mutant whose text no longer occurs in
-- its script fails loudly: mend it here when the script changes.
local M = {}

M.list = {
  {
    name = 'late_attempt_displaces_grant',
    schedules = 200,
    why = 'an attempt older than one Redis recorded is granted (no stale check)',
    file = 'acquire', find = 'if attempt < seen or attempt == tonumber(ratt) then',
    replace = 'if false then',
  },
  {
    name = 'release_without_owner_check',
    schedules = 200,
    why = 'a release deletes the lease whoever owns it',
    file = 'release', find = "if lease[1] ~= me or id ~= ARGV[3] then",
    replace = "if not lease[1] then",
  },
  {
    name = 'renewal_of_another_grant',
    schedules = 400,
    why = "a renewal extends a lease by the client's id alone, whatever its grant",
    file = 'renew', find = 'if lease[1] == ARGV[1] and lease[2] == ARGV[i + 2] and',
    replace = 'if lease[1] == ARGV[1] and',
  },
  {
    name = 'direct_grant_reservation_in_fence',
    schedules = 500,
    why = "a direct grant puts the waiter's reservation in the fence (before 0.3): "
      .. 'a dead waiter pushes the next token ahead of server time, a restart undercuts it',
    file = 'release', find = "    redis.call('HSET', KEYS[1], 'owner', h, 'token', tok, 'nonce', att, 'pl', pl,",
    replace = "    redis.call('SET', KEYS[2], string.format('%.0f', tonumber(tok) + tonumber(pl)), 'PX', "
      .. "math.max(tonumber(ARGV[4]), math.floor((tonumber(tok) + tonumber(pl) - now_us) / 1000) + 2))\n"
      .. "    redis.call('HSET', KEYS[1], 'owner', h, 'token', tok, 'nonce', att, 'pl', pl,",
  },
  {
    name = 'direct_grant_ignores_last',
    schedules = 200,
    why = "a direct grant takes server time alone, not above the released grant's last token",
    file = 'release', find = 'if now_us <= last then',
    replace = 'if false then',
  },
  {
    name = 'late_leave_frees_newer_grant',
    schedules = 200,
    why = 'a leave frees a lease the client holds under a newer attempt',
    file = 'leave', find = 'if live and lease[1] == me and (tonumber(lease[2]) or 0) < n then',
    replace = 'if live and lease[1] == me then',
  },
  {
    name = 'grant_over_live_lease',
    schedules = 200,
    why = "an acquire grants a name whose lease another client holds",
    file = 'acquire', find = 'if lease[1] and not mine then',
    replace = 'if false then',
  },
  {
    name = 'queue_without_expiry',
    schedules = 200,
    why = "the wait queue's keys are written without an expiry",
    file = 'acquire', find = "    if redis.call('PTTL', KEYS[k]) < 2 * ttl then",
    replace = '    if false then',
  },
  {
    name = 'unclean_end_forgotten',
    schedules = 400,
    why = "a release for a thread that exited (or an operator's) leaves no word of it in the fence: "
      .. 'the next holder is not told (dlock_unclean)',
    file = 'acquire', find = "local ended = tonumber(string.match(got[2] or '', ' (%d)$') or '0')",
    replace = 'local ended = 0',
  },
  {
    name = 'direct_grant_unclean_forgotten',
    schedules = 400,
    why = 'a direct grant after a release for a thread that exited does not carry the word',
    file = 'release', find = "      redis.call('HSET', KEYS[1], 'u', tostring(ended))",
    replace = '',
  },
  {
    name = 'mark_ignored',
    schedules = 500,
    why = "a grant takes no account of its slot's mark: a step back of the clock larger "
      .. "than a name's fence lives sends tokens back (protocol 1 before the mark)",
    file = 'acquire', find = 'local mark = tonumber(mtok) or 0',
    replace = 'local mark = 0',
  },
  {
    name = 'mark_not_written',
    schedules = 500,
    why = "a grant does not raise its slot's mark",
    file = 'acquire', find = "redis.call('SET', KEYS[7], tok .. ' ' .. t[1] .. us6 .. ' ' .. pl)",
    replace = '',
  },
  {
    name = 'mark_without_reservation',
    schedules = 6000,
    why = "after a step back a grant goes above the mark's token only, not its pass limit: "
      .. 'the local handoffs of a grant that expired unreleased are undercut',
    file = 'acquire', find = '  mark = mark + tonumber(mpl)',
    replace = '',
  },
  -- The client model (sim/client.lua): the C client's own mutants are in
  -- scripts/client-mutants.lua, checked by scripts/check-client.
  {
    name = 'client_answered_too_late_taken',
    schedules = 400,
    why = 'a grant whose answer came after its validity ran out is taken',
    file = 'client', find = 'if C.too_late(c.s, sent, cnow(c)) then',
    replace = 'if false then',
  },
  {
    name = 'client_handoff_not_rechecked',
    schedules = 800,
    why = 'a lease passed to a thread is taken when it runs, valid or not',
    file = 'client', find = 'if not C.takes(e, cnow(c)) then',
    replace = 'if false then',
  },
  {
    name = 'client_direct_grant_from_message',
    schedules = 600,
    why = "a direct grant's validity counted from when its message is read, not from the send "
      .. 'of the try it names',
    file = 'client', find = 'local valid = C.direct_valid(c.s, e.try_sent)',
    replace = 'local valid = C.direct_valid(c.s, now)',
  },
  {
    name = 'client_pass_limit_off_by_one',
    schedules = 400,
    why = 'one local handoff more than the pass limit (beyond the tokens the grant reserved)',
    file = 'client', find = 'return waiting and e.passes < s.pass_limit and',
    replace = 'return waiting and e.passes <= s.pass_limit and',
  },
  {
    name = 'client_clock_rule_skipped',
    schedules = 400,
    why = 'local handoffs faster than the clock rule (tokens ahead of server time)',
    file = 'client', find = "local clock_ok = s.local_rule ~= 'clock' or C.in_time(e.passes, now - e.grant_at)",
    replace = 'local clock_ok = true',
  },
  {
    name = 'client_wait_ignored',
    schedules = 600,
    why = 'a grant WAIT confirmed on fewer than min_replicas replicas is taken',
    file = 'client', find = 'if granted == 1 and c.s.min_replicas > 0 and (acked or 0) < c.s.min_replicas then',
    replace = 'if false then',
  },
  -- Protocol 2's scripts (lua/p2/, run with sim --protocol 2): the same
  -- bugs in its layout, and its own (the hash's expiry).
  {
    name = 'p2_late_attempt_displaces_grant', protocol = 2,
    schedules = 300,
    why = 'an attempt older than one Redis recorded is granted (no stale check)',
    file = 'acquire', find = 'if attempt < seen or attempt == tonumber(ratt) then',
    replace = 'if false then',
  },
  {
    name = 'p2_release_without_owner_check', protocol = 2,
    schedules = 200,
    why = 'a release empties the grant whoever owns it',
    file = 'release', find = 'if owner ~= me or id ~= ARGV[3] then',
    replace = 'if not owner then',
  },
  {
    name = 'p2_renewal_of_another_grant', protocol = 2,
    schedules = 400,
    why = "a renewal extends a lease by the client's id alone, whatever its grant",
    file = 'renew', find = 'if tok and h[3] == ARGV[1] and tok == ARGV[i + 2] and',
    replace = 'if tok and h[3] == ARGV[1] and',
  },
  {
    name = 'p2_late_leave_frees_newer_grant', protocol = 2,
    schedules = 300,
    why = 'a leave frees a lease the client holds under a newer attempt',
    file = 'leave', find = 'if live and owner == me and tonumber(nonce) < n then',
    replace = 'if live and owner == me then',
  },
  {
    name = 'p2_unclean_end_forgotten', protocol = 2,
    schedules = 300,
    why = "a release for a thread that exited leaves no word of it (field u) for the next grant",
    file = 'release', find = "redis.call('HSET', KEYS[1], 'g', '', rk, rv, 'u', uv)",
    replace = "redis.call('HSET', KEYS[1], 'g', '', rk, rv)",
  },
  {
    name = 'p2_mark_not_written', protocol = 2,
    schedules = 300,
    why = "a grant leaves the slot's mark as it was: after a step back of the clock a later "
      .. 'grant goes below its token',
    file = 'acquire', find = "redis.call('SET', KEYS[7], gt .. ' ' .. t[1] .. us6 .. ' ' .. mp)",
    replace = "local _ = mp",
  },
  {
    name = 'p2_grant_over_live_lease', protocol = 2,
    schedules = 200,
    why = "an acquire grants a name whose lease another client holds",
    file = 'acquire', find = 'if owner and not mine then',
    replace = 'if false then',
  },
  {
    name = 'p2_new_hash_without_expiry', protocol = 2,
    schedules = 200,
    why = 'a new hash gets no time to live: PEXPIRE ... GT alone leaves a key without one as it is',
    file = 'acquire', find = "  redis.call('PEXPIRE', KEYS[1], life)\n",
    replace = "  redis.call('PEXPIRE', KEYS[1], life, 'GT')\n",
  },
}

function M.find(name)
  for _, m in ipairs(M.list) do
    if m.name == name then return m end
  end
end

-- Applies a mutant of the client model (file 'client': sim/client.lua, in
-- directory dir) to the loaded module, in place: the world calls the
-- mutated functions.
function M.apply_client(m, dir)
  local f = assert(io.open(dir .. '/client.lua', 'rb'))
  local text = f:read('*a')
  f:close()
  local i, j = string.find(text, m.find, 1, true)
  if not i then
    error(string.format('mutant %s: its text is no longer in sim/client.lua: mend sim/mutants.lua',
      m.name), 0)
  end
  if string.find(text, m.find, j + 1, true) then
    error(string.format('mutant %s: its text occurs twice in sim/client.lua', m.name), 0)
  end
  local chunk = assert(loadstring(text:sub(1, i - 1) .. m.replace .. text:sub(j + 1),
    '@' .. dir .. '/client.lua'))
  local mutated, C = chunk(), require('client')
  for k, v in pairs(mutated) do C[k] = v end
end

-- Applies m to the scripts' texts (a table: script name -> text).
function M.apply(m, texts)
  local text = texts[m.file]
  local i, j = string.find(text, m.find, 1, true)
  if not i then
    error(string.format('mutant %s: its text is no longer in lua/%s%s.lua: mend sim/mutants.lua',
      m.name, m.protocol == 2 and 'p2/' or '', m.file), 0)
  end
  if string.find(text, m.find, j + 1, true) then
    error(string.format('mutant %s: its text occurs twice in lua/%s%s.lua', m.name,
      m.protocol == 2 and 'p2/' or '', m.file), 0)
  end
  texts[m.file] = text:sub(1, i - 1) .. m.replace .. text:sub(j + 1)
end

return M
