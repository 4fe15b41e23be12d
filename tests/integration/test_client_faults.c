/*
 * Integration tests of the public client API against a private redis-server
 * (tests/support/fixture.h) that fails: Redis unreachable, stopped (SIGSTOP) or
 * restarted empty, a local waiter's deadline while its poller is stuck in
 * Redis, acquires with an unknown outcome, release with Redis down, and the
 * server closing idle connections. Helpers shared with the other
 * test_client*.c files are in client_helpers.h.
 *
 * One server per executable (group setup/teardown). Tests that stop or kill
 * it restore it in their per-test teardown even when an assertion fails.
 *
 * Timing: this runs on small, noisy machines and under sanitizers, so every
 * time bound below is an upper bound several times larger than the duration
 * it guards, and says why.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <netinet/in.h>
#include <arpa/inet.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dlock.h"
#include "fixture.h"
#include "client_helpers.h"

/* ---------------------------------------------------------------- helpers */

/* A loopback port where nothing listens (bound, read, closed). */
static int dead_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* ------------------------------------------------------------------ tests */

static void test_redis_unreachable(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.redis_port = dead_port();
    cfg.key_prefix = "tc:down:";
    dlock_client *c = NULL;
    /* Not an error at open (a server may start before its Redis). */
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_non_null(c);

    /* Connection refused: fails fast. Bound: connect + command timeouts
     * (1.5 s) times ~6, for a loaded machine; a refused connect takes ~0. */
    const long long bound_ms = 10000;
    int64_t waits[] = { 0, 2000, -1 };
    for (size_t i = 0; i < 3; i++) {
        long long t0 = fx_now_ns();
        int rc = dlock_acquire(c, "x", waits[i], NULL);
        long long el = MS(fx_now_ns() - t0);
        if (rc != DLOCK_EREDIS)
            fail_msg("wait %" PRId64 ": acquire returned %s, expected DLOCK_EREDIS", waits[i],
                     dlock_err_name(rc));
        /* the message says which failure it is, and where */
        if (strncmp(dlock_last_error(), "unreachable: ", 13) != 0 ||
            !strstr(dlock_last_error(), "Connection refused"))
            fail_msg("wait %" PRId64 ": the message: %s", waits[i], dlock_last_error());
        if (el >= bound_ms)
            fail_msg("wait %" PRId64 ": EREDIS after %lld ms", waits[i], el);
        assert_int_equal(dlock_held(c, "x"), 0);
    }
    assert_int_equal(dlock_release(c, "x"), DLOCK_ENOTHELD);
    assert_table_empty(c);
    dlock_client_close(c);
}

static void test_redis_stopped(void **state)
{
    (void)state;
    const char *prefix = "tc:stop:";
    dlock_client *c = open_client(prefix, 20000);
    uint64_t f0 = 0, f = 0;
    assert_int_equal(dlock_acquire(c, "s", 0, &f0), DLOCK_OK);
    assert_int_equal(dlock_release(c, "s"), DLOCK_OK);

    assert_int_equal(fx_redis_signal(&fx_server, SIGSTOP), 0);
    /* Connect 500 ms + command 1000 ms; 10 s is ~6x that, for a loaded
     * machine. A hang would run into it. */
    const long long bound_ms = 10000;
    long long t0 = fx_now_ns();
    int rc = dlock_acquire(c, "s", 0, &f);
    long long el = MS(fx_now_ns() - t0);
    char msg[256];
    snprintf(msg, sizeof msg, "%s", dlock_last_error());
    int rc2 = dlock_acquire(c, "s2", -1, &f);
    long long el2 = MS(fx_now_ns() - t0) - el;
    assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    if (rc != DLOCK_EREDIS || rc2 != DLOCK_EREDIS)
        fail_msg("acquire with Redis stopped: %s and %s, expected DLOCK_EREDIS", dlock_err_name(rc),
                 dlock_err_name(rc2));
    if (strncmp(msg, "timed out: ", 11) != 0) /* the kind of failure comes first */
        fail_msg("the message of an acquire on a stopped server: %s", msg);
    if (el >= bound_ms || el2 >= bound_ms)
        fail_msg("EREDIS after %lld / %lld ms", el, el2);
    assert_int_equal(dlock_held(c, "s"), 0);

    /* Works again after SIGCONT. The first call may still find the stale
     * connection dead; it must recover within a few calls (10 s bound). */
    long long deadline = fx_now_ns() + 10000 * 1000000LL;
    int tries = 0;
    for (;;) {
        rc = dlock_acquire(c, "s", 5000, &f);
        tries++;
        if (rc == DLOCK_OK || fx_now_ns() > deadline)
            break;
        assert_int_equal(rc, DLOCK_EREDIS);
        fx_sleep_ms(100);
    }
    assert_int_equal(rc, DLOCK_OK);
    assert_true(f > f0);
    assert_int_equal(dlock_held(c, "s"), 1);
    assert_int_equal(dlock_release(c, "s"), DLOCK_OK);
    char key[64];
    lease_key(key, sizeof key, prefix, "s");
    assert_int_equal(lease_live(key), 0);
    assert_table_empty(c);
    dlock_client_close(c);
}

