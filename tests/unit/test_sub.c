/*
 * The subscriber (src/global/sub.h) against a private redis-server
 * (tests/support/fixture.h): messages arrive with their payloads, in order, none
 * lost on a healthy connection, and only those of our channel; exactly one
 * subscription exists on the server; after the server drops the connection
 * (CLIENT KILL), is killed and restarted, or freezes (SIGSTOP, found by the
 * keepalive PING) the subscriber subscribes again and says so once per
 * reconnection; it starts before its Redis; and stopping it is prompt while
 * Redis is down or frozen.
 *
 * Timing: every wait is bounded, and bounds are upper bounds only, several
 * times the duration they guard, because this runs on a loaded 2-core
 * machine and under sanitizers.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "global/sub.h"


#define CHANNEL "dlock:wake:0123456789abcdef0123456789abcdef"
#define OTHER "dlock:wake:ffffffffffffffffffffffffffffffff"

/* Connect 500 ms, command 1000 ms: as fx_config. */
#define CONNECT_MS 500
#define COMMAND_MS 1000
/*
 * The bound on dlock_sub_stop while Redis is down or frozen. sub.h promises
 * the poll interval (100 ms), or, when the thread is opening a connection,
 * the connect timeout (500 ms) plus one command timeout (1000 ms) for a setup
 * command the frozen server never answers: 1.6 s at most. 5 s leaves room for
 * a loaded machine and sanitizers without hiding a thread that waits for the
 * server to come back (that would never return here).
 */
#define STOP_BOUND_MS 5000

/* ------------------------------------------------------------ recorder */

typedef struct rec {
    pthread_mutex_t mu;
    uint64_t msgs;       /* messages received */
    uint64_t seq_next;   /* next expected "seq:<n>" */
    uint64_t bad;        /* payloads out of order or not ours */
    uint64_t resubs;     /* on_resubscribed calls */
    uint64_t subs;       /* on_subscribed calls */
    char last[128];      /* last payload (NUL-terminated copy) */
    size_t last_len;
} rec;

static void rec_init(rec *r)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
}

static void rec_destroy(rec *r)
{
    pthread_mutex_destroy(&r->mu);
}

static void on_message(void *arg, const char *payload, size_t len)
{
    rec *r = arg;
    pthread_mutex_lock(&r->mu);
    r->msgs++;
    if (payload[len] != '\0')
        r->bad++;
    if (len > 4 && memcmp(payload, "seq:", 4) == 0) {
        char *end;
        unsigned long long n = strtoull(payload + 4, &end, 10);
        if (end != payload + len || n != r->seq_next)
            r->bad++;
        r->seq_next = n + 1;
    } else if (len >= 5 && memcmp(payload, "other", 5) == 0) {
        r->bad++; /* published on the other channel only */
    }
    size_t n = len < sizeof r->last - 1 ? len : sizeof r->last - 1;
    memcpy(r->last, payload, n);
    r->last[n] = '\0';
    r->last_len = len;
    pthread_mutex_unlock(&r->mu);
}

static void on_resubscribed(void *arg)
{
    rec *r = arg;
    pthread_mutex_lock(&r->mu);
    r->resubs++;
    pthread_mutex_unlock(&r->mu);
}

static void on_subscribed(void *arg)
{
    rec *r = arg;
    pthread_mutex_lock(&r->mu);
    r->subs++;
    pthread_mutex_unlock(&r->mu);
}

static uint64_t rec_get(rec *r, const uint64_t *field)
{
    pthread_mutex_lock(&r->mu);
    uint64_t v = *field;
    pthread_mutex_unlock(&r->mu);
    return v;
}

static int rec_last_is(rec *r, const char *s)
{
    pthread_mutex_lock(&r->mu);
    int eq = strcmp(r->last, s) == 0;
    pthread_mutex_unlock(&r->mu);
    return eq;
}

/* ------------------------------------------------------------- helpers */

static dlock_conn_cfg conn_cfg(int port)
{
    dlock_conn_cfg cfg = {.host = (char *)"127.0.0.1", .port = port, .connect_timeout_ms = CONNECT_MS,
                          .command_timeout_ms = COMMAND_MS};
    return cfg;
}

