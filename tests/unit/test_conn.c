/*
 * The Redis connection module against a real redis-server: opening (AUTH,
 * SELECT, script digests), EVALSHA with its EVAL fallback after the server
 * forgot the scripts, and the caller threads' pool (limit, reuse, broken
 * connections dropped, waits bounded by the command timeout). Where the
 * server is: the checks of host/port, Unix socket and sentinels in the
 * config, "host:port" lists, a server on a Unix socket, and an ACL user
 * with exactly the rule of docs/deployments.md (and without parts of it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <hiredis/sds.h>

#include <cmocka.h>

#include "conn/conn.h"
#include "fixture.h"


static dlock_conn_cfg conn_cfg(int port)
{
    dlock_conn_cfg cfg = {.host = (char *)"127.0.0.1", .port = port, .connect_timeout_ms = 500,
                          .command_timeout_ms = 1000};
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

    const char *argv[15] = {"t:{n}", "t:{n}:fence", "t:{n}:q", "t:{n}:qd", "t:{n}:turn",
                            "t:{n}:c:0123456789abcdef0123456789abcdef", "t:hw:{x}",
                            "0123456789abcdef0123456789abcdef", "5000", "1", "16", "2000", "1",
                            "10000", "test"};
    r = dlock_conn_eval(c, &ctr, dlock_conn_deadline(1000), DLOCK_SCRIPT_ACQUIRE, 7, 8, argv, NULL);
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
    cfg.password = (char *)"secret"; /* the server has no password: a refusal no retry cures */
    assert_int_equal(dlock_conn_open(&cfg, &ctr, &c), DLOCK_ESERVER);
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
    const char *argv[15] = {"t:{p}", "t:{p}:fence", "t:{p}:q", "t:{p}:qd", "t:{p}:turn",
                            "t:{p}:c:0123456789abcdef0123456789abcdef", "t:hw:{x}",
                            "0123456789abcdef0123456789abcdef", "5000", "1", "16", "2000", "1",
                            "10000", "test"};
    r = dlock_conn_eval(c, &ctr, dlock_conn_deadline(1000), DLOCK_SCRIPT_ACQUIRE, 7, 8, argv, NULL);
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
        assert_int_equal(dlock_conn_check_info(ok[i], 1), DLOCK_OK);
    const char *bad[] = {
        "redis_version:4.0.14\r\nmaxmemory:0\r\n",
        "redis_version:7.0.15\r\nmaxmemory:104857600\r\nmaxmemory_policy:allkeys-lru\r\n",
        "redis_version:7.0.15\r\nmaxmemory:104857600\r\nmaxmemory_policy:volatile-ttl\r\n",
        "maxmemory:0\r\n", /* not a Redis INFO */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(dlock_conn_check_info(bad[i], 1), DLOCK_ESERVER);
    assert_int_equal(dlock_conn_check_info(bad[2], 1), DLOCK_ESERVER);
    assert_non_null(strstr(dlock_last_error(), "volatile-ttl"));
    assert_int_equal(dlock_conn_check_info(bad[0], 1), DLOCK_ESERVER);
    assert_non_null(strstr(dlock_last_error(), "Redis 5"));
    /* protocol 2 needs Redis 7.0: 6.2 fits protocol 1 only */
    assert_int_equal(dlock_conn_check_info(ok[2], 2), DLOCK_ESERVER);
    assert_non_null(strstr(dlock_last_error(), "too old for protocol 2"));
    assert_int_equal(dlock_conn_check_info(ok[1], 2), DLOCK_ESERVER);
    assert_int_equal(dlock_conn_check_info(ok[0], 2), DLOCK_OK);
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


/* Settings that name the server: exactly one of host/port, Unix socket and
 * sentinels; the message says which. */
static void test_config_server_conflicts(void **state)
{
    (void)state;
    struct {
        const char *host;
        int port;
        const char *unix_path, *sentinels, *master, *sentinel_password, *user, *password;
        const char *msg; /* NULL: valid */
    } cases[] = {
        {"127.0.0.1", 6379, "/tmp/r.sock", NULL, NULL, NULL, NULL, NULL, NULL},
        {NULL, 6379, "/tmp/r.sock", NULL, NULL, NULL, NULL, NULL, NULL},
        {"10.0.0.1", 6379, "/tmp/r.sock", NULL, NULL, NULL, NULL, NULL, "redis_unix_path and redis_host"},
        {"127.0.0.1", 6380, "/tmp/r.sock", NULL, NULL, NULL, NULL, NULL, "redis_unix_path and redis_host"},
        {"127.0.0.1", 6379, "", NULL, NULL, NULL, NULL, NULL, "redis_unix_path is empty"},
        {"127.0.0.1", 6379, "/tmp/r.sock", "127.0.0.1:26379", "m", NULL, NULL, NULL, "both name"},
        {"127.0.0.1", 6379, NULL, "127.0.0.1:26379", "m", NULL, NULL, NULL, NULL},
        {NULL, 6379, NULL, "127.0.0.1:26379,[::1]:26380", "m", "pw", NULL, NULL, NULL},
        {NULL, 6380, NULL, "127.0.0.1:26379", "m", NULL, NULL, NULL, "sentinels and redis_host"},
        {"redis.example", 6379, NULL, "127.0.0.1:26379", "m", NULL, NULL, NULL, "sentinels and redis_host"},
        {"127.0.0.1", 6379, NULL, "127.0.0.1:26379", NULL, NULL, NULL, NULL, "sentinel_master"},
        {"127.0.0.1", 6379, NULL, "127.0.0.1", "m", NULL, NULL, NULL, "not host:port"},
        {"127.0.0.1", 6379, NULL, "127.0.0.1:26379,,x:1", "m", NULL, NULL, NULL, "not host:port"},
        {"127.0.0.1", 6379, NULL, "127.0.0.1:0", "m", NULL, NULL, NULL, "not host:port"},
        {"127.0.0.1", 6379, NULL, NULL, "m", NULL, NULL, NULL, "sentinel_master is set"},
        {"127.0.0.1", 6379, NULL, NULL, NULL, "pw", NULL, NULL, "sentinel_password is set"},
        {"127.0.0.1", 6379, NULL, NULL, NULL, NULL, "dlock", NULL, "needs redis_password"},
        {"127.0.0.1", 6379, NULL, NULL, NULL, NULL, "", "pw", "redis_username is empty"},
        {"127.0.0.1", 6379, NULL, NULL, NULL, NULL, "dlock", "pw", NULL},
        {NULL, 6379, NULL, NULL, NULL, NULL, NULL, NULL, "redis_host is NULL"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dlock_config cfg;
        dlock_config_init(&cfg);
        cfg.redis_host = cases[i].host;
        cfg.redis_port = cases[i].port;
        cfg.redis_unix_path = cases[i].unix_path;
        cfg.sentinels = cases[i].sentinels;
        cfg.sentinel_master = cases[i].master;
        cfg.sentinel_password = cases[i].sentinel_password;
        cfg.redis_username = cases[i].user;
        cfg.redis_password = cases[i].password;
        dlock_client *c = NULL;
        int rc = dlock_client_open(&cfg, &c);
        if (cases[i].msg) {
            if (rc != DLOCK_EINVAL || !strstr(dlock_last_error(), cases[i].msg))
                fail_msg("case %zu: %s \"%s\", expected DLOCK_EINVAL \"...%s...\"", i,
                         dlock_err_name(rc), dlock_last_error(), cases[i].msg);
            assert_null(c);
        } else {
            if (rc != DLOCK_OK)
                fail_msg("case %zu: %s \"%s\", expected DLOCK_OK", i, dlock_err_name(rc),
                         dlock_last_error());
            dlock_client_close(c);
        }
    }
    dlock_addr *a;
    unsigned n;
    assert_int_equal(dlock_addrs_parse(" 127.0.0.1:1 , [::1]:65535,h:7", "x", &a, &n), DLOCK_OK);
    assert_int_equal(n, 3);
    assert_string_equal(a[0].host, "127.0.0.1");
    assert_int_equal(a[0].port, 1);
    assert_string_equal(a[1].host, "::1");
    assert_int_equal(a[1].port, 65535);
    assert_string_equal(a[2].host, "h");
    assert_int_equal(a[2].port, 7);
    dlock_addrs_free(a, n);
    assert_int_equal(dlock_addrs_parse("h:65536", "x", &a, &n), DLOCK_EINVAL);
    assert_int_equal(dlock_addrs_parse(":1", "x", &a, &n), DLOCK_EINVAL);
    assert_int_equal(dlock_addrs_parse("h:1x", "x", &a, &n), DLOCK_EINVAL);
    assert_int_equal(dlock_addrs_parse("a:1:2", "x", &a, &n), DLOCK_EINVAL);
    assert_int_equal(dlock_addrs_parse("[a:1", "x", &a, &n), DLOCK_EINVAL);
    assert_int_equal(dlock_addrs_parse("a: 80", "x", &a, &n), DLOCK_EINVAL);
    assert_int_equal(dlock_addrs_parse("", "x", &a, &n), DLOCK_EINVAL);
}


/* A thread that acquires `name` on c, waiting up to 10 s (a bound only
 * against a hang: the grant comes within milliseconds), and releases it. */
typedef struct waiter {
    dlock_client *c;
    const char *name;
    int rc, release_rc;
    uint64_t fence;
} waiter;

static void *wait_for(void *arg)
{
    waiter *w = arg;
    w->rc = dlock_acquire(w->c, w->name, 10000, &w->fence);
    w->release_rc = w->rc == DLOCK_OK ? dlock_release(w->c, w->name) : w->rc;
    return NULL;
}

/* Waits (at most 10 s) until key exists on the server at port (read over
 * TCP): a client has joined a wait queue. 0, or -1. */
static int wait_queued(int port, const char *key)
{
    redisContext *k = fx_connect("127.0.0.1", port);
    if (!k)
        return -1;
    int found = 0;
    for (int i = 0; i < 10000 && !found; i++) {
        redisReply *x = redisCommand(k, "EXISTS %s", key);
        found = x && x->type == REDIS_REPLY_INTEGER && x->integer == 1;
        if (x)
            freeReplyObject(x);
        if (!found)
            fx_sleep_ms(1);
    }
    redisFree(k);
    return found ? 0 : -1;
}

/* Waits (at most 10 s) until n channels matching pattern have subscribers
 * on the server at port: the clients' subscribers are subscribed. 0, or -1. */
static int wait_channels(int port, const char *pattern, size_t n)
{
    redisContext *k = fx_connect("127.0.0.1", port);
    if (!k)
        return -1;
    int found = 0;
    for (int i = 0; i < 1000 && !found; i++) {
        redisReply *x = redisCommand(k, "PUBSUB CHANNELS %s", pattern);
        found = x && x->type == REDIS_REPLY_ARRAY && x->elements >= n;
        if (x)
            freeReplyObject(x);
        if (!found)
            fx_sleep_ms(10);
    }
    redisFree(k);
    return found ? 0 : -1;
}

/* Counts the lines of CLIENT LIST (read over TCP) whose address contains
 * `needle`. */
static int clients_matching(int port, const char *needle)
{
    redisContext *c = fx_connect("127.0.0.1", port);
    assert_non_null(c);
    redisReply *r = redisCommand(c, "CLIENT LIST");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    int n = 0;
    for (const char *p = r->str; (p = strstr(p, needle)); p++)
        n++;
    freeReplyObject(r);
    redisFree(c);
    return n;
}

/* Two clients over a Unix socket: exclusion, a handoff woken through the
 * subscriber, every connection on the socket. */
static void test_unix_socket(void **state)
{
    (void)state;
    fx_redis_opts o = {.unix_socket = 1};
    fx_redis r;
    assert_int_equal(fx_redis_start_opts(&r, &o), 0);
    dlock_config cfg;
    dlock_config_init(&cfg);
    cfg.redis_host = NULL;
    cfg.redis_unix_path = r.unix_path;
    cfg.key_prefix = "tc:unix:";
    dlock_client *a, *b;
    assert_int_equal(dlock_client_open(&cfg, &a), DLOCK_OK);
    assert_int_equal(dlock_client_open(&cfg, &b), DLOCK_OK);
    assert_int_equal(wait_channels(r.port, "tc:unix:wake:*", 2), 0);
    uint64_t fa;
    assert_int_equal(dlock_acquire(a, "u", 0, &fa), DLOCK_OK);
    assert_int_equal(dlock_acquire(b, "u", 0, NULL), DLOCK_EBUSY);
    /* b waits in Redis's queue; a's release grants it the lease and tells
     * it on its channel: a direct grant proves the subscriber's socket. */
    waiter w = {.c = b, .name = "u"};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_for, &w), 0);
    assert_int_equal(wait_queued(r.port, "tc:unix:{u}:q"), 0);
    assert_int_equal(dlock_release(a, "u"), DLOCK_OK);
    pthread_join(t, NULL);
    assert_int_equal(w.rc, DLOCK_OK);
    assert_int_equal(w.release_rc, DLOCK_OK);
    assert_true(w.fence > fa);
    dlock_stats st;
    assert_int_equal(dlock_client_stats(b, &st), DLOCK_OK);
    assert_int_equal(st.direct_grants, 1);
    /* the subscriber and at least one pooled connection of each client */
    assert_true(clients_matching(r.port, "redis.sock") >= 4);
    dlock_client_close(a);
    dlock_client_close(b);

    /* a socket where no server listens: a clear error at the first call */
    char missing[320];
    snprintf(missing, sizeof missing, "%s.missing", r.unix_path);
    cfg.redis_unix_path = missing;
    assert_int_equal(dlock_client_open(&cfg, &a), DLOCK_OK);
    assert_int_equal(dlock_acquire(a, "u", 0, NULL), DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "unix:"));
    dlock_client_close(a);
    fx_redis_stop(&r);
}