/* A local waiter honours its deadline (client.h, I8) while the
 * poller of its client is stuck in Redis (stopped server, 5 s command
 * timeout). */
static void test_waiter_deadline_while_poller_stuck(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tc:stuck:";
    cfg.command_timeout_ms = 5000;
    dlock_client *c = NULL;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "warm", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(c, "warm"), DLOCK_OK);

    assert_int_equal(fx_redis_signal(&fx_server, SIGSTOP), 0);
    op poller, waiter;
    op_start(&poller, c, "x", 20000, 1);
    fx_sleep_ms(200); /* the poller is in Redis now (not required for the check) */
    op_start(&waiter, c, "x", 300, 1);
    /* The waiter's 300 ms wait, with 10x slack: still well under the
     * poller's 5 s command timeout. */
    op_join(&waiter, 3000);
    assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    op_join(&poller, 30000);
    assert_int_equal(waiter.rc, DLOCK_ETIMEDOUT);
    assert_true(MS(waiter.elapsed_ns) >= 300);
    assert_true(MS(waiter.elapsed_ns) < 3000);
    /* The poller's call was answered late or timed out. */
    assert_true(poller.rc == DLOCK_OK || poller.rc == DLOCK_EREDIS);
    if (poller.rc == DLOCK_OK)
        assert_int_equal(poller.rel_rc, DLOCK_OK);
    assert_table_empty(c);
    dlock_client_close(c);
}

/* An acquire whose reply never came (server stopped) has an unknown outcome:
 * the script may run when the server resumes. The lease must then be
 * released or confirmed, not left to expire after lease_ms. */
