/*
 * The Redis connection module against a real redis-server: opening (AUTH,
 * SELECT, script digests), EVALSHA with its EVAL fallback after the server
 * forgot the scripts, and the caller threads' pool (limit, reuse, broken
 * connections dropped, waits bounded by the command timeout).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <signal.h>
#include <string.h>

#include <hiredis/sds.h>

#include <cmocka.h>

#include "conn.h"
#include "fixture.h"


static dlock_conn_cfg conn_cfg(int port)
{
    dlock_conn_cfg cfg = {(char *)"127.0.0.1", port, NULL, 0, 500, 1000};
    return cfg;
}

static void test_open_loads_scripts(void **state)
{
    (void)state;
    dlock_counters ctr = {0};
    dlock_conn_cfg cfg = conn_cfg(fx_server.port);
    redisContext *c;
    assert_int_equal(dlock_conn_open(&cfg, &ctr, &c), DLOCK_OK);
    for (int id = 0; id < DLOCK_SCRIPT_COUNT; id++) {
        const char *sha = dlock_script_sha(id);
        assert_non_null(sha);
        assert_int_equal(strlen(sha), 40);
        redisReply *r = redisCommand(c, "SCRIPT EXISTS %s", sha);
        assert_non_null(r);
        assert_int_equal(r->element[0]->integer, 1);
        freeReplyObject(r);
    }
    redisFree(c);
}

/* A flushed (or restarted) server answers NOSCRIPT: the call still runs,
 * through EVAL, and the script is cached again for the next EVALSHA. */
static void test_eval_fallback_after_flush(void **state)
{
    (void)state;
    dlock_counters ctr = {0};
    dlock_conn_cfg cfg = conn_cfg(fx_server.port);
    redisContext *c;
    assert_int_equal(dlock_conn_open(&cfg, &ctr, &c), DLOCK_OK);
    redisReply *r = redisCommand(c, "SCRIPT FLUSH");
    freeReplyObject(r);
    long long evals = fx_info_calls("127.0.0.1", fx_server.port, "eval");

    const char *argv[13] = {"t:{n}", "t:{n}:fence", "t:{n}:q", "t:{n}:qd", "t:{n}:turn",
                            "t:{n}:c:0123456789abcdef0123456789abcdef",
                            "0123456789abcdef0123456789abcdef", "5000", "1", "16", "2000", "1",
                            "10000"};
    r = dlock_conn_eval(c, &ctr, dlock_conn_deadline(1000), DLOCK_SCRIPT_ACQUIRE, 6, 7, argv, NULL);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->element[0]->integer, 1);
    freeReplyObject(r);
    assert_int_equal(fx_info_calls("127.0.0.1", fx_server.port, "eval"), evals + 1);

    r = redisCommand(c, "SCRIPT EXISTS %s", dlock_script_sha(DLOCK_SCRIPT_ACQUIRE));
    assert_int_equal(r->element[0]->integer, 1);
    freeReplyObject(r);
    redisFree(c);
}

static void test_connect_refused(void **state)
{
    (void)state;
    fx_redis dead;
    assert_int_equal(fx_redis_start(&dead), 0);
    int port = dead.port;
    fx_redis_stop(&dead); /* nothing listens there now */
    dlock_counters ctr = {0};
    dlock_conn_cfg cfg = conn_cfg(port);
    redisContext *c = (redisContext *)1;
    assert_int_equal(dlock_conn_open(&cfg, &ctr, &c), DLOCK_EREDIS);
    assert_null(c);
    assert_non_null(strstr(dlock_last_error(), "connect"));
}

static void test_auth_and_select_errors(void **state)
{
    (void)state;
    dlock_counters ctr = {0};
    dlock_conn_cfg cfg = conn_cfg(fx_server.port);
    redisContext *c;
    cfg.password = (char *)"secret"; /* the server has no password */
    assert_int_equal(dlock_conn_open(&cfg, &ctr, &c), DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "AUTH"));
    cfg.password = NULL;
    cfg.db = 1000; /* beyond the server's 16 databases */
    assert_int_equal(dlock_conn_open(&cfg, &ctr, &c), DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "SELECT"));
    cfg.db = 3;
    assert_int_equal(dlock_conn_open(&cfg, &ctr, &c), DLOCK_OK);
    redisFree(c);
}

static void test_pool_limit_and_reuse(void **state)
{
    (void)state;
    dlock_counters ctr = {0};
    dlock_conn_cfg cfg = conn_cfg(fx_server.port);
    cfg.command_timeout_ms = 200;
    dlock_pool *p = dlock_pool_create(&cfg, 2, &ctr);
    redisContext *a, *b, *x;
    assert_int_equal(dlock_pool_get(p, DLOCK_NEVER, &a), DLOCK_OK);
    assert_int_equal(dlock_pool_get(p, DLOCK_NEVER, &b), DLOCK_OK);
    assert_ptr_not_equal(a, b);
    /* Full: the third caller waits the command timeout, then fails. */
    long long t0 = fx_now_ns();
    assert_int_equal(dlock_pool_get(p, DLOCK_NEVER, &x), DLOCK_EREDIS);
    long long waited_ms = (fx_now_ns() - t0) / 1000000;
    assert_true(waited_ms >= 190);
    assert_true(waited_ms < 5000); /* generous: a busy machine */

    dlock_pool_put(p, a, 0);
    assert_int_equal(dlock_pool_get(p, DLOCK_NEVER, &x), DLOCK_OK);
    assert_ptr_equal(x, a); /* the idle connection is reused */

    /* A broken connection is closed, and its slot opens a new one. */
    dlock_pool_put(p, x, 1);
    assert_int_equal(dlock_pool_get(p, DLOCK_NEVER, &x), DLOCK_OK);
    redisReply *r = redisCommand(x, "PING");
    assert_non_null(r);
    assert_string_equal(r->str, "PONG");
    freeReplyObject(r);
    dlock_pool_put(p, x, 0);
    dlock_pool_put(p, b, 0);
    dlock_pool_destroy(p);
}

