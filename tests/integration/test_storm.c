/*
 * Thread storms against a private redis-server (tests/support/fixture.h): many
 * threads in two clients (two independent owners, like two processes) fight
 * over one name or over many names, and check inside every critical section
 * that they are alone (occupancy counter), that the fencing token grew, and
 * that a non-atomic read-modify-write of a counter never loses an update.
 * The last storms kill and restart, or stop and resume, Redis in the middle.
 *
 * Shared state is accessed with relaxed atomics only, so that the checks
 * themselves are free of data races (TSan) while the counter update stays a
 * separate load and store: overlapping holders would lose increments.
 *
 * Timing: no assertion depends on speed; waits are bounded generously so a
 * hang fails instead of stalling.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dlock.h"
#include "fixture.h"


#define MS(ns) ((ns) / 1000000LL)
#define RLX memory_order_relaxed

static dlock_client *open_client(const char *prefix, uint32_t lease_ms)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = prefix;
    if (lease_ms)
        cfg.lease_ms = lease_ms;
    dlock_client *c = NULL;
    int rc = dlock_client_open(&cfg, &c);
    if (rc != DLOCK_OK)
        fail_msg("dlock_client_open: %s (%s)", dlock_err_name(rc), dlock_last_error());
    return c;
}

static dlock_stats stats(dlock_client *c)
{
    dlock_stats s;
    assert_int_equal(dlock_client_stats(c, &s), DLOCK_OK);
    return s;
}

static unsigned rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 16) & 0x7fff;
}

/* ------------------------------------------------------------ the storm */

typedef struct slot {
    atomic_int occupancy;
    atomic_ullong last_fence;
    atomic_long counter;      /* updated by a non-atomic load + store */
} slot;

typedef struct crit {         /* one critical section, for the fault storms */
    long long start, end;
    int name, held_at_end;
} crit;

typedef struct storm {
    dlock_client *c[2];
    int threads_per_client;
    int iters;                /* per thread; 0 = until stop */
    int nnames;
    int64_t wait_ms;
    char (*names)[32];
    slot *slots;
    /* results */
    atomic_long ok, ok_after_restart, timedout, eredis, other_acq_err;
    atomic_long occ_violations, fence_violations, not_held, bad_release;
    atomic_long rel_elost, rel_eredis;
    atomic_int stop, phase, finished;
    pthread_barrier_t start;
    /* fault storms: per-thread logs of critical sections */
    crit **logs;
    int *nlog;
    int log_cap;
} storm;

typedef struct worker {
    storm *s;
    int idx;
    dlock_client *c;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    storm *s = w->s;
    unsigned seed = 0x9e3779b9u * (unsigned)(w->idx + 1);
    pthread_barrier_wait(&s->start);
    for (int it = 0; s->iters ? it < s->iters : !atomic_load(&s->stop); it++) {
        int k = s->nnames > 1 ? (int)(rnd(&seed) % (unsigned)s->nnames) : 0;
        const char *name = s->names[k];
        slot *sl = &s->slots[k];
        int phase = atomic_load(&s->phase);
        uint64_t fence = 0;
        int rc = dlock_acquire(w->c, name, s->wait_ms, &fence);
        if (rc != DLOCK_OK) {
            if (rc == DLOCK_ETIMEDOUT)
                atomic_fetch_add(&s->timedout, 1);
            else if (rc == DLOCK_EREDIS)
                atomic_fetch_add(&s->eredis, 1);
            else
                atomic_fetch_add(&s->other_acq_err, 1);
            if (rc == DLOCK_EREDIS)
                fx_sleep_ms(10); /* Redis down: do not spin */
            continue;
        }
        /* ---- critical section ---- */
        long long t0 = fx_now_ns();
        int occ = atomic_fetch_add_explicit(&sl->occupancy, 1, RLX) + 1;
        if (occ != 1)
            atomic_fetch_add(&s->occ_violations, 1);
        uint64_t prev = atomic_load_explicit(&sl->last_fence, RLX);
        if (fence <= prev)
            atomic_fetch_add(&s->fence_violations, 1);
        atomic_store_explicit(&sl->last_fence, fence, RLX);
        long v = atomic_load_explicit(&sl->counter, RLX);
        if ((rnd(&seed) & 3) == 0)
            sched_yield(); /* widen the window for a lost update */
        atomic_store_explicit(&sl->counter, v + 1, RLX);
        occ = atomic_load_explicit(&sl->occupancy, RLX);
        if (occ != 1)
            atomic_fetch_add(&s->occ_violations, 1);
        long long t1 = fx_now_ns();
        int held = dlock_held(w->c, name);
        if (!held)
            atomic_fetch_add(&s->not_held, 1);
        atomic_fetch_sub_explicit(&sl->occupancy, 1, RLX);
        /* ---- end ---- */
        if (s->logs && s->nlog[w->idx] < s->log_cap) {
            crit *cr = &s->logs[w->idx][s->nlog[w->idx]++];
            cr->start = t0;
            cr->end = t1;
            cr->name = k;
            cr->held_at_end = held;
        }
        atomic_fetch_add(&s->ok, 1);
        if (phase == 2)
            atomic_fetch_add(&s->ok_after_restart, 1);
        rc = dlock_release(w->c, name);
        if (rc == DLOCK_ELOST)
            atomic_fetch_add(&s->rel_elost, 1);
        else if (rc == DLOCK_EREDIS)
            atomic_fetch_add(&s->rel_eredis, 1);
        else if (rc != DLOCK_OK)
            atomic_fetch_add(&s->bad_release, 1);
    }
    atomic_fetch_add(&s->finished, 1);
    return NULL;
}

