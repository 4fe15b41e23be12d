/*
 * Acquiring (acquire.h). Shared state: the entry, under client.h's rules
 * (I1 to I11), with e->mu held except around the Redis calls (rpc.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "local/acquire.h"
#include "local/client.h"
#include "common/error.h"
#include "local/orphan.h"
#include "local/release.h"
#include "local/rlmode.h"
#include "local/rpc.h"
#include "local/sem.h"

/* A small per-thread generator for retry jitter (xorshift64*). */
static uint64_t jitter_rand(void)
{
    static __thread uint64_t s;
    if (!s)
        s = (uint64_t)dlock_now_ns() ^ ((uint64_t)(uintptr_t)&s << 17) ^ 0x9e3779b97f4a7c15ULL;
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ULL;
}

/* Makes the calling thread the holder, in kind k, of a new grant in
 * protocol `protocol`, valid until valid_until (boot clock). Called with
 * e->mu held. */
static int take_grant(dlock_client *c, const dlock_kind *k, dlock_entry *e, uint64_t token,
                      int protocol, int unclean, int64_t valid_until)
{
    e->lease.state = DLOCK_LEASE_HELD;
    e->lease.kind = k;
    e->lease.shared = k->index == DLOCK_KIND_SHARED;
    e->lease.sem = 0; /* a lock's, even on an entry once a semaphore's (local/sem.h) */
    e->lease.grant_protocol = protocol;
    e->lease.grant_token = token;
    e->lease.token = token;
    e->lease.epoch++;
    e->lease.valid_until_ns = valid_until;
    e->lease.grant_boot_ns = dlock_boot_ns(); /* after the reply or message: Redis granted before */
    if (e->lease.unconfirmed) {
        e->lease.unconfirmed = 0; /* the grant's token is above it (acquire.lua) */
        e->lease.unconfirmed_end = 0;
        dlock_unconfirmed_clear(c->unconfirmed, e->name);
    }
    e->lease.provisional = 0;
    e->poll.msg_grant = 0;
    e->lease.lost_notified = 0;
    e->poll.queued = 0; /* the acquire script took this client out of the queue */
    int rc = dlock_renew_add(c->renew, e);
    if (rc != DLOCK_OK) {
        e->lease.state = DLOCK_LEASE_NONE;
        return dlock_err_set(rc, "out of memory registering the lease of '%s'", e->name);
    }
    k->hold(c, e, unclean);
    dlock_count(&c->ctr.leases_held, 1);
    dlock_count(&c->ctr.grants, 1);
    dlock_trace_event(c->trace, "grant", e->name, "%" PRIu64 " %d %" PRId64 " %" PRId64 " %" PRIu64,
                      token, unclean, valid_until, e->lease.grant_boot_ns, e->lease.epoch);
    return DLOCK_OK;
}

/* The direct grant message of e (wake_one), looked at by e's poller between
 * tries, with e->mu held. It is taken if it names the poller's last refused
 * try and enough of its validity is left, counted from when that try was
 * sent: the release that made the grant ran after Redis had seen the try,
 * and granted the lease for the waiter ttl from then (a renewal or a late
 * copy of the try resets that to the lease time: the validity counts the
 * smaller). A grant under an earlier try is never taken: that try's
 * successor was refused, so when it ran the lease was not this client's,
 * and the earlier grant was gone. A message dropped here (stale, or late)
 * costs time only: the next try finds the lease this client's own, if it
 * still is. DLOCK_OK (e is HELD by the calling
 * thread, provisionally: the renewal makes it a whole lease, at once if
 * other threads wait for it, else by half its validity), DLOCK_EBUSY
 * (dropped), or DLOCK_ENOMEM. */
