/*
 * Holds that move between threads (dlock.h, "Locks that move between
 * threads"): an exclusive hold, a shared hold or a semaphore's permit
 * owned by a dlock_handle instead of the calling thread, and dlock_with in
 * each mode. The hold is taken by the calling thread (acquire.c, sem.c),
 * then moved from the thread's bookkeeping to the handle: out of its held
 * slots (exclusive: the entry is flagged x.by_handle, so that no thread
 * takes it for its own), out of its records (shared.h: the handle counts
 * as one holder in e->s.holders), or into the handle's own record (a
 * permit: sem.h, M4, which sem.c's give takes like a thread's).
 *
 * Shared state: a handle belongs to its holder alone (no lock: dlock.h
 * forbids using one from two threads at once or after its release); its
 * entry is under client.h's rules, e->mu taken here as release.c and sem.c
 * expect it. A handle keeps its hold's reference on the entry.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/trace.h"
#include "local/client.h"
#include "local/excl.h"
#include "local/release.h"
#include "local/sem.h"
#include "local/shared.h"

enum { HANDLE_EXCL, HANDLE_SHARED, HANDLE_PERMIT };

struct dlock_handle {
    dlock_client *c;
    dlock_entry *e;   /* the hold's reference (owner's, holder's, permit's), the handle's */
    int64_t since_ns; /* the acquire: the hold time's start */
    int mode;         /* HANDLE_* */
    dlock_shold rec;  /* HANDLE_PERMIT: its one permit and generation (sem.h, M4) */
};

/* Whether the calling thread holds `name` already, exclusively or shared:
 * a handle takes a hold of its own, not one on top of the thread's. */
static int thread_holds(dlock_client *c, const char *name, size_t len)
{
    const dlock_shold *r = dlock_shold_find(c->serial, name, len);
    if (r && (r->depth > 0 || r->nested > 0))
        return 1;
    dlock_entry *e = dlock_held_find(c, name, len);
    if (!e)
        return 0;
    /* (dlock_held_find may return an entry another thread holds or waits for,
     * when this one holds more names than it caches) */
    pthread_mutex_lock(&e->mu);
    int mine = dlock_kind_excl.mine(c, e);
    pthread_mutex_unlock(&e->mu);
    dlock_table_put(c->table, e);
    return mine;
}

/* The calling thread's hold of `name` (just taken, in h->mode) becomes h's. */
static void adopt_hold(dlock_client *c, const char *name, size_t len, dlock_handle *h)
{
    dlock_entry *e;
    if (h->mode == HANDLE_EXCL) {
        e = dlock_held_find(c, name, len);
        DLOCK_ASSERT(e);
        pthread_mutex_lock(&e->mu);
        e->x.by_handle = 1;
        dlock_held_forget(c, e);
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e); /* the lookup's; the owner's stays, the handle's now */
    } else {
        dlock_shold *r = dlock_shold_find(c->serial, name, len);
        DLOCK_ASSERT(r);
        e = r->e;
        pthread_mutex_lock(&e->mu);
        if (h->mode == HANDLE_SHARED) {
            DLOCK_ASSERT(r->depth == 1 && r->nested == 0);
            r->depth = 0; /* the holder's reference and e->s.holders' count: the handle's */
            dlock_trace_event(c->trace, "shandle", e->name, "take %p", (void *)h);
        } else {
            /* one permit of the record's generation (sem.c's record made it) */
            DLOCK_ASSERT(r->permits > 0);
            h->rec = (dlock_shold){.serial = c->serial, .e = e, .permits = 1, .gen = r->gen};
            r->permits--;
            dlock_trace_event(c->trace, "sem.handle", e->name, "take %p %" PRIu64, (void *)h,
                              r->gen);
        }
        dlock_shold_tidy(r);
        pthread_mutex_unlock(&e->mu);
    }
    h->e = e;
}

/* The acquire of a handle in `mode` (a permit: of limit `limit`), inside
 * the call (enter). */