static void storm_init(storm *s, const char *prefix, uint32_t lease, int tpc, int iters,
                       int nnames, int64_t wait_ms)
{
    memset(s, 0, sizeof *s);
    s->c[0] = open_client(prefix, lease);
    s->c[1] = open_client(prefix, lease);
    s->threads_per_client = tpc;
    s->iters = iters;
    s->nnames = nnames;
    s->wait_ms = wait_ms;
    s->names = calloc((size_t)nnames, sizeof *s->names);
    s->slots = calloc((size_t)nnames, sizeof *s->slots);
    assert_non_null(s->names);
    assert_non_null(s->slots);
    for (int i = 0; i < nnames; i++)
        snprintf(s->names[i], sizeof s->names[i], nnames == 1 ? "hot" : "res:%d", i);
}

static pthread_t *storm_start(storm *s, worker **ws_out)
{
    int n = 2 * s->threads_per_client;
    pthread_t *th = calloc((size_t)n, sizeof *th);
    worker *ws = calloc((size_t)n, sizeof *ws);
    assert_non_null(th);
    assert_non_null(ws);
    assert_int_equal(pthread_barrier_init(&s->start, NULL, (unsigned)n + 1), 0);
    for (int i = 0; i < n; i++) {
        ws[i].s = s;
        ws[i].idx = i;
        ws[i].c = s->c[i % 2];
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &ws[i]), 0);
    }
    pthread_barrier_wait(&s->start);
    *ws_out = ws;
    return th;
}

/* Waits for every worker at most bound_ms, then joins. A hang fails the
 * test (the threads are left behind; the process ends with the test run). */
static void storm_join(storm *s, pthread_t *th, worker *ws, long bound_ms)
{
    int n = 2 * s->threads_per_client;
    long long deadline = fx_now_ns() + bound_ms * 1000000LL;
    while (atomic_load(&s->finished) < n && fx_now_ns() < deadline)
        fx_sleep_ms(20);
    if (atomic_load(&s->finished) < n)
        fail_msg("storm hung: %d of %d threads still running after %ld ms",
                 n - atomic_load(&s->finished), n, bound_ms);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&s->start);
    free(th);
    free(ws);
}

static void storm_free(storm *s)
{
    for (int i = 0; i < 2; i++) {
        assert_int_equal(stats(s->c[i]).leases_held, 0);
        assert_int_equal(fx_entries_settled(s->c[i]), 0);
        dlock_client_close(s->c[i]);
    }
    free(s->names);
    free(s->slots);
}

