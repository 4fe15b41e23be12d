/*
 * The Redis server's clock stepping back, on a real redis-server whose wall
 * clock the test steps (tests/support/clockshim.c with libfaketime; only the server
 * sees the fake clock). docs/guide.md, Semantics, "Fencing tokens": a step back by
 * up to one lease time (added up over steps until the clock has caught up)
 * does not make tokens go back, whether the name was just released or has
 * been idle for a while (the name's fence and expired lease key); nor does a
 * step back of any size on a name idle for longer than its fences live,
 * after a release or after a grant that expired unreleased, nor after a
 * restart of the server that kept its data (the slot's mark, which never
 * expires). Each test checks one of those sentences. (The one window the
 * mark leaves open, a step back to within the local handoffs of a grant that
 * expired unreleased, is left to sim: a test cannot time it.)
 *
 * Every test starts with the server's clock at real time and puts it back
 * there at the end (a step forward, which makes no token go back). Leases
 * are 1000 ms; the sleeps are what the sentences are about (idle times
 * against the lease), not bounds on the library's speed. The server writes
 * every command to its append-only file before it answers (appendfsync
 * always), so that a restart keeps the data.
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
#include "common/slot.h"
#include "conn/script.h"

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
    static const char *const aof[] = {"--appendonly", "yes", "--appendfsync", "always", NULL};
    fx_redis_opts o = {0};
    o.env = fake.env;
    o.args = aof;
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
    /* The server fsyncs every write under a clock shim: on a loaded 2-core
     * machine under TSan a reply can take longer than the fixture's 1 s.
     * The tests judge tokens, not timing, so the bound is generous. */
    cfg.command_timeout_ms = 5000;
    dlock_client *c = NULL;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    return c;
}

/* One acquire and release of name: its token. The server fsyncs every
 * write: on a loaded machine (two busy loops beside a sanitizer build) an
 * answer has come after the lease, which the library refuses (DLOCK_EREDIS,
 * "answered ... after the lease could have expired") and gives back. The
 * tests judge tokens, not timing: such an acquire is made again, up to 3
 * times, and said so. */
