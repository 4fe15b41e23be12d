/*
 * The public lock calls (dlock.h): their argument checks, the count of
 * threads inside a call (client.h: dlock_client_enter) and cancel tokens.
 * The work is acquire.c's, release.c's and sem.c's; no state of its own.
 * Handles and dlock_with are handle.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "local/acquire.h"
#include "local/client.h"
#include "common/error.h"
#include "local/excl.h"
#include "local/release.h"
#include "local/orphan.h"
#include "local/sem.h"
#include "local/shared.h"

/* An acquire registered on a cancel token (cancel.h). */
typedef struct cancel_reg {
    dlock_cancel_reg base; /* first: cancel_wake casts back */
    dlock_client *c;
    const char *name;
    size_t len;
    dlock_waiter *w; /* the acquiring thread's node */
} cancel_reg;

/* The token of r's acquire was fired: wakes that thread, if it waits in
 * r's entry. Called under the token's mutex (cancel.h: before the table and
 * entry mutexes); the acquire is still inside its call, so c is alive. */
static void cancel_wake(dlock_cancel_reg *base)
{
    cancel_reg *r = (cancel_reg *)base;
    dlock_entry *e = dlock_table_find(r->c->table, r->name, r->len);
    if (!e)
        return; /* not in the entry yet: it looks at the flag when it is */
    pthread_mutex_lock(&e->mu);
    if (e->poll.poller)
        pthread_cond_signal(&e->pcv); /* the poller may be r's thread */
    if (r->w->queued)
        dlock_waitq_wake(r->w); /* a thread waits for one name at a time: in e */
    pthread_mutex_unlock(&e->mu);
    dlock_table_put(r->c->table, e);
}

/* The acquire's work in kind `kind`, or of a semaphore's permit (kind
 * NULL: local/sem.h) of limit `limit`. */
static int run(dlock_client *c, const dlock_kind *kind, uint32_t limit, const char *name,
               size_t len, int64_t wait_ms, uint64_t *fence, dlock_cancel *k)
{
    if (kind)
        return dlock_acquire_run(c, kind, name, len, wait_ms, fence, k);
    int rc = dlock_sem_run(c, name, len, limit, wait_ms, k);
    if (rc == DLOCK_OK)
        dlock_orphan_arm(); /* a thread that exits holding it gives it back */
    return rc;
}

/* The common path of the acquire calls: the arguments, the stop flags, and
 * the call's registration on its cancel token k (NULL: none) around it.
 * kind NULL: a semaphore's permit, of limit `limit`. */
static int acquire(dlock_client *c, const dlock_kind *kind, uint32_t limit, const char *name,
                   int64_t wait_ms, uint64_t *fence, dlock_cancel *k)
{
    size_t len;
    int rc = dlock_client_check(c, name, &len);
    if (rc != DLOCK_OK)
        return rc;
    if ((rc = dlock_client_stop_rc(c, k)) != DLOCK_OK)
        return dlock_client_stop_err(rc, name);
    if (!kind && limit == 0)
        return dlock_err_set(DLOCK_EINVAL, "the limit of semaphore '%s' is 0: at least 1",
                             name);
    if (kind != &dlock_kind_excl) {
        if ((rc = dlock_shold_reserve()) != DLOCK_OK)
            return rc; /* (a hold or permit is recorded under the entry's mutex: shared.h) */
    } else {
        const dlock_shold *h = dlock_shold_find(c->serial, name, len);
        if (h && h->depth > 0)
            return dlock_err_set(DLOCK_EINVAL, "this thread holds '%s' shared: it cannot "
                                 "take it exclusively too (an upgrade; two threads doing so "
                                 "would wait for each other forever): release it first",
                                 name);
    }
    if (!k) {
        rc = run(c, kind, limit, name, len, wait_ms, fence, NULL);
    } else {
        cancel_reg reg = {.base.wake = cancel_wake, .c = c, .name = name, .len = len,
                          .w = dlock_waiter_self()};
        if (dlock_cancel_register(k, &reg.base) != 0) {
            rc = dlock_client_stop_err(DLOCK_ECANCELED, name);
        } else {
            rc = run(c, kind, limit, name, len, wait_ms, fence, k);
            dlock_cancel_unregister(k, &reg.base);
        }
    }
    if (rc != DLOCK_OK && kind != &dlock_kind_excl)
        dlock_shold_trim(); /* the room reserved above, unused */
    return rc;
}

