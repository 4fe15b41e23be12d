/*
 * The counting semaphore's local tier (sem.h). Shared state: the entry's
 * `m`, lease and poll fields, under sem.h's rules M1 to M8 and client.h's
 * lock order; e->mu is held except around the Redis calls (sem_rpc.h),
 * which a thread makes only in e's call slot (M2). The calling thread's
 * records (shared.h) are its own: no lock.
 * In a build with the trace (common/trace.h), each decision is recorded
 * ("sem.*" lines, under e->mu but for the Redis calls', in the call slot)
 * for sim/trace_sem.lua, which replays them through the simulator's rules.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "local/rlsem.h"
#include "local/rpc.h"
#include "local/sem.h"
#include "local/sem_rpc.h"

int dlock_sem_in_use(const dlock_entry *e)
{
    return e->m.users > 0;
}

/* The Redis calls (sem_rpc.h), on the node set's slots in Redlock mode
 * (rlsem.h). In e's call slot, without e->mu. */
static int rpc_acquire(dlock_client *c, dlock_entry *e, dlock_sem_try *t)
{
    return c->redlock ? dlock_rlsem_acquire(c, e, t) : dlock_sem_rpc_acquire(c, e, t);
}

static int rpc_release(dlock_client *c, dlock_entry *e, unsigned count)
{
    return c->redlock ? dlock_rlsem_release(c, e, count) : dlock_sem_rpc_release(c, e, count);
}

static void rpc_leave(dlock_client *c, dlock_entry *e, uint64_t gave_up)
{
    if (c->redlock)
        dlock_rlsem_leave(c, e, gave_up);
    else
        dlock_sem_rpc_leave(c, e, gave_up);
}

/* Whether a lock call uses e (M1). e->mu held. */
static int lock_in_use(const dlock_entry *e)
{
    return dlock_entry_held(e) || e->kind_waiters[DLOCK_KIND_EXCL] > 0 ||
           e->kind_waiters[DLOCK_KIND_SHARED] > 0 ||
           (e->lease.state != DLOCK_LEASE_NONE && !e->lease.sem);
}

/* M8: permits the renewal found lost are forgotten: the threads' permits
 * of the generation before are lost. e->mu held. */
static void settle(dlock_client *c, dlock_entry *e)
{
    if (!e->lease.sem || e->lease.state != DLOCK_LEASE_LOST)
        return;
    e->m.gen++;
    e->m.held = e->m.in_use = 0;
    e->m.passes = 0;
    e->lease.state = DLOCK_LEASE_NONE;
    dlock_trace_event(c->trace, "sem.settle", e->name, "%" PRIu64, e->m.gen);
}

/* Spare permits (M3) with handoff_margin of validity left at `now` (boot
 * clock): one may be taken by a waiting thread. e->mu held. */
static unsigned spare(const dlock_client *c, const dlock_entry *e, int64_t now)
{
    if (e->lease.state != DLOCK_LEASE_HELD ||
        now + c->handoff_margin_ns >= e->lease.valid_until_ns)
        return 0;
    return e->m.held - e->m.in_use;
}

/* The trace of a permit taken by the calling thread (sim/trace_sem.lua):
 * `how` s a spare one, g its own try's grant, q one passed to it in the
 * local queue; `now` the clock reading it was taken on. e->mu held. */
static void traced_take(dlock_client *c, dlock_entry *e, char how, int64_t now)
{
    dlock_trace_event(c->trace, "sem.take", e->name, "%c %" PRId64 " %" PRIu64 " %u %u", how, now,
                      e->m.gen, e->m.held, e->m.in_use);
}

/* Whether a thread waits for a permit of e: the poller, or one in the
 * local queue (one passed a permit is in neither). e->mu held. */
static int waiting(const dlock_entry *e)
{
    return e->poll.poller || e->wq.head != NULL;
}

/* M2: takes e's call slot, waiting for it. e->mu held (dropped while it
 * waits). */
static void call_begin(dlock_entry *e)
{
    while (e->m.calling)
        pthread_cond_wait(&e->pcv, &e->mu);
    e->m.calling = 1;
}

/* M2: gives the slot back; the threads waiting for it, and the poller,
 * look again. e->mu held. */
static void call_end(dlock_entry *e)
{
    e->m.calling = 0;
    pthread_cond_broadcast(&e->pcv);
}

/* The permits counted lost (M8) by the renewal or by a release: marks the
 * lease lost and settles it. Returns the registry references to drop after
 * unlocking. e->mu held, lease HELD. */