static void test_unknown_outcome_leaves_no_lease(void **state)
{
    (void)state;
    const char *prefix = "tc:orphan:";
    const uint32_t lease = 60000;
    dlock_client *c = open_client(prefix, lease);
    dlock_client *c2 = open_client(prefix, lease);
    /* Warm both clients' connections up. */
    assert_int_equal(dlock_acquire(c, "o", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(c, "o"), DLOCK_OK);
    assert_int_equal(dlock_acquire(c2, "o2", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(c2, "o2"), DLOCK_OK);

    assert_int_equal(fx_redis_signal(&fx_server, SIGSTOP), 0);
    int rc = dlock_acquire(c, "o", 0, NULL);
    assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    assert_int_equal(rc, DLOCK_EREDIS);
    assert_int_equal(dlock_held(c, "o"), 0);

    /* Another client gets the name well before the 60 s lease could expire:
     * 15 s is far more than cleanup needs, and 4x less than the lease. */
    long long t0 = fx_now_ns();
    uint64_t f = 0;
    rc = dlock_acquire(c2, "o", 15000, &f);
    long long el = MS(fx_now_ns() - t0);
    if (rc != DLOCK_OK)
        fail_msg("a lease left behind: second client got %s after %lld ms (lease %u ms)",
                 dlock_err_name(rc), el, lease);
    assert_int_equal(dlock_release(c2, "o"), DLOCK_OK);
    assert_table_empty(c);
    assert_table_empty(c2);
    dlock_client_close(c);
    dlock_client_close(c2);
}

/* Release while Redis is stopped: DLOCK_EREDIS in bounded time, and the lock
 * is released locally all the same; in Redis the lease goes away (released
 * late, or expired after lease_ms) so another client gets it. */
static void test_release_redis_down(void **state)
{
    (void)state;
    const char *prefix = "tc:reldown:";
    const uint32_t lease = 2000;
    dlock_client *c = open_client(prefix, lease);
    dlock_client *c2 = open_client(prefix, lease);
    uint64_t f = 0, f2 = 0;
    assert_int_equal(dlock_acquire(c, "rd", 0, &f), DLOCK_OK);
    assert_int_equal(dlock_acquire(c2, "warm", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(c2, "warm"), DLOCK_OK);

    assert_int_equal(fx_redis_signal(&fx_server, SIGSTOP), 0);
    long long t0 = fx_now_ns();
    int rc = dlock_release(c, "rd");
    long long el = MS(fx_now_ns() - t0);
    int held = dlock_held(c, "rd");
    dlock_stats s = stats(c);
    assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    assert_int_equal(rc, DLOCK_EREDIS);
    assert_true(el < 10000); /* ~6x connect + command timeouts */
    assert_int_equal(held, 0);
    assert_int_equal(s.entries, 0);
    assert_int_equal(s.leases_held, 0);
    assert_int_equal(dlock_release(c, "rd"), DLOCK_ENOTHELD);

    /* 15 s: 7x the lease. */
    rc = dlock_acquire(c2, "rd", 15000, &f2);
    assert_int_equal(rc, DLOCK_OK);
    assert_true(f2 > f);
    assert_int_equal(dlock_release(c2, "rd"), DLOCK_OK);
    /* And c works again for that name. */
    long long until = fx_now_ns() + 10000 * 1000000LL;
    while ((rc = dlock_acquire(c, "rd", 2000, &f)) != DLOCK_OK && fx_now_ns() < until) {
        assert_int_equal(rc, DLOCK_EREDIS);
        fx_sleep_ms(50);
    }
    assert_int_equal(rc, DLOCK_OK);
    assert_true(f > f2);
    assert_int_equal(dlock_release(c, "rd"), DLOCK_OK);
    assert_table_empty(c);
    assert_table_empty(c2);
    dlock_client_close(c);
    dlock_client_close(c2);
}

/* Redis' own `timeout` setting (common in production, like idle-closing
 * proxies) closes idle client connections. Redis stays reachable, so calls
 * after an idle period must work: DLOCK_EREDIS means "unreachable or
 * failed", and a failed release would leave the lease blocking every other
 * process for lease_ms. */
static void test_idle_connection_closed_by_server(void **state)
{
    (void)state;
    const char *prefix = "tc:idle:";
    dlock_client *c = open_client(prefix, 60000);
    dlock_client *c2 = open_client(prefix, 60000);
    char key[64];
    lease_key(key, sizeof key, prefix, "i");
    freeReplyObject(cmd("CONFIG SET timeout %d", 1));

    assert_int_equal(dlock_acquire(c, "i", 0, NULL), DLOCK_OK);
    fx_sleep_ms(2500); /* the server closes connections idle for 1 s */
    int rc = dlock_release(c, "i");
    if (rc != DLOCK_OK)
        fail_msg("release after an idle period: %s (%s)", dlock_err_name(rc),
                 dlock_last_error());
    assert_int_equal(lease_live(key), 0);
    assert_int_equal(dlock_acquire(c2, "i", 0, NULL), DLOCK_OK);

    fx_sleep_ms(2500);
    rc = dlock_acquire(c, "j", 0, NULL);
    if (rc != DLOCK_OK)
        fail_msg("acquire after an idle period: %s (%s)", dlock_err_name(rc),
                 dlock_last_error());
    assert_int_equal(dlock_release(c, "j"), DLOCK_OK);
    assert_int_equal(dlock_release(c2, "i"), DLOCK_OK);
    assert_table_empty(c);
    assert_table_empty(c2);
    dlock_client_close(c);
    dlock_client_close(c2);
}

/* Teardown of the test above: the idle timeout must not outlive it. */
static int reset_idle_timeout(void **state)
{
    if (fx_server.pid > 0) {
        redisContext *k = fx_connect("127.0.0.1", fx_server.port);
        if (k) {
            redisReply *r = redisCommand(k, "CONFIG SET timeout 0");
            if (r)
                freeReplyObject(r);
            redisFree(k);
        }
    }
    return fx_ensure_server(state);
}

static void test_redis_restarted(void **state)
{
    (void)state;
    const char *prefix = "tc:restart:";
    dlock_client *c = open_client(prefix, 20000);
    uint64_t f0 = 0, f = 0;
    assert_int_equal(dlock_acquire(c, "r", 0, &f0), DLOCK_OK);
    assert_int_equal(dlock_release(c, "r"), DLOCK_OK);

    for (int round = 0; round < 2; round++) {
        assert_int_equal(fx_redis_signal(&fx_server, SIGKILL), 0);
        /* While it is down: a fast EREDIS (10 s bound as above). */
        long long t0 = fx_now_ns();
        assert_int_equal(dlock_acquire(c, "r", 0, &f), DLOCK_EREDIS);
        assert_true(MS(fx_now_ns() - t0) < 10000);
        assert_int_equal(fx_redis_restart(&fx_server), 0);

        /* The restarted server has an empty script cache: the client must
         * reconnect and fall back from EVALSHA (NOSCRIPT). Allow a few calls
         * for the reconnect, within 10 s. */
        long long deadline = fx_now_ns() + 10000 * 1000000LL;
        int rc;
        for (;;) {
            rc = dlock_acquire(c, "r", 5000, &f);
            if (rc == DLOCK_OK || fx_now_ns() > deadline)
                break;
            if (rc != DLOCK_EREDIS)
                fail_msg("after restart: %s (%s)", dlock_err_name(rc), dlock_last_error());
            fx_sleep_ms(100);
        }
        if (rc != DLOCK_OK)
            fail_msg("no recovery after restart: %s (%s)", dlock_err_name(rc), dlock_last_error());
        char key[64];
        lease_key(key, sizeof key, prefix, "r");
        assert_int_equal(lease_live(key), 1);
        assert_true(f > f0);
        f0 = f;
        assert_int_equal(dlock_release(c, "r"), DLOCK_OK);
        assert_int_equal(lease_live(key), 0);
        /* And the next call works at once, also for a new name. */
        assert_int_equal(dlock_acquire(c, "r2", 0, NULL), DLOCK_OK);
        assert_int_equal(dlock_release(c, "r2"), DLOCK_OK);
    }
    assert_table_empty(c);
    dlock_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_redis_unreachable, fx_ensure_server),
        cmocka_unit_test_teardown(test_redis_stopped, fx_ensure_server),
        cmocka_unit_test_teardown(test_unknown_outcome_leaves_no_lease, fx_ensure_server),
        cmocka_unit_test_teardown(test_waiter_deadline_while_poller_stuck, fx_ensure_server),
        cmocka_unit_test_teardown(test_release_redis_down, fx_ensure_server),
        cmocka_unit_test_teardown(test_idle_connection_closed_by_server, reset_idle_timeout),
        cmocka_unit_test_teardown(test_redis_restarted, fx_ensure_server),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
