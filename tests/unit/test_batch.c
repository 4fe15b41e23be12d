/*
 * Automatic pipelining (src/conn/batch.c) against a real redis-server, reached
 * through the fault proxy where a test needs a round trip held back: a call
 * alone takes one round trip; calls that arrive while every lane is busy ride
 * together in the next batch, each with its own reply; a batch whose
 * connection is reset fails every call in it, none hangs; a call waiting for
 * a batch gives up at its deadline without being sent; scripts the server
 * forgot are sent again as EVAL, the whole batch included.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "conn/batch.h"
#include "common/slot.h"
#include "fixture.h"
#include "proxy.h"

#define ID "0123456789abcdef0123456789abcdef"

/* The acquire script's arguments for name (prefix tb:), as attempt 1: the
 * name's keys and its slot's mark (lua/keys.lua), then the arguments. */
#define NK 7
typedef struct acq_args {
    char keys[NK][64];
    const char *argv[NK + 8];
} acq_args;

static void acq_args_init(acq_args *a, const char *name)
{
    const char *suffix[6] = {"", ":fence", ":q", ":qd", ":turn", ":c:" ID};
    for (int k = 0; k < 6; k++)
        snprintf(a->keys[k], sizeof a->keys[k], "tb:{%s}%s", name, suffix[k]);
    snprintf(a->keys[6], sizeof a->keys[6], "tb:hw:{%s}",
             dlock_slot_tag(dlock_cluster_slot(a->keys[0], strlen(a->keys[0]))));
    for (int k = 0; k < NK; k++)
        a->argv[k] = a->keys[k];
    const char *rest[8] = {ID, "10000", "1", "16", "2000", "1", "20000", "test-batch"};
    for (int i = 0; i < 8; i++)
        a->argv[NK + i] = rest[i];
}

static void call_init(dlock_call *call, acq_args *a, int64_t deadline)
{
    memset(call, 0, sizeof *call);
    call->id = DLOCK_SCRIPT_ACQUIRE;
    call->nkeys = NK;
    call->nargs = 8;
    call->argv = a->argv;
    call->deadline = deadline;
}

/* 1 if reply is a grant {1, token > 0}. */
static int is_grant(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
           r->element[0]->type == REDIS_REPLY_INTEGER && r->element[0]->integer == 1 &&
           r->element[1]->integer > 0;
}

/* HGET tb:{name} owner == ID, on a direct connection. */
static int owned_in_redis(const char *name)
{
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(k);
    redisReply *r = redisCommand(k, "HGET tb:{%s} owner", name);
    int ok = r && r->type == REDIS_REPLY_STRING && strcmp(r->str, ID) == 0;
    freeReplyObject(r);
    redisFree(k);
    return ok;
}

/* HGET tb:{name} token as a number, -1 when absent. */
static long long lease_token(const char *name)
{
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(k);
    redisReply *r = redisCommand(k, "HGET tb:{%s} token", name);
    long long v = r && r->type == REDIS_REPLY_STRING ? atoll(r->str) : -1;
    freeReplyObject(r);
    redisFree(k);
    return v;
}

static void flush_all(void)
{
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(k);
    freeReplyObject(redisCommand(k, "FLUSHALL"));
    redisFree(k);
}

typedef struct env {
    fx_proxy *proxy;
    dlock_conn_cfg cfg;
    dlock_counters ctr;
    dlock_pool *pool;
    dlock_batch *batch;
} env;

/* A batcher with `lanes` connections to Redis through a fresh proxy. */
static void env_open(env *v, unsigned lanes)
{
    memset(v, 0, sizeof *v);
    flush_all();
    v->proxy = fx_proxy_start(fx_server.port);
    assert_non_null(v->proxy);
    v->cfg = (dlock_conn_cfg){.host = (char *)"127.0.0.1", .port = fx_proxy_port(v->proxy),
                              .connect_timeout_ms = 1000, .command_timeout_ms = 2000};
    v->pool = dlock_pool_create(&v->cfg, lanes, &v->ctr);
    v->batch = dlock_batch_create(v->pool, lanes, v->cfg.command_timeout_ms, 0, 0, &v->ctr);
    assert_non_null(v->pool);
    assert_non_null(v->batch);
}