/* The ACL rule of docs/deployments.md (Deployments: ACL user) for key_prefix
 * "tc:acl:", without the user's name and password. */
#define ACL_RULE(P)                                                                      \
    "resetkeys ~" P "* resetchannels &" P "wake:* -@all +evalsha +eval +script|load "   \
    "+info +ping +role +wait +select +subscribe +client|setname +hmget +hget +hset +hdel " \
    "+hlen +hgetall +get +mget +set +del +exists +pexpire +pttl +time +zadd +zrange +zrem "  \
    "+zcard +publish"

/* ACL SETUSER name on >pw <rule>, split into words. */
static void acl_setuser(const char *name, const char *pw, const char *rule)
{
    const char *argv[64] = {"ACL", "SETUSER", name, "reset", "on"};
    size_t lens[64];
    int n = 5;
    char pass[64];
    snprintf(pass, sizeof pass, ">%s", pw);
    argv[n++] = pass;
    char *copy = strdup(rule), *save = NULL;
    assert_non_null(copy);
    for (char *w = strtok_r(copy, " ", &save); w && n < 64; w = strtok_r(NULL, " ", &save))
        argv[n++] = w;
    for (int i = 0; i < n; i++)
        lens[i] = strlen(argv[i]);
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(k);
    redisReply *r = redisCommandArgv(k, n, argv, lens);
    assert_non_null(r);
    if (r->type == REDIS_REPLY_ERROR)
        fail_msg("ACL SETUSER: %s", r->str);
    freeReplyObject(r);
    redisFree(k);
    free(copy);
}

