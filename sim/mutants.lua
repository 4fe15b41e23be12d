-- Mutants of the scripts (protocol 1's lua/, or with protocol = 2
-- lua/p2/, which sim runs with --protocol 2), and of the client model
-- (file 'client': sim/client.lua; with protocol = 'mixed' run in mixed
-- worlds, sim --protocol mixed): each one a small change that brings back a bug
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
    schedules = 4000, seed = 16,
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
  -- The client's rule for two protocols (sim/client.lua, its head), run in
  -- mixed worlds (sim --protocol mixed, protocol = 'mixed'): a grant
  -- addressed in a protocol it is not in, or a give-back done while its
  -- grant stands, is caught by `proto`.
  {
    name = 'client_release_in_setting', protocol = 'mixed',
    schedules = 100,
    why = "a release sent first in the client's setting's protocol, not its grant's (refused, and "
      .. 'then sent again in the grant\'s)',
    file = 'client', find = 'local proto, resent = e.gproto, false',
    replace = 'local proto, resent = c.protocol, false',
  },
  {
    name = 'client_renewal_in_setting', protocol = 'mixed',
    schedules = 200,
    why = "every renewal sent in the client's setting's protocol, not its grant's",
    file = 'client', find = 'local p = e.gproto or c.protocol',
    replace = 'local p = c.protocol',
  },
  {
    name = 'client_direct_grant_in_try_protocol', protocol = 'mixed',
    schedules = 400,
    why = "a direct grant taken in the protocol its named try was sent in, not the one of the "
      .. 'release that made it (its message: g/u or G/U): a waiter queued by a protocol 1 try and '
      .. 'granted by a protocol 2 release after the name moved renews and releases it in protocol 1',
    file = 'client', find = 'take_grant(c, e, e.poller, m.token, valid, m.unclean, m.proto)',
    replace = 'take_grant(c, e, e.poller, m.token, valid, m.unclean, e.queue_proto)',
  },
  {
    name = 'client_giveback_never_switches', protocol = 'mixed',
    seed = 5, schedules = 1500,
    why = 'a give-back refused as the other protocol\'s data is done: a direct grant made under '
      .. "its attempt's queue entry by the other protocol's release is left to expire",
    file = 'client', find = "if other and (j.kind == 'giveback' or not j.switched) then",
    replace = "if other and j.kind == 'leave' and not j.switched then",
  },
  {
    name = 'client_giveback_switches_once', protocol = 'mixed',
    schedules = 300,
    why = 'a give-back refused as the other protocol\'s data is tried in that one once, and done '
      .. 'when refused again: a late copy of its attempt granted meanwhile in the protocol it was '
      .. 'sent in is left to expire',
    file = 'client', find = "if other and (j.kind == 'giveback' or not j.switched) then",
    replace = 'if other and not j.switched then',
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
    file = 'acquire', find = "redis.call('SET', KEYS[7], mt .. ' ' .. t[1] .. us6 .. ' ' .. mp)",
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
  -- The shared mode of protocol 2 (lua/p2/LAYOUT.txt, "Shared mode"; run
  -- in the shared worlds, sim --protocol 2 --shared F, F the mutant's
  -- `shared`): what each rule of its scripts keeps from happening.
  {
    name = 'p2s_writer_preference_dropped', protocol = 2, shared = 0.5,
    schedules = 200,
    why = 'a shared acquire is granted with a live exclusive waiter ahead of it: writers starve',
    file = 'acquire_shared', find = "        if not string.match(d, '^%d+ %d+ s ') then",
    replace = '        if false then',
  },
  {
    name = 'p2s_shared_beside_live_grant', protocol = 2, shared = 0.5,
    schedules = 200,
    why = 'a shared acquire is granted while another client holds the live exclusive grant',
    file = 'acquire_shared', find = 'if owner then\n  pttl = tonumber(exp) - now_ms + 1',
    replace = 'if false then\n  pttl = tonumber(exp) - now_ms + 1',
  },
  {
    name = 'p2s_exclusive_beside_shared', protocol = 2, shared = 0.5,
    schedules = 200,
    why = 'an exclusive acquire is granted while shared leases live (r ignored)',
    file = 'acquire', find = 'elseif shared then\n  pttl = shared - now_ms + 1',
    replace = 'elseif false then\n  pttl = shared - now_ms + 1',
  },
  {
    name = 'p2s_token_not_above_last', protocol = 2, shared = 0.5,
    schedules = 200,
    why = 'a shared grant takes server time alone, not max(now, last + 1): after a step back of '
      .. 'the clock its token goes below tokens handed out before it',
    file = 'acquire_shared', find = '  if token <= last then',
    replace = '  if false then',
  },
  {
    name = 'p2s_mark_not_written', protocol = 2, shared = 0.5,
    schedules = 200,
    why = "a shared grant leaves the slot's mark as it was: after a step back of the clock a later "
      .. 'grant goes below its token',
    file = 'acquire_shared', find = "redis.call('SET', KEYS[7], gt .. ' ' .. t[1] .. us6 .. ' ' .. (mpl or '0'))",
    replace = 'local _ = mpl',
  },
  {
    name = 'p2s_release_keeps_field', protocol = 2, shared = 0.5,
    schedules = 200,
    why = "a shared release leaves its lease's field s:<id>: the name is granted to a writer beside it",
    file = 'release_shared', find = 'local del, life, reply = {sk}, keep, 1',
    replace = 'local del, life, reply = {}, keep, 1',
  },
  {
    name = 'p2s_release_frees_beside_readers', protocol = 2, shared = 0.5,
    schedules = 200,
    why = 'the release of a shared lease grants the next waiter while other shared leases live',
    file = 'release_shared', find = 'if not rmax and queued then',
    replace = 'if queued then',
  },
  {
    name = 'p2s_expired_grant_kept', protocol = 2, shared = 0.5,
    schedules = 200, seed = 2,
    why = 'a shared grant leaves an expired exclusive grant in g: after a step back of the clock '
      .. 'it counts again and is renewed beside the readers (the fault the shared worlds found)',
    file = 'acquire_shared', find = '  if tok and not owner then',
    replace = '  if false then',
  },
  {
    name = 'p2s_turn_ignored', protocol = 2, shared = 0.5,
    schedules = 200,
    why = "a shared acquire is granted in another client's live turn",
    file = 'acquire_shared', find = '  if turn and turn ~= me and live_value(turn) then',
    replace = '  if false then',
  },
  {
    name = 'p2s_run_takes_writers', protocol = 2, shared = 0.5,
    schedules = 200,
    why = "an exclusive release's run of direct shared grants goes on past an exclusive waiter, "
      .. 'granting it shared',
    file = 'release', find = "local sa, st = string.match(d, '^%d+ (%d+) s (%d+)')",
    replace = "local sa, st = string.match(d, '^%d+ (%d+) %S+ (%d+)')",
  },
  {
    name = 'p2s_end_not_told', protocol = 2, shared = 0.5,
    schedules = 200,
    why = 'a shared grant is not told how the last exclusive hold ended (field u)',
    file = 'acquire_shared', find = '      ended = tonumber(e)\n    end\n  elseif fe then',
    replace = '      ended = 0\n    end\n  elseif fe then',
  },
  {
    name = 'p2s_exclusive_by_reader_queued', protocol = 2, shared = 0.5,
    schedules = 200,
    why = 'an exclusive acquire by a client holding a live shared lease is queued, not refused '
      .. '(DLOCKMODE): behind its own lease',
    file = 'acquire', find = 'if sa and tonumber(se) >= now_ms and not owner then',
    replace = 'if false then',
  },
  {
    name = 'p2s_shared_by_writer_queued', protocol = 2, shared = 0.5,
    schedules = 200,
    why = 'a shared acquire by the client holding the live exclusive grant is queued, not refused '
      .. '(DLOCKMODE): behind its own grant',
    file = 'acquire_shared', find = 'if owner == me then',
    replace = 'if false then',
  },
  -- The two protocols side by side (run = 'mixed': sim --protocol mixed,
  -- the mutant in its protocol's scripts): a script that misreads the other
  -- protocol's data, and protocol 2's taking over of a name from protocol 1.
  {
    name = 'p1_misreads_p2', run = 'mixed',
    schedules = 200,
    why = "protocol 1's acquire does not refuse protocol 2's data: it writes its grant into "
      .. "protocol 2's hash",
    file = 'acquire', find = "if lease[9] and lease[9] ~= '1' then -- another protocol's data (Protocol, above)",
    replace = 'if false then',
  },
  {
    name = 'p2_misreads_p1', protocol = 2, run = 'mixed',
    schedules = 200,
    why = "protocol 2's acquire does not refuse protocol 1's data: it writes into protocol 1's "
      .. 'lease key',
    file = 'acquire', find = "if h[1] ~= '2' and (h[1] or redis.call('EXISTS', KEYS[1]) == 1) then",
    replace = 'if false then',
  },
  {
    name = 'p2_takeover_forgets_unclean_end', protocol = 2, run = 'mixed',
    schedules = 600,
    why = "a grant that makes protocol 2's hash is not told the end word of protocol 1's fence "
      .. '(a release for a thread that exited, an operator\'s)',
    file = 'acquire', find = "    ended = tonumber(string.match(got[3], ' (%d)$') or '0')",
    replace = '    ended = 0',
  },
  {
    name = 'p2_takeover_ignores_p1_record', protocol = 2, run = 'mixed',
    schedules = 600,
    why = "protocol 2's acquire does not read the client's protocol 1 record: a late copy of an "
      .. 'attempt older than one protocol 1 recorded is granted',
    file = 'acquire', find = "elseif got[2] then\n  a, rt, rr = string.match(got[2], '^(%d+) (%d+) (%d+)$')",
    replace = "elseif false then",
  },
  -- The counting semaphore (run = 'sem': the semaphore world, sim --sem,
  -- sim/sem.lua): its scripts (lua/p2/sem_*.lua) and its client model
  -- (file 'sem_model': sim/sem.lua, the C client's local tier).
  {
    name = 'sem_limit_check_removed', protocol = 2, run = 'sem',
    schedules = 50,
    why = 'an acquire is granted whether or not a permit is free',
    file = 'sem_acquire', find = "if at ~= 'blocked' and want <= free then",
    replace = "if at ~= 'blocked' then",
  },
  {
    name = 'sem_release_does_not_subtract', protocol = 2, run = 'sem',
    schedules = 50,
    why = "a release gives permits to the waiters without taking them from the client's field",
    file = 'sem_release', find = 'mine.n = mine.n - give\nused = used - give',
    replace = 'used = used - give',
  },
  {
    name = 'sem_takeover_adds', protocol = 2, run = 'sem',
    schedules = 50,
    why = 'an attempt that names a granted attempt in doubt adds its count instead of taking '
      .. 'that grant over',
    file = 'sem_acquire', find = "    mine.a, mine.x, mine.g = attempt, 'g', attempt\n    mine.exp = math.max(mine.exp, now + l)\n    redis.call('ZREM', KEYS[3], me)",
    replace = "    mine.a, mine.x, mine.g = attempt, 'g', attempt\n    mine.n = mine.n + want\n    mine.exp = math.max(mine.exp, now + l)\n    redis.call('ZREM', KEYS[3], me)",
  },
  {
    name = 'sem_clock_rule_removed', protocol = 2, run = 'sem',
    schedules = 200, seed = 2,
    why = 'an acquire that hands on ended permits leaves them in their field (CLOCK): a step back '
      .. 'of the server clock makes them count again beside their successors',
    file = 'sem_acquire', find = 'for _, id in ipairs(ended) do',
    replace = 'for _, id in ipairs({}) do',
  },
  {
    name = 'sem_leave_keeps_direct_grant', protocol = 2, run = 'sem',
    schedules = 200,
    why = 'a leave takes the client out of the queue but keeps a direct grant to the attempt it '
      .. 'gives up',
    file = 'sem_leave', find = 'if gave_up > 0 and gave_up < num and mine.g == gave_up and mine.n > 0 then',
    replace = 'if false then',
  },
  {
    name = 'sem_giveback_ignores_attempt', protocol = 2, run = 'sem',
    schedules = 50,
    why = "a give-back by attempt (count 0) takes the client's last grant whatever attempt it "
      .. 'names: an attempt in doubt that was refused takes away permits the client uses',
    file = 'sem_release', find = 'give = (mine.g == tonumber(ARGV[4]) and mine.n > 0) and mine.gk or 0',
    replace = 'give = (mine.n > 0) and mine.gk or 0',
  },
  {
    name = 'sem_model_spare_counted_during_giveback', run = 'sem',
    schedules = 50,
    why = "the client counts the spare permits it gives back until the release's reply: its "
      .. 'threads take them meanwhile while Redis frees them (the fault the C client had)',
    file = 'sem_model', find = "  e.held = e.held - n\n  if e.held == 0 then e.lease = 'NONE' end\n  local gen = e.gen\n  local rc = self:rpc_release(th, e, n)\n",
    replace = "  local gen = e.gen\n  local rc = self:rpc_release(th, e, n)\n  e.held = e.held - n\n  if e.held == 0 then e.lease = 'NONE' end\n",
  },
  {
    name = 'sem_model_spare_ignores_validity', run = 'sem',
    schedules = 400,
    why = 'a spare permit is taken, or passed, whatever validity the lease has left',
    file = 'sem_model', find = "if e.lease ~= 'HELD' or now + r.margin >= e.valid then return 0 end",
    replace = "if e.lease ~= 'HELD' then return 0 end",
  },
  {
    name = 'sem_model_doubt_not_named', run = 'sem',
    schedules = 50,
    why = 'a try does not name the attempt in doubt (ARGV[10] 0): a direct grant to the queued '
      .. 'attempt, or a grant whose reply was lost, is never taken over',
    file = 'sem_model', find = "tostring(k.keep_ms), k.client_name, tostring(limit), tostring(doubt), k.wake, name}",
    replace = "tostring(k.keep_ms), k.client_name, tostring(limit), '0', k.wake, name}",
  },
  {
    name = 'sem_model_count_not_from_reply', run = 'sem',
    schedules = 400, seed = 8,
    why = "a granted try adds one permit to the client's count instead of taking Redis's total "
      .. '(the reply {1, held}): permits taken over or granted unseen are miscounted',
    file = 'sem_model', find = '  e.held = held\n  e.passes = 0\n',
    replace = '  e.held = e.held + 1\n  e.passes = 0\n',
  },
  -- The Redlock world (run = 'redlock': sim --redlock, sim/redlock.lua):
  -- its quorum client (file 'redlock_model') and the mark's write-back
  -- (lua/p2/mark.lua).
  {
    name = 'redlock_handout_past_validity', run = 'redlock',
    schedules = 100,
    why = 'a token confirmed by the write-back is handed out whatever validity is left',
    file = 'redlock_model', find = 'if not ok or cnow(self, c) >= valid then',
    replace = 'if not ok then',
  },
  {
    name = 'redlock_no_writeback', run = 'redlock',
    schedules = 100,
    why = 'the token is handed out without raising the marks of a majority to it',
    file = 'redlock_model', find = 'local ok = false\n  for _ = 1, 3 do',
    replace = 'local ok = true\n  for _ = 1, 0 do',
  },
  {
    name = 'redlock_floor_unequal_votes', run = 'redlock',
    schedules = 100,
    why = 'a floor-proposing grant skips the write-back although its votes differ: the highest '
      .. "vote's mark alone holds the token",
    file = 'redlock_model', find = 'local floored = F and same >= cfg.n',
    replace = 'local floored = F',
  },
  {
    name = 'redlock_floor_one_vote', run = 'redlock',
    schedules = 300,
    why = 'a floor-proposing grant skips the write-back when one vote, not every node\'s, is the token',
    file = 'redlock_model', find = 'local floored = F and same >= cfg.n',
    replace = 'local floored = F and same >= 1',
  },
  {
    name = 'redlock_writeback_one_node', run = 'redlock',
    -- (rarer since the floor: half the grants are confirmed without the
    -- write-back, and a floor near the clocks passes the token anyway
    -- unless a clock stepped; seeds 1, 2 and 3 catch it in schedules
    -- 1,302, 314, 891)
    schedules = 400, seed = 2,
    why = 'one node\'s mark raised to the token is taken as enough',
    file = 'redlock_model', find = 'ok = acks >= cfg.m',
    replace = 'ok = acks >= 1',
  },
  {
    name = 'redlock_restarted_node_votes_at_once', run = 'redlock',
    seed = 3, schedules = 300, -- (seeds 1, 2 and 3 catch it in schedules 664, 210, 209)
    why = 'a restarted node\'s vote counts at once: no wait of a lease, no seeding of its marks',
    file = 'redlock_model', find = '  return meta.seed == meta.run\n',
    replace = '  return true\n',
  },
  {
    name = 'redlock_seeded_at_once', run = 'redlock',
    -- (seed 1 does not catch it in 1,000 schedules since the floor; seed 2 in 23)
    seed = 3, schedules = 600,
    why = 'a restarted node is seeded at once, not a lease + drift after its run began: it votes '
      .. 'while a grant it lost may live',
    file = 'redlock_model', find = ' or meta.up * 1000 < cfg.L + cfg.drift_us or c.seeding[i]',
    replace = ' or c.seeding[i]',
  },
  {
    name = 'redlock_validity_from_handout', run = 'redlock',
    schedules = 300,
    why = 'the validity runs from the hand-out, not from the first send: the time the quorum '
      .. 'and the write-back took is counted twice',
    file = 'redlock_model', find = 'valid = valid, handout = self.now,',
    replace = 'valid = cnow(self, c) + cfg.L - cfg.drift_us, handout = self.now,',
  },
  {
    name = 'redlock_mark_lowered', run = 'redlock', protocol = 2,
    -- (since the floor: seeds 1 and 37 catch it in schedules 2,707 and 2,214)
    schedules = 2400, seed = 37,
    why = 'mark.lua writes the token even below the mark it found',
    file = 'mark', find = 'if want > before then',
    replace = 'if want > 0 then',
  },
  {
    name = 'redlock_attempt_reused', run = 'redlock',
    schedules = 500, seed = 9,
    why = 'every quorum acquire of a client sends one attempt number: a late copy, or the same '
      .. 'attempt seen again, takes a grant the client no longer counts',
    file = 'redlock_model', find = '  c.number = c.number + 1\n', replace = '  c.number = 1\n',
  },
  {
    name = 'redlock_expired_grant_never_ends', run = 'redlock', protocol = 2,
    schedules = 300,
    why = 'acquire.lua takes a grant past its exp for a live one: a lease whose holder never '
      .. 'released it holds the name for ever',
    file = 'acquire', find = 'if owner and now_ms > tonumber(exp) then', replace = 'if false then',
  },
  {
    name = 'redlock_renewal_by_minority', run = 'redlock',
    schedules = 2000,
    why = 'a renewal is confirmed by one node that renewed the grant, not a majority',
    file = 'redlock_model', find = 'if acks >= cfg.m and cnow(self, c) < h.valid then',
    replace = 'if acks >= 1 and cnow(self, c) < h.valid then',
  },
  {
    name = 'redlock_regrant_refusal_counted', run = 'redlock',
    -- (since the floor: seeds 1 and 2 catch it in schedules 1,371 and 1,188, 24 not in 2,000)
    seed = 2, schedules = 1300,
    why = "a renewal counts a node's refused re-grant (the name held by another there) as an ack",
    file = 'redlock_model',
    find = "    if r and type(r.rep) == 'table' and r.rep[1] == 1 then\n      if not h.node_tok[i] then",
    replace = "    if r and type(r.rep) == 'table' and (r.rep[1] == 1 or not h.node_tok[i]) then\n      if not h.node_tok[i] and r.rep[1] == 1 then",
  },
  -- Its wait queues (wait = true: sim --redlock --wait).
  {
    name = 'redlock_wait_queue_jumped', run = 'redlock', protocol = 2, wait = true,
    schedules = 20,
    why = 'acquire.lua grants a client queued behind a live waiter (or not queued at all)',
    file = 'acquire', find = '          if w ~= me then\n            pttl = -1\n          end\n',
    replace = '',
  },
  {
    name = 'redlock_wait_grant_to_tail', run = 'redlock', protocol = 2, wait = true,
    schedules = 20,
    why = 'release.lua grants directly to the last waiter of its queue, not the first',
    file = 'release', find = "      w = redis.call('ZRANGE', KEYS[3], 0, 0)[1]",
    replace = "      w = redis.call('ZRANGE', KEYS[3], -1, -1)[1]",
  },
  -- Its shared mode (shared = F: sim --redlock --shared F).
  {
    name = 'redlock_shared_beside_exclusive', run = 'redlock', protocol = 2, shared = 0.5,
    schedules = 100,
    why = 'acquire_shared.lua grants a shared lease while another client holds the live exclusive '
      .. 'grant: a majority of such nodes votes a reader in beside a writer',
    file = 'acquire_shared', find = 'if owner then\n  pttl = tonumber(exp) - now_ms + 1',
    replace = 'if false then\n  pttl = tonumber(exp) - now_ms + 1',
  },
  {
    name = 'redlock_shared_no_writeback', run = 'redlock', shared = 0.5,
    schedules = 300,
    why = "a shared grant is handed out with the highest vote + 1, never written back: a later "
      .. "exclusive grant by another majority may take a token below it",
    file = 'redlock_model', find = '  local ok = false\n  for _ = 1, 3 do',
    replace = '  local ok = shared\n  for _ = 1, shared and 0 or 3 do',
  },
  {
    name = 'redlock_shared_run_past_writer', run = 'redlock', protocol = 2, shared = 'mix', wait = true,
    hot = true, schedules = 300,
    why = "release.lua's run of direct shared grants drops a live exclusive waiter from the queue "
      .. 'and grants the shared waiters behind it',
    file = 'release', find = "          if (tonumber(string.match(d, '^%d+')) or 0) > now_ms then\n            w = x",
    replace = "          if (tonumber(string.match(d, '^%d+')) or 0) > now_ms and string.match(d, '^%d+ %d+ s ') then\n            w = x",
  },
  {
    name = 'redlock_shared_released_as_exclusive', run = 'redlock', shared = 0.5,
    schedules = 300,
    why = 'a shared holder releases with release.lua, which leaves its shared lease on every node '
      .. 'for a lease',
    file = 'redlock_model', find = "      self:release_all(c, name, h.att, '0', nil, shared)",
    replace = "      self:release_all(c, name, h.att, '0', nil, nil)",
  },
  {
    name = 'redlock_shared_keeps_unnamed', run = 'redlock', shared = 'mix', wait = true, hot = true,
    schedules = 300,
    why = 'a reader keeps a split vote against a refusal that names no holder: writers and readers '
      .. 'that hold each other\'s nodes wait for one another until they give up',
    file = 'redlock_model',
    find = "if shared and wait and type(r.rep) == 'table' and r.rep[1] == 0 and r.rep[3] == '' then",
    replace = "if false then",
  },
  {
    name = 'redlock_sem_extra_slot', run = 'redlock', rsem = true, schedules = 20,
    why = 'a semaphore over the nodes has one slot more than its limit: one permit too many',
    file = 'redlock_model', find = 'local L, held = self.cfg.limit, {}',
    replace = 'local L, held = self.cfg.limit + 1, {}',
  },
  {
    name = 'redlock_sem_held_slot_tried', run = 'redlock', rsem = true, schedules = 20,
    why = 'a client tries a slot it holds for its next permit: the slot\'s owner is granted it again, '
      .. 'and one slot counts as two permits',
    file = 'redlock_model', find = 'if not held[s] then', replace = 'if true then',
  },
  {
    name = 'redlock_claim_any_limit', run = 'redlock', protocol = 2, rsem = true,
    schedules = 200,
    why = "sem_claim.lua claims a name for any limit, whatever the claim there says: two limits "
      .. 'in use at once',
    file = 'sem_claim', find = 'elseif exists and tonumber(h[4]) ~= limit then',
    replace = 'elseif false then',
  },
  {
    name = 'redlock_claim_over_lock', run = 'redlock', protocol = 2, rsem = true,
    schedules = 200,
    why = "sem_claim.lua reads only a semaphore's hash as data, and claims a lock's over it: a "
      .. 'lock and permits at once',
    file = 'sem_claim', find = "local exists = h[1] or redis.call('EXISTS', key) == 1",
    replace = "local exists = h[2] == 's'",
  },
  {
    name = 'redlock_claim_by_minority', run = 'redlock', rsem = true, schedules = 200,
    why = 'a claim counts when one node made it, not a majority',
    file = 'redlock_model', find = 'if ok >= cfg.m and cnow(self, c) < valid then\n    c.claims',
    replace = 'if ok >= 1 and cnow(self, c) < valid then\n    c.claims',
  },
  {
    name = 'redlock_claim_not_renewed', run = 'redlock', rsem = true, schedules = 200,
    why = "the renewals renew a semaphore's slots but claim the name no more: the claim ends "
      .. 'while its permits are held, and a lock or another limit takes the name beside them',
    file = 'redlock_model', find = '    local cv = self:claim(c, sem)\n    for _, x in ipairs(renewed)',
    replace = '    local cv = math.huge\n    for _, x in ipairs(renewed)',
  },
  {
    name = 'redlock_leave_turn_to_tail', run = 'redlock', rsem = true, wait = true, schedules = 60,
    why = 'a leave passes the turn to the last live waiter of the queue, not the first',
    file = 'leave', protocol = 2, find = "  local w = redis.call('ZRANGE', KEYS[3], 0, 0)[1]",
    replace = "  local w = redis.call('ZRANGE', KEYS[3], -1, -1)[1]",
  },
}

-- Mutants that random schedules rarely tell apart (a second defence
-- covers them, or the window they open is narrow): caught by a
-- scenario written out for them (sim/redlock_scenarios.lua, run by
-- sim/test-redlock-scenarios), not by sim/test-mutants. sim --mutant runs
-- them too.
M.scenario_only = {
  {
    name = 'redlock_claim_two_leases', run = 'redlock', rsem = true,
    why = "a claim is relied on for its time to live (2 leases), not a lease: a node restarted "
      .. 'without it counts again before it ends (sim/test-redlock-scenarios: claim_restart, '
      .. 'claim_slow)',
    file = 'redlock_model', find = 'local valid = first + (cfg.L - cfg.drift_us) -- (a lease, as a grant\'s)',
    replace = 'local valid = first + 2 * (cfg.L - cfg.drift_us)',
  },
  {
    name = 'redlock_validity_without_drift', run = 'redlock',
    why = 'the validity is the lease less the time elapsed, with no allowance for clock drift',
    file = 'redlock_model', find = 'local valid = first + cfg.L - cfg.drift_us',
    replace = 'local valid = first + cfg.L',
  },
  {
    name = 'redlock_renewal_validity_late', run = 'redlock',
    why = "a renewal's validity counts from its reply, not its first send",
    file = 'redlock_model', find = '    h.valid = first + cfg.L - cfg.drift_us',
    replace = '    h.valid = cnow(self, c) + cfg.L - cfg.drift_us',
  },
  {
    name = 'redlock_writeback_without_passes', run = 'redlock',
    why = "the write-back covers the grant's token, not the passes it may hand out locally "
      .. '(T + pass limit)',
    file = 'redlock_model', find = "{string.format('%.0f', T + pl), ''})",
    replace = "{string.format('%.0f', T), ''})",
  },
  {
    name = 'redlock_unseeded_node_votes', run = 'redlock',
    why = 'a node that restarted counts once up a lease, its marks not seeded from the others',
    file = 'redlock_model', find = '  return meta.seed == meta.run\n',
    replace = '  return meta.seed == meta.run or meta.up >= self.cfg.lease_ms\n',
  },
  {
    name = 'redlock_conflict_ignored', run = 'redlock',
    why = 'a write-back that finds a mark at or above the token still hands it out',
    file = 'redlock_model', find = 'if b >= T then',
    replace = 'if false then',
  },
  {
    name = 'redlock_floor_majority', run = 'redlock',
    why = 'a grant that proposed a floor skips the write-back when a majority, not every node, '
      .. 'voted the highest: an overlapping acquire confirmed by nodes that refused it, handed '
      .. 'out before, has a higher token (sim/test-redlock-scenarios: floor_beside_writeback)',
    file = 'redlock_model', find = 'local floored = F and same >= cfg.n',
    replace = 'local floored = F and same >= cfg.m',
  },
  {
    name = 'redlock_split_keeps_votes', run = 'redlock', wait = true,
    -- (random schedules caught it, in calm ones only, until the floor:
    -- seed 8 in schedule 98 then, and not in 2,000 since)
    why = 'a client with a split vote keeps its grants whoever waited longer: split votes '
      .. 'deadlock until the waiters give up (sim/test-redlock-scenarios: split_cycle)',
    file = 'redlock_model', find = 'if not older and not nokeep and cnow(self, c) < valid then',
    replace = 'if not nokeep and cnow(self, c) < valid then',
  },
}

function M.find(name)
  for _, l in ipairs({M.list, M.scenario_only}) do
    for _, m in ipairs(l) do
      if m.name == name then return m end
    end
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

-- A world of its own (sim/<file>.lua, in directory dir: 'sem' for the
-- semaphore world, 'redlock' for the Redlock world) with mutant m (file
-- 'sem_model' or 'redlock_model') applied to its text: returns the mutated
-- module.
function M.load_world(m, dir, file)
  local f = assert(io.open(dir .. '/' .. file .. '.lua', 'rb'))
  local text = f:read('*a')
  f:close()
  local i, j = string.find(text, m.find, 1, true)
  if not i then
    error(string.format('mutant %s: its text is no longer in sim/%s.lua: mend sim/mutants.lua',
      m.name, file), 0)
  end
  if string.find(text, m.find, j + 1, true) then
    error(string.format('mutant %s: its text occurs twice in sim/%s.lua', m.name, file), 0)
  end
  return assert(loadstring(text:sub(1, i - 1) .. m.replace .. text:sub(j + 1),
    '@' .. dir .. '/' .. file .. '.lua'))()
end

function M.load_sem(m, dir) return M.load_world(m, dir, 'sem') end

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
