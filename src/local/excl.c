/*
 * The exclusive lock (excl.h), the first kind of lock (kind.h). Shared
 * state: the entry's `x` and lease, under client.h's rules (I1, I4, I5,
 * I10); every function is called with e->mu held.
 */
#include <inttypes.h>
#include <pthread.h>

#include "local/client.h"
#include "common/error.h"
#include "local/excl.h"

static int mine(const dlock_client *c, const dlock_entry *e)
{
    (void)c;
    return e->x.has_owner && !e->x.by_handle && pthread_equal(e->x.owner, pthread_self());
}

/* A reentrant acquire: depth only, no Redis command. */
static int reenter(dlock_client *c, dlock_entry *e, uint64_t *fence)
{
    int64_t at = dlock_boot_ns();
    dlock_trace_event(c->trace, "reent", e->name, "%" PRIu64 " %" PRId64 " %d", e->lease.token,
                      at, e->lease.state == DLOCK_LEASE_HELD && at < e->lease.valid_until_ns);
    if (e->lease.state != DLOCK_LEASE_HELD || at >= e->lease.valid_until_ns)
        return dlock_err_set(DLOCK_ELOST, "the lease of '%s' is lost; release it", e->name);
    e->x.depth++;
    if (fence)
        *fence = e->lease.token;
    return DLOCK_OK;
}

/* The calling thread owns a new grant, no handoff of it made yet. */
static void hold(dlock_client *c, dlock_entry *e, int unclean)
{
    e->x.unclean = unclean;
    e->x.ending = 0;
    if (unclean)
        dlock_count(&c->ctr.unclean, 1);
    e->x.handoff = 0;
    e->x.passes = 0;
    e->x.has_owner = 1;
    e->x.owner = pthread_self();
    e->x.depth = 1;
}

static int held(const dlock_entry *e)
{
    return e->x.has_owner;
}

static int passing(const dlock_client *c, const dlock_entry *e)
{
    (void)c;
    return e->x.handoff;
}

/* Takes a lease that its holder passed on (a local handoff): no Redis command.
 * Called with e->mu held, e->x.handoff set. If the lease's validity ran out
 * while it was passed, it is lost and not taken (I4): the caller polls,
 * and drops the registry's reference after unlocking if *drop was set.
 * DLOCK_OK or DLOCK_ELOST. */
static int take_handoff(dlock_client *c, dlock_entry *e, int *drop)
{
    DLOCK_ASSERT(!e->x.has_owner && e->s.holders == 0 && !e->lease.shared &&
                 e->lease.state == DLOCK_LEASE_HELD);
    e->x.handoff = 0;
    int64_t now = dlock_boot_ns();
    dlock_trace_event(c->trace, "take", e->name, "%" PRIu64 " %" PRId64 " %d", e->lease.token, now,
                      now < e->lease.valid_until_ns);
    if (now >= e->lease.valid_until_ns) {
        /* Lost by its validity alone: Redis may still have it as ours. */
        dlock_client_unconfirmed_end(c, e, e->lease.token, DLOCK_UNCLEAN_EXPIRED);
        *drop += dlock_renew_mark_lost(c->renew, e);
        e->lease.lost_notified = 1; /* no thread held it: nobody to tell */
        e->lease.state = DLOCK_LEASE_NONE;
        return DLOCK_ELOST;
    }
    e->x.has_owner = 1;
    e->x.owner = pthread_self();
    e->x.depth = 1;
    return DLOCK_OK;
}

/* A lease passed to the calling thread alone while it was parked (I10, a
 * direct handoff): the releaser made it the owner while the lease was valid,
 * but the thread runs later, maybe much later. It is taken only if it is
 * still HELD and valid now, as an open handoff is (take_handoff); otherwise
 * it was lost in passing and the thread is a waiter again (the caller
 * polls). Lost by the renewal (LOST), it was reported as any lost lease is
 * (on_lost, the log); run out with no verdict yet, nobody is told (no
 * thread held it): *ran_out is set to its token, for the caller's log line.
 * Called with e->mu held, w granted. DLOCK_OK or DLOCK_ELOST; after
 * unlocking, the caller drops the registry's reference if *drop was set. */
static int take_direct_handoff(dlock_client *c, dlock_entry *e, dlock_waiter *w, int *drop,
                               uint64_t *ran_out)
{
    DLOCK_ASSERT(dlock_waiter_granted(w) && e->x.has_owner && !e->x.by_handle &&
                 pthread_equal(e->x.owner, pthread_self()));
    int64_t now = dlock_boot_ns();
    int valid = e->lease.state == DLOCK_LEASE_HELD && now < e->lease.valid_until_ns;
    dlock_trace_event(c->trace, "dtake", e->name, "%" PRIu64 " %" PRId64 " %d", e->lease.token, now,
                      valid);
    if (valid)
        return DLOCK_OK;
    e->x.has_owner = 0;
    e->x.depth = 0;
    e->waiters++; /* the releaser counted it out */
    e->kind_waiters[DLOCK_KIND_EXCL]++;
    if (e->lease.state == DLOCK_LEASE_HELD) {
        /* Lost by its validity alone: Redis may still have it as ours. */
        dlock_client_unconfirmed_end(c, e, e->lease.token, DLOCK_UNCLEAN_EXPIRED);
        *drop += dlock_renew_mark_lost(c->renew, e);
        *ran_out = e->lease.token;
    } else if (e->lease.unconfirmed) {
        /* LOST: the renewal found it gone (and recorded it) */
        dlock_client_unconfirmed_end(c, e, e->lease.unconfirmed, e->lease.unconfirmed_end);
    }
    e->lease.lost_notified = 1;
    e->lease.state = DLOCK_LEASE_NONE;
    (void)dlock_waiter_self(); /* w, not granted any more: a new wait */
    return DLOCK_ELOST;
}