/* A storm with a fixed number of acquisitions per thread and no faults. */
static void run_plain_storm(const char *prefix, int tpc, int iters, int nnames)
{
    storm s;
    /* wait_ms 60 s: with no faults every acquire must succeed; the bound
     * only turns a lost wake-up into a failure instead of a hang. */
    storm_init(&s, prefix, 0, tpc, iters, nnames, 60000);
    dlock_stats a0 = stats(s.c[0]), b0 = stats(s.c[1]);
    long long srv0 = fx_info_calls("127.0.0.1", fx_server.port, NULL);
    long long scr0 = fx_info_calls("127.0.0.1", fx_server.port, "evalsha") +
                     fx_info_calls("127.0.0.1", fx_server.port, "eval");
    double cpu0 = fx_info_cpu("127.0.0.1", fx_server.port);
    long long t0 = fx_now_ns();
    worker *ws;
    pthread_t *th = storm_start(&s, &ws);
    storm_join(&s, th, ws, 240000);
    long long el = MS(fx_now_ns() - t0);
    long long srv1 = fx_info_calls("127.0.0.1", fx_server.port, NULL);
    long long scr1 = fx_info_calls("127.0.0.1", fx_server.port, "evalsha") +
                     fx_info_calls("127.0.0.1", fx_server.port, "eval");
    double cpu1 = fx_info_cpu("127.0.0.1", fx_server.port);
    dlock_stats a1 = stats(s.c[0]), b1 = stats(s.c[1]);

    long ok = atomic_load(&s.ok);
    long total = (long)2 * tpc * iters;
    uint64_t cmds = (a1.redis_commands - a0.redis_commands) + (b1.redis_commands - b0.redis_commands);
    uint64_t trips = (a1.redis_round_trips - a0.redis_round_trips) +
                     (b1.redis_round_trips - b0.redis_round_trips);
    printf("# storm %s: 2 clients x %d threads, %d name(s): %ld acquisitions in %lld ms; "
           "Redis commands per acquisition: %.2f sent by the clients (%.2f round trips), "
           "%.2f scripts run and %.2f commands executed by the server (commandstats also "
           "counts the commands inside scripts), %.1f us of server CPU\n",
           prefix, tpc, nnames, ok, el, ok ? (double)cmds / ok : 0.0,
           ok ? (double)trips / ok : 0.0, ok ? (double)(scr1 - scr0) / ok : 0.0,
           ok ? (double)(srv1 - srv0) / ok : 0.0, ok ? (cpu1 - cpu0) * 1e6 / ok : 0.0);
    printf("# storm %s: client 0 got %" PRIu64 ", client 1 got %" PRIu64 " grants\n", prefix,
           a1.acquisitions - a0.acquisitions, b1.acquisitions - b0.acquisitions);

    assert_int_equal(atomic_load(&s.occ_violations), 0);
    assert_int_equal(atomic_load(&s.fence_violations), 0);
    assert_int_equal(atomic_load(&s.not_held), 0);
    assert_int_equal(atomic_load(&s.bad_release), 0);
    assert_int_equal(atomic_load(&s.rel_elost), 0);
    assert_int_equal(atomic_load(&s.rel_eredis), 0);
    assert_int_equal(atomic_load(&s.other_acq_err), 0);
    assert_int_equal(atomic_load(&s.eredis), 0);
    assert_int_equal(atomic_load(&s.timedout), 0);
    assert_int_equal(ok, total);
    long sum = 0;
    for (int i = 0; i < nnames; i++) {
        sum += atomic_load(&s.slots[i].counter);
        assert_int_equal(atomic_load(&s.slots[i].occupancy), 0);
    }
    assert_int_equal(sum, ok);
    assert_int_equal((a1.acquisitions - a0.acquisitions) + (b1.acquisitions - b0.acquisitions),
                     (uint64_t)ok);
    assert_int_equal(a1.leases_lost + b1.leases_lost, 0);
    storm_free(&s);
}

static void test_storm_one_name(void **state)
{
    (void)state;
    run_plain_storm("ts:one:", 32, 100, 1);
}

static void test_storm_many_names(void **state)
{
    (void)state;
    run_plain_storm("ts:many:", 16, 150, 100);
}

typedef struct hammer {
    dlock_client *c;
    atomic_int *stop;
    atomic_long grants, errors;
} hammer;

