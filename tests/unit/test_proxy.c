/*
 * The fault-injecting proxy (tests/support/proxy.h) in front of a real redis-server:
 * plain forwarding, delays (a lower bound only: the machine is noisy), a held
 * request that reaches Redis only when released (also after its client gave
 * up and closed), a stalled proxy, resets, and a cut reply. Each test starts
 * its own proxy. Eventual conditions are polled with generous bounds (the
 * sanitizer builds are several times slower).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fixture.h"
#include "proxy.h"

#define HOST "127.0.0.1"
#define EVENTUALLY_MS 5000  /* bound of every wait for an eventual condition */

/* A connection to port with `ms` connect and command timeouts, or NULL. */
static redisContext *connect_ms(int port, long ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout(HOST, port, tv);
    if (!c)
        return NULL;
    if (c->err || redisSetTimeout(c, tv) != REDIS_OK) {
        redisFree(c);
        return NULL;
    }
    return c;
}

static redisContext *direct(void)
{
    redisContext *c = fx_connect(HOST, fx_server.port);
    assert_non_null(c);
    return c;
}

static int ping(redisContext *c)
{
    redisReply *r = redisCommand(c, "PING");
    int ok = r && r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "PONG");
    if (r)
        freeReplyObject(r);
    return ok;
}

static void del(redisContext *c, const char *key)
{
    redisReply *r = redisCommand(c, "DEL %s", key);
    assert_non_null(r);
    freeReplyObject(r);
}

/* 1 if key holds val, 0 if it is absent; fails the test otherwise. */
static int key_is(redisContext *c, const char *key, const char *val)
{
    redisReply *r = redisCommand(c, "GET %s", key);
    assert_non_null(r);
    int found = r->type == REDIS_REPLY_STRING;
    if (found)
        assert_string_equal(r->str, val);
    else
        assert_int_equal(r->type, REDIS_REPLY_NIL);
    freeReplyObject(r);
    return found;
}

/* Polls (bounded) until key holds val: 1, or 0 if it did not in time. */
static int wait_key(redisContext *c, const char *key, const char *val)
{
    long long deadline = fx_now_ns() + EVENTUALLY_MS * 1000000LL;
    while (!key_is(c, key, val)) {
        if (fx_now_ns() >= deadline)
            return 0;
        fx_sleep_ms(5);
    }
    return 1;
}

/* Polls (bounded) until the proxy has n open pairs: 1, or 0. */
static int wait_open(fx_proxy *p, int n)
{
    long long deadline = fx_now_ns() + EVENTUALLY_MS * 1000000LL;
    while (fx_proxy_open(p) != n) {
        if (fx_now_ns() >= deadline)
            return 0;
        fx_sleep_ms(2);
    }
    return 1;
}

/* Sends what hiredis has buffered, without waiting for a reply. */
static void send_buffered(redisContext *c)
{
    int done = 0;
    while (!done)
        assert_int_equal(redisBufferWrite(c, &done), REDIS_OK);
}

static int io_error(const redisContext *c)
{
    return c->err == REDIS_ERR_IO || c->err == REDIS_ERR_EOF;
}

static void test_pass_through(void **state)
{
    (void)state;
    fx_proxy *p = fx_proxy_start(fx_server.port);
    assert_non_null(p);
    assert_true(fx_proxy_port(p) > 0);
    assert_int_equal(fx_proxy_accepted(p), 0);

    redisContext *c = connect_ms(fx_proxy_port(p), 2000);
    assert_non_null(c);
    redisReply *r = redisCommand(c, "SET pt:k hello");
    assert_non_null(r);
    assert_string_equal(r->str, "OK");
    freeReplyObject(r);
    r = redisCommand(c, "GET pt:k");
    assert_non_null(r);
    assert_string_equal(r->str, "hello");
    freeReplyObject(r);
    assert_int_equal(fx_proxy_accepted(p), 1);
    /* Counted once send() returned: a reply can reach the client first. */
    assert_true(fx_proxy_chunks_up(p) >= 2);
    long long deadline = fx_now_ns() + EVENTUALLY_MS * 1000000LL;
    while (fx_proxy_chunks_down(p) < 2 && fx_now_ns() < deadline)
        fx_sleep_ms(2);
    assert_true(fx_proxy_chunks_down(p) >= 2);

    /* 4 MiB each way: many chunks, partial writes. */
    size_t big = 4u << 20;
    char *val = malloc(big + 1);
    assert_non_null(val);
    for (size_t i = 0; i < big; i++)
        val[i] = (char)('a' + i % 26);
    val[big] = '\0';
    r = redisCommand(c, "SET pt:big %b", val, big);
    assert_non_null(r);
    assert_string_equal(r->str, "OK");
    freeReplyObject(r);
    r = redisCommand(c, "GET pt:big");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    assert_int_equal(r->len, big);
    assert_memory_equal(r->str, val, big);
    freeReplyObject(r);
    free(val);

    redisContext *c2 = connect_ms(fx_proxy_port(p), 2000);
    assert_non_null(c2);
    assert_true(ping(c2));
    assert_int_equal(fx_proxy_accepted(p), 2);
    assert_int_equal(fx_proxy_open(p), 2);

    /* A client that closes ends its pair (EOF passed on, Redis closes). */
    redisFree(c);
    redisFree(c2);
    assert_true(wait_open(p, 0));
    fx_proxy_stop(p);
}