static int take_direct_grant(dlock_client *c, const dlock_kind *k, dlock_entry *e)
{
    e->poll.msg_grant = 0;
    int64_t valid =
        e->poll.try_sent_boot + (int64_t)c->grant_ms * DLOCK_NS_PER_MS - c->grant_drift_ns;
    int64_t now = dlock_boot_ns();
    int take = e->poll.msg_nonce != 0 && e->poll.msg_nonce == e->poll.try_nonce &&
               now + c->grant_margin_ns < valid;
    dlock_trace_event(c->trace, "dgrant", e->name,
                      "%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRId64 " %" PRId64 " %d",
                      e->poll.msg_nonce, e->poll.msg_token, e->poll.try_nonce,
                      e->poll.try_sent_boot, now, take);
    char nonce[24];
    snprintf(nonce, sizeof nonce, "%" PRIu64, e->poll.msg_nonce);
    if (e->poll.msg_nonce != 0 && e->poll.msg_shared != (k->index == DLOCK_KIND_SHARED)) {
        /* A grant in the other mode (a release answered a try of another
         * kind's wait, this one's or an earlier one: not one the poller asks
         * for, and its tries are refused while it lives): it goes back, as
         * a grant of unknown outcome does. */
        dlock_renew_give_back(c->renew, e, nonce, e->poll.msg_protocol, e->poll.msg_shared);
        take = 0;
    }
    if (!take)
        return DLOCK_EBUSY;
    int others = e->waiters > 1; /* (before a shared grant's invitations count them out) */
    int rc = take_grant(c, k, e, e->poll.msg_token, e->poll.msg_protocol, e->poll.msg_unclean,
                        valid);
    if (rc != DLOCK_OK) {
        dlock_renew_give_back(c->renew, e, nonce, e->poll.msg_protocol, e->poll.msg_shared);
        return rc;
    }
    e->lease.provisional = 1;
    dlock_count(&c->ctr.direct_grants, 1);
    if (others)
        dlock_renew_kick(c->renew); /* so that local handoffs (or joins) can follow */
    else
        dlock_renew_by(c->renew, dlock_now_ns() + (valid - now) / 2);
    return DLOCK_OK;
}

/* The message of a timeout or a busy try on e: what the last refused try
 * said of the holder (at 3 a.m., who holds it, since when, how many wait).
 * Called with e->mu held. Returns rc. */
static int busy_err(const dlock_entry *e, int rc);

/* The poller's wait for e ends at its deadline: DLOCK_ETIMEDOUT, or
 * DLOCK_EREDIS with the message of its last try if that try found too
 * few Redlock nodes to ask (unreachable, its message; "" otherwise), as
 * dlock.h promises for a waiting acquire in Redlock mode. */
static int wait_end(const dlock_entry *e, const char *unreachable)
{
    if (unreachable[0])
        return dlock_err_set(DLOCK_EREDIS, "%s (until the wait for '%s' ended)", unreachable,
                             e->name);
    return busy_err(e, DLOCK_ETIMEDOUT);
}

static int busy_err(const dlock_entry *e, int rc)
{
    char holder[DLOCK_CLIENT_NAME_MAX + 64] = "", queue[128] = "";
    /* the try's age */
    double since = e->poll.busy_known ? (dlock_now_ns() - e->poll.busy_at_ns) / 1e9 : 0;
    double left = e->poll.busy_left_ms / 1e3 - since;
    if (e->lease.state == DLOCK_LEASE_HELD || dlock_entry_held(e))
        snprintf(holder, sizeof holder, ": held by another thread of this client");
    else if (!e->poll.busy_known)
        ; /* no try of this wait was answered */
    else if (e->poll.busy_holder[0] && e->poll.busy_held_ms >= 0)
        snprintf(holder, sizeof holder, ": held by %s for %.1f s, its lease ends in %.1f s",
                 e->poll.busy_holder, e->poll.busy_held_ms / 1e3 + since, left > 0 ? left : 0.0);
    else if (e->poll.busy_holder[0])
        snprintf(holder, sizeof holder, ": held by %s", e->poll.busy_holder);
    else if (e->poll.busy_left_ms < 0)
        snprintf(holder, sizeof holder, ": free, but it is another waiting client's turn");
    if (e->poll.busy_known && e->poll.busy_queue >= 0)
        snprintf(queue, sizeof queue, "; %lld client%s in its wait queue in Redis%s",
                 e->poll.busy_queue, e->poll.busy_queue == 1 ? "" : "s",
                 e->poll.busy_joined ? ", this one included" : "");
    if (rc == DLOCK_ETIMEDOUT)
        return dlock_err_set(rc, "timed out waiting for '%s'%s%s", e->name, holder, queue);
    return dlock_err_set(rc, "'%s' is not free%s%s", e->name, holder, queue);
}

