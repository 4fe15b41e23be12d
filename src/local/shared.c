/*
 * The shared mode (shared.h), a kind of lock (kind.h). Shared state: the
 * entry's `s` and lease, under client.h's rules and shared.h's S1 to S7;
 * every kind operation is called with e->mu held. The calling thread's
 * records (below) are its own: no lock.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "local/client.h"
#include "local/excl.h"
#include "local/shared.h"

/* The calling thread's shared holds (shared.h): nholds records in holds,
 * room for capholds. Records of clients closed since are skipped by their
 * serial, and dropped when the array is full (dlock_shold_reserve). */
static __thread dlock_shold *holds;
static __thread unsigned nholds, capholds;

dlock_shold *dlock_shold_find(uint64_t serial, const char *name, size_t len)
{
    for (unsigned i = 0; i < nholds; i++) {
        dlock_entry *e = holds[i].e;
        if (holds[i].serial == serial && e->name_len == len && memcmp(e->name, name, len) == 0)
            return &holds[i];
    }
    return NULL;
}

dlock_shold *dlock_shold_of(uint64_t serial, const dlock_entry *e)
{
    for (unsigned i = 0; i < nholds; i++)
        if (holds[i].e == e && holds[i].serial == serial)
            return &holds[i];
    return NULL;
}

int dlock_shold_reserve(void)
{
    if (nholds < capholds)
        return DLOCK_OK;
    /* Full: first drop the records of clients closed since (or inherited
     * through fork()), which nothing else drops before the thread's exit:
     * their leases went back with their client. Only the serial is read:
     * their entries are freed. */
    for (unsigned i = 0; i < nholds;) {
        dlock_client *c = dlock_client_find_enter(holds[i].serial);
        int gone = !c || dlock_client_forked(c);
        if (c)
            dlock_client_leave(c);
        if (gone)
            holds[i] = holds[--nholds];
        else
            i++;
    }
    if (nholds < capholds)
        return DLOCK_OK;
    unsigned cap = capholds ? 2 * capholds : 4;
    dlock_shold *v = realloc(holds, cap * sizeof *v);
    if (!v)
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    holds = v;
    capholds = cap;
    return DLOCK_OK;
}

dlock_shold *dlock_shold_get(uint64_t serial, dlock_entry *e)
{
    dlock_shold *h = dlock_shold_of(serial, e);
    if (h)
        return h;
    DLOCK_ASSERT(nholds < capholds);
    h = &holds[nholds++];
    *h = (dlock_shold){.serial = serial, .e = e, .since_ns = dlock_now_ns()};
    return h;
}

void dlock_shold_trim(void)
{
    if (nholds == 0) {
        free(holds); /* a thread that holds nothing shared keeps no memory */
        holds = NULL;
        capholds = 0;
    }
}

void dlock_shold_tidy(dlock_shold *h)
{
    if (h->depth || h->nested || h->permits || h->lost)
        return;
    uintptr_t at = (uintptr_t)h, lo = (uintptr_t)holds;
    if (!holds || at < lo || at >= lo + nholds * sizeof *holds)
        return; /* a handle's record (api/handle.c), not the thread's */
    *h = holds[--nholds];
    dlock_shold_trim();
}

dlock_shold *dlock_shold_last(void)
{
    return nholds ? &holds[nholds - 1] : NULL;
}

/* A holder (S1, S4): the calling thread holds e shared, or holds it
 * exclusively (a shared acquire nests in that hold). */
static int mine(const dlock_client *c, const dlock_entry *e)
{
    if (dlock_kind_excl.mine(c, e))
        return 1;
    const dlock_shold *h = dlock_shold_of(c->serial, e);
    return h && h->depth > 0;
}

/* A reentrant shared acquire (S4): one level more, no Redis command. */
static int reenter(dlock_client *c, dlock_entry *e, uint64_t *fence)
{
    int64_t at = dlock_boot_ns();
    int nested = dlock_kind_excl.mine(c, e);
    int ok = e->lease.state == DLOCK_LEASE_HELD && at < e->lease.valid_until_ns;
    dlock_trace_event(c->trace, "sreent", e->name, "%" PRIu64 " %" PRId64 " %d %d", e->lease.token,
                      at, ok, nested);
    if (!ok)
        return dlock_err_set(DLOCK_ELOST, "the lease of '%s' is lost; release it", e->name);
    dlock_shold *h = dlock_shold_get(c->serial, e); /* room reserved by the caller */
    if (nested) {
        h->nested++;
        e->x.depth++;
    } else {
        h->depth++;
    }
    if (fence)
        *fence = e->lease.token;
    return DLOCK_OK;
}