static void env_close(env *v)
{
    dlock_batch_destroy(v->batch); /* asserts that no call is left behind */
    dlock_pool_destroy(v->pool);
    fx_proxy_stop(v->proxy);
}

/* Waits (at most 10 s: a generous bound for a busy machine) until n calls
 * wait for a batch. */
static void wait_waiting(dlock_batch *b, unsigned n)
{
    for (int i = 0; i < 1000 && dlock_batch_waiting(b) < n; i++)
        fx_sleep_ms(10);
    assert_int_equal(dlock_batch_waiting(b), n);
}

typedef struct worker {
    env *v;
    int leave; /* run the leave script instead of acquire */
    acq_args args;
    dlock_call call;
    int64_t deadline;
    pthread_t th;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    call_init(&w->call, &w->args, w->deadline);
    if (w->leave) {
        /* leave.lua: id, wake prefix, name, waiter ttl, number, record ttl */
        static const char *const rest[6] = {ID, "tb:wake:", "first", "2000", "1", "20000"};
        for (int i = 0; i < 6; i++)
            w->args.argv[NK + i] = rest[i];
        w->call.id = DLOCK_SCRIPT_LEAVE;
        w->call.nargs = 6;
    }
    dlock_batch_run(w->v->batch, &w->call);
    return NULL;
}

static void worker_start(worker *w, env *v, const char *name, int64_t deadline)
{
    w->v = v;
    /* w->leave is the caller's */
    w->deadline = deadline;
    acq_args_init(&w->args, name);
    assert_int_equal(pthread_create(&w->th, NULL, worker_main, w), 0);
}

/* A call with a free lane goes out at once, alone: one round trip. */
static void test_alone_one_round_trip(void **state)
{
    (void)state;
    env v;
    env_open(&v, 2);
    acq_args a;
    acq_args_init(&a, "alone");
    dlock_call call;
    call_init(&call, &a, DLOCK_NEVER);
    assert_int_equal(dlock_batch_run(v.batch, &call), DLOCK_OK);
    assert_true(is_grant(call.reply));
    freeReplyObject(call.reply);
    /* the connection's opening (INFO, SCRIPT LOAD) plus the call */
    uint64_t before = v.ctr.redis_round_trips;
    acq_args_init(&a, "alone2");
    call_init(&call, &a, DLOCK_NEVER);
    assert_int_equal(dlock_batch_run(v.batch, &call), DLOCK_OK);
    assert_true(is_grant(call.reply));
    freeReplyObject(call.reply);
    assert_int_equal(v.ctr.redis_round_trips - before, 1);
    assert_true(owned_in_redis("alone"));
    assert_true(owned_in_redis("alone2"));
    env_close(&v);
}

enum { RIDERS = 24 };

/* One lane, held busy by a call the proxy holds back: 24 calls that arrive
 * meanwhile wait, then all ride the next batch: one round trip for 24
 * scripts, and each caller gets its own grant. */
static void test_waiting_calls_ride_one_batch(void **state)
{
    (void)state;
    env v;
    env_open(&v, 1);
    fx_proxy_hold_next(v.proxy, "{first}");
    worker first = {0}, riders[RIDERS] = {{0}};
    worker_start(&first, &v, "first", DLOCK_NEVER);
    assert_int_equal(fx_proxy_wait_held(v.proxy, 10000), 0);
    char name[32];
    for (int i = 0; i < RIDERS; i++) {
        snprintf(name, sizeof name, "r%d", i);
        worker_start(&riders[i], &v, name, DLOCK_NEVER);
    }
    wait_waiting(v.batch, RIDERS);
    uint64_t rt0 = dlock_load_64(&v.ctr.redis_round_trips);
    fx_proxy_release_held(v.proxy);
    pthread_join(first.th, NULL);
    assert_int_equal(first.call.rc, DLOCK_OK);
    assert_true(is_grant(first.call.reply));
    freeReplyObject(first.call.reply);
    for (int i = 0; i < RIDERS; i++) {
        pthread_join(riders[i].th, NULL);
        assert_int_equal(riders[i].call.rc, DLOCK_OK);
        assert_true(is_grant(riders[i].call.reply));
        freeReplyObject(riders[i].call.reply);
        snprintf(name, sizeof name, "r%d", i);
        assert_true(owned_in_redis(name));
    }
    /* the held round trip was counted before rt0; the riders took one */
    assert_int_equal(dlock_load_64(&v.ctr.redis_round_trips) - rt0, 1);
    assert_int_equal(dlock_batch_waiting(v.batch), 0);
    env_close(&v);
}