static int acquire_handle(dlock_client *c, int mode, const char *name, uint32_t limit,
                          int64_t wait_ms, uint64_t *fence, dlock_handle **out,
                          const dlock_acquire_opts *opts)
{
    size_t len;
    int rc = dlock_client_check(c, name, &len);
    if (rc != DLOCK_OK)
        return rc;
    if (mode != HANDLE_PERMIT && thread_holds(c, name, len))
        return dlock_err_set(DLOCK_EINVAL, "'%s' is held by the calling thread already: a "
                             "handle takes a hold of its own", name);
    dlock_handle *h = calloc(1, sizeof *h);
    if (!h)
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    if (mode == HANDLE_EXCL)
        rc = dlock_acquire_ex(c, name, wait_ms, fence, opts);
    else if (mode == HANDLE_SHARED)
        rc = dlock_acquire_shared_ex(c, name, wait_ms, fence, opts);
    else
        rc = dlock_sem_acquire_ex(c, name, limit, wait_ms, opts);
    if (rc != DLOCK_OK) {
        free(h);
        return rc;
    }
    h->c = c;
    h->mode = mode;
    h->since_ns = dlock_now_ns(); /* the hold starts now, not with the wait */
    adopt_hold(c, name, len, h);
    *out = h;
    return DLOCK_OK;
}

/* The public acquire of a handle: its arguments, inside the call. */
static int handle_call(dlock_client *c, int mode, const char *name, uint32_t limit,
                       int64_t wait_ms, uint64_t *fence, dlock_handle **out,
                       const dlock_acquire_opts *opts)
{
    dlock_err_clear();
    if (!out)
        return dlock_err_set(DLOCK_EINVAL, "out is NULL");
    *out = NULL;
    if (!c)
        return dlock_err_set(DLOCK_EINVAL, "client is NULL");
    dlock_client_enter(c);
    int rc = acquire_handle(c, mode, name, limit, wait_ms, fence, out, opts);
    dlock_client_leave(c);
    return rc;
}

int dlock_acquire_handle_ex(dlock_client *c, const char *name, int64_t wait_ms, uint64_t *fence,
                            dlock_handle **out, const dlock_acquire_opts *opts)
{
    return handle_call(c, HANDLE_EXCL, name, 0, wait_ms, fence, out, opts);
}

int dlock_acquire_handle(dlock_client *c, const char *name, int64_t wait_ms, uint64_t *fence,
                         dlock_handle **out)
{
    return handle_call(c, HANDLE_EXCL, name, 0, wait_ms, fence, out, NULL);
}

int dlock_acquire_shared_handle_ex(dlock_client *c, const char *name, int64_t wait_ms,
                                   uint64_t *fence, dlock_handle **out,
                                   const dlock_acquire_opts *opts)
{
    return handle_call(c, HANDLE_SHARED, name, 0, wait_ms, fence, out, opts);
}

int dlock_acquire_shared_handle(dlock_client *c, const char *name, int64_t wait_ms,
                                uint64_t *fence, dlock_handle **out)
{
    return handle_call(c, HANDLE_SHARED, name, 0, wait_ms, fence, out, NULL);
}

int dlock_sem_acquire_handle_ex(dlock_client *c, const char *name, uint32_t limit,
                                int64_t wait_ms, dlock_handle **out,
                                const dlock_acquire_opts *opts)
{
    return handle_call(c, HANDLE_PERMIT, name, limit, wait_ms, NULL, out, opts);
}

int dlock_sem_acquire_handle(dlock_client *c, const char *name, uint32_t limit,
                             int64_t wait_ms, dlock_handle **out)
{
    return handle_call(c, HANDLE_PERMIT, name, limit, wait_ms, NULL, out, NULL);
}

