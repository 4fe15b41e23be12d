/*
 * The entry table of the local tier.
 *
 * Protocol (as Elasticsearch's AbstractRefCounted, with ck_pr atomics):
 *   - try_inc_ref succeeds only on a count > 0; a count of 0 means the entry
 *     is closing and will be unlinked: a lookup that meets it retries.
 *   - the dec_ref that takes the count to 0 unlinks and frees the entry,
 *     exactly once (only one decrement can observe the old value 1, and a
 *     count of 0 is never incremented again).
 *
 * Why a reader never touches freed memory: lookups read and try_inc_ref an
 * entry only while holding the table mutex, and the closer unlinks under the
 * same mutex before freeing. A lookup that got its reference holds the count
 * above 0, so the entry cannot close under it.
 *
 * Memory ordering: a thread's writes to an entry (made under e->mu) happen
 * before its decrement (release fence before the atomic); the closer issues
 * an acquire fence after seeing 1 -> 0, so it frees only after every other
 * user's accesses. The mutexes already order most of this; the fences make
 * the argument independent of them.
 *
 * Lock order: the table mutex is a leaf (see table.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "entry/table.h"
#include "common/slot.h"

struct dlock_table {
    pthread_mutex_t mu;
    dlock_entry *entries; /* uthash head, guarded by mu */
    unsigned count;       /* guarded by mu */
    uint64_t made;        /* guarded by mu: entries made so far */
    dlock_counters *ctr;
    size_t prefix_len;
    char client_suffix[40]; /* ":c:<client id>" */
    char prefix[];
};

dlock_table *dlock_table_create(const char *prefix, const char *client_id, dlock_counters *ctr)
{
    size_t plen = strlen(prefix);
    if (strlen(client_id) > 36)
        return NULL;
    dlock_table *t = calloc(1, sizeof *t + plen + 1);
    if (!t)
        return NULL;
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&t->mu, &ma);
    DLOCK_LOCKSTAT_NAME(&t->mu, "table");
    pthread_mutexattr_destroy(&ma);
    t->ctr = ctr;
    t->prefix_len = plen;
    memcpy(t->prefix, prefix, plen + 1);
    snprintf(t->client_suffix, sizeof t->client_suffix, "%s%s",
             dlock_script_key_suffix(DLOCK_KEY_CLIENT), client_id);
    return t;
}

static void entry_free(dlock_entry *e)
{
    pthread_cond_destroy(&e->pcv);
    pthread_mutex_destroy(&e->mu);
    free(e->keys[0]); /* the one allocation of all keys */
    free(e->lease.rl);
    free(e->lease.rls);
    free(e);
}

void dlock_table_destroy(dlock_table *t)
{
    if (!t)
        return;
    dlock_entry *e, *tmp;
    HASH_ITER(hh, t->entries, e, tmp) {
        HASH_DEL(t->entries, e);
        entry_free(e);
    }
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* Called with t->mu held (it reads the prefix only, but callers need the
 * entry linked atomically with its creation). */
static dlock_entry *entry_new(dlock_table *t, const char *name, size_t len)
{
    dlock_entry *e = calloc(1, sizeof *e + len + 1);
    if (!e)
        return NULL;
    /* Every key but HW is "<prefix>{<name>}" plus a suffix; HW is
     * "<prefix>hw:{<tag>}", the tag of the lease key's hash slot
     * (lua/keys.lua); all in one allocation. */
    const char *suffix[DLOCK_KEYS];
    for (int k = 0; k < DLOCK_KEYS; k++)
        suffix[k] = k == DLOCK_KEY_CLIENT ? t->client_suffix : dlock_script_key_suffix(k);
    size_t base = t->prefix_len + len + 2, total = 0;
    for (int k = 0; k < DLOCK_KEYS; k++)
        total += k == DLOCK_KEY_HW ? t->prefix_len + strlen(suffix[k]) + DLOCK_SLOT_TAG_MAX + 2
                                   : base + strlen(suffix[k]) + 1;
    char *buf = malloc(total);
    if (!buf) {
        free(e);
        return NULL;
    }
    for (int k = 0; k < DLOCK_KEYS; k++) {
        e->keys[k] = buf;
        if (k == DLOCK_KEY_HW) {
            unsigned slot = dlock_cluster_slot(e->keys[DLOCK_KEY_LEASE], base);
            buf += sprintf(buf, "%s%s{%s}", t->prefix, suffix[k], dlock_slot_tag(slot)) + 1;
            continue;
        }
        memcpy(buf, t->prefix, t->prefix_len);
        buf[t->prefix_len] = '{';
        memcpy(buf + t->prefix_len + 1, name, len);
        buf[t->prefix_len + 1 + len] = '}';
        memcpy(buf + base, suffix[k], strlen(suffix[k]) + 1);
        buf += base + strlen(suffix[k]) + 1;
    }

    memcpy(e->name, name, len);
    e->name[len] = '\0';
    e->name_len = len;
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&e->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->pcv, &ca);
    pthread_condattr_destroy(&ca);
    e->lease.state = DLOCK_LEASE_NONE;
    e->refs = 1;
    return e;
}