static int lose(dlock_client *c, dlock_entry *e)
{
    int drop = dlock_renew_mark_lost(c->renew, e);
    e->lease.lost_notified = 1;
    settle(c, e);
    return drop;
}

/* A granted try's reply: this client holds `held` permits of e in Redis,
 * whose lease counts from sent_boot. The lease is HELD, registered for
 * renewal. DLOCK_OK or DLOCK_ENOMEM. e->mu held, in the call slot. */
static int apply_grant(dlock_client *c, dlock_entry *e, unsigned held, int64_t sent_boot)
{
    settle(c, e);
    int64_t valid = sent_boot + (int64_t)c->lease_ms * DLOCK_NS_PER_MS - c->drift_ns;
    if (e->lease.state == DLOCK_LEASE_NONE) {
        e->lease.state = DLOCK_LEASE_HELD;
        e->lease.sem = 1;
        e->lease.shared = 0;
        e->lease.grant_protocol = 2;
        e->lease.grant_token = e->lease.token = 0;
        e->lease.epoch++;
        e->lease.valid_until_ns = valid;
        e->lease.grant_boot_ns = dlock_boot_ns();
        e->lease.provisional = 0;
        e->lease.lost_notified = 0;
        if (dlock_renew_add(c->renew, e) != DLOCK_OK) {
            e->lease.state = DLOCK_LEASE_NONE;
            return dlock_err_set(DLOCK_ENOMEM, "out of memory registering the permits of '%s'",
                                 e->name);
        }
        dlock_count(&c->ctr.leases_held, 1);
        dlock_count(&c->ctr.grants, 1);
    } else if (valid > e->lease.valid_until_ns || c->redlock) {
        /* the acquire extended them all (sem_acquire.lua); in Redlock mode
         * their slots' earliest validity, which the renewal may have set
         * later than this grant's own (rlsem.h) */
        e->lease.valid_until_ns = valid;
    }
    if (held < e->m.in_use + 1) {
        /* Redis counts fewer permits for this client than its threads use:
         * theirs ended unseen (one end for all of a client's permits), so
         * they are lost (M8) and this grant is a new one. */
        e->m.gen++;
        e->m.in_use = 0;
    }
    e->m.held = held;
    e->m.passes = 0;
    e->m.doubt = 0;
    e->poll.queued = 0; /* a granted acquire leaves the queue (sem_acquire.lua) */
    dlock_trace_event(c->trace, "sem.grant", e->name, "%u %u %" PRIu64 " %" PRId64 " %" PRIu64,
                      e->m.held, e->m.in_use, e->m.gen, e->lease.valid_until_ns, e->lease.epoch);
    return DLOCK_OK;
}

/* M5: gives the spare permits of e back to Redis, in the call slot. They
 * are no longer counted before the call (no thread takes them meanwhile),
 * whatever its outcome: a failed release's permits are not renewed once
 * this client holds none, and end in Redis within a lease time. e->mu held
 * (dropped during the call); *drop gets the registry's references to drop
 * after unlocking. DLOCK_OK, or the release's error. */
static int give_back(dlock_client *c, dlock_entry *e, int *drop)
{
    call_begin(e);
    settle(c, e);
    unsigned n = e->lease.state == DLOCK_LEASE_HELD ? e->m.held - e->m.in_use : 0;
    if (n == 0) {
        call_end(e);
        return DLOCK_OK;
    }
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
    call_end(e);
    dlock_trace_event(c->trace, "sem.backrc", e->name, "%d", rc);
    if (rc == DLOCK_ELOST && gen == e->m.gen && e->lease.state == DLOCK_LEASE_HELD) {
        /* Redis had fewer: they had ended, and with them every permit of
         * this client (one end for all) */
        *drop += lose(c, e);
    } else if (rc != DLOCK_OK && rc != DLOCK_ELOST) {
        char why[256];
        snprintf(why, sizeof why, "%s", dlock_last_error());
        uint32_t ms = c->lease_ms > c->waiter_ttl_ms ? c->lease_ms : c->waiter_ttl_ms;
        rc = dlock_err_set(rc, "%s (the permit ends in redis within %" PRIu32 " ms after this "
                           "client stops holding permits of '%s')", why, ms, e->name);
    }
    return rc;
}

/* A thread leaves e (its acquire failed, or it released a permit) with
 * e->mu held: the client leaves the wait queue in Redis if nobody here
 * waits any more (M6), spare permits nobody waits for go back (M5), and
 * the head of the local queue polls if nobody does. *drop as give_back's.
 * Returns the give-back's error, DLOCK_OK if none. */
