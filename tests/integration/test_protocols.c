/*
 * Integration tests of the two protocols this release speaks
 * (dlock_config.protocol; docs/design.md, "Protocol versions"), against a
 * private redis-server (tests/support/fixture.h): clients of either
 * setting on one prefix, each name's data in one protocol at a time, the
 * acquire sent again in the protocol of the data it finds, and every later
 * call of the grant (renewals, release, a waiter's leave) in the grant's
 * protocol.
 *
 * The names move between the protocols under the clients: a name whose
 * data changes protocol between two sends of one call, a waiter queued in
 * one protocol whose next try goes to the other, a direct grant made by the
 * other protocol's release (through the fault proxy, tests/support/proxy.h).
 *
 * Timing: leases are short so that renewals run within the test; every
 * bound is several times the duration it guards, as the comments say.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlock.h"
#include "fixture.h"
#include "client_helpers.h"
#include "proxy.h"
#include "conn/script.h"

static fx_proxy *proxy;

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

static int lost_calls; /* atomic */
static void count_lost(const char *name, uint64_t fence, void *arg)
{
    (void)name;
    (void)fence;
    (void)arg;
    __atomic_fetch_add(&lost_calls, 1, __ATOMIC_SEQ_CST);
}

/* A client on prefix "tp:" writing protocol `protocol`, lease lease_ms. */
static dlock_client *client_in(uint32_t protocol, uint32_t lease_ms)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tp:";
    cfg.lease_ms = lease_ms;
    cfg.waiter_ttl_ms = 1000;
    cfg.protocol = protocol;
    dlock_client *c = NULL;
    int rc = dlock_client_open(&cfg, &c);
    if (rc != DLOCK_OK)
        fail_msg("dlock_client_open: %s (%s)", dlock_err_name(rc), dlock_last_error());
    return c;
}

/* The protocol of name's data: its hash's pv (protocol 1 writes it with
 * each grant), 0 when the hash is gone or has none. */
static int data_protocol(const char *name)
{
    char key[128];
    snprintf(key, sizeof key, "tp:{%s}", name);
    char *pv = key_hget(key, "pv");
    int p = pv ? atoi(pv) : 0;
    free(pv);
    return p;
}

static uint64_t resends(dlock_client *c)
{
    dlock_stats s;
    assert_int_equal(dlock_client_stats(c, &s), DLOCK_OK);
    return s.protocol_resends;
}

/* A client writing `protocol` (through the proxy if via_proxy), prefix
 * "tp:", with its timeouts, counting lost leases; its subscriber ready. */
static dlock_client *client_at(uint32_t protocol, int via_proxy, uint32_t lease_ms,
                               uint32_t command_ms, uint32_t waiter_ttl_ms)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tp:";
    if (via_proxy)
        cfg.redis_port = fx_proxy_port(proxy);
    cfg.lease_ms = lease_ms;
    cfg.command_timeout_ms = command_ms;
    cfg.connect_timeout_ms = command_ms;
    cfg.waiter_ttl_ms = waiter_ttl_ms;
    cfg.protocol = protocol;
    cfg.on_lost = count_lost;
    dlock_client *c = NULL;
    int rc = dlock_client_open(&cfg, &c);
    if (rc != DLOCK_OK)
        fail_msg("dlock_client_open: %s (%s)", dlock_err_name(rc), dlock_last_error());
    assert_int_equal(fx_wait_subscriber(c), 0);
    return c;
}