static void acl_deluser(const char *name)
{
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(k);
    freeReplyObject(redisCommand(k, "ACL DELUSER %s", name));
    redisFree(k);
}

/* A client as ACL user `user` with password pw, prefix "tc:acl:". */
static dlock_client *acl_client(const char *user, const char *pw, uint32_t lease_ms,
                                uint32_t min_replicas)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tc:acl:";
    cfg.redis_username = user;
    cfg.redis_password = pw;
    cfg.lease_ms = lease_ms;
    cfg.min_replicas = min_replicas;
    dlock_client *c = NULL;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    return c;
}

/* A user with exactly the rule of docs/deployments.md can do everything dlock does: its
 * scripts, the wake-up channel (a direct grant), renewals; credentials or
 * permissions it lacks are DLOCK_ESERVER at the first call, with Redis'
 * reason. */
static void test_acl_user(void **state)
{
    (void)state;
    acl_setuser("dlock_t", "pw-t", ACL_RULE("tc:acl:"));
    dlock_client *a = acl_client("dlock_t", "pw-t", 300, 0);
    dlock_client *b = acl_client("dlock_t", "pw-t", 300, 0);
    assert_int_equal(wait_channels(fx_server.port, "tc:acl:wake:*", 2), 0);
    uint64_t fa, f2;
    int arc = dlock_acquire(a, "x", 0, &fa);
    if (arc != DLOCK_OK)
        fail_msg("acquire as the ACL user: %s: %s", dlock_err_name(arc), dlock_last_error());
    assert_int_equal(dlock_acquire(a, "x", 0, &f2), DLOCK_OK); /* reentrant */
    assert_int_equal(f2, fa);
    /* held past two renewal periods (lease 300 ms: renewed every 100 ms) */
    fx_sleep_ms(700);
    assert_int_equal(dlock_held(a, "x"), 1);
    dlock_stats st;
    assert_int_equal(dlock_client_stats(a, &st), DLOCK_OK);
    assert_true(st.renew_keys >= 2);
    assert_int_equal(st.leases_lost, 0);
    waiter w = {.c = b, .name = "x"};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_for, &w), 0);
    assert_int_equal(wait_queued(fx_server.port, "tc:acl:{x}:q"), 0);
    assert_int_equal(dlock_release(a, "x"), DLOCK_OK);
    assert_int_equal(dlock_release(a, "x"), DLOCK_OK);
    pthread_join(t, NULL);
    assert_int_equal(w.rc, DLOCK_OK);
    assert_int_equal(w.release_rc, DLOCK_OK);
    assert_true(w.fence > fa);
    assert_int_equal(dlock_client_stats(b, &st), DLOCK_OK);
    assert_int_equal(st.direct_grants, 1);
    dlock_client_close(a);
    dlock_client_close(b);

    struct {
        const char *user, *pw, *rule, *want;
        uint32_t min_replicas;
    } bad[] = {
        {"dlock_t", "wrong", NULL, "WRONGPASS", 0},
        {"nobody_t", "pw-t", NULL, "WRONGPASS", 0},
        /* no EVALSHA */
        {"dlock_n1", "pw", ACL_RULE("tc:acl:") " -evalsha", "evalsha", 0},
        /* keys of another prefix only */
        {"dlock_n2", "pw", ACL_RULE("other:"), "NOPERM", 0},
        /* no INFO: the server check at connect */
        {"dlock_n3", "pw", ACL_RULE("tc:acl:") " -info", "+info", 0},
        /* min_replicas without WAIT: said at connect, not as missing replicas */
        {"dlock_n4", "pw", ACL_RULE("tc:acl:") " -wait", "min_replicas needs it", 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (bad[i].rule)
            acl_setuser(bad[i].user, bad[i].pw, bad[i].rule);
        dlock_client *c = acl_client(bad[i].user, bad[i].pw, 30000, bad[i].min_replicas);
        int rc = dlock_acquire(c, "x", 0, NULL);
        if (rc != DLOCK_ESERVER || !strstr(dlock_last_error(), bad[i].want))
            fail_msg("case %zu: %s \"%s\", expected DLOCK_ESERVER \"...%s...\"", i,
                     dlock_err_name(rc), dlock_last_error(), bad[i].want);
        dlock_client_close(c);
        if (bad[i].rule)
            acl_deluser(bad[i].user);
    }
    acl_deluser("dlock_t");
}