static dlock_sub *start_sub(const dlock_conn_cfg *cc, dlock_counters *ctr, rec *r)
{
    dlock_sub_cfg cfg = {cc, ctr, CHANNEL, on_message, on_resubscribed, r, on_subscribed};
    dlock_sub *s = NULL;
    assert_int_equal(dlock_sub_start(&cfg, &s), DLOCK_OK);
    assert_non_null(s);
    return s;
}

/* Polls cond every 10 ms for at most ms. 1 if it became true. */
#define WAIT_UNTIL(cond, ms)                                                   \
    ({                                                                         \
        long long dl_ = fx_now_ns() + (long long)(ms) * 1000000LL;             \
        int ok_;                                                               \
        while (!(ok_ = !!(cond)) && fx_now_ns() < dl_)                         \
            fx_sleep_ms(10);                                                   \
        ok_;                                                                   \
    })

static long long elapsed_ms(long long t0)
{
    return (fx_now_ns() - t0) / 1000000LL;
}

/* PUBLISH on a fresh connection; the number of receivers, or -1. */
static long long publish(int port, const char *channel, const char *payload)
{
    redisContext *c = fx_connect("127.0.0.1", port);
    if (!c)
        return -1;
    redisReply *r = redisCommand(c, "PUBLISH %s %s", channel, payload);
    long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return n;
}

/* PUBSUB NUMSUB channel, or -1. */
static long long numsub(int port, const char *channel)
{
    redisContext *c = fx_connect("127.0.0.1", port);
    if (!c)
        return -1;
    redisReply *r = redisCommand(c, "PUBSUB NUMSUB %s", channel);
    long long n = -1;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_INTEGER)
        n = r->element[1]->integer;
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return n;
}

/* Clients in CLIENT LIST TYPE pubsub, and those among them with exactly
 * one channel (sub=1) and no pattern (psub=0). -1 on error. */
static long long pubsub_clients(int port, long long *one_channel)
{
    redisContext *c = fx_connect("127.0.0.1", port);
    if (!c)
        return -1;
    redisReply *r = redisCommand(c, "CLIENT LIST TYPE pubsub");
    long long n = -1;
    *one_channel = 0;
    if (r && r->type == REDIS_REPLY_STRING) {
        n = 0;
        for (char *line = r->str; line && *line; n++) {
            char *eol = strchr(line, '\n');
            if (eol)
                *eol = '\0';
            if (strstr(line, " sub=1 ") && strstr(line, " psub=0 "))
                (*one_channel)++;
            line = eol ? eol + 1 : NULL;
        }
    }
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return n;
}

/* CLIENT KILL TYPE pubsub: the number of clients killed, or -1. */
static long long kill_pubsub(int port)
{
    redisContext *c = fx_connect("127.0.0.1", port);
    if (!c)
        return -1;
    redisReply *r = redisCommand(c, "CLIENT KILL TYPE pubsub");
    long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return n;
}

/* Publishes "after:<tag>" until it arrives (a message published before the
 * server registered a resubscription may be lost, by design), at most 10 s. */
static void expect_delivery(rec *r, int port, const char *tag)
{
    char payload[64];
    snprintf(payload, sizeof payload, "after:%s", tag);
    long long dl = fx_now_ns() + 10000LL * 1000000LL;
    int got = 0;
    while (!got && fx_now_ns() < dl) {
        publish(port, CHANNEL, payload);
        got = WAIT_UNTIL(rec_last_is(r, payload), 200);
    }
    assert_true(got);
}

/* --------------------------------------------------------------- tests */

static void test_invalid_args(void **state)
{
    (void)state;
    dlock_conn_cfg cc = conn_cfg(fx_server.port);
    dlock_sub *s = (dlock_sub *)1;
    dlock_sub_cfg cfg = {&cc, NULL, CHANNEL, on_message, NULL, NULL, NULL};
    assert_int_equal(dlock_sub_start(NULL, &s), DLOCK_EINVAL);
    assert_null(s);
    cfg.channel = "";
    assert_int_equal(dlock_sub_start(&cfg, &s), DLOCK_EINVAL);
    cfg.channel = NULL;
    assert_int_equal(dlock_sub_start(&cfg, &s), DLOCK_EINVAL);
    cfg.channel = CHANNEL;
    cfg.on_message = NULL;
    assert_int_equal(dlock_sub_start(&cfg, &s), DLOCK_EINVAL);
    cfg.on_message = on_message;
    cfg.conn = NULL;
    assert_int_equal(dlock_sub_start(&cfg, &s), DLOCK_EINVAL);
    assert_int_equal(dlock_sub_start(&cfg, NULL), DLOCK_EINVAL);
    dlock_sub_stop(NULL);
    assert_int_equal(dlock_sub_ready(NULL), 0);
}