static long long zcard(const char *key)
{
    redisReply *r = cmd("ZCARD %s", key);
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

/* Whether key's wait queue holds n clients within ms. */
static int wait_zcard(const char *key, long long n, long ms)
{
    long long until = fx_now_ns() + ms * 1000000LL;
    while (zcard(key) != n) {
        if (fx_now_ns() >= until)
            return 0;
        fx_sleep_ms(10);
    }
    return 1;
}

/* A thread that waits for a name, holds it hold_ms, releases it. */
typedef struct holder {
    pthread_t thread;
    dlock_client *c;
    const char *name;
    int64_t wait_ms;
    int hold_ms;
    int rc, rel_rc;
    char msg[300];
    uint64_t fence;
} holder_t;

static void *holder_main(void *arg)
{
    holder_t *w = arg;
    w->rc = dlock_acquire(w->c, w->name, w->wait_ms, &w->fence);
    snprintf(w->msg, sizeof w->msg, "%s", dlock_last_error());
    w->rel_rc = 99;
    if (w->rc == DLOCK_OK) {
        fx_sleep_ms(w->hold_ms);
        w->rel_rc = dlock_release(w->c, w->name);
        snprintf(w->msg, sizeof w->msg, "%s", dlock_last_error());
    }
    return NULL;
}

static void holder_start(holder_t *w, dlock_client *c, const char *name, int64_t wait_ms,
                         int hold_ms)
{
    memset(w, 0, sizeof *w);
    w->c = c;
    w->name = name;
    w->wait_ms = wait_ms;
    w->hold_ms = hold_ms;
    assert_int_equal(pthread_create(&w->thread, NULL, holder_main, w), 0);
}

static void test_setting_checked(void **state)
{
    (void)state;
    dlock_config cfg;
    dlock_config_init(&cfg);
    assert_int_equal(cfg.protocol, DLOCK_PROTOCOL_VERSION);
    for (uint32_t bad = 0; bad <= 3; bad += 3) {
        fx_config(&cfg, &fx_server);
        cfg.protocol = bad;
        dlock_client *c = NULL;
        assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_EINVAL);
        assert_null(c);
        assert_non_null(strstr(dlock_last_error(), "protocol"));
    }
}

/* Each setting writes its own protocol to a name without data, and the
 * other client, finding it, is sent again in that protocol: granted, with
 * a greater token, and the data stays in the first protocol. */