static int leave(dlock_client *c, dlock_entry *e, int *drop)
{
    int rc = DLOCK_OK;
    if (e->poll.queued && !waiting(e)) {
        call_begin(e);
        if (e->poll.queued && !waiting(e)) {
            uint64_t gave_up = e->m.doubt;
            e->poll.queued = 0;
            e->m.doubt = 0;
            pthread_mutex_unlock(&e->mu);
            rpc_leave(c, e, gave_up);
            pthread_mutex_lock(&e->mu);
        }
        call_end(e);
    }
    /* permits found lost (M8) are settled here too: the next semaphore
     * call may never come, and a lost lease must not outlive the last
     * user (a lock call would take it for a lost lock's) */
    settle(c, e);
    if (!waiting(e) && e->lease.state == DLOCK_LEASE_HELD && e->m.held > e->m.in_use)
        rc = give_back(c, e, drop);
    if (e->m.doubt && !waiting(e) && !e->m.calling) {
        /* a try in doubt that nobody will name: its grant, if any, goes
         * back (Redlock mode has none: rlsem.c gives back its own) */
        char nonce[24];
        snprintf(nonce, sizeof nonce, "%" PRIu64, e->m.doubt);
        if (!c->redlock)
            dlock_renew_sem_give_back(c->renew, e, nonce);
        e->m.doubt = 0;
    }
    if (c->redlock && !e->m.calling)
        dlock_rlsem_tidy(c, e); /* (rlsem.h, R1) */
    dlock_trace_event(c->trace, "sem.left", e->name, "%d %d", waiting(e), e->m.calling);
    if (e->wq.head && !e->poll.poller)
        dlock_waitq_wake(e->wq.head); /* it polls, or takes a spare permit */
    return rc;
}

/* The poller's loop (M6): called with e->mu held as e's poller; returns
 * with it held. DLOCK_OK: the calling thread holds a permit (counted in
 * m.in_use). */
