/*
 * Helpers shared by the tests of the public client API (test_client.c,
 * test_client_locking.c, test_client_faults.c, test_client_ops.c), each a
 * cmocka executable of its own against the private redis-server fx_server
 * (tests/support/fixture.h): a client on it, commands to it and what its keys
 * hold (the grant in either protocol's layout), a client's stats, and one
 * acquire on another thread (op).
 * static inline: each executable uses some of them.
 */
#ifndef DLOCK_TESTS_CLIENT_HELPERS_H
#define DLOCK_TESTS_CLIENT_HELPERS_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dlock.h"
#include "fixture.h"

#define MS(ns) ((ns) / 1000000LL)

static inline dlock_client *open_client(const char *prefix, uint32_t lease_ms)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = prefix;
    if (lease_ms)
        cfg.lease_ms = lease_ms;
    dlock_client *c = NULL;
    int rc = dlock_client_open(&cfg, &c);
    if (rc != DLOCK_OK)
        fail_msg("dlock_client_open: %s (%s)", dlock_err_name(rc), dlock_last_error());
    assert_non_null(c);
    return c;
}

static inline redisReply *cmd(const char *fmt, ...)
{
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    if (!k)
        fail_msg("cannot connect to the test redis on port %d", fx_server.port);
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(k, fmt, ap);
    va_end(ap);
    redisFree(k);
    if (!r)
        fail_msg("redis command failed");
    return r;
}

static inline void lease_key(char *out, size_t n, const char *prefix, const char *name)
{
    int w = snprintf(out, n, "%s{%s}", prefix, name);
    assert_true(w > 0 && (size_t)w < n);
}

static inline long long key_exists(const char *key)
{
    redisReply *r = cmd("EXISTS %b", key, strlen(key));
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

/* HGET as a malloc'd string, NULL when absent. */
static inline char *key_hget(const char *key, const char *field)
{
    redisReply *r = cmd("HGET %b %s", key, strlen(key), field);
    char *v = NULL;
    if (r->type == REDIS_REPLY_STRING)
        v = strdup(r->str);
    else
        assert_int_equal(r->type, REDIS_REPLY_NIL);
    freeReplyObject(r);
    return v;
}

/* A field of the grant of a name's key, "token" or "owner", in the layout
 * of whichever protocol wrote it (fx_grant_get), malloc'd, or NULL when no
 * grant stands. */
static inline char *grant_get(const char *key, const char *what)
{
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    if (!k)
        fail_msg("cannot connect to the test redis on port %d", fx_server.port);
    char *v = fx_grant_get(k, key, what);
    redisFree(k);
    return v;
}

/* The protocol of the name's data (fx_key_protocol: 1, 2, or 0 none). */
static inline int key_protocol(const char *key)
{
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    if (!k)
        fail_msg("cannot connect to the test redis on port %d", fx_server.port);
    int p = fx_key_protocol(k, key);
    redisFree(k);
    return p;
}

/* The protocol a client of fx_config writes to a name without data:
 * DLOCK_TEST_PROTOCOL's, else the library's default. */
static inline int config_protocol(void)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    return (int)cfg.protocol;
}

/* 1 if the name of key has a grant that has not run out by the server's
 * clock, in either protocol's layout (fx_lease_ms >= 0), 0 if it has none
 * (-2: released, expired, or never written). An unreachable server fails
 * the test rather than read as "no grant". */
static inline int lease_live(const char *key)
{
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    if (!k)
        fail_msg("cannot connect to the test redis on port %d", fx_server.port);
    long long ms = fx_lease_ms(k, key);
    redisFree(k);
    return ms >= 0;
}

static inline dlock_stats stats(dlock_client *c)
{
    dlock_stats s;
    memset(&s, 0xa5, sizeof s);
    assert_int_equal(dlock_client_stats(c, &s), DLOCK_OK);
    return s;
}

static inline void assert_table_empty(dlock_client *c)
{
    assert_int_equal(stats(c).leases_held, 0); /* exact once the callers are done */
    assert_int_equal(fx_entries_settled(c), 0);
}

/* One acquire (and optional release) on another thread. */
typedef struct op {
    dlock_client *c;
    const char *name;
    int64_t wait_ms;
    int release;        /* release after a successful acquire */
    int rc, rel_rc, held;
    uint64_t fence;
    long long elapsed_ns;
    atomic_int done;
    pthread_t th;
} op;

static inline void *op_main(void *arg)
{
    op *o = arg;
    long long t0 = fx_now_ns();
    o->rc = dlock_acquire(o->c, o->name, o->wait_ms, &o->fence);
    o->elapsed_ns = fx_now_ns() - t0;
    o->held = dlock_held(o->c, o->name);
    if (o->rc == DLOCK_OK && o->release)
        o->rel_rc = dlock_release(o->c, o->name);
    atomic_store(&o->done, 1);
    return NULL;
}

static inline void op_start(op *o, dlock_client *c, const char *name, int64_t wait_ms, int release)
{
    memset(o, 0, sizeof *o);
    o->c = c;
    o->name = name;
    o->wait_ms = wait_ms;
    o->release = release;
    o->rc = o->rel_rc = 1000;
    assert_int_equal(pthread_create(&o->th, NULL, op_main, o), 0);
}

/* Joins, failing (instead of hanging) if the thread is not done in bound_ms. */
static inline void op_join(op *o, long bound_ms)
{
    long long deadline = fx_now_ns() + bound_ms * 1000000LL;
    while (!atomic_load(&o->done) && fx_now_ns() < deadline)
        fx_sleep_ms(5);
    if (!atomic_load(&o->done))
        fail_msg("thread acquiring '%s' still running after %ld ms", o->name, bound_ms);
    pthread_join(o->th, NULL);
}

#endif