/* A write to a connection the server has reset raises SIGPIPE, which kills
 * a process that does not ignore it (this test keeps the default action):
 * the library's calls must fail with an error instead. */
static void test_no_sigpipe_on_closed_connection(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_DFL);
    dlock_counters ctr = {0};
    dlock_conn_cfg cfg = conn_cfg(fx_server.port);
    redisContext *c;
    assert_int_equal(dlock_conn_open(&cfg, &ctr, &c), DLOCK_OK);
    redisReply *r = redisCommand(c, "CLIENT ID");
    long long id = r->integer;
    freeReplyObject(r);
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    freeReplyObject(redisCommand(k, "CLIENT KILL ID %lld", id));
    redisFree(k);
    /* A first write reaches the closed socket and draws a reset; the next
     * write, the library's, then fails with EPIPE. */
    int done = 0;
    redisAppendCommand(c, "PING");
    redisBufferWrite(c, &done);
    fx_sleep_ms(100);
    c->obuf[0] = '\0'; /* drop what hiredis still holds of the first PING */
    sdsclear(c->obuf);
    const char *argv[13] = {"t:{p}", "t:{p}:fence", "t:{p}:q", "t:{p}:qd", "t:{p}:turn",
                            "t:{p}:c:0123456789abcdef0123456789abcdef",
                            "0123456789abcdef0123456789abcdef", "5000", "1", "16", "2000", "1",
                            "10000"};
    r = dlock_conn_eval(c, &ctr, dlock_conn_deadline(1000), DLOCK_SCRIPT_ACQUIRE, 6, 7, argv, NULL);
    assert_null(r); /* an error, and the process is still alive */
    assert_true(c->err != 0);
    redisFree(c);
    sigset_t pending;
    sigpending(&pending);
    assert_false(sigismember(&pending, SIGPIPE)); /* consumed, not left behind */
}

/* The server checks at connect: Redis 5 or later (the scripts read TIME
 * before writing), and no eviction policy that could evict a live lease. */
static void test_info_check(void **state)
{
    (void)state;
    const char *ok[] = {
        "# Server\r\nredis_version:7.0.15\r\n# Memory\r\nmaxmemory:0\r\n"
        "maxmemory_policy:allkeys-lru\r\n",
        "redis_version:5.0.0\r\nmaxmemory:104857600\r\nmaxmemory_policy:noeviction\r\n",
        "redis_version:6.2.1\r\n", /* no memory section: no maxmemory */
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        assert_int_equal(dlock_conn_check_info(ok[i]), DLOCK_OK);
    const char *bad[] = {
        "redis_version:4.0.14\r\nmaxmemory:0\r\n",
        "redis_version:7.0.15\r\nmaxmemory:104857600\r\nmaxmemory_policy:allkeys-lru\r\n",
        "redis_version:7.0.15\r\nmaxmemory:104857600\r\nmaxmemory_policy:volatile-ttl\r\n",
        "maxmemory:0\r\n", /* not a Redis INFO */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(dlock_conn_check_info(bad[i]), DLOCK_ESERVER);
    assert_int_equal(dlock_conn_check_info(bad[2]), DLOCK_ESERVER);
    assert_non_null(strstr(dlock_last_error(), "volatile-ttl"));
    assert_int_equal(dlock_conn_check_info(bad[0]), DLOCK_ESERVER);
    assert_non_null(strstr(dlock_last_error(), "Redis 5"));
}

static void config_set(const char *param, const char *value)
{
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(k);
    redisReply *r = redisCommand(k, "CONFIG SET %s %s", param, value);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
    redisFree(k);
}

/* Against the real server: an evicting policy with maxmemory set is refused
 * with DLOCK_ESERVER and a message that says what to change, by the
 * connection module and by the first lock call; noeviction is accepted. */
static void test_evicting_server_refused(void **state)
{
    (void)state;
    dlock_counters ctr = {0};
    dlock_conn_cfg cfg = conn_cfg(fx_server.port);
    redisContext *c = NULL;
    config_set("maxmemory", "104857600");
    config_set("maxmemory-policy", "allkeys-lru");
    assert_int_equal(dlock_conn_open(&cfg, &ctr, &c), DLOCK_ESERVER);
    assert_null(c);
    assert_non_null(strstr(dlock_last_error(), "noeviction"));

    dlock_config dc;
    fx_config(&dc, &fx_server);
    dlock_client *client;
    assert_int_equal(dlock_client_open(&dc, &client), DLOCK_OK);
    assert_int_equal(dlock_acquire(client, "evict", 0, NULL), DLOCK_ESERVER);
    assert_non_null(strstr(dlock_last_error(), "allkeys-lru"));

    config_set("maxmemory-policy", "noeviction");
    assert_int_equal(dlock_acquire(client, "evict", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(client, "evict"), DLOCK_OK);
    dlock_client_close(client);
    config_set("maxmemory", "0");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_loads_scripts),
        cmocka_unit_test(test_eval_fallback_after_flush),
        cmocka_unit_test(test_connect_refused),
        cmocka_unit_test(test_auth_and_select_errors),
        cmocka_unit_test(test_pool_limit_and_reuse),
        cmocka_unit_test(test_no_sigpipe_on_closed_connection),
        cmocka_unit_test(test_info_check),
        cmocka_unit_test(test_evicting_server_refused),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
