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

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

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

/*
 * Atomic loads and stores. ConcurrencyKit's read-modify-write operations are
 * visible to ThreadSanitizer when built with CK_USE_CC_BUILTINS=1, but its
 * plain loads and stores are volatile accesses that TSan takes for races; in
 * TSan builds these use the compiler's relaxed atomics instead, which is what
 * ck_pr_load/ck_pr_store are (no ordering implied; callers add fences).
 */
#if defined(__SANITIZE_THREAD__)
#define DLOCK_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DLOCK_UNDER_TSAN 1
#endif
#endif

#ifdef DLOCK_UNDER_TSAN
#define DLOCK_LOAD_(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define DLOCK_STORE_(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
static inline unsigned dlock_load_uint(unsigned *p) { return DLOCK_LOAD_(p); }
static inline int dlock_load_int(int *p) { return DLOCK_LOAD_(p); }
static inline uint64_t dlock_load_64(uint64_t *p) { return DLOCK_LOAD_(p); }
static inline void dlock_store_int(int *p, int v) { DLOCK_STORE_(p, v); }
static inline int dlock_load_int_acquire(int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void dlock_store_int_release(int *p, int v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline unsigned dlock_load_uint_acquire(unsigned *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline void dlock_dec_uint_release(unsigned *p)
{
    __atomic_fetch_sub(p, 1, __ATOMIC_RELEASE);
}
#else
static inline unsigned dlock_load_uint(unsigned *p) { return ck_pr_load_uint(p); }
static inline int dlock_load_int(int *p) { return ck_pr_load_int(p); }
static inline uint64_t dlock_load_64(uint64_t *p) { return ck_pr_load_64(p); }
static inline void dlock_store_int(int *p, int v) { ck_pr_store_int(p, v); }
/* Publication of data written before the flag: the store is preceded by a
 * store fence, the load followed by a load fence (acquire/release). */
static inline int dlock_load_int_acquire(int *p)
{
    int v = ck_pr_load_int(p);
    ck_pr_fence_load();
    return v;
}
static inline void dlock_store_int_release(int *p, int v)
{
    ck_pr_fence_store();
    ck_pr_store_int(p, v);
}
/* A count dropped by a thread done with an object, read by the one that
 * frees it at 0: every access before the decrement happens before the
 * free (release/acquire). */
static inline unsigned dlock_load_uint_acquire(unsigned *p)
{
    unsigned v = ck_pr_load_uint(p);
    ck_pr_fence_acquire();
    return v;
}
static inline void dlock_dec_uint_release(unsigned *p)
{
    ck_pr_fence_release();
    ck_pr_dec_uint(p);
}
#endif

#define DLOCK_NS_PER_MS 1000000LL

/* Names a process-wide mutex for stress/lockstat.c, which measures waits and
 * holds in storm built with -DDLOCK_LOCKSTAT=ON; nothing in other builds. */
#ifdef DLOCK_LOCKSTAT
void dlock_lockstat_name(const void *addr, const char *name) __attribute__((weak));
#define DLOCK_LOCKSTAT_NAME(addr, name)                                        \
    do {                                                                       \
        if (dlock_lockstat_name)                                               \
            dlock_lockstat_name((addr), (name));                               \
    } while (0)
#else
#define DLOCK_LOCKSTAT_NAME(addr, name) ((void)0)
#endif

/* CLOCK_MONOTONIC in ns: every local deadline but lease validity uses it. */
static inline int64_t dlock_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Simulated suspend time added to CLOCK_BOOTTIME readings, for tests
 * only: 0 in every real use. Read as a relaxed atomic. */
extern uint64_t dlock_boot_skew_ns;

/* How long dlock_client_shutdown pauses inside its call, for tests only
 * (a shutdown caught while a close starts): 0 in every real use. Read as a
 * relaxed atomic. */
extern uint64_t dlock_test_shutdown_delay_ns;

/* CLOCK_BOOTTIME in ns: lease validity deadlines use it. Unlike
 * CLOCK_MONOTONIC it keeps counting while the system is suspended (and in
 * the VM pauses that the guest sees as a suspend), as Redis keeps expiring
 * keys meanwhile: a lease is never taken for valid after a resume. Waits and
 * timeouts stay on the monotonic clock. */
static inline int64_t dlock_boot_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec + (int64_t)dlock_load_64(&dlock_boot_skew_ns);
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

/* Sleeps while *word == val, until a dlock_futex_wake on word or the
 * monotonic deadline_ns (DLOCK_NEVER: none). Returns on a wake-up, a
 * spurious one, the deadline or a signal alike: callers look again. */
static inline void dlock_futex_wait(int *word, int val, int64_t deadline_ns)
{
    struct timespec ts, *tp = NULL;
    if (deadline_ns != DLOCK_NEVER) {
        ts = dlock_ts(deadline_ns);
        tp = &ts;
    }
    /* FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline. */
    syscall(SYS_futex, word, FUTEX_WAIT_BITSET_PRIVATE, val, tp, NULL, FUTEX_BITSET_MATCH_ANY);
}

/* Wakes at most n threads sleeping on word. The word's memory may have been
 * reused since it was written: a wake-up that reaches another sleeper is a
 * spurious one, which every dlock_futex_wait caller tolerates. */
static inline void dlock_futex_wake(int *word, int n)
{
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/*
 * Counters of one client, shared by all its threads. Each is updated with an
 * atomic add and read with an atomic load; they are statistics, so no other
 * memory is ordered by them (ck_pr's default, no fences).
 */
/* A latency histogram: n[i] counts values up to 16 us * 2^i (i < last),
 * n[DLOCK_HIST_BUCKETS - 1] the larger ones; sum_ns their sum. Each field is
 * a counter as below. */
#define DLOCK_HIST_BUCKETS 24
typedef struct dlock_hist {
    uint64_t n[DLOCK_HIST_BUCKETS];
    uint64_t sum_ns;
} dlock_hist;

/* The return codes counted per call: DLOCK_OK (0) down to DLOCK_ECANCELED,
 * indexed by -code. */
#define DLOCK_NCODES 12
_Static_assert(DLOCK_NCODES == 1 - DLOCK_ECANCELED, "a new error code: count it here");

typedef struct dlock_counters {
    uint64_t acquisitions;
    uint64_t grants;
    uint64_t handoffs;
    uint64_t redis_commands;
    uint64_t redis_round_trips;
    uint64_t renew_rounds;
    uint64_t renew_round_trips;
    uint64_t renew_keys;
    uint64_t leases_held;
    uint64_t leases_lost;
    uint64_t entries;
    uint64_t direct_grants;
    uint64_t acquire_rc[DLOCK_NCODES]; /* dlock_acquire's returns, by -code */
    uint64_t release_rc[DLOCK_NCODES]; /* dlock_release's */
    dlock_hist wait;            /* successful acquires: call to return */
    dlock_hist hold;            /* outermost acquire to outermost release */
    dlock_hist renew;           /* a renewal round's first pipeline: write to last reply */
    uint64_t renew_failures;    /* renewal rounds that left some lease unconfirmed */
    uint64_t renewed;           /* leases renewed (Redis said so), over rounds */
    uint64_t forced_releases;   /* operators' releases of held leases (dlockctl) */
    uint64_t unclean;           /* grants and handoffs that followed an unclean end */
    uint64_t abandoned;         /* locks released for a holder thread that exited */
    uint64_t protocol_resends;  /* acquire attempts sent again in the other protocol */
    uint64_t shared_acquisitions; /* of acquisitions, those in shared mode */
    uint64_t shared_joins;      /* shared acquires that joined a held shared lease */
    uint64_t sem_acquisitions;  /* of acquisitions, semaphore permits taken */
    uint64_t sem_passes;        /* permits passed between threads with no Redis command */
} dlock_counters;

static inline void dlock_count(uint64_t *counter, uint64_t n)
{
    ck_pr_add_64(counter, n);
}

/* Adds a duration to h. */
static inline void dlock_hist_add(dlock_hist *h, int64_t ns)
{
    if (ns < 0)
        ns = 0;
    uint64_t v = (uint64_t)ns, bound = 16000; /* ns: 16 us, doubling */
    int i = 0;
    while (v > bound && i < DLOCK_HIST_BUCKETS - 1) {
        bound <<= 1;
        i++;
    }
    dlock_count(&h->n[i], 1);
    dlock_count(&h->sum_ns, (uint64_t)ns);
}

/* Counts a public call's return code (0 or negative) in by_code. */
static inline void dlock_count_rc(uint64_t *by_code, int rc)
{
    int i = -rc;
    if (i >= 0 && i < DLOCK_NCODES)
        dlock_count(&by_code[i], 1);
}

#endif