/*
 * The poller's loop. Called with e->mu held, as e's designated poller
 * (e->poll.poller == 1, !has_owner, state NONE); returns with e->mu held. Talks
 * to Redis without e->mu. A refused try leaves the client in the lock's wait
 * queue in Redis (unless `once`); the poller then sleeps on e->cv until a
 * wake-up (e->poll.woken, set by the subscriber when a release gives this client
 * the turn), the fallback retry time (waiter_ttl/4, which also keeps its
 * place in the queue alive; sooner if the lease's remaining time is
 * shorter, for a holder that died), or its own deadline. A poller that gives
 * up while no other thread of this client waits takes the client out of the
 * queue. A shutdown or a fired cancel token (dlock_client_stop_rc) ends the poll: a
 * grant that its last try brought back is given back in the background.
 */
static int poll_loop(dlock_client *c, const dlock_kind *kind, dlock_entry *e, int64_t deadline,
                     int once, dlock_cancel *k);

static int poll_redis(dlock_client *c, const dlock_kind *kind, dlock_entry *e, int64_t deadline,
                      int once, dlock_cancel *k)
{
    int rc = poll_loop(c, kind, e, deadline, once, k);
    if (c->redlock)
        dlock_rlmode_wait_end(c, e); /* (a split vote kept by its last try goes back) */
    return rc;
}

