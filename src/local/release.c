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
#include "local/kind.h"
#include "common/error.h"
#include "local/excl.h"
#include "local/release.h"
#include "local/rlmode.h"
#include "local/rpc.h"
#include "local/shared.h"

/* An exclusive lease (not a shared one) whose holders of kind k are done
 * serves this client's threads of the other kind without Redis, when a
 * local pass is allowed: after a reader phase, a thread waiting
 * exclusively (a handoff); after an exclusive hold, the threads waiting
 * shared (a reader phase: shared.h, S8). 1 if it stays (*wake as for
 * pass, or the phase's readers in ws), else 0. e->mu held. */
static int adopt(dlock_client *c, const dlock_kind *k, dlock_entry *e, int64_t now,
                 dlock_waiter **wake, dlock_wakeset *ws)
{
    *wake = NULL;
    if (e->lease.shared)
        return 0;
    if (k == &dlock_kind_shared)
        return dlock_kind_excl.pass(c, e, now, wake);
    return dlock_shared_phase(c, e, now, ws);
}

/* The outermost release of e by the calling thread, which holds it in kind
 * k, e->mu and two references (its lookup's and the owner's, both dropped
 * here). */
int dlock_release_outermost(dlock_client *c, const dlock_kind *k, dlock_entry *e,
                            const char *name)
{
    int rc;
    k->unhold(e);
    if (e->lease.state == DLOCK_LEASE_LOST) {
        dlock_trace_event(c->trace, "rlost", e->name, NULL);
        if (!dlock_entry_held(e)) {
            /* the last holder (other threads sharing it learn it at their
             * own releases: shared.h, S5) */
            (void)k->end(e); /* Redis took it back: the next grant learns that itself */
            if (e->lease.unconfirmed) /* found lost by validity */
                dlock_client_unconfirmed_end(c, e, e->lease.unconfirmed,
                                             e->lease.unconfirmed_end);
            e->lease.state = DLOCK_LEASE_NONE;
            dlock_entry_kick_head(e); /* it polls */
        }
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
        dlock_table_put(c->table, e); /* the owner's reference */
        return dlock_err_set(DLOCK_ELOST, "the lease of '%s' was lost while held", name);
    }
    DLOCK_ASSERT(e->lease.state == DLOCK_LEASE_HELD);
    dlock_waiter *wk;
    dlock_wakeset ws;
    ws.n = 0;
    int64_t now = dlock_boot_ns();
    if (k->pass(c, e, now, &wk) || adopt(c, k, e, now, &wk, &ws)) {
        /* A local handoff (I10): the lease stays with this client. */
        pthread_mutex_unlock(&e->mu);
        /* Woken after the unlock, so that they do not wake up only to wait
         * for e->mu (their nodes outlive the wait: park.h). */
        dlock_waiter_unpark(wk);
        dlock_wakeset_run(&ws);
        dlock_table_put(c->table, e);
        dlock_table_put(c->table, e); /* the owner's: the taker has its own */
        return DLOCK_OK;
    }
    int drop = dlock_renew_remove(c->renew, e); /* no renewal after this point */
    e->lease.state = DLOCK_LEASE_RELEASING;
    uint64_t grant = e->lease.grant_token, token = e->lease.token;
    int protocol = e->lease.grant_protocol;
    int ending = k->end(e);
    pthread_mutex_unlock(&e->mu);
    if (drop)
        dlock_table_put(c->table, e); /* we still hold two references */
    dlock_renew_quiesce(c->renew); /* no renewal of this grant after the release */

    rc = c->redlock ? dlock_rlmode_release(c, e, ending)
                    : dlock_rpc_release(c, e, grant, protocol, token, ending);

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
        notify = !e->lease.lost_notified;
        e->lease.lost_notified = 1;
    }
    e->lease.state = DLOCK_LEASE_NONE;
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

int dlock_release_shared_hold(dlock_client *c, dlock_entry *e, const char *name,
                              int64_t since_ns)
{
    dlock_hist_add(&c->ctr.hold, dlock_now_ns() - since_ns);
    /* Another holder keeps the lease: this release asks no Redis, so the
     * lease's validity tells whether it lasted through this hold. */
    int others = e->s.holders > 1;
    uint64_t token = e->lease.token;
    int ran_out = e->lease.state == DLOCK_LEASE_HELD && dlock_boot_ns() >= e->lease.valid_until_ns;
    int rc = dlock_release_outermost(c, &dlock_kind_shared, e, name);
    if (rc == DLOCK_OK && others && ran_out)
        rc = dlock_err_set(DLOCK_ELOST, "the shared lease of '%s' (token %" PRIu64 ") ran out "
                           "while held (not renewed in time)", name, token);
    return rc;
}