static void test_delay(void **state)
{
    (void)state;
    fx_proxy *p = fx_proxy_start(fx_server.port);
    assert_non_null(p);
    redisContext *c = connect_ms(fx_proxy_port(p), 5000);
    assert_non_null(c);
    assert_true(ping(c));

    fx_proxy_set_delay(p, 5000, 5000);
    for (int i = 0; i < 3; i++) {
        long long t0 = fx_now_ns();
        assert_true(ping(c));
        assert_true(fx_now_ns() - t0 >= 10 * 1000000LL);
    }

    /* Below a millisecond: 2 x 200 us per round trip, not rounded away. */
    fx_proxy_set_delay(p, 200, 200);
    for (int i = 0; i < 20; i++) {
        long long t0 = fx_now_ns();
        assert_true(ping(c));
        assert_true(fx_now_ns() - t0 >= 400 * 1000LL);
    }

    fx_proxy_set_delay(p, 0, 0);
    assert_true(ping(c));
    redisFree(c);
    fx_proxy_stop(p);
}

/* 64 connections at once with a 200 us delay each way, pipelined rounds: the
 * one-loop delay path keeps up, keeps every reply, and honours the delay. */
static void test_delay_many_connections(void **state)
{
    (void)state;
    enum { CONNS = 64, ROUNDS = 20 };
    fx_proxy *p = fx_proxy_start(fx_server.port);
    assert_non_null(p);
    fx_proxy_set_delay(p, 200, 200);
    redisContext *c[CONNS];
    for (int i = 0; i < CONNS; i++) {
        c[i] = connect_ms(fx_proxy_port(p), 10000);
        assert_non_null(c[i]);
    }
    long up0 = fx_proxy_chunks_up(p);
    for (int round = 0; round < ROUNDS; round++) {
        long long t0 = fx_now_ns();
        for (int i = 0; i < CONNS; i++) {
            assert_int_equal(redisAppendCommand(c[i], "INCR storm:%d", i), REDIS_OK);
            send_buffered(c[i]);
        }
        for (int i = 0; i < CONNS; i++) {
            void *reply = NULL;
            assert_int_equal(redisGetReply(c[i], &reply), REDIS_OK);
            redisReply *r = reply;
            assert_int_equal(r->type, REDIS_REPLY_INTEGER);
            freeReplyObject(r);
        }
        assert_true(fx_now_ns() - t0 >= 400 * 1000LL);
    }
    assert_true(fx_proxy_chunks_up(p) - up0 >= CONNS * ROUNDS);
    redisContext *d = direct();
    for (int i = 0; i < CONNS; i++) {
        redisReply *r = redisCommand(d, "GETDEL storm:%d", i);
        assert_non_null(r);
        assert_int_equal(r->type, REDIS_REPLY_STRING);
        assert_int_equal(atoi(r->str), ROUNDS);
        freeReplyObject(r);
        redisFree(c[i]);
    }
    redisFree(d);
    assert_true(wait_open(p, 0));
    fx_proxy_stop(p);
}

/* The held SET reaches Redis only when released, after its client timed out
 * and closed; other connections flow meanwhile. */