static void test_each_writes_its_own_and_reads_the_other(void **state)
{
    (void)state;
    dlock_client *one = client_in(1, 2000), *two = client_in(2, 2000);
    uint64_t f1 = 0, f2 = 0;
    assert_int_equal(dlock_acquire(one, "a", 0, &f1), DLOCK_OK);
    assert_int_equal(data_protocol("a"), 1);
    assert_int_equal(dlock_release(one, "a"), DLOCK_OK);
    assert_int_equal(dlock_acquire(two, "b", 0, &f2), DLOCK_OK);
    assert_int_equal(data_protocol("b"), 2);
    assert_int_equal(dlock_release(two, "b"), DLOCK_OK);
    assert_int_equal(resends(one) + resends(two), 0);

    /* b's data is protocol 2's and lives on (the client's record): the
     * protocol 1 client is sent again in 2 */
    uint64_t g = 0;
    assert_int_equal(dlock_acquire(one, "b", 0, &g), DLOCK_OK);
    assert_true(g > f2);
    assert_int_equal(resends(one), 1);
    assert_int_equal(data_protocol("b"), 2);
    assert_int_equal(dlock_release(one, "b"), DLOCK_OK);

    /* a held under protocol 1: the protocol 2 client finds it so, waits in
     * protocol 1's queue, and gets it when it is released */
    assert_int_equal(dlock_acquire(one, "a", 0, &f1), DLOCK_OK);
    assert_int_equal(dlock_acquire(two, "a", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(resends(two), 1);
    assert_int_equal(dlock_release(one, "a"), DLOCK_OK);
    assert_int_equal(dlock_acquire(two, "a", 1000, &g), DLOCK_OK);
    assert_true(g > f1);
    assert_int_equal(dlock_release(two, "a"), DLOCK_OK);
    dlock_client_close(one);
    dlock_client_close(two);
}

typedef struct waiter {
    dlock_client *c;
    const char *name;
    int64_t wait_ms;
    int rc;
    uint64_t fence;
} waiter;

static void *wait_for(void *arg)
{
    waiter *w = arg;
    w->rc = dlock_acquire(w->c, w->name, w->wait_ms, &w->fence);
    if (w->rc == DLOCK_OK)
        w->rc = dlock_release(w->c, w->name);
    return NULL;
}

/* A waiter sent again in the holder's protocol queues there, and the
 * holder's release grants it directly (one grant, from the message): the
 * direct grant is in that protocol, so its release works. */
static void test_direct_grant_across_settings(void **state)
{
    (void)state;
    for (uint32_t holder = 1; holder <= 2; holder++) {
        char name[16];
        snprintf(name, sizeof name, "dg%u", holder);
        dlock_client *h = client_in(holder, 2000), *o = client_in(3 - holder, 2000);
        assert_int_equal(fx_wait_subscriber(o), 0);
        uint64_t f = 0;
        assert_int_equal(dlock_acquire(h, name, 0, &f), DLOCK_OK);
        dlock_stats s0;
        assert_int_equal(dlock_client_stats(o, &s0), DLOCK_OK);
        waiter w = {o, name, 10000, -99, 0}; /* 10 s: far above the 0.3 s it takes */
        pthread_t t;
        pthread_create(&t, NULL, wait_for, &w);
        /* the waiter is in the queue once its try came back refused */
        char q[64];
        snprintf(q, sizeof q, "tp:{%s}:q", name);
        for (int i = 0; i < 500 && !key_exists(q); i++)
            fx_sleep_ms(10);
        fx_sleep_ms(300); /* (its poller is asleep by then) */
        assert_int_equal(dlock_release(h, name), DLOCK_OK);
        pthread_join(t, NULL);
        assert_int_equal(w.rc, DLOCK_OK); /* granted, and released in its protocol */
        assert_true(w.fence > f);
        dlock_stats s1;
        assert_int_equal(dlock_client_stats(o, &s1), DLOCK_OK);
        assert_int_equal(s1.direct_grants - s0.direct_grants, 1);
        assert_true(s1.protocol_resends > s0.protocol_resends);
        /* the data stayed in the holder's protocol: protocol 2's hash, or
         * none (protocol 1 deletes its lease hash at the release) */
        assert_int_equal(data_protocol(name), holder == 2 ? 2 : 0);
        dlock_client_close(h);
        dlock_client_close(o);
    }
}

/* One client holds a name of each protocol for three lease times: each
 * renewal round renews both (one renew call per protocol), and both
 * releases find their leases. */
static void test_renewals_of_both_protocols(void **state)
{
    (void)state;
    dlock_client *one = client_in(1, 300), *two = client_in(2, 300);
    assert_int_equal(dlock_acquire(two, "r2", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(two, "r2"), DLOCK_OK); /* r2's data: protocol 2 */
    assert_int_equal(dlock_acquire(one, "r1", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_acquire(one, "r2", 0, NULL), DLOCK_OK);
    assert_int_equal(data_protocol("r1"), 1);
    assert_int_equal(data_protocol("r2"), 2);
    fx_sleep_ms(900); /* three lease times: held only if renewed */
    assert_int_equal(dlock_held(one, "r1"), 1);
    assert_int_equal(dlock_held(one, "r2"), 1);
    /* the other client cannot take either */
    assert_int_equal(dlock_acquire(two, "r1", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(dlock_acquire(two, "r2", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(dlock_release(one, "r1"), DLOCK_OK);
    assert_int_equal(dlock_release(one, "r2"), DLOCK_OK);
    dlock_client_close(one);
    dlock_client_close(two);
}

/* A waiter that gives up leaves the queue of the protocol it waited in:
 * the queue is empty after its timeout. */
static void test_leave_in_the_waits_protocol(void **state)
{
    (void)state;
    for (uint32_t holder = 1; holder <= 2; holder++) {
        char name[16], q[64];
        snprintf(name, sizeof name, "lv%u", holder);
        snprintf(q, sizeof q, "tp:{%s}:q", name);
        dlock_client *h = client_in(holder, 2000), *o = client_in(3 - holder, 2000);
        assert_int_equal(dlock_acquire(h, name, 0, NULL), DLOCK_OK);
        assert_int_equal(dlock_acquire(o, name, 300, NULL), DLOCK_ETIMEDOUT);
        /* the leave runs before the acquire returns (Redis is up) */
        assert_int_equal(key_exists(q), 0);
        assert_int_equal(dlock_release(h, name), DLOCK_OK);
        dlock_client_close(h);
        dlock_client_close(o);
    }
}

/* Data of a protocol this release does not speak is refused by both
 * settings, naming it, and left as it was. */
static void test_unknown_protocol_refused_by_both(void **state)
{
    (void)state;
    freeReplyObject(cmd("HSET tp:{x3} pv 3"));
    for (uint32_t p = 1; p <= 2; p++) {
        dlock_client *c = client_in(p, 2000);
        assert_int_equal(dlock_acquire(c, "x3", 0, NULL), DLOCK_ESERVER);
        assert_non_null(strstr(dlock_last_error(), "dlock protocol 3"));
        assert_int_equal(resends(c), 0);
        dlock_client_close(c);
    }
    assert_int_equal(data_protocol("x3"), 3);
    redisReply *r = cmd("HLEN tp:{x3}");
    assert_int_equal(r->integer, 1);
    freeReplyObject(r);
}

/* A waiter set to 1 queued in protocol 2 (sent there again) whose next
 * try fails (Redis stalls under it): it gives up, and its leave goes to
 * the protocol it queued in, not to its failed try's, so its queue entry
 * goes and the next waiter is not held back for a waiter ttl. */
static void test_leave_after_a_failed_try(void **state)
{
    (void)state;
    /* command timeout 0.5 s: the stall fails X's next try within it */
    dlock_client *x = client_at(1, 1, 6000, 500, 10000);
    dlock_client *y = client_at(2, 0, 6000, 1000, 10000);
    dlock_client *z = client_at(2, 0, 6000, 1000, 10000);
    assert_int_equal(dlock_acquire(y, "lv", 0, NULL), DLOCK_OK);
    holder_t wx, wz;
    holder_start(&wx, x, "lv", 60000, 0);
    assert_true(wait_zcard("tp:{lv}:q", 1, 5000));
    holder_start(&wz, z, "lv", 60000, 0);
    assert_true(wait_zcard("tp:{lv}:q", 2, 5000));
    fx_proxy_stall(proxy, 1); /* X's next try (within 10 s / 4) fails */
    pthread_join(wx.thread, NULL);
    assert_int_equal(wx.rc, DLOCK_EREDIS);
    fx_proxy_stall(proxy, 0);
    /* the leave went to the background: 5 s is many retries of it */
    assert_true(wait_zcard("tp:{lv}:q", 1, 5000));
    assert_int_equal(dlock_release(y, "lv"), DLOCK_OK);
    pthread_join(wz.thread, NULL);
    assert_int_equal(wz.rc, DLOCK_OK);
    dlock_client_close(x);
    dlock_client_close(y);
    dlock_client_close(z);
}

/* The name changes protocol between the two sends of one attempt (its
 * holder in protocol 1 releases, a client of protocol 2 takes and releases
 * it): the attempt goes back, and the wait ends with the lock, not with
 * DLOCK_ESERVER. */
static void test_name_moves_between_two_sends(void **state)
{
    (void)state;
    dlock_client *a = client_at(1, 0, 6000, 1000, 2000);
    dlock_client *b = client_at(2, 1, 6000, 3000, 2000);
    dlock_client *c = client_at(2, 0, 6000, 1000, 2000);
    assert_int_equal(dlock_acquire(a, "pp", 0, NULL), DLOCK_OK); /* protocol 1 */
    /* B's try in 2 is refused; its send again, in 1, is held on the way */
    fx_proxy_hold_next(proxy, dlock_script_sha(DLOCK_SCRIPT_ACQUIRE));
    holder_t wb;
    holder_start(&wb, b, "pp", 10000, 0);
    assert_int_equal(fx_proxy_wait_held(proxy, 5000), 0);
    assert_int_equal(dlock_release(a, "pp"), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "pp", 0, NULL), DLOCK_OK); /* protocol 2 now */
    assert_int_equal(dlock_release(c, "pp"), DLOCK_OK);
    fx_proxy_release_held(proxy);
    pthread_join(wb.thread, NULL);
    if (wb.rc != DLOCK_OK || wb.rel_rc != DLOCK_OK)
        fail_msg("B: %s, release %d: %s", dlock_err_name(wb.rc), wb.rel_rc, wb.msg);
    assert_int_equal(data_protocol("pp"), 2);
    dlock_client_close(a);
    dlock_client_close(b);
    dlock_client_close(c);
}

/* X (set to 2) queues through protocol 1; the protocol 1 holder's key goes
 * (it crashed, its lease ran out); C, ahead in the queue, takes the name in
 * protocol 2 and its release grants X directly: X holds it in protocol 2,
 * renewed (held past half the direct grant's validity), and releases it. */
static void test_direct_grant_from_the_other_protocol(void **state)
{
    (void)state;
    __atomic_store_n(&lost_calls, 0, __ATOMIC_SEQ_CST);
    dlock_client *a = client_at(1, 0, 10000, 1000, 2000);
    dlock_client *cc = client_at(2, 0, 10000, 1000, 400); /* polls every ~100 ms */
    dlock_client *x = client_at(2, 0, 10000, 1000, 8000); /* every ~2 s */
    assert_int_equal(dlock_acquire(a, "dg", 0, NULL), DLOCK_OK); /* protocol 1 */
    holder_t wc, wx;
    holder_start(&wc, cc, "dg", 20000, 0);
    assert_true(wait_zcard("tp:{dg}:q", 1, 5000));
    /* held 5 s: the direct grant's validity (8 s) is renewed by half of it */
    holder_start(&wx, x, "dg", 20000, 5000);
    assert_true(wait_zcard("tp:{dg}:q", 2, 5000));
    fx_sleep_ms(50);
    freeReplyObject(cmd("DEL tp:{dg}")); /* A's lease gone */
    pthread_join(wc.thread, NULL);
    pthread_join(wx.thread, NULL);
    dlock_stats s;
    assert_int_equal(dlock_client_stats(x, &s), DLOCK_OK);
    if (wc.rc != DLOCK_OK || wx.rc != DLOCK_OK || wx.rel_rc != DLOCK_OK)
        fail_msg("C %s, X %s, X's release %d: %s", dlock_err_name(wc.rc), dlock_err_name(wx.rc),
                 wx.rel_rc, wx.msg);
    assert_int_equal(s.direct_grants, 1);
    assert_int_equal(s.leases_lost, 0); /* (A lost its own: on_lost counts it) */
    assert_int_equal(__atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST), 1);
    dlock_client_close(cc);
    dlock_client_close(x);
    dlock_client_close(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_setting_checked),
        cmocka_unit_test(test_each_writes_its_own_and_reads_the_other),
        cmocka_unit_test(test_direct_grant_across_settings),
        cmocka_unit_test(test_renewals_of_both_protocols),
        cmocka_unit_test(test_leave_in_the_waits_protocol),
        cmocka_unit_test(test_unknown_protocol_refused_by_both),
        cmocka_unit_test(test_leave_after_a_failed_try),
        cmocka_unit_test(test_name_moves_between_two_sends),
        cmocka_unit_test(test_direct_grant_from_the_other_protocol),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