/* 10000 messages, pipelined, interleaved with messages on another channel:
 * ours all arrive, in order, with their payloads; the others never do. */
static void test_messages_in_order(void **state)
{
    (void)state;
    enum { N = 10000, BATCH = 500 };
    dlock_counters ctr = {0};
    dlock_conn_cfg cc = conn_cfg(fx_server.port);
    rec r;
    rec_init(&r);
    dlock_sub *s = start_sub(&cc, &ctr, &r);
    assert_true(WAIT_UNTIL(dlock_sub_ready(s), 10000));
    assert_true(dlock_load_64(&ctr.redis_commands) >= 1); /* SUBSCRIBE counted */

    redisContext *c = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(c);
    long long receivers = 0, others = 0;
    for (int at = 0; at < N; at += BATCH) {
        for (int i = at; i < at + BATCH; i++) {
            char p[32];
            snprintf(p, sizeof p, "seq:%d", i);
            assert_int_equal(redisAppendCommand(c, "PUBLISH %s %s", CHANNEL, p), REDIS_OK);
            assert_int_equal(redisAppendCommand(c, "PUBLISH %s other%d", OTHER, i), REDIS_OK);
        }
        for (int i = 0; i < 2 * BATCH; i++) {
            redisReply *rep = NULL;
            assert_int_equal(redisGetReply(c, (void **)&rep), REDIS_OK);
            assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
            if (i % 2 == 0)
                receivers += rep->integer;
            else
                others += rep->integer;
            freeReplyObject(rep);
        }
    }
    /* A binary payload: an embedded NUL, length kept. */
    redisReply *rep = redisCommand(c, "PUBLISH %s %b", CHANNEL, "bin\0ary", (size_t)7);
    assert_non_null(rep);
    freeReplyObject(rep);
    redisFree(c);
    assert_int_equal(receivers, N); /* exactly one receiver each */
    assert_int_equal(others, 0);

    assert_true(WAIT_UNTIL(rec_get(&r, &r.msgs) == N + 1, 30000));
    assert_int_equal(rec_get(&r, &r.seq_next), N);
    assert_int_equal(rec_get(&r, &r.bad), 0);
    pthread_mutex_lock(&r.mu);
    assert_int_equal(r.last_len, 7);
    assert_memory_equal(r.last, "bin", 4); /* the copy stops at the NUL */
    pthread_mutex_unlock(&r.mu);
    assert_int_equal(rec_get(&r, &r.resubs), 0);
    assert_int_equal(rec_get(&r, &r.subs), 1); /* the first subscription too */
    assert_int_equal(dlock_sub_reconnects(s), 0);
    assert_int_equal(dlock_sub_ready(s), 1);
    dlock_sub_stop(s);
    assert_int_equal(rec_get(&r, &r.msgs), N + 1); /* nothing more arrived */
    rec_destroy(&r);
}

/* One connection, one channel, one subscription; none left after stop. */
static void test_one_subscription(void **state)
{
    (void)state;
    dlock_conn_cfg cc = conn_cfg(fx_server.port);
    rec r;
    rec_init(&r);
    dlock_sub *s = start_sub(&cc, NULL, &r); /* NULL counters are allowed */
    assert_true(WAIT_UNTIL(dlock_sub_ready(s), 10000));
    fx_sleep_ms(300); /* a duplicate subscription, if any, would show up */
    assert_int_equal(numsub(fx_server.port, CHANNEL), 1);
    long long one;
    assert_int_equal(pubsub_clients(fx_server.port, &one), 1);
    assert_int_equal(one, 1);
    dlock_sub_stop(s);
    assert_true(WAIT_UNTIL(numsub(fx_server.port, CHANNEL) == 0, 5000));
    rec_destroy(&r);
}