static void test_hold_after_client_closed(void **state)
{
    (void)state;
    fx_proxy *p = fx_proxy_start(fx_server.port);
    assert_non_null(p);
    redisContext *d = direct();
    del(d, "k1");
    redisContext *a = connect_ms(fx_proxy_port(p), 200);
    assert_non_null(a);

    fx_proxy_hold_next(p, "k1");
    assert_int_equal(fx_proxy_held(p), 0);
    assert_int_equal(redisAppendCommand(a, "SET k1 v"), REDIS_OK);
    send_buffered(a);
    assert_int_equal(fx_proxy_wait_held(p, EVENTUALLY_MS), 0);
    assert_int_equal(fx_proxy_held(p), 1);
    assert_false(key_is(d, "k1", "v"));

    /* Another connection is served while A's request is held. */
    redisContext *b = connect_ms(fx_proxy_port(p), 5000);
    assert_non_null(b);
    assert_true(ping(b));
    assert_false(key_is(b, "k1", "v"));
    redisFree(b);

    void *reply = NULL;
    assert_int_equal(redisGetReply(a, &reply), REDIS_ERR); /* 200 ms timeout */
    assert_null(reply);
    assert_int_equal(a->err, REDIS_ERR_IO);
    redisFree(a);
    long long deadline = fx_now_ns() + EVENTUALLY_MS * 1000000LL;
    while (!fx_proxy_held_orphaned(p) && fx_now_ns() < deadline)
        fx_sleep_ms(2);
    assert_int_equal(fx_proxy_held_orphaned(p), 1);
    assert_true(wait_open(p, 1)); /* B's pair is gone, A's upstream side stays */
    assert_int_equal(fx_proxy_held(p), 1);
    assert_false(key_is(d, "k1", "v"));

    long long t0 = fx_now_ns();
    fx_proxy_release_held(p);
    assert_int_equal(fx_proxy_held(p), 0);
    assert_int_equal(fx_proxy_wait_released(p, EVENTUALLY_MS), 0);
    assert_true(wait_key(d, "k1", "v"));
    /* Upstream had at least 200 ms to answer before the pair was closed. */
    assert_true(wait_open(p, 0));
    assert_true(fx_now_ns() - t0 >= 200 * 1000000LL);

    del(d, "k1");
    redisFree(d);
    fx_proxy_stop(p);
}

/* A held request whose client waits gets its reply after the release. */
static void test_hold_release_live(void **state)
{
    (void)state;
    fx_proxy *p = fx_proxy_start(fx_server.port);
    assert_non_null(p);
    redisContext *d = direct();
    del(d, "k3");
    redisContext *a = connect_ms(fx_proxy_port(p), 10000);
    assert_non_null(a);

    fx_proxy_hold_next(p, "k3");
    assert_int_equal(redisAppendCommand(a, "SET k3 v"), REDIS_OK);
    send_buffered(a);
    assert_int_equal(fx_proxy_wait_held(p, EVENTUALLY_MS), 0);
    fx_sleep_ms(50);
    assert_false(key_is(d, "k3", "v"));
    fx_proxy_release_held(p);
    assert_int_equal(fx_proxy_wait_released(p, EVENTUALLY_MS), 0);

    void *reply = NULL;
    assert_int_equal(redisGetReply(a, &reply), REDIS_OK);
    redisReply *r = reply;
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    assert_string_equal(r->str, "OK");
    freeReplyObject(r);
    assert_true(key_is(d, "k3", "v"));
    assert_int_equal(fx_proxy_held_orphaned(p), 0);
    /* The connection goes on normally. */
    assert_true(ping(a));

    /* Nothing held: release disarms, wait_released returns at once. */
    fx_proxy_hold_next(p, "never-sent");
    fx_proxy_release_held(p);
    assert_int_equal(fx_proxy_wait_released(p, 0), 0);
    assert_true(ping(a));

    redisFree(a);
    del(d, "k3");
    redisFree(d);
    fx_proxy_stop(p);
}

/* A pattern split over two reads is still found (in the chunk where it ends). */
static void test_hold_pattern_across_chunks(void **state)
{
    (void)state;
    fx_proxy *p = fx_proxy_start(fx_server.port);
    assert_non_null(p);
    redisContext *d = direct();
    del(d, "k9");

    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons((unsigned short)fx_proxy_port(p));
    assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof addr), 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);

    fx_proxy_hold_next(p, "k9");
    static const char part1[] = "*3\r\n$3\r\nSET\r\n$2\r\nk";
    static const char part2[] = "9\r\n$1\r\nv\r\n";
    assert_int_equal(send(fd, part1, sizeof part1 - 1, MSG_NOSIGNAL), (ssize_t)sizeof part1 - 1);
    fx_sleep_ms(50); /* most likely two reads for the proxy */
    assert_int_equal(send(fd, part2, sizeof part2 - 1, MSG_NOSIGNAL), (ssize_t)sizeof part2 - 1);
    assert_int_equal(fx_proxy_wait_held(p, EVENTUALLY_MS), 0);
    fx_sleep_ms(50);
    assert_false(key_is(d, "k9", "v"));

    fx_proxy_release_held(p);
    assert_int_equal(fx_proxy_wait_released(p, EVENTUALLY_MS), 0);
    char buf[16];
    size_t got = 0;
    while (got < 5) {
        ssize_t n = recv(fd, buf + got, sizeof buf - got, 0);
        assert_true(n > 0);
        got += (size_t)n;
    }
    assert_memory_equal(buf, "+OK\r\n", 5);
    assert_true(key_is(d, "k9", "v"));
    close(fd);
    del(d, "k9");
    redisFree(d);
    fx_proxy_stop(p);
}