static int poll_redis(dlock_client *c, dlock_entry *e, int64_t deadline, int once,
                      dlock_cancel *k)
{
    for (;;) {
        settle(c, e);
        int64_t now = dlock_boot_ns();
        if (spare(c, e, now) > 0) {
            e->m.in_use++;
            traced_take(c, e, 's', now);
            return DLOCK_OK;
        }
        int rc = dlock_client_stop_rc(c, k);
        if (rc != DLOCK_OK)
            return dlock_client_stop_err(rc, e->name);
        if (dlock_load_int_acquire(&c->server_bad)) {
            pthread_mutex_lock(&c->server_mu);
            rc = dlock_err_set(DLOCK_ESERVER, "%s (found by the periodic check of the server; "
                               "acquires that ask Redis fail until it is mended)", c->server_msg);
            pthread_mutex_unlock(&c->server_mu);
            return rc;
        }
        call_begin(e);
        settle(c, e);
        if (spare(c, e, dlock_boot_ns()) > 0) { /* (passed while this thread waited for the slot) */
            call_end(e);
            continue;
        }
        char nonce[24];
        dlock_rpc_number(c, nonce);
        int64_t by = once ? dlock_now_ns() + (int64_t)c->conn.command_timeout_ms * DLOCK_NS_PER_MS
                          : deadline;
        dlock_sem_try t = {.nonce = nonce, .limit = e->m.limit, .queue = !once,
                           .doubt = e->m.doubt, .deadline = by, .cancel = k};
        e->poll.woken = 0; /* a wake-up from now on makes another try */
        pthread_mutex_unlock(&e->mu);
        rc = rpc_acquire(c, e, &t);
        if (rc != DLOCK_OK && t.in_doubt && !t.answered) {
            /* Its outcome unknown: the same attempt again makes it known
             * (lua/p2/SEM.txt, Idempotence). Else the attempt it named in
             * doubt would be forgotten (M7: m.doubt names this one from
             * now), and if this one never ran, a direct grant to that one
             * would stay this client's in Redis, renewed with its permits,
             * which no leave names. */
            int first = rc;
            t.deadline = dlock_now_ns() + (int64_t)c->conn.command_timeout_ms * DLOCK_NS_PER_MS;
            rc = rpc_acquire(c, e, &t);
            if (!t.answered) {
                rc = first; /* still unknown */
                t.in_doubt = 1;
            }
        }
        if (once && rc == DLOCK_ETIMEDOUT)
            rc = dlock_err_set(DLOCK_EREDIS, "timed out: redis took no try of '%s' within the "
                               "command timeout (%" PRIu32 " ms): every connection was busy or "
                               "stuck", e->name, c->conn.command_timeout_ms);
        int64_t answered = dlock_boot_ns();
        /* (Redlock mode: the node set hands a slot out only before its
         * validity, route/redlock.h, and t.sent_boot stands for the
         * earliest of the permits' slots, rlsem.h, not for this grant's) */
        if (rc == DLOCK_OK && !c->redlock &&
            answered >= t.sent_boot + (int64_t)c->lease_ms * DLOCK_NS_PER_MS - c->drift_ns) {
            t.in_doubt = 1; /* answered after the permit could have ended: given back */
            rc = dlock_err_set(DLOCK_EREDIS, "timed out: redis answered the acquire of '%s' "
                               "after the permit could have ended", e->name);
        }
        pthread_mutex_lock(&e->mu);
        int fresh_lost = 0; /* (Redlock mode: the try's slot went with lost permits) */
        if (rc == DLOCK_OK && c->redlock) {
            rc = dlock_rlsem_granted(c, e, &t); /* (the slots as they are now) */
            fresh_lost = rc == DLOCK_EBUSY;
        }
        if (!fresh_lost && (t.in_doubt || (rc == DLOCK_EBUSY && !once)))
            e->m.doubt = strtoull(nonce, NULL, 10); /* M7: the next try names it */
        if (!fresh_lost && rc == DLOCK_EBUSY && !once)
            e->poll.queued = 1;
        dlock_trace_event(c->trace, "sem.tried", e->name, "%s %d %" PRId64 " %d %" PRIu64 " %d",
                          nonce, rc, answered, t.in_doubt, e->m.doubt, e->poll.queued);
        if (rc == DLOCK_OK) {
            rc = apply_grant(c, e, t.held, t.sent_boot);
            if (rc != DLOCK_OK && c->redlock)
                dlock_rlsem_ungrant(c, e, nonce);
            else if (rc != DLOCK_OK)
                e->m.doubt = strtoull(nonce, NULL, 10);
        }
        call_end(e);
        if (rc == DLOCK_OK) {
            e->m.in_use++;
            traced_take(c, e, 'g', answered);
            return DLOCK_OK;
        }
        if (rc != DLOCK_EBUSY)
            return rc;
        settle(c, e);
        now = dlock_boot_ns();
        if (spare(c, e, now) > 0) {
            /* passed to this thread while the try was out (M5): its, even
             * past the deadline or for a single try */
            e->m.in_use++;
            traced_take(c, e, 's', now);
            return DLOCK_OK;
        }
        if (once && c->redlock) /* (rlsem.c said which slots refused) */
            return DLOCK_EBUSY;
        if (fresh_lost && dlock_now_ns() < deadline)
            continue; /* (queued nowhere: another try at once, rlsem.h) */
        if (once)
            return dlock_err_set(DLOCK_EBUSY, "no permit of '%s' is free (%lld free, %lld "
                                 "client%s in its wait queue in redis)", e->name, t.free, t.queued,
                                 t.queued == 1 ? "" : "s");
        now = dlock_now_ns();
        if (now >= deadline && t.queued < 0) /* (Redlock mode: no count) */
            return dlock_err_set(DLOCK_ETIMEDOUT, "timed out waiting for a permit of '%s' "
                                 "(limit %" PRIu32 ")", e->name, e->m.limit);
        if (now >= deadline)
            return dlock_err_set(DLOCK_ETIMEDOUT, "timed out waiting for a permit of '%s' "
                                 "(limit %" PRIu32 ", %lld client%s in its wait queue in redis, "
                                 "this one included)", e->name, e->m.limit, t.queued,
                                 t.queued == 1 ? "" : "s");
        int64_t delay = c->fallback_ns;
        delay -= (int64_t)((uint64_t)now % (uint64_t)(delay / 4 + 1)); /* jitter */
        int64_t wake = now + delay < deadline ? now + delay : deadline;
        while (!e->poll.woken && spare(c, e, dlock_boot_ns()) == 0 && e->lease.state != DLOCK_LEASE_LOST &&
               dlock_client_stop_rc(c, k) == DLOCK_OK && dlock_now_ns() < wake) {
            struct timespec ts = dlock_ts(wake);
            pthread_cond_timedwait(&e->pcv, &e->mu, &ts);
        }
        if (spare(c, e, dlock_boot_ns()) == 0 && dlock_client_stop_rc(c, k) == DLOCK_OK &&
            dlock_now_ns() >= deadline)
            return dlock_err_set(DLOCK_ETIMEDOUT, "timed out waiting for a permit of '%s' "
                                 "(limit %" PRIu32 ")", e->name, e->m.limit);
    }
}