/* The server drops the connection twice: each time the subscriber comes
 * back, calls on_resubscribed once, counts one reconnect, and gets later
 * messages. Still exactly one subscription. */
static void test_client_kill_reconnects(void **state)
{
    (void)state;
    dlock_counters ctr = {0};
    dlock_conn_cfg cc = conn_cfg(fx_server.port);
    rec r;
    rec_init(&r);
    dlock_sub *s = start_sub(&cc, &ctr, &r);
    assert_true(WAIT_UNTIL(dlock_sub_ready(s), 10000));
    expect_delivery(&r, fx_server.port, "first");
    /* Earlier tests' connections are gone: the kill hits only ours. */
    assert_true(WAIT_UNTIL(numsub(fx_server.port, CHANNEL) == 1, 5000));
    for (uint64_t k = 1; k <= 2; k++) {
        assert_int_equal(kill_pubsub(fx_server.port), 1);
        assert_true(WAIT_UNTIL(dlock_sub_reconnects(s) == k && dlock_sub_ready(s), 10000));
        assert_int_equal(rec_get(&r, &r.resubs), k);
        assert_int_equal(rec_get(&r, &r.subs), k + 1);
        /* Ready means the server confirmed: the first PUBLISH arrives. */
        char payload[32];
        snprintf(payload, sizeof payload, "after:kill%" PRIu64, k);
        assert_int_equal(publish(fx_server.port, CHANNEL, payload), 1);
        assert_true(WAIT_UNTIL(rec_last_is(&r, payload), 10000));
        assert_int_equal(numsub(fx_server.port, CHANNEL), 1);
    }
    fx_sleep_ms(200);
    assert_int_equal(dlock_sub_reconnects(s), 2); /* no spurious reconnects */
    assert_int_equal(rec_get(&r, &r.resubs), 2);
    assert_int_equal(rec_get(&r, &r.bad), 0);
    dlock_sub_stop(s);
    rec_destroy(&r);
}

/* SIGKILL and restart on the same port (an empty server): it recovers. */
static void test_server_restart(void **state)
{
    (void)state;
    dlock_counters ctr = {0};
    dlock_conn_cfg cc = conn_cfg(fx_server.port);
    rec r;
    rec_init(&r);
    dlock_sub *s = start_sub(&cc, &ctr, &r);
    assert_true(WAIT_UNTIL(dlock_sub_ready(s), 10000));
    assert_int_equal(fx_redis_signal(&fx_server, SIGKILL), 0);
    assert_true(WAIT_UNTIL(!dlock_sub_ready(s), 10000));
    fx_sleep_ms(500); /* a few failed attempts while it is down */
    assert_int_equal(dlock_sub_ready(s), 0);
    assert_int_equal(fx_redis_restart(&fx_server), 0);
    assert_true(WAIT_UNTIL(dlock_sub_ready(s) && dlock_sub_reconnects(s) == 1, 15000));
    assert_int_equal(rec_get(&r, &r.resubs), 1);
    expect_delivery(&r, fx_server.port, "restart");
    assert_int_equal(numsub(fx_server.port, CHANNEL), 1);
    dlock_sub_stop(s);
    rec_destroy(&r);
}

/* A frozen server does not close anything: only the keepalive PING finds it
 * (PING after 2 s idle, lost after a command timeout without an answer).
 * After SIGCONT the subscriber is back. */
static void test_frozen_server_detected(void **state)
{
    (void)state;
    dlock_counters ctr = {0};
    dlock_conn_cfg cc = conn_cfg(fx_server.port);
    rec r;
    rec_init(&r);
    dlock_sub *s = start_sub(&cc, &ctr, &r);
    assert_true(WAIT_UNTIL(dlock_sub_ready(s), 10000));
    assert_int_equal(fx_redis_signal(&fx_server, SIGSTOP), 0);
    assert_true(WAIT_UNTIL(!dlock_sub_ready(s), 20000));
    assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    assert_true(WAIT_UNTIL(dlock_sub_ready(s) && dlock_sub_reconnects(s) >= 1, 20000));
    assert_int_equal(rec_get(&r, &r.resubs), dlock_sub_reconnects(s));
    expect_delivery(&r, fx_server.port, "thawed");
    /* The connections opened while it was frozen are all gone now. */
    assert_true(WAIT_UNTIL(numsub(fx_server.port, CHANNEL) == 1, 10000));
    dlock_sub_stop(s);
    rec_destroy(&r);
}

