/*
 * The renewal manager's registry (renew.h): grants registered for renewal
 * and unregistered, a lease marked lost, the waits of releasers and the
 * requests for an early round. The rules of the state it shares with the
 * other files of the manager, and the lock order, are in renew.h.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "global/renew.h"
#include "global/renew_int.h"

int64_t dlock_renew_check_ns(uint32_t lease_ms)
{
    int64_t p = (int64_t)lease_ms * DLOCK_NS_PER_MS / 3;
    if (p < 1000 * DLOCK_NS_PER_MS)
        p = 1000 * DLOCK_NS_PER_MS;
    if (p > 30000 * DLOCK_NS_PER_MS)
        p = 30000 * DLOCK_NS_PER_MS;
    return p;
}


int64_t dlock_renew_drift_ns(uint32_t lease_ms)
{
    /* Clock drift between this host and Redis: 1% of the lease plus 2 ms. */
    return (int64_t)lease_ms * DLOCK_NS_PER_MS / 100 + 2 * DLOCK_NS_PER_MS;
}

int dlock_renew_add(dlock_renew *r, dlock_entry *e)
{
    DLOCK_ASSERT(e->lease.state == DLOCK_LEASE_HELD && e->lease.renew == NULL);
    dlock_renew_item *it = calloc(1, sizeof *it);
    if (!it)
        return DLOCK_ENOMEM;
    it->e = e;
    it->epoch = e->lease.epoch;
    it->protocol = e->lease.sem ? DLOCK_RENEW_SEM : e->lease.grant_protocol;
    it->shared = e->lease.shared;
    snprintf(it->token, sizeof it->token, "%" PRIu64, e->lease.grant_token);
    if (r->cfg.redlock && e->lease.sem && e->lease.rls && e->lease.rls->n) {
        it->rls_n = e->lease.rls->n;
        if (!(it->rls = malloc(sizeof *it->rls * it->rls_n))) {
            free(it);
            return DLOCK_ENOMEM;
        }
        memcpy(it->rls, e->lease.rls->s, sizeof *it->rls * it->rls_n);
        it->rls_limit = e->lease.rls->limit;
    } else if (r->cfg.redlock && e->lease.rl && !e->lease.sem) {
        if (!(it->rl = malloc(sizeof *it->rl))) {
            free(it);
            return DLOCK_ENOMEM;
        }
        *it->rl = *e->lease.rl;
    }
    dlock_table_ref(e);
    pthread_mutex_lock(&r->mu);
    it->next = r->items;
    if (r->items)
        r->items->prev = it;
    r->items = it;
    r->count++;
    e->lease.renew = it;
    if (r->count == 1)
        pthread_cond_signal(&r->cv); /* the thread may sleep without a period */
    pthread_mutex_unlock(&r->mu);
    return DLOCK_OK;
}

/* Called with r->mu held. */
static void unlink_item(dlock_renew *r, dlock_renew_item *it)
{
    if (it->prev)
        it->prev->next = it->next;
    else
        r->items = it->next;
    if (it->next)
        it->next->prev = it->prev;
    r->count--;
    it->e->lease.renew = NULL;
    free(it->rl);
    free(it->rls);
    free(it);
}

int dlock_renew_rl_slots_sync(dlock_renew *r, dlock_entry *e)
{
    dlock_renew_item *it = e->lease.renew;
    if (!it || !e->lease.rls)
        return DLOCK_OK;
    unsigned n = e->lease.rls->n;
    pthread_mutex_lock(&r->mu);
    it->rls_limit = e->lease.rls->limit;
    if (n <= it->rls_n) {
        /* fewer (or as many): in place (it->rls is written under r->mu) */
        if (n)
            memmove(it->rls, e->lease.rls->s, sizeof *it->rls * n);
        it->rls_n = n;
        pthread_mutex_unlock(&r->mu);
        return DLOCK_OK;
    }
    pthread_mutex_unlock(&r->mu);
    dlock_redlock_slot *copy = malloc(sizeof *copy * n);
    if (!copy)
        return DLOCK_ENOMEM;
    memcpy(copy, e->lease.rls->s, sizeof *copy * n);
    pthread_mutex_lock(&r->mu);
    dlock_redlock_slot *old = it->rls;
    it->rls = copy;
    it->rls_n = n;
    it->rls_limit = e->lease.rls->limit;
    pthread_mutex_unlock(&r->mu);
    free(old);
    return DLOCK_OK;
}

int dlock_renew_remove(dlock_renew *r, dlock_entry *e)
{
    if (!e->lease.renew)
        return 0;
    pthread_mutex_lock(&r->mu);
    unlink_item(r, e->lease.renew);
    pthread_mutex_unlock(&r->mu);
    return 1;
}

int dlock_renew_mark_lost(dlock_renew *r, dlock_entry *e)
{
    DLOCK_ASSERT(e->lease.state == DLOCK_LEASE_HELD);
    e->lease.state = DLOCK_LEASE_LOST;
    dlock_count(&r->cfg.ctr->leases_held, (uint64_t)-1);
    dlock_count(&r->cfg.ctr->leases_lost, 1);
    dlock_waitq_wake_head(&e->wq); /* a passed lease lost: the head polls instead */
    return dlock_renew_remove(r, e);
}

void dlock_renew_quiesce(dlock_renew *r)
{
    pthread_mutex_lock(&r->mu);
    while (r->writing)
        pthread_cond_wait(&r->wrote, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

void dlock_renew_by(dlock_renew *r, int64_t when_ns)
{
    pthread_mutex_lock(&r->mu);
    if (when_ns < r->due) {
        r->due = when_ns;
        pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

void dlock_renew_kick(dlock_renew *r)
{
    pthread_mutex_lock(&r->mu);
    r->kick = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}
