/*
 * The Redis server's clock stepping back, on a real redis-server whose wall
 * clock the test steps (tests/support/clockshim.c with libfaketime; only the server
 * sees the fake clock). docs/guide.md, Semantics, "Fencing tokens": a step back by
 * up to one lease time (added up over steps until the clock has caught up)
 * does not make tokens go back, whether the name was just released or has
 * been idle for a while; a larger step can, on a name idle for longer than
 * its fences live. Each test checks one of those sentences. (A grant that
 * expired unreleased is left to sim: on a real server its holder's tokens,
 * never ahead of the server clock, are below the stepped-back clock once
 * the grant has expired, unless the holder handed the grant to its threads
 * in the last moments before it died, which a test cannot time.)
 *
 * Every test starts with the server's clock at real time and puts it back
 * there at the end (a step forward, which makes no token go back). Leases
 * are 1000 ms; the sleeps are what the sentences are about (idle times
 * against the lease), not bounds on the library's speed.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fixture.h"

#define LEASE_MS 1000
#define PREFIX "tclk:"

static fx_redis srv;
static fx_fake_clock fake;

/* The server's clock: real time + offset_ms. */
static void clock_offset(long offset_ms)
{
    assert_int_equal(fx_fake_clock_set(&fake, offset_ms), 0);
}

/* The server's TIME less this host's real time, in ms. */
static long long server_offset_ms(void)
{
    redisReply *r = fx_cmd_at(srv.port, "TIME");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    long long us = atoll(r->element[0]->str) * 1000000LL + atoll(r->element[1]->str);
    freeReplyObject(r);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long real = (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
    return (us - real) / 1000;
}

static int setup(void **state)
{
    (void)state;
    if (fx_fake_clock_init(&fake, DLOCK_CLOCKSHIM_PATH, DLOCK_FAKETIME_PATH) != 0)
        return -1;
    fx_redis_opts o = {0};
    o.env = fake.env;
    return fx_redis_start_opts(&srv, &o) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    fx_redis_stop(&srv);
    fx_fake_clock_remove(&fake);
    return 0;
}

static dlock_client *client(void)
{
    dlock_config cfg;
    fx_config(&cfg, &srv);
    cfg.key_prefix = PREFIX;
    cfg.lease_ms = LEASE_MS;
    dlock_client *c = NULL;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    return c;
}

/* One acquire and release of name: its token. */
static uint64_t take(dlock_client *c, const char *name)
{
    uint64_t t = 0;
    assert_int_equal(dlock_acquire(c, name, 5000, &t), DLOCK_OK);
    assert_int_equal(dlock_release(c, name), DLOCK_OK);
    return t;
}

/* The shim works: the server sees each step at once, nothing else does. */
static void test_server_clock_steps(void **state)
{
    (void)state;
    clock_offset(-1500);
    long long o = server_offset_ms();
    assert_true(o > -1700 && o < -1300);
    clock_offset(2000);
    o = server_offset_ms();
    assert_true(o > 1800 && o < 2200);
    clock_offset(0);
    o = server_offset_ms();
    assert_true(o > -200 && o < 200);
}

/* A step back of one lease time, right after a release and after idle
 * times of 0.3, 0.6 and 0.9 lease, and by two steps of half a lease each:
 * the next token is above the last. Each idle time is below the step, so
 * the stepped-back clock reads below the last token: only the name's fence
 * (or its expired lease key) can keep the next token above it. */
static void test_step_back_one_lease(void **state)
{
    (void)state;
    dlock_client *c = client();
    const long idle[] = {0, LEASE_MS * 3 / 10, LEASE_MS * 6 / 10, LEASE_MS * 9 / 10};
    char name[32];
    for (size_t i = 0; i < sizeof idle / sizeof idle[0]; i++) {
        snprintf(name, sizeof name, "back%zu", i);
        uint64_t t1 = take(c, name);
        fx_sleep_ms(idle[i]);
        clock_offset(-LEASE_MS);
        uint64_t t2 = take(c, name);
        uint64_t t3 = take(c, name);
        clock_offset(0);
        if (t2 <= t1 || t3 <= t2)
            fail_msg("idle %ld ms, step back %d ms: tokens %llu, %llu, %llu", idle[i], LEASE_MS,
                     (unsigned long long)t1, (unsigned long long)t2, (unsigned long long)t3);
    }
    /* Two steps of half a lease, added up before the clock caught up. */
    uint64_t t1 = take(c, "twice");
    clock_offset(-LEASE_MS / 2);
    uint64_t t2 = take(c, "twice");
    clock_offset(-LEASE_MS);
    uint64_t t3 = take(c, "twice");
    fx_sleep_ms(LEASE_MS / 2);
    uint64_t t4 = take(c, "twice");
    clock_offset(0);
    assert_true(t2 > t1 && t3 > t2 && t4 > t3);
    dlock_client_close(c);
}

/* Beyond the bound: a step back of six lease times on a name idle for
 * longer than its fences live (2.5 leases) gives a token below the last
 * (the docs say so; this shows the bound is not loose). The margin,
 * 3.5 s, is for the idle sleep overrunning on a loaded machine. */
static void test_step_back_beyond_bound(void **state)
{
    (void)state;
    dlock_client *c = client();
    uint64_t t1 = take(c, "far");
    fx_sleep_ms(2 * LEASE_MS + 500); /* fence and lease key are gone */
    redisReply *r = fx_cmd_at(srv.port, "EXISTS " PREFIX "{far} " PREFIX "{far}:fence");
    assert_non_null(r);
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
    clock_offset(-6 * LEASE_MS);
    uint64_t t2 = take(c, "far");
    clock_offset(0);
    if (t2 >= t1)
        fail_msg("expected a token below %llu after a step back of 6 leases, got %llu",
                 (unsigned long long)t1, (unsigned long long)t2);
    dlock_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_clock_steps),
        cmocka_unit_test(test_step_back_one_lease),
        cmocka_unit_test(test_step_back_beyond_bound),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