/* Stop while the server is frozen: once with the thread waiting in poll on a
 * healthy-looking connection, once while it is reconnecting to the frozen
 * server (SELECT makes dlock_conn_open send a command that never gets an
 * answer). */
static void test_stop_while_frozen(void **state)
{
    (void)state;
    for (int round = 0; round < 2; round++) {
        dlock_conn_cfg cc = conn_cfg(fx_server.port);
        cc.db = round; /* round 1: SELECT 1 on every connect */
        rec r;
        rec_init(&r);
        dlock_sub *s = start_sub(&cc, NULL, &r);
        assert_true(WAIT_UNTIL(dlock_sub_ready(s), 10000));
        assert_int_equal(fx_redis_signal(&fx_server, SIGSTOP), 0);
        if (round == 1) {
            assert_true(WAIT_UNTIL(!dlock_sub_ready(s), 20000));
            fx_sleep_ms(700); /* somewhere in connect, SELECT, backoff or SUBSCRIBE */
        } else {
            fx_sleep_ms(200);
        }
        long long t0 = fx_now_ns();
        dlock_sub_stop(s);
        long long took = elapsed_ms(t0);
        assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
        print_message("stop with a frozen server (round %d): %lld ms\n", round, took);
        assert_true(took < STOP_BOUND_MS);
        rec_destroy(&r);
    }
}

/* Nothing listens: start succeeds, nothing is ready, stop is prompt. */
static void test_down_from_start(void **state)
{
    (void)state;
    fx_redis dead;
    assert_int_equal(fx_redis_start(&dead), 0);
    int port = dead.port;
    fx_redis_stop(&dead);
    dlock_conn_cfg cc = conn_cfg(port);
    rec r;
    rec_init(&r);
    dlock_sub *s = start_sub(&cc, NULL, &r);
    fx_sleep_ms(1500); /* a few attempts, up to the longest backoff */
    assert_int_equal(dlock_sub_ready(s), 0);
    long long t0 = fx_now_ns();
    dlock_sub_stop(s);
    long long took = elapsed_ms(t0);
    print_message("stop with redis down: %lld ms\n", took);
    assert_true(took < STOP_BOUND_MS);
    rec_destroy(&r);
}

/* The subscriber starts before its Redis and subscribes once Redis is up:
 * that first subscription is not a re-subscription. */
static void test_redis_starts_later(void **state)
{
    (void)state;
    fx_redis late;
    assert_int_equal(fx_redis_start(&late), 0);
    assert_int_equal(fx_redis_signal(&late, SIGKILL), 0); /* port and dir kept */
    dlock_counters ctr = {0};
    dlock_conn_cfg cc = conn_cfg(late.port);
    rec r;
    rec_init(&r);
    dlock_sub *s = start_sub(&cc, &ctr, &r);
    fx_sleep_ms(1200);
    assert_int_equal(dlock_sub_ready(s), 0);
    assert_int_equal(fx_redis_restart(&late), 0);
    assert_true(WAIT_UNTIL(dlock_sub_ready(s), 15000));
    assert_int_equal(dlock_sub_reconnects(s), 0);
    assert_int_equal(rec_get(&r, &r.resubs), 0);
    assert_int_equal(publish(late.port, CHANNEL, "after:late"), 1);
    assert_true(WAIT_UNTIL(rec_last_is(&r, "after:late"), 10000));
    dlock_sub_stop(s);
    fx_redis_stop(&late);
    rec_destroy(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalid_args),
        cmocka_unit_test(test_messages_in_order),
        cmocka_unit_test(test_one_subscription),
        cmocka_unit_test_teardown(test_client_kill_reconnects, fx_ensure_server),
        cmocka_unit_test_teardown(test_server_restart, fx_ensure_server),
        cmocka_unit_test_teardown(test_frozen_server_detected, fx_ensure_server),
        cmocka_unit_test_teardown(test_stop_while_frozen, fx_ensure_server),
        cmocka_unit_test(test_down_from_start),
        cmocka_unit_test(test_redis_starts_later),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
