/*
 * lockstat: how long the library's threads wait for, and hold, its mutexes,
 * for storm built with -DDLOCK_LOCKSTAT=ON (never in the library's normal
 * builds). The link wraps pthread_mutex_lock/unlock and the condition waits
 * (-Wl,--wrap), so the library's code is measured as it is; the library
 * only names its process-wide mutexes (DLOCK_LOCKSTAT_NAME in common.h).
 * Every other mutex counts as "entry" (the per-name entry mutexes; storm's
 * own dlock mode takes none).
 *
 * A lock that succeeds at its first try is uncontended; otherwise the time
 * until it is granted is its wait. A hold runs from the grant to the unlock,
 * and a condition wait on the mutex ends one hold and starts another when
 * it returns. Reading the clock at every lock and unlock slows the library
 * by a few percent: the figures are for finding contention, not throughput.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "lockstat.h"

enum { K_TABLE, K_POOL, K_RENEW, K_SUB, K_ENTRY, K_N };
static const char *const kind_name[K_N] = {"table", "pool", "renew", "sub", "entry"};

#define MAX_NAMED 256
static struct {
    const void *addr;
    int kind;
} named[MAX_NAMED];
static int n_named; /* appended with an atomic index; read with acquire */

typedef struct {
    uint64_t locks, contended, wait_ns, max_wait_ns, hold_ns, max_hold_ns, cond_waits;
} kstat;
static kstat st[K_N];
static __thread int64_t held_since[K_N];

static int64_t now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void dlock_lockstat_name(const void *addr, const char *name)
{
    int k = K_ENTRY;
    for (int i = 0; i < K_N; i++)
        if (strcmp(kind_name[i], name) == 0)
            k = i;
    int slot = __atomic_fetch_add(&n_named, 1, __ATOMIC_RELAXED);
    if (slot >= MAX_NAMED)
        return; /* counted as "entry" */
    named[slot].kind = k;
    __atomic_store_n(&named[slot].addr, addr, __ATOMIC_RELEASE);
}

static int kind_of(const void *m)
{
    int n = __atomic_load_n(&n_named, __ATOMIC_ACQUIRE);
    if (n > MAX_NAMED)
        n = MAX_NAMED;
    for (int i = 0; i < n; i++)
        if (__atomic_load_n(&named[i].addr, __ATOMIC_ACQUIRE) == m)
            return named[i].kind;
    return K_ENTRY;
}

static void add_max(uint64_t *max, uint64_t v)
{
    uint64_t cur = __atomic_load_n(max, __ATOMIC_RELAXED);
    while (v > cur && !__atomic_compare_exchange_n(max, &cur, v, 0, __ATOMIC_RELAXED,
                                                   __ATOMIC_RELAXED))
        ;
}

static void hold_start(int k)
{
    held_since[k] = now();
}

static void hold_end(int k)
{
    if (!held_since[k])
        return;
    uint64_t h = (uint64_t)(now() - held_since[k]);
    held_since[k] = 0;
    __atomic_add_fetch(&st[k].hold_ns, h, __ATOMIC_RELAXED);
    add_max(&st[k].max_hold_ns, h);
}

int __real_pthread_mutex_lock(pthread_mutex_t *m);
int __real_pthread_mutex_unlock(pthread_mutex_t *m);
int __real_pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m);
int __real_pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m,
                                  const struct timespec *ts);

int __wrap_pthread_mutex_lock(pthread_mutex_t *m)
{
    int k = kind_of(m), rc = 0;
    if (pthread_mutex_trylock(m) != 0) {
        int64_t t0 = now();
        rc = __real_pthread_mutex_lock(m);
        uint64_t w = (uint64_t)(now() - t0);
        __atomic_add_fetch(&st[k].contended, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&st[k].wait_ns, w, __ATOMIC_RELAXED);
        add_max(&st[k].max_wait_ns, w);
    }
    __atomic_add_fetch(&st[k].locks, 1, __ATOMIC_RELAXED);
    hold_start(k);
    return rc;
}

int __wrap_pthread_mutex_unlock(pthread_mutex_t *m)
{
    hold_end(kind_of(m));
    return __real_pthread_mutex_unlock(m);
}

int __wrap_pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m)
{
    int k = kind_of(m);
    hold_end(k);
    __atomic_add_fetch(&st[k].cond_waits, 1, __ATOMIC_RELAXED);
    int rc = __real_pthread_cond_wait(c, m);
    hold_start(k);
    return rc;
}

int __wrap_pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *ts)
{
    int k = kind_of(m);
    hold_end(k);
    __atomic_add_fetch(&st[k].cond_waits, 1, __ATOMIC_RELAXED);
    int rc = __real_pthread_cond_timedwait(c, m, ts);
    hold_start(k);
    return rc;
}

void dlock_lockstat_report(FILE *f, int proc, uint64_t acquisitions, double seconds)
{
    fprintf(f, "lockstat proc %d: %" PRIu64 " acquisitions in %.2f s\n", proc, acquisitions,
            seconds);
    fprintf(f, "lockstat %-6s %10s %10s %9s %12s %12s %12s %12s %10s\n", "mutex", "locks",
            "per acq", "contended", "wait us/acq", "max wait us", "hold us/acq", "max hold us",
            "cond waits");
    double a = acquisitions ? (double)acquisitions : 1;
    for (int k = 0; k < K_N; k++) {
        kstat *s = &st[k];
        if (!s->locks)
            continue;
        fprintf(f, "lockstat %-6s %10" PRIu64 " %10.2f %8.2f%% %12.3f %12.1f %12.3f %12.1f %10" PRIu64
                "\n", kind_name[k], s->locks, s->locks / a, 100.0 * s->contended / s->locks,
                s->wait_ns / 1e3 / a, s->max_wait_ns / 1e3, s->hold_ns / 1e3 / a,
                s->max_hold_ns / 1e3, s->cond_waits);
    }
}
