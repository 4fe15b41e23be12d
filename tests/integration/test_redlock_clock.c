/*
 * Redlock mode (dlock_config.redlock_nodes; docs/design.md, "Redlock")
 * with one node's wall clock stepped, on 3 private redis-servers: the
 * first runs under libfaketime and the project's clock shim
 * (tests/support/clockshim.c; fx_fake_clock in tests/support/fixture.h),
 * the other two on real time. Two clients, a thread each, take turns on
 * one name (a 20 ms hold, a 20 ms pause) for 3 s at real time, then while
 * the node's clock steps back by three leases and forward by as much to
 * real time, four times each 500 ms apart (each step forward while a
 * holder is inside: it ends that holder's grant on the node at once), then
 * 3 s more at real time.
 *
 * What it checks: in every critical section, that no other thread is
 * inside (an atomic count), and that the token is strictly greater than
 * the last one handed out (read and written under the lock, so in the
 * order of the grants): the token rule's order holds whatever one node's
 * clock does, and mutual exclusion holds while the two other nodes keep
 * real time (a step forward ends only the grants of the stepped node, and
 * a majority needs one of the others). Also that no acquire or release
 * failed other than by timing out (a release finds its lease lost when no
 * majority held it: a grant that should not have been made), that the
 * clients took turns in each of the three phases, and that the node's TIME
 * did step each time. Acquires that time out (a refused client polls, no
 * wake-ups in this mode) are counted and printed, not failed.
 *
 * Timing: leases of 500 ms, timeouts of 100 ms; acquires wait at most 3 s
 * (the clients' first sight of the nodes costs a lease, then a holder's
 * lease time left, plus a margin for a loaded machine).
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dlock.h"
#include "fixture.h"
#include "common/common.h"

#define NSRV 3
#define LEASE_MS 500
#define STEP_MS (3 * LEASE_MS)
#define PHASE_MS 3000
#define STEPS 4
#define STEP_EVERY_MS 500
#define WAIT_MS 3000
#define HOLD_MS 20  /* long enough that a step forward finds a holder inside */
#define THINK_MS 20 /* the name free as long: the other client's poller gets it */
#define PREFIX "rlclk:"
#define NAME "hot"

static fx_redis srv[NSRV];
static fx_fake_clock fake;
static char nodes[NSRV * 24];

/* Shared by the threads: written under the lock under test, except the
 * counts (atomic). */
static int inside, violations, regressions, failures, timeouts, stop;
static uint64_t last_token;
static long grants, crossings; /* crossings: grants whose last holder was the other client */
static int last_client;        /* 1 + the client of the last grant (0: none) */

typedef struct warg {
    dlock_client *c;
    int client;
} warg;

/* Node 0's TIME less this host's real time, in ms. */
static long long node0_offset_ms(void)
{
    redisReply *r = fx_cmd_at(srv[0].port, "TIME");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    long long us = atoll(r->element[0]->str) * 1000000LL + atoll(r->element[1]->str);
    freeReplyObject(r);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (us - ((long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000)) / 1000;
}

static int setup(void **state)
{
    (void)state;
    if (fx_fake_clock_init(&fake, DLOCK_CLOCKSHIM_PATH, DLOCK_FAKETIME_PATH) != 0)
        return -1;
    size_t at = 0;
    for (int i = 0; i < NSRV; i++) {
        fx_redis_opts o = {0};
        if (i == 0)
            o.env = fake.env;
        if (fx_redis_start_opts(&srv[i], &o) != 0)
            return -1;
        at += (size_t)snprintf(nodes + at, sizeof nodes - at, "%s127.0.0.1:%d", i ? "," : "",
                               srv[i].port);
    }
    /* a fresh deployment, seeded as `dlockctl seed-fresh` does */
    return fx_redlock_seed_fresh(nodes, PREFIX, LEASE_MS, 300, 2000);
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < NSRV; i++)
        fx_redis_stop(&srv[i]);
    fx_fake_clock_remove(&fake);
    return 0;
}

