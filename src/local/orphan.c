/*
 * Threads that exit holding locks (orphan.h). Shared state: the pthread key
 * (made once), the calling thread's held slots (client.h: only it touches
 * them), and the entries it releases, under client.h's rules.
 */
#include <pthread.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "local/client.h"
#include "common/error.h"
#include "local/excl.h"
#include "local/orphan.h"
#include "local/sem.h"
#include "local/release.h"
#include "local/shared.h"

/*
 * The thread-exit hook. A thread's first outermost acquire arms it (a
 * pthread key whose destructor runs when the thread exits); at exit it
 * releases every lock the thread still holds as owner, as its release
 * would, but as DLOCK_UNCLEAN_ABANDONED (the next holder is told: dlock_unclean),
 * logs each (on_log) and counts it. The locks are found in the thread's
 * cache of held entries, and, if it held more than it caches, in the
 * tables of the open clients. A slot of a client closed since is skipped:
 * its leases were released by the close.
 */
static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static __thread int exit_armed;

static void on_thread_exit(void *unused);

static void exit_key_create(void)
{
    /* Without a key (none left) nothing is released at exit: the leases
     * stay held and renewed until the client closes, as before. */
    (void)pthread_key_create(&exit_key, on_thread_exit);
}

void dlock_orphan_arm(void)
{
    if (exit_armed)
        return;
    exit_armed = 1;
    pthread_once(&exit_once, exit_key_create);
    (void)pthread_setspecific(exit_key, &exit_armed); /* non-NULL: the destructor runs */
}

/* Releases e, which the exiting calling thread owns in the entered client
 * c, as an abandoned hold. Takes the lookup's reference itself. */
static void abandon(dlock_client *c, dlock_entry *e)
{
    char name[DLOCK_NAME_MAX + 1];
    memcpy(name, e->name, e->name_len + 1); /* e may be freed by the release */
    dlock_table_ref(e); /* the lookup's: the owner's keeps e alive meanwhile */
    pthread_mutex_lock(&e->mu);
    DLOCK_ASSERT(dlock_kind_excl.mine(c, e));
    uint64_t token = e->lease.token;
    unsigned depth = e->x.depth;
    e->x.depth = 1;
    e->x.ending = DLOCK_UNCLEAN_ABANDONED;
    dlock_held_forget(c, e);
    int rc = dlock_release_outermost(c, &dlock_kind_excl, e, name);
    dlock_count(&c->ctr.abandoned, 1);
    dlock_count_rc(c->ctr.release_rc, rc);
    if (rc == DLOCK_OK)
        dlock_client_log(c, DLOCK_LOG_WARN, "thread %ld exited holding '%s' (token %" PRIu64
                         ", depth %u): released for it; the next holder is told "
                         "(DLOCK_UNCLEAN_ABANDONED)",
                         (long)syscall(SYS_gettid), name, token, depth);
    else
        dlock_client_log(c, DLOCK_LOG_WARN, "thread %ld exited holding '%s' (token %" PRIu64
                         ", depth %u): its release failed (%s: %s); the lease ends by "
                         "itself within its lease time",
                         (long)syscall(SYS_gettid), name, token, depth, dlock_err_name(rc),
                         dlock_last_error());
}

/* Releases the shared hold h of the exiting calling thread in the entered
 * client c (shared.h): the lease goes back if it was the last holder. A
 * shared acquire nested in an exclusive hold is one level of that hold,
 * which abandon() releases whole. */
static void abandon_shared(dlock_client *c, dlock_shold *h)
{
    dlock_entry *e = h->e;
    unsigned depth = h->depth;
    h->nested = 0;
    if (depth == 0) {
        dlock_shold_tidy(h);
        return;
    }
    char name[DLOCK_NAME_MAX + 1];
    memcpy(name, e->name, e->name_len + 1); /* e may be freed by the release */
    dlock_table_ref(e); /* the lookup's: the holder's keeps e alive meanwhile */
    pthread_mutex_lock(&e->mu);
    uint64_t token = e->lease.token;
    h->depth = 0;
    dlock_shold_tidy(h);
    int rc = dlock_release_outermost(c, &dlock_kind_shared, e, name);
    dlock_count(&c->ctr.abandoned, 1);
    dlock_count_rc(c->ctr.release_rc, rc);
    dlock_client_log(c, DLOCK_LOG_WARN, "thread %ld exited holding '%s' shared (token %" PRIu64
                     ", depth %u): released for it (%s)", (long)syscall(SYS_gettid), name, token,
                     depth, rc == DLOCK_OK ? "OK" : dlock_err_name(rc));
}