static int poll_loop(dlock_client *c, const dlock_kind *kind, dlock_entry *e, int64_t deadline,
                     int once, dlock_cancel *k)
{
    e->poll.try_nonce = 0; /* a new wait: no direct grant yet */
    e->poll.msg_grant = 0;
    e->poll.busy_known = 0;
    e->poll.unreachable = 0;
    int shared = kind->index == DLOCK_KIND_SHARED;
    dlock_trace_event(c->trace, "poll", e->name, "%d %" PRIu64 " %c", once, e->made,
                      shared ? 's' : 'x');
    for (;;) {
        DLOCK_ASSERT(!dlock_entry_held(e) && e->lease.state == DLOCK_LEASE_NONE);
        e->lease.state = DLOCK_LEASE_ACQUIRING;
        e->poll.woken = 0; /* a wake-up from now on triggers another try */
        uint64_t unconfirmed = e->lease.unconfirmed;
        int unconfirmed_how = e->lease.unconfirmed_end;
        pthread_mutex_unlock(&e->mu);
        int kept_how;
        uint64_t kept = dlock_unconfirmed_get(c->unconfirmed, e->name, &kept_how);
        if (kept > unconfirmed) {
            unconfirmed = kept; /* the entry was freed and made anew since */
            unconfirmed_how = kept_how;
        }
        if (dlock_load_int_acquire(&c->server_bad)) {
            /* no new grant from a server the periodic check found unfit (a
             * held lease, reentrancy and local handoffs need no Redis call) */
            pthread_mutex_lock(&c->server_mu);
            int rc = dlock_err_set(DLOCK_ESERVER, "%s (found by the periodic check of the "
                                   "server; acquires that ask Redis fail until it is mended)",
                                   c->server_msg);
            pthread_mutex_unlock(&c->server_mu);
            pthread_mutex_lock(&e->mu);
            e->lease.state = DLOCK_LEASE_NONE;
            return rc;
        }
        char nonce[24];
        dlock_rpc_number(c, nonce);
        /* A single try waits for a connection (or a place in a batch) at
         * most one command timeout: it has no deadline of its own. */
        int64_t by = once ? dlock_now_ns() + (int64_t)c->conn.command_timeout_ms * DLOCK_NS_PER_MS
                          : deadline;
        dlock_rpc_try t = {.nonce = nonce, .queue = !once, .unconfirmed = unconfirmed,
                           .unconfirmed_end = unconfirmed_how, .deadline = by, .cancel = k,
                           .protocol = shared ? 2 : c->protocol, .shared = shared,
                           .busy = {"", -1, -1}};
        int rc = c->redlock ? dlock_rlmode_acquire(c, e, &t) : dlock_rpc_acquire(c, e, &t);
        uint64_t token = t.token;
        int unclean = t.unclean;
        int64_t pttl = t.pttl_ms, sent_boot = t.sent_boot;
        /* (Redlock mode: too few nodes, the message of why, for the end) */
        char unreachable[300] = "";
        if (t.unreachable)
            snprintf(unreachable, sizeof unreachable, "%s", dlock_last_error());
        int last_unreachable = t.unreachable;
        busy_info busy = t.busy;
        if (once && rc == DLOCK_ETIMEDOUT)
            rc = dlock_err_set(DLOCK_EREDIS, "timed out: redis took no try of '%s' within the "
                               "command timeout (%" PRIu32 " ms): every connection was busy or "
                               "stuck", e->name, c->conn.command_timeout_ms);
        int64_t answered = dlock_boot_ns();
        if (rc == DLOCK_OK &&
            answered >= sent_boot + (int64_t)c->lease_ms * DLOCK_NS_PER_MS - c->drift_ns) {
            /* The answer came back after the lease could have expired. */
            dlock_renew_give_back(c->renew, e, nonce, t.protocol, t.shared);
            rc = dlock_err_set(DLOCK_EREDIS, "timed out: redis answered the acquire of '%s' "
                               "after the lease could have expired", e->name);
        }
        pthread_mutex_lock(&e->mu);
        e->lease.state = DLOCK_LEASE_NONE;
        e->poll.unreachable = last_unreachable; /* (for the waiters' ends: acquire_wait) */
        if (t.unanswered && !once) {
            /* The try may have run without its answer reaching us (a
             * timeout, a connection lost after the send): it may have
             * queued the client, even on the wait's first try, before any
             * refusal told us so. The last waiter to go takes the client
             * out, as after a refusal (dlock_acquire_run): a leave that
             * finds no entry changes nothing, and, numbered after this try,
             * it makes Redis refuse the try if that arrives later. Without
             * it the entry would stay until a release or a leave walked
             * past it dead, and a release would hand this client the turn
             * (or a direct grant) for its waiter ttl. (Redlock mode keeps
             * its own account of the nodes a try reached: local/rlmode.c.) */
            e->poll.queued = 1;
            e->poll.queue_protocol = t.protocol;
        }
        if (unconfirmed > e->lease.unconfirmed) {
            /* the set's (the entry was made anew): kept here too, so that
             * a grant, which goes above it, clears both (take_grant) */
            e->lease.unconfirmed = unconfirmed;
            e->lease.unconfirmed_end = unconfirmed_how;
        }
        int stop = dlock_client_stop_rc(c, k);
        dlock_trace_event(c->trace, "tried", e->name, "%s %d %" PRId64 " %" PRId64 " %d", nonce, rc,
                          sent_boot, answered, stop);
        if (stop != DLOCK_OK) {
            if (rc == DLOCK_OK) {
                dlock_renew_give_back(c->renew, e, nonce, t.protocol, t.shared);
            } else if (rc == DLOCK_EBUSY && !once) {
                /* the last waiter to go takes the client out */
                e->poll.queued = 1;
                e->poll.queue_protocol = t.protocol;
            }
            return dlock_client_stop_err(stop, e->name);
        }
        if (rc == DLOCK_OK) {
            rc = take_grant(c, kind, e, token, t.protocol, unclean,
                            sent_boot + (int64_t)c->lease_ms * DLOCK_NS_PER_MS - c->drift_ns);
            if (rc != DLOCK_OK)
                dlock_renew_give_back(c->renew, e, nonce, t.protocol, t.shared);
            return rc;
        }
        if (rc == DLOCK_ETIMEDOUT && !once && e->poll.busy_known)
            /* The wait's deadline came while this try waited for a
             * connection: the wait ends, and says why it waited (an
             * earlier try's refusal), not the pool's word. */
            return wait_end(e, unreachable);
        if (rc != DLOCK_EBUSY)
            return rc;
        snprintf(e->poll.busy_holder, sizeof e->poll.busy_holder, "%s", busy.holder);
        e->poll.busy_held_ms = busy.held_ms;
        e->poll.busy_left_ms = pttl;
        e->poll.busy_queue = busy.queue;
        e->poll.busy_joined = !once;
        e->poll.busy_known = 1;
        e->poll.busy_at_ns = dlock_now_ns() - (dlock_boot_ns() - sent_boot); /* the send */
        if (once)
            return busy_err(e, DLOCK_EBUSY);
        e->poll.queued = 1;
        e->poll.queue_protocol = t.protocol;
        e->poll.try_nonce = strtoull(nonce, NULL, 10);
        e->poll.try_sent_boot = sent_boot;
        if (e->poll.msg_grant && (rc = take_direct_grant(c, kind, e)) != DLOCK_EBUSY)
            return rc; /* it came before the refusal's answer */
        int64_t now = dlock_now_ns();
        if (now >= deadline)
            return wait_end(e, unreachable);
        int64_t delay_ns = c->fallback_ns;
        if (pttl > 0 && pttl * DLOCK_NS_PER_MS < delay_ns)
            delay_ns = pttl * DLOCK_NS_PER_MS + DLOCK_NS_PER_MS / 2;
        /* Jitter: a uniform time in [3/4, 1] of the delay, so that pollers of
         * many clients do not retry in step. */
        delay_ns -= (int64_t)(jitter_rand() % (uint64_t)(delay_ns / 4 + 1));
        int64_t wake = now + delay_ns < deadline ? now + delay_ns : deadline;
        while (!e->poll.woken && (stop = dlock_client_stop_rc(c, k)) == DLOCK_OK &&
               dlock_now_ns() < wake) {
            struct timespec ts = dlock_ts(wake);
            pthread_cond_timedwait(&e->pcv, &e->mu, &ts);
        }
        if ((stop = dlock_client_stop_rc(c, k)) != DLOCK_OK)
            return dlock_client_stop_err(stop, e->name); /* a direct grant is freed by the leave */
        if (e->poll.msg_grant && (rc = take_direct_grant(c, kind, e)) != DLOCK_EBUSY)
            return rc; /* granted by a release: no call needed */
        if (dlock_now_ns() >= deadline) /* no try after the deadline, woken or not */
            return wait_end(e, unreachable);
    }
}