static int take(dlock_client *c, dlock_entry *e, dlock_waiter *w, int direct, int *drop,
                uint64_t *ran_out)
{
    return direct ? take_direct_handoff(c, e, w, drop, ran_out) : take_handoff(c, e, drop);
}

static void drop_lost(dlock_entry *e)
{
    e->x.handoff = 0;
}

static void unhold(dlock_entry *e)
{
    e->x.has_owner = 0;
    e->x.depth = 0;
}

static int end(dlock_entry *e)
{
    int ending = e->x.ending;
    e->x.ending = 0;
    return ending;
}

static void unused(dlock_entry *e)
{
    e->x.ending = e->x.unclean;
}

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
    int64_t us = (now - e->lease.grant_boot_ns) / 1000;
    return (int64_t)e->x.passes + 1 <= us - (us + 99) / 100;
}

/* Whether the lease may pass to another holder of this client now: the
 * pass limit allows, the lease's validity has room (a margin for the
 * taker), the clock rule of tokens allows (handoff_in_time), and the
 * client is not closing. */
static int may_pass(const dlock_client *c, const dlock_entry *e, int64_t now, int closing)
{
    return e->x.passes < c->pass_limit && !closing &&
           now + (e->lease.provisional ? c->grant_margin_ns : c->handoff_margin_ns) <
               e->lease.valid_until_ns &&
           handoff_in_time(e, now);
}

int dlock_excl_take_pass(dlock_client *c, dlock_entry *e, int64_t now, int closing)
{
    DLOCK_ASSERT(!e->x.has_owner && !e->lease.shared && e->lease.state == DLOCK_LEASE_HELD);
    if (!may_pass(c, e, now, closing))
        return 0;
    e->x.passes++;
    e->lease.token++;
    return 1;
}

/* The local handoff's decision (I10), after the holder's hold ended: the
 * lease stays with this client and passes to a waiting thread, with the
 * next token and with word of how this hold ended (a thread that exited:
 * dlock_unclean), if a thread waits and the lease may pass (may_pass). */
static int pass(dlock_client *c, dlock_entry *e, int64_t now, dlock_waiter **wake)
{
    int closing = dlock_load_int(&c->closing);
    /* (only to a thread that waits for it exclusively: threads waiting
     * shared are served by a reader phase, shared.c, or ask Redis) */
    int pass = e->kind_waiters[DLOCK_KIND_EXCL] > 0 && may_pass(c, e, now, closing);
    dlock_trace_event(c->trace, "rdec", e->name,
                      "%d %" PRId64 " %u %u %" PRIu64 " %" PRId64 " %d %d %d %u", pass, now,
                      e->waiters, e->x.passes, e->lease.token, e->lease.valid_until_ns,
                      e->lease.provisional, closing, e->x.ending,
                      e->kind_waiters[DLOCK_KIND_EXCL]);
    *wake = NULL;
    if (!pass)
        return 0;
    e->x.passes++;
    e->lease.token++;
    e->x.unclean = e->x.ending;
    e->x.ending = 0;
    if (e->x.unclean)
        dlock_count(&c->ctr.unclean, 1);
    dlock_count(&c->ctr.handoffs, 1);
    dlock_waiter *h = e->wq.head;
    int64_t led = e->wq.head_since_ns;
    if (h && h->kind != DLOCK_KIND_EXCL) {
        /* the longest exclusive waiter (the queue holds threads waiting
         * shared too): led since it started to wait */
        h = dlock_waitq_first(&e->wq, DLOCK_KIND_EXCL);
        led = h ? h->since_ns : 0;
    }
    if (h && dlock_now_ns() - led >= DLOCK_FAIR_NS) {
        /* Direct handoff (I10) to the longest waiter: it has waited
         * long enough that nobody may pass it. */
        e->x.has_owner = 1;
        e->x.owner = h->self;
        e->x.depth = 1;
        e->waiters--;
        e->kind_waiters[DLOCK_KIND_EXCL]--;
        *wake = dlock_waitq_grant(&e->wq, h, e->lease.token);
    } else {
        /* Open handoff: the first thread of this client to run takes
         * it, a newcomer or the head, which is woken (one waiter, not
         * all: the others would only burn CPU). */
        e->x.handoff = 1;
        if (h)
            *wake = dlock_waitq_wake_later(h);
    }
    return 1;
}

const dlock_kind dlock_kind_excl = {
    .name = "exclusive",
    .index = DLOCK_KIND_EXCL,
    .mine = mine,
    .reenter = reenter,
    .hold = hold,
    .held = held,
    .passing = passing,
    .take = take,
    .drop_lost = drop_lost,
    .pass = pass,
    .unhold = unhold,
    .end = end,
    .unused = unused,
};