static void *hammer_main(void *arg)
{
    hammer *h = arg;
    while (!atomic_load(h->stop)) {
        if (dlock_acquire(h->c, "p", 30000, NULL) != DLOCK_OK) {
            atomic_fetch_add(&h->errors, 1);
            continue;
        }
        atomic_fetch_add(&h->grants, 1);
        if (dlock_release(h->c, "p") != DLOCK_OK)
            atomic_fetch_add(&h->errors, 1);
    }
    return NULL;
}

/* The pass limit keeps another process from starving: while 8 threads of
 * one client take the name back to back (local handoffs), a thread of
 * another client still gets it. Its wait of 10 s is 20x the fallback retry
 * interval (waiter_ttl_ms / 4) of a missed wake-up. */
static void test_storm_no_starvation(void **state)
{
    (void)state;
    dlock_client *c1 = open_client("ts:starve:", 0);
    dlock_client *c2 = open_client("ts:starve:", 0);
    atomic_int *stop = calloc(1, sizeof *stop); /* heap: threads may outlive a failure */
    hammer *h = calloc(1, sizeof *h);
    assert_non_null(stop);
    assert_non_null(h);
    h->c = c1;
    h->stop = stop;
    enum { T = 8 };
    pthread_t th[T];
    for (int i = 0; i < T; i++)
        assert_int_equal(pthread_create(&th[i], NULL, hammer_main, h), 0);
    /* Wait until the hammer runs (bounded). */
    long long deadline = fx_now_ns() + 10000 * 1000000LL;
    while (atomic_load(&h->grants) < 100 && fx_now_ns() < deadline)
        fx_sleep_ms(5);
    assert_true(atomic_load(&h->grants) >= 100);

    int fails = 0;
    long long worst = 0;
    for (int k = 0; k < 5; k++) {
        long long t0 = fx_now_ns();
        int rc = dlock_acquire(c2, "p", 10000, NULL);
        long long el = MS(fx_now_ns() - t0);
        if (el > worst)
            worst = el;
        if (rc != DLOCK_OK) {
            fails++;
            continue;
        }
        assert_int_equal(dlock_held(c2, "p"), 1);
        assert_int_equal(dlock_release(c2, "p"), DLOCK_OK);
    }
    long grants = atomic_load(&h->grants);
    atomic_store(stop, 1);
    for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
    printf("# no starvation: other client got the name %d of 5 times (slowest %lld ms) "
           "against %ld grants of the hammering client\n", 5 - fails, worst, grants);
    assert_int_equal(fails, 0);
    assert_int_equal(atomic_load(&h->errors), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(stats(i ? c2 : c1).leases_held, 0);
        assert_int_equal(fx_entries_settled(i ? c2 : c1), 0);
    }
    dlock_client_close(c1);
    dlock_client_close(c2);
    free(stop);
    free(h);
}