/* A lease whose validity ran out while it was passed between threads:
 * nobody held it, so on_lost has no holder to tell, but the log says so.
 * Called with no lock held. */
static void log_lost_in_passing(dlock_client *c, const char *name, uint64_t token)
{
    dlock_client_log(c, DLOCK_LOG_WARN, "the lease of '%s' (token %" PRIu64 ") ran out while it "
                     "was passed between threads (not renewed in time): it goes back to Redis",
                     name, token);
}

/* acquire's work, once the arguments are checked and the cancel token, if
 * any, has this call registered. */
int dlock_acquire_run(dlock_client *c, const dlock_kind *kind, const char *name, size_t len,
                      int64_t wait_ms, uint64_t *fence, dlock_cancel *k)
{
    int rc = DLOCK_OK;
    int64_t start = dlock_now_ns();
    /* Waits beyond ~292 years are "forever". */
    int64_t deadline = wait_ms < 0 || wait_ms > (DLOCK_NEVER - start) / DLOCK_NS_PER_MS
                           ? DLOCK_NEVER
                           : start + wait_ms * DLOCK_NS_PER_MS;
    dlock_entry *e = dlock_held_find(c, name, len); /* a reentrant acquire, without the table */
    if (!e)
        e = dlock_table_get(c->table, name, len);
    if (!e)
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");

    pthread_mutex_lock(&e->mu);
    if (dlock_sem_in_use(e)) {
        /* (local/sem.h, M1) */
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
        return dlock_err_set(DLOCK_EINVAL, "'%s' is used as a semaphore by this client: a name "
                             "is a lock or a semaphore", name);
    }
    if (kind->mine(c, e)) {
        /* Reentrant acquire: no Redis command. */
        rc = kind->reenter(c, e, fence);
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e); /* the owner keeps its outermost reference */
        if (rc == DLOCK_OK)
            dlock_count(&c->ctr.acquisitions, 1);
        return rc;
    }

    e->waiters++;
    e->kind_waiters[kind->index]++;
    uint64_t fail_seq = e->poll.fail_seq;
    int drop_registry = 0, give_back = 0;
    uint64_t passed_lost = 0; /* a lease lost while being passed here: logged on the way out */
    dlock_waiter *w = dlock_waiter_self();
    w->kind = kind->index;
    for (;;) {
        if (dlock_waiter_granted(w)) {
            /* Passed to this thread alone while it was parked (I10). */
            rc = kind->take(c, e, w, 1, &drop_registry, &passed_lost);
            if (rc == DLOCK_OK)
                break;
            continue; /* lost in passing: poll Redis again */
        }
        if (!dlock_entry_held(e) && e->lease.state == DLOCK_LEASE_LOST) {
            /* Lost while being passed between threads: nobody holds it. */
            if (e->lease.unconfirmed)
                dlock_client_unconfirmed_end(c, e, e->lease.unconfirmed, e->lease.unconfirmed_end);
            e->lease.state = DLOCK_LEASE_NONE;
            e->lease.kind->drop_lost(e); /* the lease's kind: an open pass of it ends */
        }
        if ((rc = dlock_client_stop_rc(c, k)) != DLOCK_OK) {
            /* Shutdown or cancelled: stop waiting. A lease being passed to
             * the waiters (an open handoff, I5) must not be left without
             * anyone to take it: the last waiter takes it to give it back
             * (below); otherwise the next one is woken on the way out. */
            if (kind->index == DLOCK_KIND_EXCL && kind->passing(c, e) &&
                e->kind_waiters[DLOCK_KIND_EXCL] == 1) {
                uint64_t t = e->lease.token;
                if (kind->take(c, e, w, 0, &drop_registry, NULL) == DLOCK_OK)
                    give_back = 1;
                else
                    passed_lost = t;
            }
            rc = dlock_client_stop_err(rc, name);
            break;
        }
        if (kind->passing(c, e)) {
            uint64_t t = e->lease.token;
            rc = kind->take(c, e, w, 0, &drop_registry, NULL);
            if (rc == DLOCK_OK)
                break;
            if (rc == DLOCK_ELOST)
                passed_lost = t; /* it expired in passing: poll Redis again */
            continue;            /* (DLOCK_EBUSY: a join refused on its own reading) */
        }
        if (e->poll.fail_seq != fail_seq) {
            /* The poll this thread waited behind failed: so does this call,
             * rather than poll again and wait another timeout (rule: waiters
             * fail with their poller). */
            rc = dlock_err_set(e->poll.fail_rc, "%s", e->poll.fail_msg);
            break;
        }
        if (!dlock_entry_held(e) && e->lease.state == DLOCK_LEASE_NONE && !e->poll.poller) {
            if (wait_ms != 0 && dlock_now_ns() >= deadline) {
                /* No Redis call starts past the caller's deadline; the
                 * wake-up that may have been meant to make this thread the
                 * poller goes to the next waiter on the way out (I9). */
                rc = busy_err(e, DLOCK_ETIMEDOUT);
                break;
            }
            /* The poller sleeps on e->pcv between tries, out of the queue. */
            dlock_waitq_remove(&e->wq, w);
            e->poll.poller = 1;
            rc = poll_redis(c, kind, e, deadline, wait_ms == 0, k);
            e->poll.poller = 0;
            if (rc != DLOCK_OK && rc != DLOCK_EBUSY && rc != DLOCK_ETIMEDOUT &&
                rc != DLOCK_ECLOSED && rc != DLOCK_ECANCELED) {
                /* Tell the threads that waited behind this poll: they fail
                 * too rather than each wait a timeout in turn. */
                e->poll.fail_seq++;
                e->poll.fail_rc = rc;
                snprintf(e->poll.fail_msg, sizeof e->poll.fail_msg, "%s", dlock_last_error());
                dlock_waitq_wake_all(&e->wq);
            }
            break;
        }
        if (wait_ms == 0) {
            rc = dlock_err_set(DLOCK_EBUSY, "'%s' is held or being acquired by another thread",
                               name);
            break;
        }
        int64_t now = dlock_now_ns();
        if (now >= deadline) {
            rc = e->poll.unreachable
                     ? dlock_err_set(DLOCK_EREDIS, "'%s': too few Redlock nodes counted and "
                                     "answered this client's last try, until the wait ended",
                                     name)
                     : busy_err(e, DLOCK_ETIMEDOUT);
            break;
        }
        if (!w->queued)
            dlock_waitq_push(&e->wq, w, now);
        dlock_waiter_park(w, &e->mu, deadline);
    }
    if (give_back) {
        /* A stopped waiter that took an open handoff nobody else waits for:
         * it releases it as the releasing thread would have, with word of
         * how the hold before ended (it used the lease for nothing). */
        dlock_waitq_remove(&e->wq, w);
        e->waiters--;
        e->kind_waiters[kind->index]--;
        kind->unused(e);
        char keep[256];
        snprintf(keep, sizeof keep, "%s", dlock_last_error());
        dlock_table_ref(e); /* the owner's, which dlock_release_outermost drops with ours */
        (void)dlock_release_outermost(c, kind, e, name);
        dlock_err_set(rc, "%s", keep);
        return rc;
    }
    if (dlock_waiter_granted(w)) {
        /* A direct handoff: the releaser made this thread the owner, took
         * it out of the queue and out of e->waiters (I10). */
        dlock_trace_event(c->trace, "ok", e->name, "%" PRIu64, w->token);
        pthread_mutex_unlock(&e->mu);
        if (passed_lost)
            log_lost_in_passing(c, name, passed_lost);
        dlock_orphan_arm(); /* a thread that exits holding it releases it */
        if (kind->index == DLOCK_KIND_EXCL)
            dlock_held_remember(c, e); /* (a shared holder has its record: shared.h) */
        dlock_count(&c->ctr.acquisitions, 1);
        if (fence)
            *fence = w->token;
        return DLOCK_OK;
    }
    dlock_waitq_remove(&e->wq, w);
    int passing = rc != DLOCK_OK && kind->passing(c, e);
    if (rc != DLOCK_OK)
        /* (what the leave below is decided on, for sim/trace.lua, which
         * requires the leave when its own view has the client queued) */
        dlock_trace_event(c->trace, "gaveup", e->name, "%d %u %d %d %d %d", rc, e->waiters,
                          e->poll.poller, dlock_entry_held(e), (int)e->lease.state, passing);
    if (rc != DLOCK_OK && e->poll.queued && e->waiters == 1 && !e->poll.poller && !dlock_entry_held(e) &&
        e->lease.state == DLOCK_LEASE_NONE && !passing) {
        /* The last thread here that wanted the name gives up: take the
         * client out of the queue (passing its turn on, if it had it). The
         * call is numbered now, before any later attempt of this client, so
         * Redis ignores it if it arrives after one. */
        char number[24];
        dlock_rpc_number(c, number);
        e->poll.queued = 0;
        if ((rc != DLOCK_ETIMEDOUT && rc != DLOCK_EBUSY) || c->redlock) {
            /* Redis is failing, or the acquire was cancelled or the client
             * shuts down (the thread returns at once, without a Redis
             * call): the renewal thread tells it when it can
             * (dlock_client_close makes it try once more). Redlock mode's
             * leave goes to every node, in the background too, rather than
             * keep the caller for a stopped node's command timeout. */
            dlock_renew_leave(c->renew, e, number, e->poll.queue_protocol);
        } else {
            /* As e's poller, so that nobody else talks to Redis for e
             * meanwhile. */
            e->poll.poller = 1;
            int in = e->poll.queue_protocol;
            pthread_mutex_unlock(&e->mu);
            dlock_rpc_leave(c, e, number, in);
            pthread_mutex_lock(&e->mu);
            e->poll.poller = 0;
        }
    }
    /* A thread that came meanwhile may poll; a wake-up this thread received
     * and did not use goes on (I9). */
    e->waiters--;
    e->kind_waiters[kind->index]--;
    dlock_entry_kick_head(e);
    uint64_t token = e->lease.token;
    if (rc == DLOCK_OK)
        dlock_trace_event(c->trace, "ok", e->name, "%" PRIu64, token);
    pthread_mutex_unlock(&e->mu);
    if (passed_lost)
        log_lost_in_passing(c, name, passed_lost);
    while (drop_registry-- > 0)
        dlock_table_put(c->table, e); /* our own reference keeps e alive */
    if (rc != DLOCK_OK) {
        dlock_table_put(c->table, e);
        return rc;
    }
    /* Our reference becomes the owner's, dropped by the outermost release. */
    dlock_orphan_arm(); /* a thread that exits holding it releases it */
    if (kind->index == DLOCK_KIND_EXCL)
        dlock_held_remember(c, e); /* (a shared holder has its record: shared.h) */
    dlock_count(&c->ctr.acquisitions, 1);
    if (fence)
        *fence = token;
    return DLOCK_OK;
}