static int release(dlock_client *c, const char *name)
{
    size_t len;
    int rc = dlock_client_check(c, name, &len);
    if (rc != DLOCK_OK)
        return rc;
    dlock_entry *e = dlock_held_find(c, name, len);
    if (!e)
        return dlock_err_set(DLOCK_ENOTHELD, "'%s' is not held by this thread", name);

    pthread_mutex_lock(&e->mu);
    if (!dlock_kind_excl.mine(c, e)) {
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
        return dlock_err_set(DLOCK_ENOTHELD, "'%s' is not held by this thread", name);
    }
    const dlock_shold *h = dlock_shold_of(c->serial, e);
    if (h && h->nested >= e->x.depth) {
        /* its levels left are shared acquires nested in it: released by
         * dlock_release_shared */
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
        return dlock_err_set(DLOCK_ENOTHELD, "'%s' is held by this thread only through "
                             "dlock_acquire_shared now: release it with dlock_release_shared",
                             name);
    }
    if (e->x.depth > 1) {
        e->x.depth--;
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
        return DLOCK_OK;
    }
    dlock_held_forget(c, e);
    return dlock_release_outermost(c, &dlock_kind_excl, e, name);
}

/* dlock_release_shared's work, inside the call (shared.h, S4 and S5). */
static int release_shared(dlock_client *c, const char *name)
{
    size_t len;
    int rc = dlock_client_check(c, name, &len);
    if (rc != DLOCK_OK)
        return rc;
    dlock_shold *h = dlock_shold_find(c->serial, name, len);
    if (!h || (h->depth == 0 && h->nested == 0)) /* (or a semaphore's permits: sem.h) */
        return dlock_err_set(DLOCK_ENOTHELD, "'%s' is not held shared by this thread", name);
    dlock_entry *e = h->e;
    dlock_table_ref(e); /* the lookup's: the holder's keeps e alive meanwhile */
    pthread_mutex_lock(&e->mu);
    if (h->nested > 0) {
        /* one level of the thread's exclusive hold */
        h->nested--;
        dlock_shold_tidy(h);
        if (e->x.depth > 1) {
            e->x.depth--;
            pthread_mutex_unlock(&e->mu);
            dlock_table_put(c->table, e);
            return DLOCK_OK;
        }
        dlock_held_forget(c, e);
        return dlock_release_outermost(c, &dlock_kind_excl, e, name);
    }
    if (--h->depth > 0) {
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
        return DLOCK_OK;
    }
    int64_t since = h->since_ns;
    dlock_shold_tidy(h);
    return dlock_release_shared_hold(c, e, name, since);
}

/* The entry `name` of c with a new reference, if the calling thread may
 * hold it, exclusively (dlock_held_find) or shared (its record); else NULL.
 * The caller still checks under e->mu. */
static dlock_entry *held_lookup(dlock_client *c, const char *name, size_t len)
{
    dlock_entry *e = dlock_held_find(c, name, len);
    const dlock_shold *h = e ? NULL : dlock_shold_find(c->serial, name, len);
    if (h) {
        e = h->e;
        dlock_table_ref(e); /* the holder's reference keeps it alive meanwhile */
    }
    return e;
}

int dlock_unclean(dlock_client *c, const char *name)
{
    dlock_err_clear();
    if (!c)
        return dlock_err_set(DLOCK_EINVAL, "client is NULL");
    dlock_client_enter(c);
    size_t len;
    int rc = dlock_client_check(c, name, &len);
    dlock_entry *e = rc == DLOCK_OK ? held_lookup(c, name, len) : NULL;
    if (rc == DLOCK_OK && !e)
        rc = dlock_err_set(DLOCK_ENOTHELD, "'%s' is not held by this thread", name);
    if (e) {
        pthread_mutex_lock(&e->mu);
        const dlock_shold *h = dlock_shold_of(c->serial, e);
        if (dlock_kind_excl.mine(c, e))
            rc = e->x.unclean;
        else if (h && h->depth > 0)
            rc = e->s.unclean;
        else
            rc = dlock_err_set(DLOCK_ENOTHELD, "'%s' is not held by this thread", name);
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
    }
    dlock_client_leave(c);
    return rc;
}

void dlock_acquire_opts_init(dlock_acquire_opts *o)
{
    if (o)
        memset(o, 0, sizeof *o);
}

/* A public acquire call in kind `kind`: inside the call (enter ... leave),
 * counted (its code, its wait, a shared acquisition). */