static int crit_by_start(const void *a, const void *b)
{
    const crit *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

/* Redis fails in the middle of a storm with a short lease: killed and
 * restarted empty (SIGKILL), or stopped and resumed (SIGSTOP: requests sent
 * meanwhile run late, so acquires have unknown outcomes). */
static void fault_storm(const char *prefix, int sig)
{
    enum { TPC = 8, NAMES = 4, CAP = 50000 };
    const uint32_t lease = 600;
    storm s;
    storm_init(&s, prefix, lease, TPC, 0, NAMES, 1000);
    s.log_cap = CAP;
    s.logs = calloc(2 * TPC, sizeof *s.logs);
    s.nlog = calloc(2 * TPC, sizeof *s.nlog);
    assert_non_null(s.logs);
    assert_non_null(s.nlog);
    for (int i = 0; i < 2 * TPC; i++) {
        s.logs[i] = calloc(CAP, sizeof(crit));
        assert_non_null(s.logs[i]);
    }

    long long t0 = fx_now_ns();
    worker *ws;
    pthread_t *th = storm_start(&s, &ws);
    fx_sleep_ms(1500);
    long ok_before = atomic_load(&s.ok);
    assert_int_equal(fx_redis_signal(&fx_server, sig), 0);
    atomic_store(&s.phase, 1);
    /* Down for 1.5 s, 2.5 leases: every old lease is invalid locally before
     * the server answers again (empty, or with those leases expired), so no
     * holder can still think it holds one. */
    fx_sleep_ms(1500);
    if (sig == SIGKILL)
        assert_int_equal(fx_redis_restart(&fx_server), 0);
    else
        assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    atomic_store(&s.phase, 2);
    /* Acquisitions succeed again: wait for 50 of them, at most 30 s (a
     * reconnect takes a few calls; 30 s is far more). */
    long long deadline = fx_now_ns() + 30000 * 1000000LL;
    while (atomic_load(&s.ok_after_restart) < 50 && fx_now_ns() < deadline)
        fx_sleep_ms(20);
    fx_sleep_ms(500);
    atomic_store(&s.stop, 1);
    /* Each thread finishes its current call: at most wait_ms 1 s plus the
     * connect and command timeouts; 30 s is ~10x that. */
    storm_join(&s, th, ws, 30000);
    long long el = MS(fx_now_ns() - t0);

    long ok = atomic_load(&s.ok);
    printf("# %s storm: %ld acquisitions (%ld before the fault, %ld after the recovery) in "
           "%lld ms; acquire errors: %ld EREDIS, %ld ETIMEDOUT, %ld other; releases: %ld ELOST, "
           "%ld EREDIS; %ld sections ended without a valid lease\n",
           prefix, ok, ok_before, atomic_load(&s.ok_after_restart), el, atomic_load(&s.eredis),
           atomic_load(&s.timedout), atomic_load(&s.other_acq_err), atomic_load(&s.rel_elost),
           atomic_load(&s.rel_eredis), atomic_load(&s.not_held));

    assert_true(ok_before > 0);
    assert_true(atomic_load(&s.ok_after_restart) >= 50);
    assert_int_equal(atomic_load(&s.other_acq_err), 0);
    assert_int_equal(atomic_load(&s.bad_release), 0);

    /* Exclusion while leases were valid: two critical sections of the same
     * name that both ended with dlock_held == 1 must not overlap in time
     * (dlock_held stays 0 once a lease is lost, so such a holder's lease was
     * valid during its whole section). Sort by start, sweep the latest end. */
    long checked = 0, overlaps = 0;
    crit *all = calloc((size_t)2 * TPC * CAP, sizeof *all);
    assert_non_null(all);
    for (int k = 0; k < NAMES; k++) {
        size_t n = 0;
        for (int a = 0; a < 2 * TPC; a++)
            for (int i = 0; i < s.nlog[a]; i++)
                if (s.logs[a][i].name == k && s.logs[a][i].held_at_end)
                    all[n++] = s.logs[a][i];
        qsort(all, n, sizeof *all, crit_by_start);
        long long max_end = 0;
        for (size_t i = 0; i < n; i++) {
            if (i > 0 && all[i].start < max_end)
                overlaps++;
            if (all[i].end > max_end)
                max_end = all[i].end;
        }
        checked += (long)n;
    }
    free(all);
    printf("# %s storm: %ld valid critical sections checked, %ld overlaps, %ld fence "
           "regressions seen\n", prefix, checked, overlaps, atomic_load(&s.fence_violations));
    assert_true(checked > 50);
    assert_int_equal(overlaps, 0);

    for (int i = 0; i < 2 * TPC; i++)
        free(s.logs[i]);
    free(s.logs);
    free(s.nlog);
    storm_free(&s); /* tables empty on both clients */
}

static void test_storm_redis_restart(void **state)
{
    (void)state;
    fault_storm("ts:restart:", SIGKILL);
}

static void test_storm_redis_stopped(void **state)
{
    (void)state;
    fault_storm("ts:stop:", SIGSTOP);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_storm_one_name, fx_ensure_server),
        cmocka_unit_test_teardown(test_storm_many_names, fx_ensure_server),
        cmocka_unit_test_teardown(test_storm_no_starvation, fx_ensure_server),
        cmocka_unit_test_teardown(test_storm_redis_restart, fx_ensure_server),
        cmocka_unit_test_teardown(test_storm_redis_stopped, fx_ensure_server),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
