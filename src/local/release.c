/*
 * Releasing (release.h): a handoff to a waiting thread of this client, or
 * the release script. Shared state: the entry, under client.h's rules; the
 * caller holds e->mu on entry.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "local/client.h"
#include "common/error.h"
#include "local/release.h"
#include "local/rpc.h"

/* The k-th local handoff of a grant takes token grant_token + k: only once
 * k us have passed since the grant on the server's clock, so that no token
 * is ever ahead of it (docs/guide.md, "Fencing tokens": a restart or failover that
 * loses the fence cannot undercut a token in use). Redis made the grant at
 * server time grant_token (a grant is never ahead of server time but after a
 * clock step back), before this client learned it at grant_boot_ns; this
 * host's clock may run up to 1% fast (the drift margin's assumption), so the
 * elapsed time counts 99%. A handoff this fast (more than one per
 * microsecond) goes back to Redis instead. Called with e->mu held. */
static int handoff_in_time(const dlock_entry *e, int64_t now)
{
    int64_t us = (now - e->grant_boot_ns) / 1000;
    return (int64_t)e->passes + 1 <= us - (us + 99) / 100;
}

/* The outermost release of e by the calling thread, which holds e->mu and
 * two references (its lookup's and the owner's, both dropped here). */
int dlock_release_outermost(dlock_client *c, dlock_entry *e, const char *name)
{
    int rc;
    e->has_owner = 0;
    e->depth = 0;
    if (e->state == DLOCK_LEASE_LOST) {
        dlock_trace_event(c->trace, "rlost", e->name, NULL);
        e->ending = 0; /* Redis took it back: the next grant learns that itself */
        if (e->unconfirmed) /* found lost by validity */
            dlock_client_unconfirmed_end(c, e, e->unconfirmed, e->unconfirmed_end);
        e->state = DLOCK_LEASE_NONE;
        dlock_entry_kick_head(e); /* it polls */
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
        dlock_table_put(c->table, e); /* the owner's reference */
        return dlock_err_set(DLOCK_ELOST, "the lease of '%s' was lost while held", name);
    }
    DLOCK_ASSERT(e->state == DLOCK_LEASE_HELD);
    int64_t now = dlock_boot_ns();
    int closing = dlock_load_int(&c->closing);
    int pass = e->waiters > 0 && e->passes < c->pass_limit && !closing &&
               now + (e->provisional ? c->grant_margin_ns : c->handoff_margin_ns) <
                   e->valid_until_ns &&
               handoff_in_time(e, now);
    dlock_trace_event(c->trace, "rdec", e->name,
                      "%d %" PRId64 " %u %u %" PRIu64 " %" PRId64 " %d %d %d", pass, now,
                      e->waiters, e->passes, e->token, e->valid_until_ns, e->provisional, closing,
                      e->ending);
    if (pass) {
        /* A local handoff (I10): the lease stays with this client and
         * passes to a waiting thread, with the next token, and with word of
         * how this hold ended (a thread that exited: dlock_unclean). */
        e->passes++;
        e->token++;
        e->unclean = e->ending;
        e->ending = 0;
        if (e->unclean)
            dlock_count(&c->ctr.unclean, 1);
        dlock_count(&c->ctr.handoffs, 1);
        dlock_waiter *h = e->wq.head, *wk = NULL;
        if (h && dlock_now_ns() - e->wq.head_since_ns >= DLOCK_FAIR_NS) {
            /* Direct handoff (I10) to the longest waiter: it has waited
             * long enough that nobody may pass it. */
            e->has_owner = 1;
            e->owner = h->self;
            e->depth = 1;
            e->waiters--;
            wk = dlock_waitq_grant(&e->wq, h, e->token);
        } else {
            /* Open handoff: the first thread of this client to run takes
             * it, a newcomer or the head, which is woken (one waiter, not
             * all: the others would only burn CPU). */
            e->handoff = 1;
            if (h)
                wk = dlock_waitq_wake_later(h);
        }
        pthread_mutex_unlock(&e->mu);
        /* Woken after the unlock, so that it does not wake up only to wait
         * for e->mu (its node outlives the wait: park.h). */
        dlock_waiter_unpark(wk);
        dlock_table_put(c->table, e);
        dlock_table_put(c->table, e); /* the owner's: the taker has its own */
        return DLOCK_OK;
    }
    int drop = dlock_renew_remove(c->renew, e); /* no renewal after this point */
    e->state = DLOCK_LEASE_RELEASING;
    uint64_t grant = e->grant_token, token = e->token;
    int protocol = e->grant_protocol;
    int ending = e->ending;
    e->ending = 0;
    pthread_mutex_unlock(&e->mu);
    if (drop)
        dlock_table_put(c->table, e); /* we still hold two references */
    dlock_renew_quiesce(c->renew); /* no renewal of this grant after the release */

    rc = dlock_rpc_release(c, e, grant, protocol, token, ending);

    int notify = 0;
    pthread_mutex_lock(&e->mu);
    dlock_trace_event(c->trace, "released", e->name, "%d", rc);
    dlock_count(&c->ctr.leases_held, (uint64_t)-1);
    if (rc != DLOCK_OK) {
        /* The lease may still be ours in Redis, until it expires (the
         * release did not arrive), or be ours again (a step back of the
         * server's clock brings an expired grant back): a later acquire
         * that finds it so is granted above every token handed out under
         * it. */
        dlock_client_unconfirmed_end(c, e, token,
                                     rc == DLOCK_ELOST ? DLOCK_UNCLEAN_EXPIRED : ending);
    }
    if (rc == DLOCK_ELOST) {
        dlock_count(&c->ctr.leases_lost, 1);
        notify = !e->lost_notified;
        e->lost_notified = 1;
    }
    e->state = DLOCK_LEASE_NONE;
    /* One waiter becomes the poller; waking all of them (a thousand threads
     * every pass_limit acquisitions) cost 40% of the throughput of one
     * process x 1024 threads on one name. A woken waiter that gives up
     * instead passes the wake-up on (I9). */
    dlock_entry_kick_head(e);
    pthread_mutex_unlock(&e->mu);
    if (notify) {
        /* found at the release, before the renewal did: said here */
        dlock_client_log(c, DLOCK_LOG_WARN, "the lease of '%s' (token %" PRIu64 ") was gone "
                         "from Redis at its release: it was lost while held (it expired, or "
                         "was taken or released by an operator)", e->name, token);
        if (c->on_lost)
            c->on_lost(e->name, token, c->on_lost_arg);
    }
    dlock_table_put(c->table, e);
    dlock_table_put(c->table, e); /* the owner's reference */
    return rc;
}
