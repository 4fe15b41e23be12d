-- Mutants of the C client: each a small change to src/ that brings back a
-- bug the client had or could have. scripts/check-client builds the tree
-- with each one and fails unless its checks observe wrong behaviour (a
-- trace the model refuses, a failed test, a storm's violation). A mutant
-- whose text no longer occurs in its file fails loudly: mend it here when
-- the file changes. `find` must occur exactly once.
return {
  {
    name = 'validity_from_answer',
    why = "a grant's validity counted from when its answer came, not from the acquire's send",
    file = 'src/local/acquire.c',
    find = 'rc = take_grant(c, kind, e, token, t.protocol, unclean,\n                            sent_boot +',
    replace = 'rc = take_grant(c, kind, e, token, t.protocol, unclean,\n                            answered +',
  },
  {
    name = 'release_in_setting',
    why = "a grant released in the client's setting, not in the protocol it was granted in",
    file = 'src/local/release.c',
    find = ': dlock_rpc_release(c, e, grant, protocol, token, ending);',
    replace = ': dlock_rpc_release(c, e, grant, c->protocol, token, ending);',
  },
  {
    name = 'no_protocol_resend',
    why = "an acquire refused for the other protocol's data is not sent again in it",
    file = 'src/local/rpc.c',
    find = 'resent < DLOCK_RPC_RESENDS ? resend_in(rep, t->protocol)',
    replace = 'resent < 0 ? resend_in(rep, t->protocol)',
  },
  {
    name = 'handoff_in_time_skipped',
    why = 'local handoffs faster than the clock rule allows (tokens ahead of server time)',
    file = 'src/local/excl.c',
    find = '               e->lease.valid_until_ns &&\n           handoff_in_time(e, now);',
    replace = '               e->lease.valid_until_ns &&\n           (handoff_in_time(e, now) || 1);',
  },
  {
    name = 'answered_too_late_taken',
    why = 'a grant whose answer came after its validity ran out is taken',
    file = 'src/local/acquire.c',
    find = 'if (rc == DLOCK_OK &&\n            answered >=',
    replace = 'if (0 && rc == DLOCK_OK &&\n            answered >=',
  },
  {
    name = 'pass_limit_off_by_one',
    why = 'one local handoff more than pass_limit',
    file = 'src/local/excl.c',
    find = 'e->x.passes < c->pass_limit',
    replace = 'e->x.passes <= c->pass_limit',
  },
  {
    name = 'direct_handoff_not_rechecked',
    why = 'a lease handed directly to a parked thread is taken when it runs, valid or not',
    file = 'src/local/excl.c',
    find = 'int valid = e->lease.state == DLOCK_LEASE_HELD && now < e->lease.valid_until_ns;',
    replace = 'int valid = 1;',
  },
  {
    name = 'open_handoff_not_rechecked',
    why = 'an open handoff is taken after its validity ran out',
    file = 'src/local/excl.c',
    find = '    if (now >= e->lease.valid_until_ns) {\n        /* Lost by its validity alone',
    replace = '    if (0) {\n        /* Lost by its validity alone',
  },
  {
    name = 'unconfirmed_set_ignored',
    why = 'the tokens of a grant whose end Redis never confirmed are forgotten with its entry',
    file = 'src/local/acquire.c',
    find = 'if (kept > unconfirmed) {',
    replace = 'if (0) {',
  },
  {
    name = 'wait_ignored',
    why = 'a grant that WAIT did not confirm on min_replicas replicas is taken',
    file = 'src/local/rpc.c',
    find = 'if (rep->element[0]->integer == 1 && c->min_replicas &&',
    replace = 'if (rep->element[0]->integer == 1 && 0 &&',
  },
  {
    name = 'renewal_trusts_partial_reply',
    why = 'a renewal chunk whose reply is short of its grants renews them all',
    file = 'src/global/renew_round.c',
    find = '            p[ch->at + i]->verdict = rep->element[i]->type == REDIS_REPLY_INTEGER &&\n                                     rep->element[i]->integer == 1;',
    replace = '            p[ch->at + i]->verdict = 1;',
  },
  {
    name = 'lost_by_validity_never',
    why = 'a lease whose renewals go unanswered is never found lost by its validity',
    file = 'src/global/renew_round.c',
    find = '} else if (s[i].verdict == 0 || now >= e->lease.valid_until_ns) {',
    replace = '} else if (s[i].verdict == 0) {',
  },
  {
    name = 'direct_grant_any_try',
    why = 'a direct grant is taken whichever try of the poller it names',
    file = 'src/local/acquire.c',
    find = 'int take = e->poll.msg_nonce != 0 && e->poll.msg_nonce == e->poll.try_nonce &&',
    replace = 'int take = e->poll.msg_nonce != 0 &&',
  },
  {
    name = 'drift_margin_tenth',
    why = 'the drift margin a tenth of what the promises assume (0.1% of the lease)',
    file = 'src/global/renew.c',
    find = 'return (int64_t)lease_ms * DLOCK_NS_PER_MS / 100 + 2 * DLOCK_NS_PER_MS;',
    replace = 'return (int64_t)lease_ms * DLOCK_NS_PER_MS / 1000 + 2 * DLOCK_NS_PER_MS;',
  },
  {
    name = 'release_last_token_is_grant',
    why = "a release tells Redis the grant's token, not the last one its handoffs handed out",
    file = 'src/local/release.c',
    find = ': dlock_rpc_release(c, e, grant, protocol, token, ending);',
    replace = ': dlock_rpc_release(c, e, grant, protocol, grant, ending);',
  },
  {
    name = 'no_give_back_after_unknown_outcome',
    why = 'an acquire whose outcome is unknown (sent, no answer) leaves its grant to expire',
    file = 'src/local/rpc.c',
    find = '        if (sent)\n            dlock_renew_give_back(c->renew, e, nonce, t->protocol, t->shared);\n        return rc;',
    replace = '        return rc;',
  },
  {
    name = 'unanswered_try_not_queued',
    why = 'a wait\'s try that went unanswered is not counted as queued: no leave takes the client out',
    file = 'src/local/acquire.c',
    find = 'if (t.unanswered && !once) {',
    replace = 'if (0 && t.unanswered && !once) {',
  },
  {
    name = 'shared_join_beside_writer',
    why = 'a thread joins the shared lease while a thread of its client waits exclusively (S3)',
    file = 'src/local/shared.c',
    find = '    if ((!e->lease.shared && !e->s.under_x) || e->lease.state != DLOCK_LEASE_HELD ||\n        e->kind_waiters[DLOCK_KIND_EXCL] > 0)',
    replace = '    if ((!e->lease.shared && !e->s.under_x) || e->lease.state != DLOCK_LEASE_HELD)',
  },
  {
    name = 'shared_join_past_window',
    why = 'threads join the shared lease after its join window (a writer of another client waits on)',
    file = 'src/local/shared.c',
    find = 'return now < e->s.join_until_ns && roomy(c, e, now);',
    replace = 'return roomy(c, e, now);',
  },
  {
    name = 'excl_handoff_to_any_waiter',
    why = 'an exclusive release opens a local handoff when only threads waiting shared wait',
    file = 'src/local/excl.c',
    find = 'int pass = e->kind_waiters[DLOCK_KIND_EXCL] > 0 && may_pass(c, e, now, closing);',
    replace = 'int pass = e->waiters > 0 && may_pass(c, e, now, closing);',
  },
  {
    name = 'lost_reset_beside_holders',
    why = 'a lost shared lease is reset at the first holder\'s release while others hold it (S5)',
    file = 'src/local/release.c',
    find = '        if (!dlock_entry_held(e)) {\n            /* the last holder',
    replace = '        if (1) {\n            /* the last holder',
  },
  {
    name = 'reader_phase_same_token',
    why = 'a reader phase under the exclusive lease takes no token of its own (readers share the writer\'s)',
    file = 'src/local/excl.c',
    find = '    e->x.passes++;\n    e->lease.token++;\n    return 1;',
    replace = '    e->x.passes++;\n    return 1;',
  },
  {
    name = 'shared_phase_past_pass_limit',
    why = 'a reader phase begins past the pass limit (readers and writers of one client keep the name from others)',
    file = 'src/local/excl.c',
    find = '    if (!may_pass(c, e, now, closing))',
    replace = '    if (!may_pass(c, e, now, closing) && e->x.passes < c->pass_limit)',
  },
  {
    name = 'shared_invited_grant_token',
    why = "threads invited to a reader phase get the grant's token, not the pass's (below the writer's before them)",
    file = 'src/local/shared.c',
    find = 'dlock_wakeset_add(ws, dlock_waitq_grant(&e->wq, w, e->lease.token));',
    replace = 'dlock_wakeset_add(ws, dlock_waitq_grant(&e->wq, w, e->lease.grant_token));',
  },
  {
    name = 'sem_spare_counted_during_release',
    why = 'spare permits leave the count only after their release (threads take them meanwhile: more holders than the limit)',
    file = 'src/local/sem.c',
    find = [[
    e->m.held -= n;
    if (e->m.held == 0) {
        e->lease.state = DLOCK_LEASE_NONE;
        dlock_count(&c->ctr.leases_held, (uint64_t)-1);
        *drop += dlock_renew_remove(c->renew, e);
    }
    dlock_trace_event(c->trace, "sem.back", e->name, "%u %u", n, e->m.held);
    uint64_t gen = e->m.gen;
    pthread_mutex_unlock(&e->mu);
    int rc = rpc_release(c, e, n);
    pthread_mutex_lock(&e->mu);
    call_end(e);]],
    replace = [[
    dlock_trace_event(c->trace, "sem.back", e->name, "%u %u", n, e->m.held);
    uint64_t gen = e->m.gen;
    pthread_mutex_unlock(&e->mu);
    int rc = rpc_release(c, e, n);
    pthread_mutex_lock(&e->mu);
    call_end(e);
    if (gen == e->m.gen && e->lease.state == DLOCK_LEASE_HELD) {
        e->m.held -= n;
        if (e->m.held == 0) {
            e->lease.state = DLOCK_LEASE_NONE;
            dlock_count(&c->ctr.leases_held, (uint64_t)-1);
            *drop += dlock_renew_remove(c->renew, e);
        }
    }]],
  },
  {
    name = 'sem_calls_at_once',
    why = "a client's calls on a semaphore go to Redis side by side (no call slot, M2): late numbers refused",
    file = 'src/local/sem.c',
    find = '    while (e->m.calling)\n        pthread_cond_wait(&e->pcv, &e->mu);\n    e->m.calling = 1;',
    replace = '    e->m.calling = 1;',
  },
  {
    name = 'sem_lost_kept',
    why = 'permits found lost are not settled by generation (M8): their holders are not told DLOCK_ELOST',
    file = 'src/local/sem.c',
    find = '    e->m.gen++;\n    e->m.held = e->m.in_use = 0;',
    replace = '    e->m.held = e->m.in_use = 0;',
  },
  {
    name = 'sem_mark_kept_by_lock',
    why = "a lock's grant keeps the semaphore's mark of its entry: renewed as permits, lost at once",
    file = 'src/local/acquire.c',
    find = '    e->lease.sem = 0; /* a lock',
    replace = '    /* a lock',
  },
  {
    name = 'sem_poller_misses_pass',
    why = 'a permit passed to the poller while its last try was out goes back to Redis; the poller fails',
    file = 'src/local/sem.c',
    find = [[
        settle(c, e);
        now = dlock_boot_ns();
        if (spare(c, e, now) > 0) {
            /* passed to this thread while the try was out (M5): its, even]],
    replace = [[
        if (0) {
            /* passed to this thread while the try was out (M5): its, even]],
  },
  {
    name = 'sem_pass_not_rechecked',
    why = 'a permit passed to a parked thread is taken when it runs, whatever validity is left',
    file = 'src/local/sem.c',
    find = "                if (now < e->lease.valid_until_ns) {\n                    traced_take(c, e, 'q', now);",
    replace = "                if (1) {\n                    traced_take(c, e, 'q', now);",
  },
  -- Caught by the semaphore's trace (sim/trace_sem.lua) first.
  {
    name = 'sem_pass_limit_off_by_one',
    why = 'one local pass of a permit more than pass_limit',
    file = 'src/local/sem.c',
    find = 'e->m.passes < c->pass_limit',
    replace = 'e->m.passes <= c->pass_limit',
  },
  {
    name = 'sem_validity_plus_drift',
    why = "granted permits counted valid past their lease in Redis (the drift margin added, not taken off)",
    file = 'src/local/sem.c',
    find = 'int64_t valid = sent_boot + (int64_t)c->lease_ms * DLOCK_NS_PER_MS - c->drift_ns;',
    replace = 'int64_t valid = sent_boot + (int64_t)c->lease_ms * DLOCK_NS_PER_MS + c->drift_ns;',
  },
  {
    name = 'sem_answered_too_late_taken',
    why = "a try's grant answered after the permit's validity ran out is taken",
    file = 'src/local/sem.c',
    find = 'if (rc == DLOCK_OK && !c->redlock &&\n            answered >= t.sent_boot',
    replace = 'if (0 && rc == DLOCK_OK && !c->redlock &&\n            answered >= t.sent_boot',
  },
  {
    name = 'sem_spare_ignores_margin',
    why = 'a spare permit is passed, or taken, with less than the handoff margin of validity left',
    file = 'src/local/sem.c',
    find = 'now + c->handoff_margin_ns >= e->lease.valid_until_ns)',
    replace = 'now + 0 * c->handoff_margin_ns >= e->lease.valid_until_ns)',
  },
  {
    name = 'sem_giveback_forgotten',
    why = 'an attempt in doubt that nobody will name is dropped, not given back (its grant stays until it expires)',
    file = 'src/local/sem.c',
    find = '        dlock_renew_sem_give_back(c->renew, e, nonce);\n        e->m.doubt = 0;',
    replace = '        e->m.doubt = 0;',
  },
  {
    name = 'sem_leave_names_no_attempt',
    why = 'the leave reads the queued attempt after clearing it: a direct grant to it is never given back',
    file = 'src/local/sem.c',
    find = '            uint64_t gave_up = e->m.doubt;\n            e->poll.queued = 0;\n            e->m.doubt = 0;',
    replace = '            e->m.doubt = 0;\n            uint64_t gave_up = e->m.doubt;\n            e->poll.queued = 0;',
  },
  {
    name = 'rl_validity_from_answer',
    why = "Redlock mode: a quorum grant's validity counted from its answer, not its first send",
    file = 'src/local/rlmode.c',
    find = '        t->sent_boot = g.first_boot;',
    replace = '        t->sent_boot = dlock_boot_ns();',
  },
  {
    name = 'rl_validity_without_drift',
    why = "Redlock mode: a quorum grant's validity without the drift allowance",
    file = 'src/route/redlock_grant.c',
    find = '    int64_t first = dlock_boot_ns(), mono = dlock_now_ns();\n    int64_t valid = first + rl->lease_ns - rl->drift_ns;',
    replace = '    int64_t first = dlock_boot_ns(), mono = dlock_now_ns();\n    int64_t valid = first + rl->lease_ns;',
  },
  {
    name = 'rl_renewal_without_drift',
    why = "Redlock mode: a renewal's new validity without the drift allowance",
    file = 'src/route/redlock_renew.c',
    find = '        int64_t valid = first + rl->lease_ns - rl->drift_ns;\n        for (size_t j',
    replace = '        int64_t valid = first + rl->lease_ns;\n        for (size_t j',
  },
  {
    name = 'rl_unknown_not_given_back',
    why = 'Redlock mode: a quorum try of unknown outcome is not given back on the nodes',
    file = 'src/local/rlmode.c',
    find = '    dlock_renew_rl_give_back(c->renew, e, t->nonce, t->shared, all & ~busy.sent);',
    replace = '',
  },
  {
    name = 'rl_split_kept_from_older',
    why = 'Redlock mode: a wait keeps its split vote although an older waiter holds a node',
    file = 'src/route/redlock_grant.c',
    find = '        if (votes > 0 && !q->no_keep && !busy->older && dlock_boot_ns() < valid) {',
    replace = '        if (votes > 0 && !q->no_keep && dlock_boot_ns() < valid) {',
  },
  {
    name = 'rl_kept_not_given_back',
    why = 'Redlock mode: the vote a wait kept is not given back when the wait ends',
    file = 'src/local/rlmode.c',
    find = '    if (e->poll.rl_kept)\n        give_back(c, e, e->poll.rl_kept, e->poll.rl_kept_shared);',
    replace = '',
  },
  {
    name = 'rl_shared_unnamed_kept',
    why = 'Redlock mode: a shared wait keeps its split vote although a node refused it naming no '
      .. 'holder (a writer queued ahead there)',
    file = 'src/route/redlock_grant.c',
    find = "    if (q->shared && r->element[2]->str[0] == '\\0')\n        return 1;\n",
    replace = '',
  },
  {
    name = 'leave_not_sent',
    why = 'the last thread waiting for a name gives up while the client is queued in Redis and '
      .. 'sends no leave: its queue entry stays until its waiter ttl',
    file = 'src/local/acquire.c',
    find = '    if (rc != DLOCK_OK && e->poll.queued && e->waiters == 1 && !e->poll.poller',
    replace = '    if (rc != DLOCK_OK && e->poll.queued && e->waiters == 0 && !e->poll.poller',
  },
  {
    name = 'rl_unreachable_not_queued',
    why = 'Redlock mode: a waiting try that too few nodes answered is not counted as queued, so '
      .. 'a wait ending after it leaves the client in the queues of the nodes that refused it',
    file = 'src/local/rlmode.c', find = '    t->unanswered = t->queue;\n', replace = '',
  },
  {
    name = 'rl_own_mode_unanswered',
    why = "Redlock mode: a node that answers DLOCKMODE (this client's own lease of the other mode "
      .. 'still there) counts as a node that did not answer: DLOCK_EREDIS instead of DLOCK_EBUSY',
    file = 'src/route/redlock_grant.c',
    find = '!strncmp(r->str, "DLOCKMODE ", 10) && dlock_rl_same_run(rl, p, i) < 0 &&',
    replace = '!strncmp(r->str, "DLOCKMODE ", 10) && 0 &&',
  },
  {
    name = 'rl_sem_lost_fresh_slot_taken',
    why = "Redlock mode: a semaphore's granted try is taken although the renewal found the "
      .. 'permits lost meanwhile and took its fresh slot out (a permit counted on no slot)',
    file = 'src/local/rlsem.c',
    find = '    if (at < 0) {\n        /* the renewal found a slot',
    replace = '    if (at < 0) { /* the count as the try saw it */\n'
      .. '        t->held = h->n + 1;\n        t->sent_boot = dlock_boot_ns();\n'
      .. '        return DLOCK_OK;\n    }\n    if (0) {\n        /* the renewal found a slot',
  },
  {
    name = 'rl_sem_claim_not_renewed',
    why = "Redlock mode: the renewal rounds renew a semaphore's slots but not its name's claim, "
      .. 'which ends two leases after the try that made it while its permits are still held',
    file = 'src/global/renew_redlock.c',
    find = '    claim_all(r, s, n);\n',
    replace = '',
  },
  {
    name = 'rl_direct_grant_given_back',
    why = "Redlock mode: a node's direct grant, unwanted while threads wait in the other mode, is "
      .. 'given back by its attempt, which may be the held lease\'s',
    file = 'src/local/client.c',
    find = '    int unwanted = nonce && !stored && !c->redlock &&',
    replace = '    int unwanted = nonce && !stored &&',
  },
  {
    name = 'rl_shared_released_as_exclusive',
    why = "Redlock mode: a shared lease is released with the exclusive release script",
    file = 'src/route/redlock_grant.c',
    find = '    r.shared = g->shared;\n',
    replace = '',
  },
  {
    name = 'rl_sem_valid_latest_slot',
    why = "Redlock mode: a granted try counts its semaphore's permits valid until their slots' "
      .. 'latest validity, not their earliest (a permit used after its slot could have ended)',
    file = 'src/local/rlsem.c',
    find = '        if (h->s[i].g.valid_boot < valid)\n            valid = h->s[i].g.valid_boot;\n'
      .. '    if (dlock_boot_ns() >= valid) {',
    replace = '        if (valid == DLOCK_NEVER || h->s[i].g.valid_boot > valid)\n'
      .. '            valid = h->s[i].g.valid_boot;\n    if (dlock_boot_ns() >= valid) {',
  },
  {
    name = 'rl_sem_slot_past_claim',
    why = "Redlock mode: a semaphore's slot is counted valid for its grant's lease, past the "
      .. "name's claim it relied on (R4)",
    file = 'src/local/rlsem.c',
    find = '            if (g.valid_boot > cl.valid_boot)\n',
    replace = '            if (0)\n',
  },
  {
    name = 'rl_kind_from_uncounted',
    why = "Redlock mode: a lock's try counts a refusal as a semaphore's name (DLOCKKIND) from a "
      .. 'node that does not count, and fails as a configuration error where too few nodes count',
    file = 'src/route/redlock_grant.c',
    find = '!strncmp(r->str, "DLOCKKIND", 9) && dlock_rl_same_run(rl, p, i) < 0 &&\n'
      .. '                dlock_rl_counts_now(rl, i, p[i].run, p[i].seed, first))',
    replace = '!strncmp(r->str, "DLOCKKIND", 9) && dlock_rl_same_run(rl, p, i) < 0)',
  },
  {
    name = 'rl_floor_one_vote',
    why = 'Redlock mode: a grant skips the write-back when one counting vote, not every node\'s, '
      .. 'is the highest: the token is handed out above the marks of the other voters',
    file = 'src/route/redlock_grant.c',
    find = 'int floored = !q->shared && same == rl->n;',
    replace = 'int floored = !q->shared && same >= 1;',
  },
  {
    name = 'rl_floor_majority',
    why = 'Redlock mode: a grant skips the write-back when a majority of counting votes, not '
      .. 'every node, is the highest: an overlapping acquire confirmed by nodes that refused it '
      .. 'may hold a higher token, handed out first',
    file = 'src/route/redlock_grant.c',
    find = 'int floored = !q->shared && same == rl->n;',
    replace = 'int floored = !q->shared && same >= rl->m;',
  },
  {
    name = 'rl_sem_wait_queues_home_only',
    why = "Redlock mode: a semaphore's wait queues on its home slot only, so that a release of "
      .. 'another slot wakes nobody (found by the fallback poll)',
    file = 'src/local/rlsem.c',
    find = '        int queue = home != 0;\n',
    replace = '        int queue = home && k == home - 1;\n',
  },
  {
    name = 'rl_sem_grant_leaves_home_only',
    why = "Redlock mode: a semaphore's wait that got a permit leaves its home slot's queue only, "
      .. 'staying queued (and granted directly) on the other slots for a waiter ttl',
    file = 'src/local/rlsem.c',
    find = '    uint64_t q = h->queued | (h->home ? 1ull << (h->home - 1) : 0);\n',
    replace = '    uint64_t q = h->home ? 1ull << (h->home - 1) : 0;\n',
  },
  {
    name = 'rl_sem_leave_home_only',
    why = "Redlock mode: a semaphore's wait that gave up leaves its home slot's queue only",
    file = 'src/local/rlsem.c',
    find = '        q = h->queued | (h->home ? 1ull << (h->home - 1) : 0);\n',
    replace = '        q = h->home ? 1ull << (h->home - 1) : 0;\n',
  },
}