static void *worker(void *arg)
{
    dlock_client *c = ((warg *)arg)->c;
    int me = ((warg *)arg)->client + 1;
    while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE)) {
        uint64_t t = 0;
        int rc = dlock_acquire(c, NAME, WAIT_MS, &t);
        if (rc == DLOCK_ETIMEDOUT) {
            __atomic_add_fetch(&timeouts, 1, __ATOMIC_RELAXED);
            continue;
        }
        if (rc != DLOCK_OK) {
            print_error("acquire: %s: %s\n", dlock_strerror(rc), dlock_last_error());
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
            continue;
        }
        if (__atomic_add_fetch(&inside, 1, __ATOMIC_SEQ_CST) != 1)
            __atomic_add_fetch(&violations, 1, __ATOMIC_RELAXED);
        uint64_t last = __atomic_load_n(&last_token, __ATOMIC_ACQUIRE);
        if (t <= last) {
            print_error("token %" PRIu64 " after %" PRIu64 "\n", t, last);
            __atomic_add_fetch(&regressions, 1, __ATOMIC_RELAXED);
        } else {
            __atomic_store_n(&last_token, t, __ATOMIC_RELEASE);
        }
        int lc = __atomic_load_n(&last_client, __ATOMIC_ACQUIRE);
        if (lc && lc != me)
            __atomic_add_fetch(&crossings, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&last_client, me, __ATOMIC_RELEASE);
        struct timespec hold = {0, HOLD_MS * 1000000L};
        nanosleep(&hold, NULL);
        __atomic_sub_fetch(&inside, 1, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&grants, 1, __ATOMIC_RELAXED);
        if ((rc = dlock_release(c, NAME)) != DLOCK_OK) {
            print_error("release: %s: %s\n", dlock_strerror(rc), dlock_last_error());
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
        }
        /* a pause, so that the name goes back to the nodes and the other
         * client's poller finds it free now and then */
        struct timespec think = {0, THINK_MS * 1000000L};
        nanosleep(&think, NULL);
    }
    return NULL;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Runs a phase of ms: the grants in it, and the crossings. */
static long phase(long ms, long *cross)
{
    long g0 = __atomic_load_n(&grants, __ATOMIC_RELAXED);
    long x0 = __atomic_load_n(&crossings, __ATOMIC_RELAXED);
    sleep_ms(ms);
    *cross = __atomic_load_n(&crossings, __ATOMIC_RELAXED) - x0;
    return __atomic_load_n(&grants, __ATOMIC_RELAXED) - g0;
}

/* Node 0's clock back by three leases, and forward by as much to real
 * time, STEPS times each, STEP_EVERY_MS apart, while two clients take
 * turns on one name; a step forward is taken while a holder is inside (it
 * ends that holder's grant on node 0 at once). Before and after, the
 * clock at real time. */
static void test_one_node_stepped_back_and_forward(void **state)
{
    (void)state;
    dlock_client *c[2];
    pthread_t th[2];
    warg wa[2];
    for (int i = 0; i < 2; i++) {
        dlock_config cfg;
        dlock_config_init(&cfg);
        cfg.redlock_nodes = nodes;
        cfg.key_prefix = PREFIX;
        cfg.lease_ms = LEASE_MS;
        cfg.connect_timeout_ms = 100;
        cfg.command_timeout_ms = 100;
        assert_int_equal(dlock_client_open(&cfg, &c[i]), DLOCK_OK);
    }
    for (int i = 0; i < 2; i++) {
        wa[i] = (warg){c[i], i};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &wa[i]), 0);
    }
    /* the clients count the nodes a lease after they first saw them */
    sleep_ms(1000);
    long xr, xs, xa;
    long real = phase(PHASE_MS, &xr);
    long g0 = __atomic_load_n(&grants, __ATOMIC_RELAXED);
    long x0 = __atomic_load_n(&crossings, __ATOMIC_RELAXED);
    long long back_off[STEPS], fwd_off[STEPS];
    for (int k = 0; k < STEPS; k++) {
        assert_int_equal(fx_fake_clock_set(&fake, -STEP_MS), 0);
        back_off[k] = node0_offset_ms();
        sleep_ms(STEP_EVERY_MS);
        for (int w = 0; w < 100 && !__atomic_load_n(&inside, __ATOMIC_SEQ_CST); w++)
            sleep_ms(1);
        assert_int_equal(fx_fake_clock_set(&fake, 0), 0);
        fwd_off[k] = node0_offset_ms();
        sleep_ms(STEP_EVERY_MS);
    }
    long stepping = __atomic_load_n(&grants, __ATOMIC_RELAXED) - g0;
    xs = __atomic_load_n(&crossings, __ATOMIC_RELAXED) - x0;
    long after = phase(PHASE_MS, &xa);
    __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        dlock_client_close(c[i]);
    print_message("grants (from the other client): %ld (%ld) at real time, %ld (%ld) while node"
                  " 0 stepped back and forward %d times each, %ld (%ld) after; %d acquires"
                  " timed out; last token %" PRIu64 "\n",
                  real, xr, stepping, xs, STEPS, after, xa, timeouts, last_token);
    /* the node's clock did step */
    for (int k = 0; k < STEPS; k++) {
        assert_true(back_off[k] < -STEP_MS + 200 && back_off[k] > -STEP_MS - 200);
        assert_true(fwd_off[k] > -200 && fwd_off[k] < 200);
    }
    assert_int_equal(violations, 0);
    assert_int_equal(regressions, 0);
    assert_int_equal(failures, 0);
    /* the two clients took turns in every phase */
    assert_true(xr > 0);
    assert_true(xs > 0);
    assert_true(xa > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_node_stepped_back_and_forward),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
