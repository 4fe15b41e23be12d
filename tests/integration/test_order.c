/*
 * Late, repeated and lost messages, end to end: clients reach a private
 * redis-server through the project's fault-injecting proxy (tests/support/proxy.h),
 * which holds back one chosen request, drops one answer, or stalls.
 *
 *   - A late acquire: attempt N of client X is held back until X has a newer
 *     grant; then N reaches Redis and the renewal thread releases "attempt N"
 *     as a give-back. No other client may be granted while X's holder still
 *     has dlock_held() == 1 (before the fix, N re-granted the lease in place
 *     and its give-back deleted X's live grant).
 *   - A release whose answer is lost: the proxy lets it run and resets the
 *     connection before the answer; the release is sent again and must
 *     report DLOCK_OK, not DLOCK_ELOST, with no on_lost call.
 *   - A waiter whose poll fails (stalled network): the client leaves the
 *     wait queue in the background once Redis answers, so the next release
 *     does not hand the turn to a client that stopped waiting. So does one
 *     whose first poll ran in Redis but was never answered (it never
 *     learned from a refusal that it was queued).
 *   - A grant answered after the lease could have expired (a slow network)
 *     is not taken: the acquire fails.
 *
 * Timing: waits are bounded polls with bounds several times what they
 * guard; the assertions compare orders of events and Redis state.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "dlock.h"
#include "fixture.h"
#include "proxy.h"
#include "conn/script.h"

static fx_proxy *proxy;
/* The protocol the clients write (fx_config): the proxy picks requests by
 * the digest of that protocol's script. */
static int protocol;

static int setup(void **state)
{
    if (fx_group_setup(state) != 0)
        return -1;
    proxy = fx_proxy_start(fx_server.port);
    return proxy ? 0 : -1;
}

static int teardown(void **state)
{
    fx_proxy_stop(proxy);
    return fx_group_teardown(state);
}

static atomic_int lost_calls;

static void count_lost(const char *name, uint64_t fence, void *arg)
{
    (void)name;
    (void)fence;
    (void)arg;
    atomic_fetch_add(&lost_calls, 1);
}

/* A client through the proxy (via_proxy) or straight to Redis. */
static dlock_client *open_client(int via_proxy, uint32_t lease_ms, uint32_t command_ms,
                                 uint32_t waiter_ttl_ms)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "to:";
    if (via_proxy)
        cfg.redis_port = fx_proxy_port(proxy);
    cfg.lease_ms = lease_ms;
    cfg.command_timeout_ms = command_ms;
    cfg.connect_timeout_ms = command_ms;
    cfg.waiter_ttl_ms = waiter_ttl_ms;
    cfg.on_lost = count_lost;
    protocol = (int)cfg.protocol;
    dlock_client *c = NULL;
    int rc = dlock_client_open(&cfg, &c);
    if (rc != DLOCK_OK)
        fail_msg("dlock_client_open: %s (%s)", dlock_err_name(rc), dlock_last_error());
    assert_int_equal(fx_wait_subscriber(c), 0);
    return c;
}

static long long redis_int(const char *fmt, const char *arg)
{
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(k);
    redisReply *r = redisCommand(k, fmt, arg);
    assert_non_null(r);
    long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    redisFree(k);
    return v;
}

/* Waits (polling, at most ms) until ZCARD of key is n. 1 or 0. */
static int wait_zcard(const char *key, long long n, long ms)
{
    long long until = fx_now_ns() + ms * 1000000LL;
    while (redis_int("ZCARD %s", key) != n) {
        if (fx_now_ns() >= until)
            return 0;
        fx_sleep_ms(10);
    }
    return 1;
}

typedef struct waiter {
    pthread_t thread;
    dlock_client *c;
    const char *name;
    int64_t wait_ms;
    int rc;
    uint64_t fence;
    atomic_llong done_ns;
    int hold_ms; /* how long it holds the lock once it has it */
} waiter;

static void *waiter_main(void *arg)
{
    waiter *w = arg;
    w->rc = dlock_acquire(w->c, w->name, w->wait_ms, &w->fence);
    atomic_store(&w->done_ns, fx_now_ns());
    if (w->rc == DLOCK_OK) {
        fx_sleep_ms(w->hold_ms);
        dlock_release(w->c, w->name);
    }
    return NULL;
}

static void waiter_start(waiter *w, dlock_client *c, const char *name, int64_t wait_ms)
{
    memset(w, 0, sizeof *w);
    w->c = c;
    w->name = name;
    w->wait_ms = wait_ms;
    assert_int_equal(pthread_create(&w->thread, NULL, waiter_main, w), 0);
}