/* A connection reset under a batch fails every call in it with
 * DLOCK_EREDIS, marked sent and closed: here the scripts ran and only the
 * answers were lost, and the same call made again is answered with the same
 * grant (every script is idempotent for its caller). */
static void test_reset_fails_whole_batch(void **state)
{
    (void)state;
    env v;
    env_open(&v, 1);
    fx_proxy_hold_next(v.proxy, "{first}");
    worker first = {0}, riders[4] = {{0}};
    worker_start(&first, &v, "first", DLOCK_NEVER);
    assert_int_equal(fx_proxy_wait_held(v.proxy, 10000), 0);
    char name[32];
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "x%d", i);
        worker_start(&riders[i], &v, name, DLOCK_NEVER);
    }
    wait_waiting(v.batch, 4);
    /* The riders' batch, sent when the first call returns, runs; its
     * answers are dropped and the connection reset. */
    fx_proxy_cut_next(v.proxy, "{x");
    fx_proxy_release_held(v.proxy);
    pthread_join(first.th, NULL);
    assert_int_equal(first.call.rc, DLOCK_OK);
    freeReplyObject(first.call.reply);
    for (int i = 0; i < 4; i++) {
        pthread_join(riders[i].th, NULL);
        assert_int_equal(riders[i].call.rc, DLOCK_EREDIS);
        assert_null(riders[i].call.reply);
        assert_int_equal(riders[i].call.sent, 1);
        if (!riders[i].call.closed)
            fail_msg("rider %d: not marked closed: %s", i, riders[i].call.err);
        snprintf(name, sizeof name, "x%d", i);
        assert_true(owned_in_redis(name)); /* it ran */
    }
    assert_int_equal(fx_proxy_cut_done(v.proxy), 1);
    acq_args a;
    acq_args_init(&a, "x0");
    dlock_call call;
    call_init(&call, &a, DLOCK_NEVER);
    assert_int_equal(dlock_batch_run(v.batch, &call), DLOCK_OK);
    assert_true(is_grant(call.reply)); /* the same attempt: its grant stands */
    assert_int_equal(call.reply->element[1]->integer, lease_token("x0"));
    freeReplyObject(call.reply);
    env_close(&v);
}

/* A call that waits for a batch past its deadline gives up unsent with
 * DLOCK_ETIMEDOUT; the leader's call is unaffected. */
static void test_deadline_while_waiting(void **state)
{
    (void)state;
    env v;
    env_open(&v, 1);
    fx_proxy_hold_next(v.proxy, "{first}");
    worker first = {0}, late = {0};
    worker_start(&first, &v, "first", DLOCK_NEVER);
    assert_int_equal(fx_proxy_wait_held(v.proxy, 10000), 0);
    long long t0 = fx_now_ns();
    worker_start(&late, &v, "late", dlock_now_ns() + 200 * DLOCK_NS_PER_MS);
    pthread_join(late.th, NULL);
    long long waited_ms = (fx_now_ns() - t0) / 1000000;
    assert_int_equal(late.call.rc, DLOCK_ETIMEDOUT);
    assert_int_equal(late.call.sent, 0);
    assert_null(late.call.reply);
    assert_true(waited_ms >= 190);
    assert_int_equal(dlock_batch_waiting(v.batch), 0);
    fx_proxy_release_held(v.proxy);
    pthread_join(first.th, NULL);
    assert_int_equal(first.call.rc, DLOCK_OK);
    freeReplyObject(first.call.reply);
    assert_false(owned_in_redis("late"));
    env_close(&v);
}

/* After SCRIPT FLUSH every call of a batch draws NOSCRIPT: all are sent
 * again as EVAL, in the same exchange, and all are granted. The held first
 * call is a leave, whose own EVAL does not cache the acquire script. */
