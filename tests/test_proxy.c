/*
 * The fault-injecting proxy (tests/proxy.h) against a real redis-server:
 * plain forwarding, a delay on every chunk, one request held back and
 * delivered late (also after its client gave up), a stall, a reset of every
 * connection, and a command whose answer is dropped.
 *
 * Timing: delays are checked from below only; eventual conditions are
 * polled with bounds several times what they guard.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <sys/time.h>

#include <cmocka.h>

#include "fixture.h"
#include "proxy.h"

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

/* A connection through the proxy with a 300 ms timeout. */
static redisContext *via_proxy(void)
{
    struct timeval tv = {0, 300000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", fx_proxy_port(proxy), tv);
    assert_non_null(c);
    assert_int_equal(c->err, 0);
    redisSetTimeout(c, tv);
    return c;
}

/* GET key straight from Redis: its value, or "" when absent. */
static void direct_get(const char *key, char *out, size_t n)
{
    redisContext *d = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(d);
    redisReply *r = redisCommand(d, "GET %s", key);
    assert_non_null(r);
    snprintf(out, n, "%s", r->type == REDIS_REPLY_STRING ? r->str : "");
    freeReplyObject(r);
    redisFree(d);
}

static void test_forwards(void **state)
{
    (void)state;
    long before = fx_proxy_accepted(proxy);
    redisContext *c = via_proxy();
    redisReply *r = redisCommand(c, "SET pk1 hello");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
    r = redisCommand(c, "GET pk1");
    assert_non_null(r);
    assert_string_equal(r->str, "hello");
    freeReplyObject(r);
    redisFree(c);
    assert_true(fx_proxy_accepted(proxy) >= before + 1);
}

static void test_delay(void **state)
{
    (void)state;
    redisContext *c = via_proxy();
    struct timeval tv = {2, 0};
    redisSetTimeout(c, tv);
    fx_proxy_set_delay(proxy, 5000, 5000);
    long long t0 = fx_now_ns();
    redisReply *r = redisCommand(c, "PING");
    long long took = fx_now_ns() - t0;
    fx_proxy_set_delay(proxy, 0, 0);
    assert_non_null(r);
    freeReplyObject(r);
    assert_true(took >= 10LL * 1000000LL); /* 5 ms each way */
    redisFree(c);
}

static void test_hold_delivers_late(void **state)
{
    (void)state;
    char v[32];
    redisContext *a = via_proxy();
    fx_proxy_hold_next(proxy, "pk-held");
    redisReply *r = redisCommand(a, "SET pk-held v");
    assert_null(r); /* held: the client times out */
    assert_int_equal(fx_proxy_wait_held(proxy, 2000), 0);
    redisFree(a); /* the client gives up and closes */
    /* Another connection works meanwhile. */
    redisContext *b = via_proxy();
    r = redisCommand(b, "PING");
    assert_non_null(r);
    freeReplyObject(r);
    redisFree(b);
    direct_get("pk-held", v, sizeof v);
    assert_string_equal(v, "");
    fx_proxy_release_held(proxy);
    assert_int_equal(fx_proxy_wait_released(proxy, 2000), 0);
    for (int i = 0; i < 200; i++) {
        direct_get("pk-held", v, sizeof v);
        if (v[0])
            break;
        fx_sleep_ms(10);
    }
    assert_string_equal(v, "v");
}

static void test_stall(void **state)
{
    (void)state;
    redisContext *c = via_proxy();
    fx_proxy_stall(proxy, 1);
    redisReply *r = redisCommand(c, "PING");
    assert_null(r);
    redisFree(c);
    fx_proxy_stall(proxy, 0);
    c = via_proxy();
    r = redisCommand(c, "PING");
    assert_non_null(r);
    freeReplyObject(r);
    redisFree(c);
}

static void test_reset_all(void **state)
{
    (void)state;
    redisContext *c = via_proxy();
    redisReply *r = redisCommand(c, "PING");
    assert_non_null(r);
    freeReplyObject(r);
    assert_true(fx_proxy_reset_all(proxy) >= 1);
    r = redisCommand(c, "PING");
    assert_null(r);
    assert_true(c->err == REDIS_ERR_IO || c->err == REDIS_ERR_EOF);
    redisFree(c);
    c = via_proxy();
    r = redisCommand(c, "PING");
    assert_non_null(r);
    freeReplyObject(r);
    redisFree(c);
}

static void test_cut(void **state)
{
    (void)state;
    char v[32];
    redisContext *c = via_proxy();
    fx_proxy_cut_next(proxy, "pk-cut");
    redisReply *r = redisCommand(c, "SET pk-cut ran");
    assert_null(r);
    assert_true(c->err == REDIS_ERR_IO || c->err == REDIS_ERR_EOF);
    assert_int_equal(fx_proxy_cut_done(proxy), 1);
    redisFree(c);
    direct_get("pk-cut", v, sizeof v);
    assert_string_equal(v, "ran");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forwards),
        cmocka_unit_test(test_delay),
        cmocka_unit_test(test_hold_delivers_late),
        cmocka_unit_test(test_stall),
        cmocka_unit_test(test_reset_all),
        cmocka_unit_test(test_cut),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