/* S2: the threads waiting shared at the head of the local queue hold the
 * new grant too. They are woken through ws once e->mu is dropped, as a
 * handoff's taker is; with ws NULL (a grant from Redis: rare beside the
 * joins it saves), under e->mu. */
static void invite(dlock_entry *e, dlock_wakeset *ws)
{
    dlock_waiter *w = e->wq.head;
    while (w && w->kind == DLOCK_KIND_SHARED) {
        dlock_waiter *next = w->next;
        e->s.holders++;
        e->waiters--;
        e->kind_waiters[DLOCK_KIND_SHARED]--;
        dlock_wakeset_add(ws, dlock_waitq_grant(&e->wq, w, e->lease.token));
        w = next;
    }
}

/* The calling thread (the poller) holds the new shared grant. */
static void hold(dlock_client *c, dlock_entry *e, int unclean)
{
    e->s.holders = 1;
    e->s.under_x = 0;
    e->s.unclean = unclean;
    if (unclean)
        dlock_count(&c->ctr.unclean, 1);
    e->s.join_until_ns = e->lease.grant_boot_ns + c->join_ns;
    dlock_shold_get(c->serial, e)->depth = 1; /* room reserved by the caller */
    invite(e, NULL);
    dlock_trace_event(c->trace, "sinv", e->name, "%u", e->s.holders);
}

static int held(const dlock_entry *e)
{
    return e->s.holders > 0;
}

/* Whether the lease, HELD, has room left for one more holder at `now`:
 * the margin a local handoff keeps (excl.c, pass), so that a holder joins
 * only a lease the renewal has time to keep. */
static int roomy(const dlock_client *c, const dlock_entry *e, int64_t now)
{
    return now + (e->lease.provisional ? c->grant_margin_ns : c->handoff_margin_ns) <
           e->lease.valid_until_ns;
}

/* S1 at `now`: a thread asking shared may join the lease. */
static int joinable(const dlock_client *c, const dlock_entry *e, int64_t now)
{
    if ((!e->lease.shared && !e->s.under_x) || e->lease.state != DLOCK_LEASE_HELD ||
        e->kind_waiters[DLOCK_KIND_EXCL] > 0)
        return 0;
    return now < e->s.join_until_ns && roomy(c, e, now);
}

/* S1: a thread asking shared may join the lease now. */
static int passing(const dlock_client *c, const dlock_entry *e)
{
    return joinable(c, e, dlock_boot_ns());
}

/* Nobody holds e's shared lease any more and it is not valid: it goes, as
 * an exclusive lease lost in passing does (excl.c). */
static void lose(dlock_client *c, dlock_entry *e, int *drop, uint64_t *ran_out)
{
    if (e->lease.state == DLOCK_LEASE_HELD) {
        /* Lost by its validity alone: Redis may still have it as ours. */
        dlock_client_unconfirmed_end(c, e, e->lease.token, DLOCK_UNCLEAN_EXPIRED);
        *drop += dlock_renew_mark_lost(c->renew, e);
        if (ran_out)
            *ran_out = e->lease.token;
    } else if (e->lease.unconfirmed) {
        dlock_client_unconfirmed_end(c, e, e->lease.unconfirmed, e->lease.unconfirmed_end);
    }
    e->lease.lost_notified = 1;
    e->lease.state = DLOCK_LEASE_NONE;
    e->s.under_x = 0;
}

/* A join (S1, as passing found it, checked again on this reading of the
 * clock: the trace records the rule's inputs at the decision), or an
 * invitation (S2, `direct`: the granter counted the calling thread as a
 * holder of a fresh grant) taken only if the lease is still HELD and valid
 * now; else the thread waits again (DLOCK_EBUSY: a join whose window
 * closed, or whose lease has no room left for it, on a lease still valid),
 * and the last holder of a lease that ran out or was lost drops it
 * (DLOCK_ELOST). */