/* The calling thread's permit of e is recorded (M4). e->mu held. */
static void record(dlock_client *c, dlock_entry *e)
{
    dlock_shold *h = dlock_shold_get(c->serial, e); /* room reserved by the caller */
    if (h->permits > 0 && h->gen != e->m.gen) {
        h->lost += h->permits; /* M8 */
        h->permits = 0;
    }
    h->gen = e->m.gen;
    h->permits++;
}

int dlock_sem_run(dlock_client *c, const char *name, size_t len, uint32_t limit,
                  int64_t wait_ms, dlock_cancel *k)
{
    int64_t start = dlock_now_ns();
    int64_t deadline = wait_ms < 0 || wait_ms > (DLOCK_NEVER - start) / DLOCK_NS_PER_MS
                           ? DLOCK_NEVER
                           : start + wait_ms * DLOCK_NS_PER_MS;
    dlock_entry *e = dlock_table_get(c->table, name, len);
    if (!e)
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_lock(&e->mu);
    int rc = DLOCK_OK;
    if (lock_in_use(e))
        rc = dlock_err_set(DLOCK_EINVAL, "'%s' is used as a lock by this client: a name is a "
                           "lock or a semaphore", name);
    else if (e->m.users > 0 && e->m.limit != limit)
        rc = dlock_err_set(DLOCK_EINVAL, "the semaphore '%s' is used with limit %" PRIu32 " by "
                           "this client's threads; this call gives limit %" PRIu32, name,
                           e->m.limit, limit);
    if (rc != DLOCK_OK) {
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
        return rc;
    }
    e->m.limit = limit;
    e->m.users++;
    e->waiters++;
    uint64_t fail_seq = e->poll.fail_seq;
    dlock_waiter *w = dlock_waiter_self();
    w->kind = DLOCK_KINDS; /* none of the lock's kinds */
    int drop = 0;
    for (;;) {
        settle(c, e);
        if (dlock_waiter_granted(w)) {
            if (w->token == e->m.gen) {
                int64_t now = dlock_boot_ns();
                if (now < e->lease.valid_until_ns) {
                    traced_take(c, e, 'q', now);
                    break; /* a releaser passed its permit to this thread (M5) */
                }
                /* it ran out before this thread ran: every permit of the
                 * lease with it (M8), found by their validity */
                dlock_trace_event(c->trace, "sem.ranout", e->name, "%" PRId64, now);
                drop += lose(c, e);
            }
            (void)dlock_waiter_self(); /* lost in passing (M8): a new wait */
            w->kind = DLOCK_KINDS;
            continue;
        }
        if ((rc = dlock_client_stop_rc(c, k)) != DLOCK_OK) {
            rc = dlock_client_stop_err(rc, name);
            break;
        }
        int64_t at = dlock_boot_ns();
        if (spare(c, e, at) > 0 && !e->poll.poller && (!e->wq.head || e->wq.head == w)) {
            e->m.in_use++;
            traced_take(c, e, 's', at);
            break;
        }
        if (e->poll.fail_seq != fail_seq) {
            rc = dlock_err_set(e->poll.fail_rc, "%s", e->poll.fail_msg);
            break;
        }
        if (!e->poll.poller) {
            if (wait_ms != 0 && dlock_now_ns() >= deadline) {
                rc = dlock_err_set(DLOCK_ETIMEDOUT, "timed out waiting for a permit of '%s' "
                                   "(limit %" PRIu32 ")", name, limit);
                break;
            }
            dlock_waitq_remove(&e->wq, w);
            e->poll.poller = 1;
            rc = poll_redis(c, e, deadline, wait_ms == 0, k);
            e->poll.poller = 0;
            if (rc != DLOCK_OK && rc != DLOCK_EBUSY && rc != DLOCK_ETIMEDOUT &&
                rc != DLOCK_ECLOSED && rc != DLOCK_ECANCELED && rc != DLOCK_EINVAL) {
                /* the threads that waited behind this poll fail with it */
                e->poll.fail_seq++;
                e->poll.fail_rc = rc;
                snprintf(e->poll.fail_msg, sizeof e->poll.fail_msg, "%s", dlock_last_error());
                dlock_waitq_wake_all(&e->wq);
            }
            break;
        }
        if (wait_ms == 0) {
            rc = dlock_err_set(DLOCK_EBUSY, "every permit of '%s' this client holds is in use, "
                               "and another thread of it asks redis for one", name);
            break;
        }
        int64_t now = dlock_now_ns();
        if (now >= deadline) {
            rc = dlock_err_set(DLOCK_ETIMEDOUT, "timed out waiting for a permit of '%s' (limit "
                               "%" PRIu32 ")", name, limit);
            break;
        }
        if (!w->queued)
            dlock_waitq_push(&e->wq, w, now);
        dlock_waiter_park(w, &e->mu, deadline);
    }
    dlock_waitq_remove(&e->wq, w);
    e->waiters--;
    if (rc == DLOCK_OK) {
        record(c, e);
        (void)leave(c, e, &drop); /* (the client may leave the queue; spare go back) */
    } else {
        char keep[256];
        snprintf(keep, sizeof keep, "%s", dlock_last_error());
        (void)leave(c, e, &drop);
        e->m.users--;
        if (e->m.users == 0)
            e->m.limit = 0;
        dlock_err_set(rc, "%s", keep);
    }
    pthread_mutex_unlock(&e->mu);
    while (drop-- > 0)
        dlock_table_put(c->table, e);
    if (rc != DLOCK_OK) {
        dlock_table_put(c->table, e);
        return rc;
    }
    /* the reference becomes the permit's (M4); the caller arms the thread's
     * exit hook (orphan.h), which gives it back */
    dlock_count(&c->ctr.acquisitions, 1);
    dlock_count(&c->ctr.sem_acquisitions, 1);
    return DLOCK_OK;
}