/* ------------------------------------------------------------ late acquire */

static void test_late_acquire_never_displaces_a_live_grant(void **state)
{
    (void)state;
    /* lease 6 s: X's renewal runs every 2 s, so a lease deleted behind X's
     * back would still read as held for up to 2 s; the give-back of
     * the late attempt retries after 100, 200, 400, 800 ms. */
    dlock_client *x = open_client(1, 6000, 300, 2000);
    dlock_client *y = open_client(0, 6000, 1000, 2000);
    atomic_store(&lost_calls, 0);

    /* 1. Attempt N of X is held back by the network; X times out. */
    fx_proxy_hold_next(proxy, dlock_script_sha(dlock_script_in(DLOCK_SCRIPT_ACQUIRE, protocol)));
    assert_int_equal(dlock_acquire(x, "late", 0, NULL), DLOCK_EREDIS);
    assert_true(fx_proxy_held(proxy));

    /* 2. X tries again and holds the lock with a newer grant. */
    uint64_t fx;
    assert_int_equal(dlock_acquire(x, "late", 0, &fx), DLOCK_OK);
    assert_int_equal(dlock_held(x, "late"), 1);

    /* 3. Y waits for the lock. */
    waiter wy;
    waiter_start(&wy, y, "late", 20000);
    assert_true(wait_zcard("to:{late}:q", 1, 5000));

    /* 4. Attempt N reaches Redis now; X keeps holding for 3 s, long enough
     * for the give-back of N to run several times. */
    fx_proxy_release_held(proxy);
    assert_int_equal(fx_proxy_wait_released(proxy, 5000), 0);
    long long last_held = 0, until = fx_now_ns() + 3000LL * 1000000LL;
    while (fx_now_ns() < until) {
        if (dlock_held(x, "late"))
            last_held = fx_now_ns();
        fx_sleep_ms(1);
    }
    assert_true(last_held > 0);
    assert_int_equal(atomic_load(&wy.done_ns), 0); /* Y still waits */
    assert_int_equal(dlock_release(x, "late"), DLOCK_OK);
    pthread_join(wy.thread, NULL);
    assert_int_equal(wy.rc, DLOCK_OK);
    assert_true(atomic_load(&wy.done_ns) > last_held);
    assert_true(wy.fence > fx);
    assert_int_equal(atomic_load(&lost_calls), 0);
    dlock_client_close(x);
    dlock_client_close(y);
}

/* ------------------------------------------------------- lost answer */

static void test_release_whose_answer_is_lost(void **state)
{
    (void)state;
    dlock_client *x = open_client(1, 6000, 1000, 2000);
    atomic_store(&lost_calls, 0);
    assert_int_equal(dlock_acquire(x, "cut", 0, NULL), DLOCK_OK);
    fx_proxy_cut_next(proxy, dlock_script_sha(dlock_script_in(DLOCK_SCRIPT_RELEASE, protocol)));
    int rc = dlock_release(x, "cut");
    assert_true(fx_proxy_cut_done(proxy));
    assert_int_equal(rc, DLOCK_OK);
    assert_int_equal(atomic_load(&lost_calls), 0);
    dlock_stats s;
    assert_int_equal(dlock_client_stats(x, &s), DLOCK_OK);
    assert_int_equal(s.leases_lost, 0);
    /* released in Redis, not left to expire */
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(k);
    assert_int_equal(fx_lease_ms(k, "to:{cut}"), -2);
    assert_null(fx_grant_get(k, "to:{cut}", "token"));
    redisFree(k);
    dlock_client_close(x);
}

/* ------------------------------------------- leave after a failed poll */