static void test_noscript_batch_falls_back_to_eval(void **state)
{
    (void)state;
    env v;
    env_open(&v, 1);
    fx_proxy_hold_next(v.proxy, "{first}");
    worker first = {0}, riders[6] = {{0}};
    first.leave = 1;
    worker_start(&first, &v, "first", DLOCK_NEVER);
    assert_int_equal(fx_proxy_wait_held(v.proxy, 10000), 0);
    char name[32];
    for (int i = 0; i < 6; i++) {
        snprintf(name, sizeof name, "n%d", i);
        worker_start(&riders[i], &v, name, DLOCK_NEVER);
    }
    wait_waiting(v.batch, 6);
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    freeReplyObject(redisCommand(k, "SCRIPT FLUSH"));
    redisFree(k);
    long long evals = fx_info_calls("127.0.0.1", fx_server.port, "eval");
    uint64_t rt0 = dlock_load_64(&v.ctr.redis_round_trips);
    fx_proxy_release_held(v.proxy);
    pthread_join(first.th, NULL);
    assert_int_equal(first.call.rc, DLOCK_OK);
    assert_non_null(first.call.reply);
    assert_int_equal(first.call.reply->type, REDIS_REPLY_INTEGER); /* not queued: 0 */
    freeReplyObject(first.call.reply);
    for (int i = 0; i < 6; i++) {
        pthread_join(riders[i].th, NULL);
        assert_int_equal(riders[i].call.rc, DLOCK_OK);
        assert_true(is_grant(riders[i].call.reply));
        freeReplyObject(riders[i].call.reply);
    }
    assert_int_equal(fx_info_calls("127.0.0.1", fx_server.port, "eval"), evals + 7);
    /* The first call's EVAL, then one EVAL exchange for the whole batch,
     * after its EVALSHA exchange: 3 round trips after the held one. */
    assert_int_equal(dlock_load_64(&v.ctr.redis_round_trips) - rt0, 3);
    env_close(&v);
}

enum { CROWD = 48, CALLS = 40 };

typedef struct crowd_arg {
    env *v;
    int id;
    int granted;
} crowd_arg;

static void *crowd_main(void *p)
{
    crowd_arg *a = p;
    for (int i = 0; i < CALLS; i++) {
        char name[32];
        snprintf(name, sizeof name, "c%d_%d", a->id, i);
        acq_args args;
        acq_args_init(&args, name);
        dlock_call call;
        call_init(&call, &args, DLOCK_NEVER);
        if (dlock_batch_run(a->v->batch, &call) == DLOCK_OK && is_grant(call.reply))
            a->granted++;
        freeReplyObject(call.reply);
    }
    return NULL;
}

/* 48 threads share 4 lanes, 40 calls each on names of their own: every
 * call gets its own grant, nothing is left waiting, and no lane leaks
 * (dlock_batch_destroy asserts it). */
static void test_crowd_on_four_lanes(void **state)
{
    (void)state;
    env v;
    env_open(&v, 4);
    pthread_t th[CROWD];
    crowd_arg args[CROWD];
    for (int i = 0; i < CROWD; i++) {
        args[i] = (crowd_arg){&v, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, crowd_main, &args[i]), 0);
    }
    for (int i = 0; i < CROWD; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].granted, CALLS);
    }
    assert_true(owned_in_redis("c0_0"));
    assert_true(owned_in_redis("c47_39"));
    assert_int_equal(dlock_batch_waiting(v.batch), 0);
    printf("# %d calls in %llu round trips\n", CROWD * CALLS,
           (unsigned long long)dlock_load_64(&v.ctr.redis_round_trips));
    env_close(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_alone_one_round_trip, fx_ensure_server),
        cmocka_unit_test_teardown(test_waiting_calls_ride_one_batch, fx_ensure_server),
        cmocka_unit_test_teardown(test_reset_fails_whole_batch, fx_ensure_server),
        cmocka_unit_test_teardown(test_deadline_while_waiting, fx_ensure_server),
        cmocka_unit_test_teardown(test_noscript_batch_falls_back_to_eval, fx_ensure_server),
        cmocka_unit_test_teardown(test_crowd_on_four_lanes, fx_ensure_server),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