static int acquire_call(dlock_client *c, const dlock_kind *kind, uint32_t limit,
                        const char *name, int64_t wait_ms, uint64_t *fence,
                        const dlock_acquire_opts *opts)
{
    dlock_err_clear();
    if (!c)
        return dlock_err_set(DLOCK_EINVAL, "client is NULL");
    if (!kind && c->redlock && limit > DLOCK_REDLOCK_SEM_MAX)
        /* (a handle's and dlock_with*'s acquires come here too) */
        return dlock_err_set(DLOCK_EINVAL, "the limit of semaphore '%s' is %" PRIu32 ": in "
                             "Redlock mode at most %d (a permit is a slot, each a quorum lock "
                             "of its own)", name ? name : "(null)", limit, DLOCK_REDLOCK_SEM_MAX);
    dlock_client_enter(c);
    int64_t t0 = dlock_now_ns();
    int rc = acquire(c, kind, limit, name, wait_ms, fence, opts ? opts->cancel : NULL);
    if (rc != DLOCK_EFORK) { /* a forked client's counters are not ours */
        dlock_count_rc(c->ctr.acquire_rc, rc);
        if (rc == DLOCK_OK) {
            dlock_hist_add(&c->ctr.wait, dlock_now_ns() - t0);
            if (kind == &dlock_kind_shared)
                dlock_count(&c->ctr.shared_acquisitions, 1);
        }
    }
    dlock_client_leave(c);
    return rc;
}

/* dlock_sem_release's work, inside the call (local/sem.h). */
static int release_sem(dlock_client *c, const char *name)
{
    size_t len;
    int rc = dlock_client_check(c, name, &len);
    if (rc != DLOCK_OK)
        return rc;
    dlock_shold *h = dlock_shold_find(c->serial, name, len);
    if (!h || (h->permits == 0 && h->lost == 0))
        return dlock_err_set(DLOCK_ENOTHELD, "this thread holds no permit of '%s'", name);
    return dlock_sem_give(c, h);
}

/* A public release call (exclusive 0, `shared` 1, a semaphore's permit 2),
 * inside the call, counted. */
static int release_call(dlock_client *c, const char *name, int shared)
{
    dlock_err_clear();
    if (!c)
        return dlock_err_set(DLOCK_EINVAL, "client is NULL");
    dlock_client_enter(c);
    int rc = shared == 2 ? release_sem(c, name) : shared ? release_shared(c, name)
                                                           : release(c, name);
    if (rc != DLOCK_EFORK)
        dlock_count_rc(c->ctr.release_rc, rc);
    dlock_client_leave(c);
    return rc;
}

int dlock_acquire_ex(dlock_client *c, const char *name, int64_t wait_ms, uint64_t *fence,
                     const dlock_acquire_opts *opts)
{
    return acquire_call(c, &dlock_kind_excl, 0, name, wait_ms, fence, opts);
}

int dlock_acquire(dlock_client *c, const char *name, int64_t wait_ms, uint64_t *fence)
{
    return acquire_call(c, &dlock_kind_excl, 0, name, wait_ms, fence, NULL);
}

int dlock_release(dlock_client *c, const char *name)
{
    return release_call(c, name, 0);
}

int dlock_acquire_shared_ex(dlock_client *c, const char *name, int64_t wait_ms, uint64_t *fence,
                            const dlock_acquire_opts *opts)
{
    return acquire_call(c, &dlock_kind_shared, 0, name, wait_ms, fence, opts);
}

int dlock_acquire_shared(dlock_client *c, const char *name, int64_t wait_ms, uint64_t *fence)
{
    return acquire_call(c, &dlock_kind_shared, 0, name, wait_ms, fence, NULL);
}

int dlock_release_shared(dlock_client *c, const char *name)
{
    return release_call(c, name, 1);
}

int dlock_sem_acquire_ex(dlock_client *c, const char *name, uint32_t limit, int64_t wait_ms,
                         const dlock_acquire_opts *opts)
{
    return acquire_call(c, NULL, limit, name, wait_ms, NULL, opts);
}

int dlock_sem_acquire(dlock_client *c, const char *name, uint32_t limit, int64_t wait_ms)
{
    return acquire_call(c, NULL, limit, name, wait_ms, NULL, NULL);
}

int dlock_sem_release(dlock_client *c, const char *name)
{
    return release_call(c, name, 2);
}

static int held_check(dlock_client *c, const char *name)
{
    size_t len;
    if (dlock_client_check(c, name, &len) != DLOCK_OK)
        return 0;
    dlock_entry *e = held_lookup(c, name, len);
    if (!e)
        return 0;
    pthread_mutex_lock(&e->mu);
    const dlock_shold *h = dlock_shold_of(c->serial, e);
    int mine = dlock_kind_shared.mine(c, e) || /* exclusive or shared */
               (h && h->permits > 0 && h->gen == e->m.gen); /* a permit, not lost (sem.h, M8) */
    int yes = mine && e->lease.state == DLOCK_LEASE_HELD &&
              dlock_boot_ns() < e->lease.valid_until_ns;
    pthread_mutex_unlock(&e->mu);
    dlock_table_put(c->table, e);
    return yes;
}

int dlock_held(dlock_client *c, const char *name)
{
    if (!c)
        return 0;
    dlock_client_enter(c);
    int yes = held_check(c, name);
    dlock_client_leave(c);
    return yes;
}