int dlock_sem_give(dlock_client *c, dlock_shold *h)
{
    dlock_entry *e = h->e;
    pthread_mutex_lock(&e->mu);
    settle(c, e);
    dlock_trace_event(c->trace, "sem.rec", e->name, "%u %u %" PRIu64, h->permits, h->lost, h->gen);
    if (h->permits > 0 && h->gen != e->m.gen) {
        h->lost += h->permits; /* M8 */
        h->permits = 0;
    }
    int rc = DLOCK_OK, drop = 0;
    dlock_waiter *wake = NULL;
    if (h->lost > 0) {
        dlock_trace_event(c->trace, "sem.give", e->name, "l %" PRId64 " 0 %u 0 %u %u",
                          c->trace ? dlock_boot_ns() : 0, e->m.passes, e->m.held, e->m.in_use);
        h->lost--;
        rc = dlock_err_set(DLOCK_ELOST, "a permit of '%s' this thread held was lost (its lease "
                           "ran out or was not renewed in time); released locally", e->name);
    } else {
        h->permits--;
        e->m.in_use--;
        int64_t now = dlock_boot_ns();
        int ranout = now >= e->lease.valid_until_ns;
        if (ranout)
            rc = dlock_err_set(DLOCK_ELOST, "the permit of '%s' ran out while held (not renewed "
                               "in time)", e->name);
        int pass = waiting(e) && e->m.passes < c->pass_limit && spare(c, e, now) > 0;
        dlock_trace_event(c->trace, "sem.give", e->name, "%c %" PRId64 " %d %u %d %u %u",
                          !pass ? 'b' : e->wq.head ? 'q' : 'p', now, waiting(e), e->m.passes,
                          ranout, e->m.held, e->m.in_use);
        if (pass) {
            /* M5: passed, without Redis */
            e->m.passes++;
            dlock_count(&c->ctr.sem_passes, 1);
            if (e->wq.head) {
                e->m.in_use++;
                wake = dlock_waitq_grant(&e->wq, e->wq.head, e->m.gen);
            } else {
                pthread_cond_broadcast(&e->pcv); /* the poller takes it */
            }
        } else {
            int r = give_back(c, e, &drop);
            if (rc == DLOCK_OK)
                rc = r;
        }
    }
    char keep[256];
    snprintf(keep, sizeof keep, "%s", dlock_last_error());
    (void)leave(c, e, &drop);
    dlock_err_set(rc, "%s", keep);
    e->m.users--;
    if (e->m.users == 0)
        e->m.limit = 0;
    dlock_shold_tidy(h);
    pthread_mutex_unlock(&e->mu);
    dlock_waiter_unpark(wake);
    while (drop-- > 0)
        dlock_table_put(c->table, e);
    dlock_table_put(c->table, e); /* the permit's (M4) */
    return rc;
}
