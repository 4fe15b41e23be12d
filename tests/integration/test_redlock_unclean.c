/*
 * dlock_unclean in Redlock mode (dlock_config.redlock_nodes): how the hold
 * before a grant of the nodes ended, as a majority of the nodes tell it
 * (each node's acquire.lua replies with its own word, End; the quorum
 * acquire takes the word at least m of its votes report alike, else 0).
 * On 3 private redis-servers (tests/support/fixture.h): a release (0), a
 * holder thread that exited holding it and a client closed while holding
 * it (ABANDONED), a lease that expired unreleased while a majority of the
 * nodes was paused (EXPIRED), and words planted on one node and on two
 * (a minority's word is none; a majority's is told).
 *
 * Each test runs on a key prefix of its own, seeded fresh (as `dlockctl
 * seed-fresh` does). Timing: leases of 1000 ms, command and connect
 * timeouts of 100 ms; a client counts a node a lease after it first saw
 * it, so each client's first acquire waits up to 3 s. A node tells that a
 * grant expired for a lease time past its end: the expiry test resumes
 * the nodes 1.1 s after pausing them, when the grant (renewed at most a
 * third of a lease before the pause) has ended and is still told for at
 * least 0.5 s.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlock.h"
#include "fixture.h"
#include "common/common.h"
#include "common/error.h"
#include "conn/script.h"

#define NSRV 3
#define LEASE_MS 1000
#define FIRST_WAIT_MS 3000 /* a fresh client's first acquire: a lease + margin */
#define RL_TAG "rlu"

#include "redlock_helpers.h"


static dlock_client *open_client(void)
{
    dlock_config cfg;
    rl_config(&cfg, LEASE_MS, 100);
    return rl_open(&cfg);
}

static void must_acquire(dlock_client *c, const char *name, int64_t wait)
{
    int rc = dlock_acquire(c, name, wait, NULL);
    if (rc != DLOCK_OK)
        fail_msg("acquire of %s: %s: %s", name, dlock_strerror(rc), dlock_last_error());
}

/* Waits until c counts its nodes: an acquire and release of its own name. */
static void warm(dlock_client *c, const char *name)
{
    must_acquire(c, name, FIRST_WAIT_MS);
    assert_int_equal(dlock_release(c, name), DLOCK_OK);
}

/* Acquires name on c (waiting up to wait ms), returns what dlock_unclean
 * says of the hold, and releases it. */
static int unclean_of(dlock_client *c, const char *name, int64_t wait)
{
    must_acquire(c, name, wait);
    int u = dlock_unclean(c, name);
    assert_int_equal(dlock_release(c, name), DLOCK_OK);
    return u;
}

/* Leaves word `end` for the next grant of name on server i, as a release
 * that ended so would (the lease hash's field u, "<end> <until ms>":
 * lua/p2/LAYOUT.txt), good for a minute of the server's clock. */
static void plant_end(int i, const char *name, int end)
{
    char key[128];
    snprintf(key, sizeof key, "%s{%s}%s", prefix, name, dlock_script_key_suffix(DLOCK_KEY_LEASE));
    redisReply *r = fx_cmd_at(srv[i].port, "TIME");
    assert_non_null(r);
    long long ms = atoll(r->element[0]->str) * 1000 + atoll(r->element[1]->str) / 1000;
    freeReplyObject(r);
    char word[48];
    snprintf(word, sizeof word, "%d %lld", end, ms + 60000);
    r = fx_cmd_at(srv[i].port, "HSET %s u %s", key, word);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    freeReplyObject(r);
}

static int restore(void **state)
{
    (void)state;
    for (int i = 0; i < NSRV; i++)
        if (srv[i].pid > 0)
            fx_redis_signal(&srv[i], SIGCONT);
    return 0;
}

/* ------------------------------------------------------------------ tests */

static dlock_client *thread_client;

static void *hold_and_exit(void *arg)
{
    must_acquire(thread_client, arg, 0);
    return NULL; /* exits holding it: the library releases it as abandoned */
}

/* A release leaves no word (0); a holder thread that exited holding the
 * name, and a client closed while holding it, leave ABANDONED, which the
 * next holder of another client is told once. */
static void test_released_and_abandoned(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client(), *b = open_client();
    warm(a, "wa");
    warm(b, "wb");
    must_acquire(a, "r", 0);
    assert_int_equal(dlock_release(a, "r"), DLOCK_OK);
    assert_int_equal(unclean_of(b, "r", 0), 0);

    thread_client = a;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, hold_and_exit, "t"), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(unclean_of(b, "t", 2000), DLOCK_UNCLEAN_ABANDONED);
    assert_int_equal(unclean_of(b, "t", 0), 0); /* (told once) */

    must_acquire(a, "c", 0);
    dlock_client_close(a);
    assert_int_equal(unclean_of(b, "c", 2000), DLOCK_UNCLEAN_ABANDONED);
    dlock_client_close(b);
}

/* A lease that expired unreleased: its holder's renewals stop reaching a
 * majority (nodes 1 and 2 paused past the lease); once they resume, the
 * next holder is told EXPIRED by every node. */
static void test_expired(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client(), *b = open_client();
    warm(a, "wa");
    warm(b, "wb");
    must_acquire(a, "e", 0);
    assert_int_equal(fx_redis_signal(&srv[1], SIGSTOP), 0);
    assert_int_equal(fx_redis_signal(&srv[2], SIGSTOP), 0);
    fx_sleep_ms(LEASE_MS + 100);
    assert_int_equal(fx_redis_signal(&srv[1], SIGCONT), 0);
    assert_int_equal(fx_redis_signal(&srv[2], SIGCONT), 0);
    assert_int_equal(dlock_held(a, "e"), 0); /* (lost: no majority renewed it) */
    assert_int_equal(unclean_of(b, "e", 300), DLOCK_UNCLEAN_EXPIRED);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* Each node's word counts only as part of a majority's: one node telling
 * EXPIRED (it missed the release, say) while the others tell nothing
 * makes 0; two of three telling it make EXPIRED; two telling FORCED make
 * FORCED; two telling different words make 0. */
static void test_majority_word(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client();
    warm(a, "wa");
    must_acquire(a, "m", 0);
    assert_int_equal(dlock_release(a, "m"), DLOCK_OK);
    plant_end(2, "m", DLOCK_UNCLEAN_EXPIRED);
    assert_int_equal(unclean_of(a, "m", 0), 0);
    plant_end(0, "m", DLOCK_UNCLEAN_EXPIRED);
    plant_end(2, "m", DLOCK_UNCLEAN_EXPIRED);
    assert_int_equal(unclean_of(a, "m", 0), DLOCK_UNCLEAN_EXPIRED);
    plant_end(1, "m", DLOCK_UNCLEAN_FORCED);
    plant_end(2, "m", DLOCK_UNCLEAN_FORCED);
    assert_int_equal(unclean_of(a, "m", 0), DLOCK_UNCLEAN_FORCED);
    plant_end(0, "m", DLOCK_UNCLEAN_FORCED);
    plant_end(1, "m", DLOCK_UNCLEAN_EXPIRED);
    assert_int_equal(unclean_of(a, "m", 0), 0);
    dlock_client_close(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_released_and_abandoned, restore),
        cmocka_unit_test_teardown(test_expired, restore),
        cmocka_unit_test_teardown(test_majority_word, restore),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
