/*
 * Redlock mode's glue (rlmode.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "local/rlmode.h"

/* How a refused or failed waiting try paces its next one: at least this,
 * and at most a third of the lease. */
#define RETRY_MIN_MS 5


int64_t dlock_rlmode_retry_ms(const dlock_client *c, int64_t pttl)
{
    int64_t hi = c->lease_ms / 3 > RETRY_MIN_MS ? c->lease_ms / 3 : RETRY_MIN_MS;
    if (pttl < RETRY_MIN_MS)
        return RETRY_MIN_MS;
    return pttl > hi ? hi : pttl;
}

int64_t dlock_rlmode_exchange_deadline(const dlock_client *c)
{
    return dlock_now_ns() + ((int64_t)c->conn.connect_timeout_ms +
                             2 * (int64_t)c->conn.command_timeout_ms) * DLOCK_NS_PER_MS;
}

uint64_t dlock_rlmode_ticket(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t us = ts.tv_sec > 0 ? (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u : 0;
    return us ? us : 1;
}

/* Gives attempt `attempt` of e (a shared try's or not) back on every
 * node, in the background. */
static void give_back(dlock_client *c, dlock_entry *e, uint64_t attempt, int shared)
{
    char number[24];
    snprintf(number, sizeof number, "%" PRIu64, attempt);
    dlock_renew_give_back(c->renew, e, number, 2, shared);
}

void dlock_rlmode_wait_end(dlock_client *c, dlock_entry *e)
{
    if (e->poll.rl_kept)
        give_back(c, e, e->poll.rl_kept, e->poll.rl_kept_shared);
    dlock_trace_event(c->trace, "rl.wend", e->name, "%" PRIu64, e->poll.rl_kept);
    e->poll.rl_kept = 0;
    e->poll.rl_ticket = 0;
}

int dlock_rlmode_acquire(dlock_client *c, dlock_entry *e, dlock_rpc_try *t)
{
    if (!e->lease.rl && !(e->lease.rl = calloc(1, sizeof *e->lease.rl)))
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    t->protocol = 2;
    /* a wait's ticket: its first try's wall clock, kept by its tries */
    if (t->queue && !e->poll.rl_ticket)
        e->poll.rl_ticket = dlock_rlmode_ticket();
    dlock_redlock_req q = {.name = e->name, .keys = e->keys, .args = &c->args,
                           .client_name = c->conn.client_name,
                           .attempt = strtoull(t->nonce, NULL, 10),
                           .pass_limit = c->pass_limit,
                           /* a try started before the caller's deadline gets
                            * a whole exchange (a single try's deadline bounds
                            * the wait for a connection only: acquire.c) */
                           .deadline = dlock_rlmode_exchange_deadline(c),
                           .queue = t->queue, .ticket = e->poll.rl_ticket,
                           .client_id = c->args.client_id, .shared = t->shared};
    if (t->queue && t->deadline > q.deadline)
        q.deadline = t->deadline; /* (waits for a pooled connection until then) */
    dlock_redlock_grant g;
    dlock_redlock_busy busy;
    t->sent_boot = dlock_boot_ns();
    int rc = dlock_redlock_acquire(c->redlock, &q, &g, &busy);
    dlock_trace_event(c->trace, "rl.acq", e->name,
                      "%s %d %" PRIu64 " %u %" PRId64 " %" PRId64 " %" PRId64 " %d %d", t->nonce,
                      rc, g.token, rc == DLOCK_OK ? g.votes : busy.votes, t->sent_boot,
                      g.first_boot, g.valid_boot, rc == DLOCK_EBUSY && busy.kept, busy.older);
    /* A split vote an earlier try kept, on nodes this try did not reach:
     * given back once this try ended (a release by that attempt leaves
     * this one's grants alone). */
    uint64_t before = e->poll.rl_kept;
    int before_shared = e->poll.rl_kept_shared;
    e->poll.rl_kept = rc == DLOCK_EBUSY && busy.kept ? q.attempt : 0;
    e->poll.rl_kept_shared = t->shared;
    if (before && before != e->poll.rl_kept)
        give_back(c, e, before, before_shared);
    if (rc == DLOCK_OK) {
        /* A wait granted may still be queued where a try of it was
         * refused (or not answered): out of every node's queue, in the
         * background, numbered as the grant's attempt, so that a node
         * whose queue holds it does not later grant it directly what it
         * no longer waits for (leave.lua gives up only grants of older
         * attempts: this one's, held, stay; a node that saw a later
         * attempt ignores it). Not on the nodes that granted it: the
         * grant took the client out of their queues. */
        uint32_t granted = 0;
        for (unsigned i = 0; i < dlock_redlock_nodes(c->redlock); i++)
            granted |= (uint32_t)(g.node_token[i] != 0) << i;
        if (t->queue && granted + 1 != 1u << dlock_redlock_nodes(c->redlock))
            dlock_renew_rl_leave(c->renew, e, t->nonce, granted);
        *e->lease.rl = g;
        t->token = g.token;
        t->unclean = g.unclean;
        t->sent_boot = g.first_boot;
        return DLOCK_OK;
    }
    t->busy.holder[0] = '\0';
    t->busy.held_ms = t->busy.queue = -1;
    if (rc == DLOCK_EBUSY) {
        /* (refused for another waiter's turn alone, no lease told: the
         * fallback, as with one server; the simulator's a third of a
         * lease) */
        t->pttl_ms = busy.pttl_ms > 0 ? dlock_rlmode_retry_ms(c, busy.pttl_ms) : -1;
        /* (a waiting holder's name without its "@<ticket>.<id>") */
        char *at = strrchr(busy.holder, '@');
        if (at && strchr(at, '.'))
            *at = '\0';
        snprintf(t->busy.holder, sizeof t->busy.holder, "%.*s", (int)sizeof t->busy.holder - 1,
                 busy.holder);
        return DLOCK_EBUSY;
    }
    if (rc == DLOCK_ESERVER && t->queue)
        /* (a semaphore's claim on a majority: the wait ends; a node that
         * refused it as held may have queued the client: the last waiter
         * leaves every queue, as below) */
        t->unanswered = 1;
    if (rc != DLOCK_EREDIS)
        return rc;
    /* A node that did not answer (or did not count) may have run the
     * acquire: the renewal thread gives this attempt back on every node it
     * was sent to, without delaying the caller, as a single server's
     * attempt of unknown outcome (rpc.c). */
    uint32_t all = (uint32_t)((1u << dlock_redlock_nodes(c->redlock)) - 1);
    dlock_renew_rl_give_back(c->renew, e, t->nonce, t->shared, all & ~busy.sent);
    char why[900];
    snprintf(why, sizeof why, "%s", dlock_last_error());
    if (strstr(why, "not seeded"))
        rc = dlock_err_set(rc, "%s. A fresh deployment is seeded once by an operator: "
                           "dlockctl --redlock-nodes HOST:PORT,... seed-fresh (docs/operations.md, "
                           "\"Redlock\"); a restarted node is seeded by the clients a lease after "
                           "they see it", why);
    /* A waiting try's nodes that answered may have queued the client
     * (they refused it): the last waiter to go takes it out of every
     * node's queue, as after a refusal (acquire.c; the give-back above is
     * by attempt, which leaves queues alone). A waiting try goes on while
     * its deadline leaves time for another: a node restarted and not
     * seeded yet, a node back. */
    t->unanswered = t->queue;
    int64_t pause = dlock_rlmode_retry_ms(c, c->lease_ms / 10) * DLOCK_NS_PER_MS;
    int again = t->queue && (t->deadline == DLOCK_NEVER ||
                             dlock_now_ns() + pause + DLOCK_NS_PER_MS < t->deadline);
    if (again) {
        t->unreachable = 1;
        t->pttl_ms = pause / DLOCK_NS_PER_MS;
        snprintf(t->busy.holder, sizeof t->busy.holder, "%s", "");
        return DLOCK_EBUSY;
    }
    return rc;
}

int dlock_rlmode_release(dlock_client *c, dlock_entry *e, int ending)
{
    if (!e->lease.rl)
        return dlock_err_set(DLOCK_EREDIS, "redlock release of '%s': no grant known", e->name);
    dlock_redlock_req q = {.name = e->name, .keys = e->keys, .args = &c->args,
                           .client_name = c->conn.client_name, .attempt = e->lease.rl->attempt,
                           .deadline = dlock_rlmode_exchange_deadline(c), .ended = ending};
    /* (the releaser owns the lease's fields while it is RELEASING) */
    int ran_out = dlock_boot_ns() >= e->lease.valid_until_ns;
    int rc = dlock_redlock_release(c->redlock, &q, e->lease.rl);
    dlock_trace_event(c->trace, "rl.rel", e->name, "%" PRIu64 " %d %d", e->lease.rl->token, rc,
                      ran_out);
    if (rc != DLOCK_ELOST && ran_out)
        /* No majority confirmed it to this point: another client may
         * have held it meanwhile (the nodes' grants end by their clocks). */
        rc = dlock_err_set(DLOCK_ELOST, "the lease of '%s' ran out before its release (its "
                           "validity passed unrenewed): it was lost while held", e->name);
    return rc;
}