/* The same rule for a client writing protocol 2, whose first release in a
 * hash of more than 16 fields prunes it (lua/p2/LAYOUT.txt: HLEN, HGETALL,
 * HDEL): 20 record fields past their time are put in first. */
/* A thread that waits for a permit of "sem" (limit 2) and gives it back. */
typedef struct sem_waiter {
    dlock_client *c;
    int rc;
} sem_waiter;

static void *sem_wait(void *arg)
{
    sem_waiter *w = arg;
    w->rc = dlock_sem_acquire(w->c, "sem", 2, 10000);
    if (w->rc == DLOCK_OK)
        w->rc = dlock_sem_release(w->c, "sem");
    return NULL;
}

static void test_acl_user_protocol_2(void **state)
{
    (void)state;
    acl_setuser("dlock_p2", "pw-2", ACL_RULE("tc:acl:"));
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(k);
    freeReplyObject(redisCommand(k, "DEL tc:acl:{p2}"));
    freeReplyObject(redisCommand(k, "HSET tc:acl:{p2} pv 2"));
    for (int i = 0; i < 20; i++) /* records that lasted until server ms 1 */
        freeReplyObject(redisCommand(k, "HSET tc:acl:{p2} c:old%d %s", i, "1 1 1 1"));
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tc:acl:";
    cfg.redis_username = "dlock_p2";
    cfg.redis_password = "pw-2";
    cfg.protocol = 2;
    dlock_client *c = NULL;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    int rc = dlock_acquire(c, "p2", 0, NULL);
    if (rc != DLOCK_OK)
        fail_msg("acquire as the ACL user: %s: %s", dlock_err_name(rc), dlock_last_error());
    rc = dlock_release(c, "p2");
    if (rc != DLOCK_OK)
        fail_msg("release as the ACL user: %s: %s", dlock_err_name(rc), dlock_last_error());
    redisReply *r = redisCommand(k, "HLEN tc:acl:{p2}");
    assert_true(r->integer < 20); /* pruned */
    freeReplyObject(r);
    /* The shared mode's scripts, as the same user: two readers (one a
     * second client), renewed, released; its commands are in the rule. */
    dlock_client *d = NULL;
    cfg.lease_ms = 300; /* renewed every 100 ms */
    assert_int_equal(dlock_client_open(&cfg, &d), DLOCK_OK);
    rc = dlock_acquire_shared(c, "p2", 0, NULL);
    if (rc != DLOCK_OK)
        fail_msg("shared acquire as the ACL user: %s: %s", dlock_err_name(rc),
                 dlock_last_error());
    assert_int_equal(dlock_acquire_shared(d, "p2", 0, NULL), DLOCK_OK);
    fx_sleep_ms(700); /* past two renewal periods of d's lease */
    assert_int_equal(dlock_held(d, "p2"), 1);
    assert_int_equal(dlock_release_shared(d, "p2"), DLOCK_OK);
    rc = dlock_release_shared(c, "p2");
    if (rc != DLOCK_OK)
        fail_msg("shared release as the ACL user: %s: %s", dlock_err_name(rc),
                 dlock_last_error());
    /* The semaphore's scripts, as the same user: two permits held and
     * renewed, a third client queued and granted directly at a release. */
    assert_int_equal(dlock_sem_acquire(c, "sem", 2, 0), DLOCK_OK);
    rc = dlock_sem_acquire(d, "sem", 2, 0);
    if (rc != DLOCK_OK)
        fail_msg("semaphore acquire as the ACL user: %s: %s", dlock_err_name(rc),
                 dlock_last_error());
    dlock_client *e = NULL;
    assert_int_equal(dlock_client_open(&cfg, &e), DLOCK_OK);
    sem_waiter sw = {e, -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, sem_wait, &sw), 0);
    fx_sleep_ms(700); /* past two renewal periods; the waiter queued */
    assert_int_equal(dlock_sem_release(d, "sem"), DLOCK_OK);
    pthread_join(th, NULL);
    if (sw.rc != DLOCK_OK)
        fail_msg("semaphore wait as the ACL user: %s", dlock_err_name(sw.rc));
    rc = dlock_sem_release(c, "sem");
    if (rc != DLOCK_OK)
        fail_msg("semaphore release as the ACL user: %s: %s", dlock_err_name(rc),
                 dlock_last_error());
    dlock_client_close(e);
    dlock_client_close(d);
    redisFree(k);
    dlock_client_close(c);
    acl_deluser("dlock_p2");
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
        cmocka_unit_test(test_config_server_conflicts),
        cmocka_unit_test(test_unix_socket),
        cmocka_unit_test(test_acl_user),
        cmocka_unit_test(test_acl_user_protocol_2),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