/* Gives back the semaphore permits of h (the exiting calling thread's, in
 * the entered client c: sem.h), each as dlock_sem_release would. */
static void abandon_sem(dlock_client *c, dlock_shold *h)
{
    unsigned n = h->permits + h->lost;
    char name[DLOCK_NAME_MAX + 1];
    memcpy(name, h->e->name, h->e->name_len + 1);
    int rc = DLOCK_OK;
    for (unsigned i = 0; i < n; i++) { /* (the last give drops the record h) */
        int r = dlock_sem_give(c, h);
        if (rc == DLOCK_OK)
            rc = r;
    }
    dlock_count(&c->ctr.abandoned, n);
    dlock_client_log(c, DLOCK_LOG_WARN, "thread %ld exited holding %u permit%s of '%s': given "
                     "back for it (%s)", (long)syscall(SYS_gettid), n, n == 1 ? "" : "s", name,
                     rc == DLOCK_OK ? "OK" : dlock_err_name(rc));
}

/* Adds e to the list in arg if the calling thread owns it (not through a
 * handle) and its cache does not hold it; with a reference for the list.
 * For dlock_table_each_ref. */
typedef struct owned_list {
    const dlock_client *c;
    dlock_entry **v;
    size_t n, cap;
} owned_list;

static void collect_owned(dlock_entry *e, void *arg)
{
    owned_list *l = arg;
    for (int i = 0; i < DLOCK_HELD_SLOTS; i++)
        if (dlock_held_slots[i].e == e)
            return;
    pthread_mutex_lock(&e->mu);
    int mine = dlock_kind_excl.mine(l->c, e);
    pthread_mutex_unlock(&e->mu);
    if (!mine)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        dlock_entry **v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return; /* out of memory: that lease stays until the client closes */
        l->v = v;
        l->cap = cap;
    }
    dlock_table_ref(e);
    l->v[l->n++] = e;
}

static void on_thread_exit(void *unused)
{
    (void)unused;
    dlock_shold *h;
    while ((h = dlock_shold_last())) {
        dlock_client *c = dlock_client_find_enter(h->serial);
        if (!c || dlock_client_forked(c)) {
            /* its client closed (or is the parent's): nothing to do */
            h->depth = h->nested = h->permits = h->lost = 0;
            dlock_shold_tidy(h);
        } else if (h->permits || h->lost) {
            abandon_sem(c, h);
        } else {
            abandon_shared(c, h);
        }
        if (c)
            dlock_client_leave(c);
    }
    for (int i = 0; i < DLOCK_HELD_SLOTS; i++) {
        if (!dlock_held_slots[i].e)
            continue;
        dlock_client *c = dlock_client_find_enter(dlock_held_slots[i].serial);
        if (!c || dlock_client_forked(c)) {
            /* its client closed (or is the parent's): nothing to do */
            dlock_held_slots[i].e = NULL;
            if (c)
                dlock_client_leave(c);
            continue;
        }
        abandon(c, dlock_held_slots[i].e);
        dlock_client_leave(c);
    }
    while (dlock_held_uncached > 0) {
        /* More names than the cache holds: look in every open client's table. */
        size_t n;
        dlock_client **cs = dlock_client_enter_all(&n);
        size_t found = 0;
        for (size_t k = 0; k < n; k++) {
            owned_list l = {cs[k], NULL, 0, 0};
            dlock_table_each_ref(cs[k]->table, collect_owned, &l);
            for (size_t j = 0; j < l.n; j++) {
                abandon(cs[k], l.v[j]);
                dlock_table_put(cs[k]->table, l.v[j]); /* the list's */
            }
            found += l.n;
            free(l.v);
            dlock_client_leave(cs[k]);
        }
        free(cs);
        if (found == 0)
            break; /* held by clients closed since: nothing left to release */
    }
}