static uint64_t take(dlock_client *c, const char *name)
{
    uint64_t t = 0;
    int rc = dlock_acquire(c, name, 5000, &t);
    for (int again = 0; again < 3 && rc == DLOCK_EREDIS &&
                        strstr(dlock_last_error(), "after the lease could have expired");
         again++) {
        printf("# acquire %s answered late (%s): made again\n", name, dlock_last_error());
        rc = dlock_acquire(c, name, 5000, &t);
    }
    if (rc != DLOCK_OK)
        fail_msg("acquire %s: %s (%s)", name, dlock_strerror(rc), dlock_last_error());
    rc = dlock_release(c, name);
    if (rc != DLOCK_OK)
        fail_msg("release %s: %s (%s)", name, dlock_strerror(rc), dlock_last_error());
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

/* Whether any of name's own keys (lease, fence) is still there. */
static int name_keys(const char *name)
{
    redisReply *r = fx_cmd_at(srv.port, "EXISTS " PREFIX "{%s} " PREFIX "{%s}:fence", name, name);
    assert_non_null(r);
    long long n = r->integer;
    freeReplyObject(r);
    return (int)n;
}

/* Sleeps until name's own keys are gone (its fence lives a lease time, an
 * expired lease key two): at most 10 leases, generous for a loaded machine. */
static void wait_keys_gone(const char *name)
{
    for (int i = 0; i < 100 && name_keys(name) > 0; i++)
        fx_sleep_ms(LEASE_MS / 10);
    assert_int_equal(name_keys(name), 0);
}

/* Beyond the fences: steps back of six lease times, a minute and a day on a
 * name idle for longer than its fence lives (its keys are gone): the next
 * token is still above the last, kept so by the mark of the name's slot
 * (before the mark, the six leases alone gave a token below). */
static void test_step_back_beyond_the_fences(void **state)
{
    (void)state;
    dlock_client *c = client();
    const long step[] = {6 * LEASE_MS, 60 * 1000, 86400L * 1000};
    char name[32];
    for (size_t i = 0; i < sizeof step / sizeof step[0]; i++) {
        snprintf(name, sizeof name, "far%zu", i);
        uint64_t t1 = take(c, name);
        wait_keys_gone(name);
        clock_offset(-step[i]);
        uint64_t t2 = take(c, name);
        uint64_t t3 = take(c, name);
        clock_offset(0);
        if (t2 <= t1 || t3 <= t2)
            fail_msg("step back %ld ms after the fence went: tokens %llu, %llu, %llu", step[i],
                     (unsigned long long)t1, (unsigned long long)t2, (unsigned long long)t3);
    }
    dlock_client_close(c);
}

/* A grant whose holder died: made by the acquire script as the library
 * would, never released nor renewed. Returns its token. */
static uint64_t grant_abandoned(const char *name)
{
    char k[DLOCK_SCRIPT_KEYS][128];
    static const char *const suffix[6] = {"", ":fence", ":q", ":qd", ":turn",
                                          ":c:00000000000000000000000000000001"};
    for (int i = 0; i < 6; i++)
        snprintf(k[i], sizeof k[i], PREFIX "{%s}%s", name, suffix[i]);
    snprintf(k[6], sizeof k[6], PREFIX "%s{%s}", dlock_script_key_suffix(DLOCK_KEY_HW),
             dlock_slot_tag(dlock_cluster_slot(k[0], strlen(k[0]))));
    char lease[16];
    snprintf(lease, sizeof lease, "%d", LEASE_MS);
    const char *argv[] = {"EVAL", dlock_script_body(DLOCK_SCRIPT_ACQUIRE), "7",
                          k[0], k[1], k[2], k[3], k[4], k[5], k[6],
                          "00000000000000000000000000000001", lease, "1", "1000", "2000", "0",
                          "20000", "gone", "0", "0"};
    redisContext *rc = fx_connect("127.0.0.1", srv.port);
    assert_non_null(rc);
    redisReply *r = redisCommandArgv(rc, (int)(sizeof argv / sizeof argv[0]), argv, NULL);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->element[0]->integer, 1);
    uint64_t t = (uint64_t)r->element[1]->integer;
    freeReplyObject(r);
    redisFree(rc);
    return t;
}

/* The same after a grant that expired unreleased (its holder died holding
 * it, with a pass limit of 1000): a step back of a minute once its keys
 * are gone gives a token above it, and above its pass limit. */
static void test_step_back_after_an_abandoned_grant(void **state)
{
    (void)state;
    assert_int_equal(DLOCK_SCRIPT_KEYS, 7);
    uint64_t t1 = grant_abandoned("dead");
    wait_keys_gone("dead");
    dlock_client *c = client();
    clock_offset(-60 * 1000);
    uint64_t t2 = take(c, "dead");
    clock_offset(0);
    if (t2 <= t1 + 1000)
        fail_msg("step back of a minute after an abandoned grant %llu: token %llu",
                 (unsigned long long)t1, (unsigned long long)t2);
    dlock_client_close(c);
}

/* A restart that kept the data (the append-only file): the mark survives
 * it, so a step back of a minute after the restart, on a name whose keys
 * had gone before it, still gives a token above the last. */
static void test_step_back_after_a_restart(void **state)
{
    (void)state;
    dlock_client *c = client();
    uint64_t t1 = take(c, "kept");
    dlock_client_close(c);
    wait_keys_gone("kept");
    assert_int_equal(fx_redis_restart(&srv), 0);
    c = client();
    clock_offset(-60 * 1000);
    uint64_t t2 = take(c, "kept");
    clock_offset(0);
    if (t2 <= t1)
        fail_msg("step back of a minute after a restart: tokens %llu, %llu",
                 (unsigned long long)t1, (unsigned long long)t2);
    dlock_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_clock_steps),
        cmocka_unit_test(test_step_back_one_lease),
        cmocka_unit_test(test_step_back_beyond_the_fences),
        cmocka_unit_test(test_step_back_after_an_abandoned_grant),
        cmocka_unit_test(test_step_back_after_a_restart),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
