/*
 * Private declarations shared by the modules of libdlock: clocks, counters,
 * and an always-on assert for states that must be impossible.
 */
#ifndef DLOCK_COMMON_H
#define DLOCK_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <ck_pr.h>

#include "dlock.h"

/* Always on, also in release builds: a broken invariant of the lock must stop
 * the process rather than let two holders run. */
#define DLOCK_ASSERT(cond)                                                     \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "dlock: %s:%d: invariant broken: %s\n", __FILE__,  \
                    __LINE__, #cond);                                          \
            abort();                                                           \
        }                                                                      \
    } while (0)

#define DLOCK_NS_PER_MS 1000000LL

/* CLOCK_MONOTONIC in ns: every local deadline uses it. */
static inline int64_t dlock_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A deadline of "never". */
#define DLOCK_NEVER INT64_MAX

/* Turns a monotonic deadline into a struct timespec for
 * pthread_cond_timedwait on a CLOCK_MONOTONIC condition variable. */
static inline struct timespec dlock_ts(int64_t ns)
{
    struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
    return ts;
}

/*
 * Counters of one client, shared by all its threads. Each is updated with an
 * atomic add and read with an atomic load; they are statistics, so no other
 * memory is ordered by them (ck_pr's default, no fences).
 */
typedef struct dlock_counters {
    uint64_t acquisitions;
    uint64_t redis_commands;
    uint64_t redis_round_trips;
    uint64_t renew_rounds;
    uint64_t renew_round_trips;
    uint64_t renew_keys;
    uint64_t leases_held;
    uint64_t leases_lost;
    uint64_t entries;
} dlock_counters;

static inline void dlock_count(uint64_t *counter, uint64_t n)
{
    ck_pr_add_64(counter, n);
}

#endif