static int try_inc_ref(dlock_entry *e)
{
    unsigned n = dlock_load_uint(&e->refs);
    while (n > 0) {
        /* On failure ck_pr_cas_uint_value stores the current count in n. */
        if (ck_pr_cas_uint_value(&e->refs, n, n + 1, &n))
            return 1;
    }
    return 0;
}

static dlock_entry *lookup(dlock_table *t, const char *name, size_t len, int create)
{
    for (;;) {
        dlock_entry *e;
        pthread_mutex_lock(&t->mu);
        HASH_FIND(hh, t->entries, name, len, e);
        if (e && try_inc_ref(e)) {
            pthread_mutex_unlock(&t->mu);
            return e;
        }
        if (!e) {
            if (create && (e = entry_new(t, name, len)) != NULL) {
                e->made = ++t->made;
                HASH_ADD_KEYPTR(hh, t->entries, e->name, len, e);
                t->count++;
                dlock_count(&t->ctr->entries, 1);
            }
            pthread_mutex_unlock(&t->mu);
            return e;
        }
        /* Closing: its closer is waiting for t->mu to unlink it. */
        pthread_mutex_unlock(&t->mu);
        sched_yield();
    }
}

dlock_entry *dlock_table_get(dlock_table *t, const char *name, size_t len)
{
    return lookup(t, name, len, 1);
}

dlock_entry *dlock_table_find(dlock_table *t, const char *name, size_t len)
{
    return lookup(t, name, len, 0);
}

void dlock_table_ref(dlock_entry *e)
{
    unsigned old = ck_pr_faa_uint(&e->refs, 1);
    DLOCK_ASSERT(old > 0);
}

void dlock_table_put(dlock_table *t, dlock_entry *e)
{
    ck_pr_fence_release(); /* our accesses to e come before the decrement */
    unsigned old = ck_pr_faa_uint(&e->refs, (unsigned)-1);
    DLOCK_ASSERT(old > 0);
    if (old != 1)
        return;
    ck_pr_fence_acquire(); /* every other user's accesses come before the free */
    pthread_mutex_lock(&t->mu);
    HASH_DEL(t->entries, e);
    t->count--;
    pthread_mutex_unlock(&t->mu);
    dlock_count(&t->ctr->entries, (uint64_t)-1);
    entry_free(e);
}

unsigned dlock_table_count(dlock_table *t)
{
    pthread_mutex_lock(&t->mu);
    unsigned n = t->count;
    pthread_mutex_unlock(&t->mu);
    return n;
}

void dlock_table_foreach(dlock_table *t, void (*fn)(dlock_entry *e, void *arg), void *arg)
{
    pthread_mutex_lock(&t->mu);
    dlock_entry *e, *tmp;
    HASH_ITER(hh, t->entries, e, tmp) fn(e, arg);
    pthread_mutex_unlock(&t->mu);
}

void dlock_table_each_ref(dlock_table *t, void (*fn)(dlock_entry *e, void *arg), void *arg)
{
    pthread_mutex_lock(&t->mu);
    dlock_entry **v = malloc(sizeof *v * (t->count ? t->count : 1));
    size_t n = 0;
    dlock_entry *e, *tmp;
    if (v)
        HASH_ITER(hh, t->entries, e, tmp) if (try_inc_ref(e)) v[n++] = e;
    pthread_mutex_unlock(&t->mu);
    for (size_t i = 0; i < n; i++) {
        fn(v[i], arg);
        dlock_table_put(t, v[i]);
    }
    free(v);
}

/* Someone changed e's state: wakes the head of the local queue if there is
 * something for it to do: an open handoff to take (the first exclusive
 * waiter: only it can), or no poller while the lease is not here (it polls:
 * I9); or every waiter, when the shared lease may be joined (no exclusive
 * waiter, the join window open: local/shared.h). Called with e->mu held. */
void dlock_entry_kick_head(dlock_entry *e)
{
    if (!e->wq.head)
        return;
    if (e->x.handoff) {
        dlock_waiter *w = dlock_waitq_first(&e->wq, DLOCK_KIND_EXCL);
        if (w)
            dlock_waitq_wake(w);
    } else if (!dlock_entry_held(e) && e->lease.state == DLOCK_LEASE_NONE && !e->poll.poller) {
        dlock_waitq_wake(e->wq.head);
    } else if ((e->lease.shared || e->s.under_x) && e->lease.state == DLOCK_LEASE_HELD &&
               e->kind_waiters[DLOCK_KIND_EXCL] == 0 && dlock_boot_ns() < e->s.join_until_ns) {
        dlock_waitq_wake_all(&e->wq);
    }
}