static void test_stall(void **state)
{
    (void)state;
    fx_proxy *p = fx_proxy_start(fx_server.port);
    assert_non_null(p);
    redisContext *c = connect_ms(fx_proxy_port(p), 200);
    assert_non_null(c);
    assert_true(ping(c));

    fx_proxy_stall(p, 1);
    redisReply *r = redisCommand(c, "PING");
    assert_null(r);
    assert_int_equal(c->err, REDIS_ERR_IO); /* timed out; the connection is open */
    redisFree(c);
    /* A new connection gets through the handshake (backlog) but no answer. */
    redisContext *n = connect_ms(fx_proxy_port(p), 200);
    assert_non_null(n);
    assert_false(ping(n));
    redisFree(n);
    assert_int_equal(fx_proxy_accepted(p), 1);

    fx_proxy_stall(p, 0);
    redisContext *c2 = connect_ms(fx_proxy_port(p), 5000);
    assert_non_null(c2);
    assert_true(ping(c2));
    redisFree(c2);
    fx_proxy_stop(p);
}

static void test_reset_all(void **state)
{
    (void)state;
    fx_proxy *p = fx_proxy_start(fx_server.port);
    assert_non_null(p);
    redisContext *c = connect_ms(fx_proxy_port(p), 5000);
    assert_non_null(c);
    assert_true(ping(c));

    assert_true(fx_proxy_reset_all(p) >= 1);
    assert_int_equal(fx_proxy_open(p), 0); /* synchronous */
    redisReply *r = redisCommand(c, "PING");
    assert_null(r);
    assert_true(io_error(c));
    redisFree(c);

    redisContext *c2 = connect_ms(fx_proxy_port(p), 5000);
    assert_non_null(c2);
    assert_true(ping(c2));
    redisFree(c2);

    /* Stalled: the connection waiting in the backlog is reset too. */
    fx_proxy_stall(p, 1);
    redisContext *c3 = connect_ms(fx_proxy_port(p), 5000);
    assert_non_null(c3);
    /* connect() may return before the listener queued the connection. */
    long long deadline = fx_now_ns() + EVENTUALLY_MS * 1000000LL;
    while (fx_proxy_reset_all(p) < 1) {
        assert_true(fx_now_ns() < deadline);
        fx_sleep_ms(2);
    }
    fx_proxy_stall(p, 0);
    r = redisCommand(c3, "PING");
    assert_null(r);
    assert_true(io_error(c3));
    redisFree(c3);
    fx_proxy_stop(p);
}

static void test_cut(void **state)
{
    (void)state;
    fx_proxy *p = fx_proxy_start(fx_server.port);
    assert_non_null(p);
    redisContext *d = direct();
    del(d, "k2");
    redisContext *c = connect_ms(fx_proxy_port(p), 5000);
    assert_non_null(c);
    assert_true(ping(c));

    fx_proxy_cut_next(p, "k2");
    assert_int_equal(fx_proxy_cut_done(p), 0);
    redisReply *r = redisCommand(c, "SET k2 v");
    assert_null(r);
    assert_true(io_error(c));
    assert_int_equal(fx_proxy_cut_done(p), 1);
    assert_true(key_is(d, "k2", "v")); /* the command ran */
    redisFree(c);

    /* Other connections are not affected, and the cut is used up. */
    redisContext *c2 = connect_ms(fx_proxy_port(p), 5000);
    assert_non_null(c2);
    r = redisCommand(c2, "GET k2");
    assert_non_null(r);
    assert_string_equal(r->str, "v");
    freeReplyObject(r);
    redisFree(c2);

    del(d, "k2");
    redisFree(d);
    fx_proxy_stop(p);
}

static void test_stop_with_open_connections(void **state)
{
    (void)state;
    fx_proxy_stop(NULL);
    fx_proxy *p = fx_proxy_start(fx_server.port);
    assert_non_null(p);
    redisContext *c = connect_ms(fx_proxy_port(p), 5000);
    assert_non_null(c);
    assert_true(ping(c));
    fx_proxy_set_delay(p, 2000000, 2000000);
    assert_int_equal(redisAppendCommand(c, "PING"), REDIS_OK);
    send_buffered(c);
    fx_proxy_hold_next(p, "zzz");
    fx_proxy_stop(p); /* queued data and an armed hold: all freed */
    redisReply *r = redisCommand(c, "PING");
    assert_null(r);
    assert_true(io_error(c));
    redisFree(c);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* hiredis writes to connections the proxy reset */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pass_through),
        cmocka_unit_test(test_delay),
        cmocka_unit_test(test_delay_many_connections),
        cmocka_unit_test(test_hold_after_client_closed),
        cmocka_unit_test(test_hold_release_live),
        cmocka_unit_test(test_hold_pattern_across_chunks),
        cmocka_unit_test(test_stall),
        cmocka_unit_test(test_reset_all),
        cmocka_unit_test(test_cut),
        cmocka_unit_test(test_stop_with_open_connections),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