int dlock_handle_release(dlock_handle *h)
{
    dlock_err_clear();
    if (!h)
        return dlock_err_set(DLOCK_EINVAL, "handle is NULL");
    dlock_client *c = h->c;
    if (dlock_client_forked(c))
        return dlock_err_set(DLOCK_EFORK, "this handle's client was opened before fork()");
    dlock_client_enter(c);
    dlock_entry *e = h->e;
    int rc;
    if (h->mode == HANDLE_PERMIT) {
        pthread_mutex_lock(&e->mu);
        dlock_trace_event(c->trace, "sem.handle", e->name, "release %p %" PRIu64, (void *)h,
                          h->rec.gen);
        pthread_mutex_unlock(&e->mu);
        rc = dlock_sem_give(c, &h->rec); /* drops the permit's reference */
    } else {
        char name[DLOCK_NAME_MAX + 1]; /* for messages: e may be freed before they are made */
        memcpy(name, e->name, e->name_len + 1);
        dlock_table_ref(e); /* the lookup's, as release.h expects */
        pthread_mutex_lock(&e->mu);
        if (h->mode == HANDLE_SHARED) {
            dlock_trace_event(c->trace, "shandle", e->name, "release %p", (void *)h);
            rc = dlock_release_shared_hold(c, e, name, h->since_ns);
        } else {
            DLOCK_ASSERT(e->x.has_owner && e->x.by_handle && e->x.depth == 1);
            e->x.by_handle = 0;
            e->x.owner = pthread_self(); /* the calling thread releases it */
            dlock_hist_add(&c->ctr.hold, dlock_now_ns() - h->since_ns);
            rc = dlock_release_outermost(c, &dlock_kind_excl, e, name);
        }
    }
    dlock_count_rc(c->ctr.release_rc, rc);
    free(h);
    dlock_client_leave(c);
    return rc;
}

int dlock_handle_held(dlock_handle *h)
{
    /* In a forked child the entry's mutex may have been held by a thread
     * of the parent at the fork: not touched (the child holds nothing). */
    if (!h || dlock_client_forked(h->c))
        return 0;
    dlock_client_enter(h->c);
    dlock_entry *e = h->e;
    pthread_mutex_lock(&e->mu);
    int yes = e->lease.state == DLOCK_LEASE_HELD && dlock_boot_ns() < e->lease.valid_until_ns;
    if (h->mode == HANDLE_EXCL)
        yes = yes && e->x.has_owner && e->x.by_handle;
    else if (h->mode == HANDLE_PERMIT)
        yes = yes && h->rec.gen == e->m.gen; /* not lost since (sem.h, M8) */
    pthread_mutex_unlock(&e->mu);
    dlock_client_leave(h->c);
    return yes;
}

int dlock_handle_unclean(dlock_handle *h)
{
    if (!h)
        return dlock_err_set(DLOCK_EINVAL, "handle is NULL");
    if (dlock_client_forked(h->c))
        return dlock_err_set(DLOCK_EFORK, "this handle's client was opened before fork()");
    if (h->mode == HANDLE_PERMIT)
        return 0; /* permits keep no word of how others ended */
    dlock_client_enter(h->c);
    dlock_entry *e = h->e;
    pthread_mutex_lock(&e->mu);
    int rc = h->mode == HANDLE_SHARED ? e->s.unclean : e->x.unclean;
    pthread_mutex_unlock(&e->mu);
    dlock_client_leave(h->c);
    return rc;
}

int dlock_with(dlock_client *c, const char *name, int64_t wait_ms,
               void (*fn)(void *arg, uint64_t fence), void *arg)
{
    if (!fn) {
        dlock_err_clear();
        return dlock_err_set(DLOCK_EINVAL, "fn is NULL");
    }
    uint64_t fence;
    int rc = dlock_acquire(c, name, wait_ms, &fence);
    if (rc != DLOCK_OK)
        return rc;
    fn(arg, fence);
    return dlock_release(c, name);
}

int dlock_with_shared(dlock_client *c, const char *name, int64_t wait_ms,
                      void (*fn)(void *arg, uint64_t fence), void *arg)
{
    if (!fn) {
        dlock_err_clear();
        return dlock_err_set(DLOCK_EINVAL, "fn is NULL");
    }
    uint64_t fence;
    int rc = dlock_acquire_shared(c, name, wait_ms, &fence);
    if (rc != DLOCK_OK)
        return rc;
    fn(arg, fence);
    return dlock_release_shared(c, name);
}

int dlock_sem_with(dlock_client *c, const char *name, uint32_t limit, int64_t wait_ms,
                   void (*fn)(void *arg), void *arg)
{
    if (!fn) {
        dlock_err_clear();
        return dlock_err_set(DLOCK_EINVAL, "fn is NULL");
    }
    /* a handle: its own record, so that the permit given back is this one
     * (a release by name gives back a lost one of the thread's first) */
    dlock_handle *h;
    int rc = dlock_sem_acquire_handle(c, name, limit, wait_ms, &h);
    if (rc != DLOCK_OK)
        return rc;
    fn(arg);
    return dlock_handle_release(h);
}