static int take(dlock_client *c, dlock_entry *e, dlock_waiter *w, int direct, int *drop,
                uint64_t *ran_out)
{
    (void)w;
    int64_t now = dlock_boot_ns();
    int valid = direct ? e->lease.state == DLOCK_LEASE_HELD && now < e->lease.valid_until_ns
                       : joinable(c, e, now);
    dlock_trace_event(c->trace, direct ? "stake" : "sjoin", e->name,
                      "%" PRIu64 " %" PRId64 " %d %u", e->lease.token, now, valid,
                      e->kind_waiters[DLOCK_KIND_EXCL]);
    if (!direct && valid) {
        e->s.holders++;
        dlock_count(&c->ctr.shared_joins, 1);
    }
    if (valid) {
        dlock_shold_get(c->serial, e)->depth = 1; /* room reserved by the caller */
        return DLOCK_OK;
    }
    if (direct) {
        e->s.holders--;
        e->waiters++; /* the granter counted it out */
        e->kind_waiters[DLOCK_KIND_SHARED]++;
        (void)dlock_waiter_self(); /* w, not granted any more: a new wait */
    }
    int gone = e->lease.state != DLOCK_LEASE_HELD || now >= e->lease.valid_until_ns;
    if (e->s.holders == 0 && !e->x.has_owner && gone)
        lose(c, e, drop, ran_out); /* (a join found it HELD with room: never here) */
    return gone ? DLOCK_ELOST : DLOCK_EBUSY;
}

static void drop_lost(dlock_entry *e)
{
    (void)e; /* no pass is ever open */
}

/* S5: the lease stays while other threads hold it; the last one's release
 * gives it back. Nobody is woken: joiners do not wait. */
static int pass(dlock_client *c, dlock_entry *e, int64_t now, dlock_waiter **wake)
{
    *wake = NULL;
    dlock_trace_event(c->trace, "srel", e->name, "%u %" PRId64, e->s.holders, now);
    return e->s.holders > 0;
}

static void unhold(dlock_entry *e)
{
    if (--e->s.holders == 0)
        e->s.under_x = 0; /* a reader phase ends with its last holder */
}

static int end(dlock_entry *e)
{
    (void)e;
    return 0; /* a shared hold's end is told to nobody (lua/p2/LAYOUT.txt) */
}

static void unused(dlock_entry *e)
{
    (void)e;
}

int dlock_shared_phase(dlock_client *c, dlock_entry *e, int64_t now, dlock_wakeset *ws)
{
    int closing = dlock_load_int(&c->closing);
    int phase = !e->lease.shared && e->lease.state == DLOCK_LEASE_HELD && !e->x.has_owner &&
                e->s.holders == 0 && e->kind_waiters[DLOCK_KIND_SHARED] > 0 &&
                e->kind_waiters[DLOCK_KIND_EXCL] == 0 && dlock_excl_take_pass(c, e, now, closing);
    if (!phase) {
        dlock_trace_event(c->trace, "sphase", e->name, "0 0 %" PRIu64 " %" PRId64 " %u %u %d",
                          e->lease.token, now, e->kind_waiters[DLOCK_KIND_SHARED],
                          e->kind_waiters[DLOCK_KIND_EXCL], closing);
        return 0;
    }
    e->s.under_x = 1;
    e->s.unclean = e->x.ending; /* how the exclusive hold before ended */
    e->x.ending = 0;
    if (e->s.unclean)
        dlock_count(&c->ctr.unclean, 1);
    e->s.join_until_ns = now + c->join_ns;
    unsigned waiting = e->kind_waiters[DLOCK_KIND_SHARED];
    invite(e, ws);
    dlock_trace_event(c->trace, "sphase", e->name, "1 %u %" PRIu64 " %" PRId64 " %u %u %d",
                      e->s.holders, e->lease.token, now, waiting, e->kind_waiters[DLOCK_KIND_EXCL],
                      closing);
    if (e->s.holders == 0) {
        /* (every thread waiting shared waits in the queue: never here) */
        e->s.under_x = 0;
        return 0;
    }
    dlock_count(&c->ctr.handoffs, 1);
    return 1;
}

const dlock_kind dlock_kind_shared = {
    .name = "shared",
    .index = DLOCK_KIND_SHARED,
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