static void test_failed_waiter_leaves_the_queue(void **state)
{
    (void)state;
    /* waiter ttl 10 s: a queue entry left behind would keep Z waiting
     * that long after Y's release (the check below allows 5 s); X polls
     * every 2.5 s. */
    dlock_client *x = open_client(1, 6000, 500, 10000);
    dlock_client *y = open_client(0, 6000, 1000, 10000);
    dlock_client *z = open_client(0, 6000, 1000, 10000);
    assert_int_equal(dlock_acquire(y, "lv", 0, NULL), DLOCK_OK);
    waiter wx, wz;
    waiter_start(&wx, x, "lv", 60000);
    assert_true(wait_zcard("to:{lv}:q", 1, 5000));
    waiter_start(&wz, z, "lv", 60000);
    assert_true(wait_zcard("to:{lv}:q", 2, 5000));

    /* X's next poll cannot reach Redis: its acquire fails. */
    fx_proxy_stall(proxy, 1);
    pthread_join(wx.thread, NULL);
    assert_int_equal(wx.rc, DLOCK_EREDIS);
    fx_proxy_stall(proxy, 0);
    /* Once the network is back, the client leaves the queue by itself
     * (in tens of ms here). Nothing else takes X's entry out while Y holds
     * the lock and Z keeps the queue alive, so the bound only keeps the
     * test from hanging: 15 s, generous for a busy machine. */
    long long t_left = fx_now_ns();
    if (!wait_zcard("to:{lv}:q", 1, 15000))
        fail_msg("X's entry still queued %lld ms after the network came back",
                 (fx_now_ns() - t_left) / 1000000);
    /* And the release hands the turn to Z, which gets the lock well before
     * X's stale entry would have expired. */
    long long t0 = fx_now_ns();
    assert_int_equal(dlock_release(y, "lv"), DLOCK_OK);
    pthread_join(wz.thread, NULL);
    assert_int_equal(wz.rc, DLOCK_OK);
    assert_true(atomic_load(&wz.done_ns) - t0 < 5000LL * 1000000LL);
    dlock_client_close(x);
    dlock_client_close(y);
    dlock_client_close(z);
}

/* ------------------------------- leave after an unanswered first poll */

static void test_unanswered_first_poll_leaves_the_queue(void **state)
{
    (void)state;
    /* The stall in the test above can catch the answer of X's first poll
     * instead of its second: the try ran in Redis (X is queued) but X never
     * heard it, so X had no refusal to learn from that it was queued. Made
     * certain here: every answer to X comes 1 s late, past its command
     * timeout (500 ms), while its requests reach Redis at once. */
    dlock_client *x = open_client(1, 6000, 500, 10000);
    dlock_client *y = open_client(0, 6000, 1000, 10000);
    assert_int_equal(dlock_acquire(y, "lv1", 0, NULL), DLOCK_OK);
    /* X's pooled connection is set up before the answers slow down (a
     * single try: refused, not queued) */
    assert_int_equal(dlock_acquire(x, "lv1", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(redis_int("ZCARD %s", "to:{lv1}:q"), 0);
    fx_proxy_set_delay(proxy, 0, 1000000);
    assert_int_equal(dlock_acquire(x, "lv1", 60000, NULL), DLOCK_EREDIS);
    fx_proxy_set_delay(proxy, 0, 0);
    /* Nothing else takes X's entry out while Y holds the lock (a release
     * would hand X the turn, live for the waiter ttl, 10 s): the client
     * leaves by itself, in tens of ms here; 15 s is generous for a busy
     * machine. */
    long long t_left = fx_now_ns();
    if (!wait_zcard("to:{lv1}:q", 0, 15000))
        fail_msg("X's entry still queued %lld ms after its try went unanswered",
                 (fx_now_ns() - t_left) / 1000000);
    assert_int_equal(dlock_release(y, "lv1"), DLOCK_OK);
    dlock_client_close(x);
    dlock_client_close(y);
}

/* ------------------------------------------------ answered too late */

static void test_answer_after_validity_not_taken(void **state)
{
    (void)state;
    /* lease 200 ms (valid 196 ms from the send, less the drift margin);
     * every answer comes 400 ms late, within the command timeout (2 s) */
    dlock_client *x = open_client(1, 200, 2000, 2000);
    fx_proxy_set_delay(proxy, 0, 400000);
    int rc = dlock_acquire(x, "slow", 0, NULL);
    char msg[256];
    snprintf(msg, sizeof msg, "%s", dlock_last_error());
    int held = dlock_held(x, "slow");
    fx_proxy_set_delay(proxy, 0, 0);
    if (rc == DLOCK_OK)
        dlock_release(x, "slow");
    assert_int_equal(rc, DLOCK_EREDIS);
    assert_non_null(strstr(msg, "after the lease could have expired"));
    assert_int_equal(held, 0);
    dlock_client_close(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_late_acquire_never_displaces_a_live_grant),
        cmocka_unit_test(test_release_whose_answer_is_lost),
        cmocka_unit_test(test_failed_waiter_leaves_the_queue),
        cmocka_unit_test(test_unanswered_first_poll_leaves_the_queue),
        cmocka_unit_test(test_answer_after_validity_not_taken),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
