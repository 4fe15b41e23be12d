/*
 * The Lua scripts' ordering and idempotence rules, called directly against a
 * real redis-server (no client around them, so every interleaving is chosen
 * by the test): an acquire attempt older than one Redis has seen from the
 * same client for the same name changes nothing at all; a release retried
 * after its first try ran reports released; a late leave cannot take out a
 * client that queued again; a give-back reports when its attempt is
 * superseded; data of another protocol is refused and left as it was.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "conn/conn.h"
#include "common/slot.h"
#include "fixture.h"

#define X "0123456789abcdef0123456789abcdef"
#define Y "fedcba9876543210fedcba9876543210"

static redisContext *conn; /* the scripts' connection */
static redisContext *raw;  /* plain commands, to look at the keys */
static dlock_counters ctr;

/* The keys of name for client id, in the scripts' order (lua/keys.lua). */
#define NK 7
typedef struct keys {
    char k[NK][96];
} keys;

static keys keys_of(const char *name, const char *id)
{
    keys k;
    const char *suffix[5] = {"", ":fence", ":q", ":qd", ":turn"};
    for (int i = 0; i < 5; i++)
        snprintf(k.k[i], sizeof k.k[i], "ts:{%s}%s", name, suffix[i]);
    snprintf(k.k[5], sizeof k.k[5], "ts:{%s}:c:%s", name, id);
    snprintf(k.k[6], sizeof k.k[6], "ts:hw:{%s}",
             dlock_slot_tag(dlock_cluster_slot(k.k[0], strlen(k.k[0]))));
    return k;
}

static redisReply *run(dlock_script_id id, const char **argv, int nargs)
{
    redisReply *r = dlock_conn_eval(conn, &ctr, dlock_conn_deadline(2000), id, NK, nargs, argv,
                                    NULL);
    assert_non_null(r);
    if (r->type == REDIS_REPLY_ERROR)
        fail_msg("script error: %s", r->str);
    return r;
}

/* Attempt `n` of client id on name with pass limit pl and waiter ttl ttl,
 * queueing when refused. Returns the reply's first element (1 granted, 0
 * refused, -1 stale), *second the other. */
static long long acquire_full(const char *name, const char *id, long long n, const char *lease,
                              const char *pl, const char *ttl, long long *second)
{
    keys k = keys_of(name, id);
    char nonce[24];
    snprintf(nonce, sizeof nonce, "%lld", n);
    const char *argv[15];
    for (int i = 0; i < NK; i++)
        argv[i] = k.k[i];
    const char *a[8] = {id, lease, nonce, pl, ttl, "1", "20000", "test-client"};
    memcpy(argv + NK, a, sizeof a);
    redisReply *r = run(DLOCK_SCRIPT_ACQUIRE, argv, 8);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    long long first = r->element[0]->integer;
    if (second)
        *second = r->element[1]->integer;
    freeReplyObject(r);
    return first;
}

static long long acquire_with(const char *name, const char *id, long long n, const char *pl,
                              const char *ttl, long long *second)
{
    return acquire_full(name, id, n, "10000", pl, ttl, second);
}

/* Attempt `n` of client id on name, pass limit 16, waiter ttl 2 s. */
static long long acquire(const char *name, const char *id, long long n, long long *second)
{
    return acquire_with(name, id, n, "16", "2000", second);
}

/* Release of client id's grant of name by field ("token" or "nonce"). */
static long long release_full(const char *name, const char *id, const char *field,
                              long long value, const char *lease, long long handed)
{
    keys k = keys_of(name, id);
    char v[24], h[24];
    snprintf(v, sizeof v, "%lld", value);
    snprintf(h, sizeof h, "%lld", handed);
    const char *argv[16];
    for (int i = 0; i < NK; i++)
        argv[i] = k.k[i];
    const char *a[9] = {id, field, v, lease, h, "ts:wake:", name, "2000", "20000"};
    memcpy(argv + NK, a, sizeof a);
    redisReply *r = run(DLOCK_SCRIPT_RELEASE, argv, 9);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    long long out = r->integer;
    freeReplyObject(r);
    return out;
}

/* Release with a lease time of 10 s and no token handed out locally. */
static long long release(const char *name, const char *id, const char *field, long long value)
{
    return release_full(name, id, field, value, "10000", 0);
}

/* Leave of client id from name's queue, as call n. */
static long long leave(const char *name, const char *id, long long n)
{
    keys k = keys_of(name, id);
    char num[24];
    snprintf(num, sizeof num, "%lld", n);
    const char *argv[13];
    for (int i = 0; i < NK; i++)
        argv[i] = k.k[i];
    const char *a[6] = {id, "ts:wake:", name, "2000", num, "20000"};
    memcpy(argv + NK, a, sizeof a);
    redisReply *r = run(DLOCK_SCRIPT_LEAVE, argv, 6);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    long long out = r->integer;
    freeReplyObject(r);
    return out;
}

/* An acquire of attempt n (lease `lease`, pass limit 16, ttl 2 s, queueing)
 * that returns how the grant before ended (acquire.lua, "End"), or -1 when
 * not granted. */
static long long acquire_end_after(const char *name, const char *id, long long n,
                                   const char *lease, long long unconfirmed, const char *how)
{
    keys k = keys_of(name, id);
    char nonce[24], last[24];
    snprintf(nonce, sizeof nonce, "%lld", n);
    snprintf(last, sizeof last, "%lld", unconfirmed);
    const char *argv[17];
    for (int i = 0; i < NK; i++)
        argv[i] = k.k[i];
    const char *a[10] = {id, lease, nonce, "16", "2000", "1", "20000", "test-client", last, how};
    memcpy(argv + NK, a, sizeof a);
    redisReply *r = run(DLOCK_SCRIPT_ACQUIRE, argv, 10);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    long long out = -1;
    if (r->element[0]->integer == 1) {
        assert_int_equal(r->elements, 3);
        out = r->element[2]->integer;
    }
    freeReplyObject(r);
    return out;
}

static long long acquire_end(const char *name, const char *id, long long n, const char *lease)
{
    return acquire_end_after(name, id, n, lease, 0, "0");
}

/* A release (ARGV[10] = ended) of client id's grant of name. */
static long long release_ended(const char *name, const char *id, const char *field,
                               long long value, const char *ended)
{
    keys k = keys_of(name, id);
    char v[24];
    snprintf(v, sizeof v, "%lld", value);
    const char *argv[17];
    for (int i = 0; i < NK; i++)
        argv[i] = k.k[i];
    const char *a[10] = {id, field, v, "10000", "0", "ts:wake:", name, "2000", "20000", ended};
    memcpy(argv + NK, a, sizeof a);
    redisReply *r = run(DLOCK_SCRIPT_RELEASE, argv, 10);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    long long out = r->integer;
    freeReplyObject(r);
    return out;
}

/* HGET of the lease's field, as a number (-1: absent). */
static long long lease_field(const char *name, const char *field)
{
    redisReply *r = redisCommand(raw, "HGET ts:{%s} %s", name, field);
    assert_non_null(r);
    long long v = r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : -1;
    freeReplyObject(r);
    return v;
}

/* The token of the mark of name's hash slot (lua/keys.lua, HW), -1 if none. */
static long long mark_token(const char *name)
{
    keys k = keys_of(name, X);
    redisReply *r = redisCommand(raw, "GET %s", k.k[6]);
    assert_non_null(r);
    long long v = r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : -1;
    freeReplyObject(r);
    return v;
}

/* The calls of Redis commands made inside scripts since the last
 * CONFIG RESETSTAT: every command's calls in INFO commandstats but the
 * script calls themselves and the test's own INFO and CONFIG. */
static long long inner_calls(void)
{
    redisReply *r = redisCommand(raw, "INFO commandstats");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    long long n = 0;
    for (const char *p = r->str; (p = strstr(p, "cmdstat_")); p++) {
        if (!strncmp(p, "cmdstat_evalsha:", 16) || !strncmp(p, "cmdstat_eval:", 13) ||
            !strncmp(p, "cmdstat_info:", 13) || !strncmp(p, "cmdstat_config", 14))
            continue;
        const char *c = strstr(p, "calls=");
        assert_non_null(c);
        n += strtoll(c + 6, NULL, 10);
    }
    freeReplyObject(r);
    return n;
}

static void reset_stats(void)
{
    freeReplyObject(redisCommand(raw, "CONFIG RESETSTAT"));
}

static long long key_exists(const char *key)
{
    redisReply *r = redisCommand(raw, "EXISTS %s", key);
    assert_non_null(r);
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

static long long queued(const char *name, const char *id)
{
    redisReply *r = redisCommand(raw, "ZSCORE ts:{%s}:q %s", name, id);
    assert_non_null(r);
    long long v = r->type == REDIS_REPLY_STRING;
    freeReplyObject(r);
    return v;
}

static int setup(void **state)
{
    if (fx_group_setup(state) != 0)
        return -1;
    dlock_conn_cfg cfg = {.host = (char *)"127.0.0.1", .port = fx_server.port, .connect_timeout_ms = 1000, .command_timeout_ms = 2000};
    if (dlock_conn_open(&cfg, &ctr, &conn) != DLOCK_OK)
        return -1;
    raw = fx_connect("127.0.0.1", fx_server.port);
    return raw ? 0 : -1;
}

static int teardown(void **state)
{
    redisFree(conn);
    redisFree(raw);
    return fx_group_teardown(state);
}

/* The DUMP of every key of name (the six of client id, and Y's record),
 * concatenated as hex, with each key's presence: what a refused script must
 * leave exactly as it was. */
static void dump_keys(const char *name, const char *id, char *out, size_t n)
{
    keys k = keys_of(name, id);
    char rec_y[96];
    snprintf(rec_y, sizeof rec_y, "ts:{%s}:c:" Y, name);
    const char *all[7] = {k.k[0], k.k[1], k.k[2], k.k[3], k.k[4], k.k[5], rec_y};
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < 7; i++) {
        redisReply *r = redisCommand(raw, "DUMP %s", all[i]);
        assert_non_null(r);
        used += (size_t)snprintf(out + used, n - used, "%d:", i);
        if (r->type == REDIS_REPLY_STRING)
            for (size_t j = 0; j < r->len && used + 3 < n; j++)
                used += (size_t)snprintf(out + used, n - used, "%02x",
                                         (unsigned char)r->str[j]);
        else
            used += (size_t)snprintf(out + used, n - used, "none");
        assert_true(used + 8 < n);
        freeReplyObject(r);
    }
}

/* Asserts that script id with argv (nargs after the six keys) is refused as
 * data of protocol 2, naming both protocols. */
static void assert_refused(dlock_script_id id, const char **argv, int nargs)
{
    redisReply *r = dlock_conn_eval(conn, &ctr, dlock_conn_deadline(2000), id, NK, nargs, argv,
                                    NULL);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ERROR);
    assert_int_equal(dlock_conn_reply_code(r), DLOCK_ESERVER);
    assert_non_null(strstr(r->str, "DLOCKPROTOCOL"));
    assert_non_null(strstr(r->str, "dlock protocol 2"));
    /* (these are protocol 1's scripts, whatever the default) */
    assert_non_null(strstr(r->str, "speaks protocol 1"));
    freeReplyObject(r);
}

/* Data of another protocol: a later release marks a name's data with the
 * lease hash's field pv (lua/acquire.lua, "Protocol"). This release's
 * acquire, release and leave scripts refuse it with an error naming both
 * protocols, and change nothing at all (every key's DUMP is the same);
 * pv 1 is this protocol's own and works as usual. */
static void test_other_protocol_refused(void **state)
{
    (void)state;
    long long ty;
    assert_int_equal(acquire("pv", Y, 1, &ty), 1);
    assert_int_equal(lease_field("pv", "pv"), 1); /* a grant writes its protocol */
    assert_int_equal(acquire("pv", X, 5, NULL), 0); /* queued, with a record */
    freeReplyObject(redisCommand(raw, "HSET ts:{pv} pv 2"));
    static char before[16384], after[16384];
    dump_keys("pv", X, before, sizeof before);

    keys kx = keys_of("pv", X), ky = keys_of("pv", Y);
    const char *argv[17];
    for (int i = 0; i < NK; i++)
        argv[i] = kx.k[i];
    const char *acq[10] = {X, "10000", "6", "16", "2000", "1", "20000", "test-client", "0", "0"};
    memcpy(argv + NK, acq, sizeof acq);
    assert_refused(DLOCK_SCRIPT_ACQUIRE, argv, 10);
    const char *lv[6] = {X, "ts:wake:", "pv", "2000", "7", "20000"};
    memcpy(argv + NK, lv, sizeof lv);
    assert_refused(DLOCK_SCRIPT_LEAVE, argv, 6);
    for (int i = 0; i < NK; i++)
        argv[i] = ky.k[i];
    char tok[24];
    snprintf(tok, sizeof tok, "%lld", ty);
    const char *rel[10] = {Y, "token", tok, "10000", "0", "ts:wake:", "pv", "2000", "20000", "0"};
    memcpy(argv + NK, rel, sizeof rel);
    assert_refused(DLOCK_SCRIPT_RELEASE, argv, 10);
    /* the holder's renewal of it: not renewed, and nothing written (its
     * DUMP, and its time to live not reset) */
    long long pttl = fx_lease_ms(raw, "ts:{pv}");
    const char *rn[4] = {ky.k[0], Y, "10000", tok};
    redisReply *r = dlock_conn_eval(conn, &ctr, dlock_conn_deadline(2000), DLOCK_SCRIPT_RENEW,
                                    1, 3, rn, NULL);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->element[0]->integer, 0);
    freeReplyObject(r);
    assert_true(fx_lease_ms(raw, "ts:{pv}") <= pttl);
    dump_keys("pv", X, after, sizeof after);
    assert_string_equal(before, after);

    /* pv 1: this protocol's own mark */
    freeReplyObject(redisCommand(raw, "HSET ts:{pv} pv 1"));
    assert_int_equal(release("pv", Y, "token", ty), 2); /* X, queued, gets it */
    assert_int_equal(lease_field("pv", "pv"), 1);          /* a direct grant too */
    assert_int_equal(leave("pv", X, 8), 1);
}

/* The critical case: attempt 5 of X is granted; attempt 3 of X, sent
 * earlier, arrives now. It must neither grant again (new token, nonce 3, so
 * that a give-back of attempt 3 would delete the live grant) nor touch
 * anything else. */
static void test_late_attempt_never_regrants(void **state)
{
    (void)state;
    long long t5;
    assert_int_equal(acquire("late", X, 5, &t5), 1);
    assert_int_equal(acquire("late", X, 3, NULL), -1);
    assert_int_equal(lease_field("late", "token"), t5);
    assert_int_equal(lease_field("late", "nonce"), 5);
    /* So the give-back of attempt 3 finds nothing of its own, and says
     * that attempt 3 is superseded: no grant of it can appear any more. */
    assert_int_equal(release("late", X, "nonce", 3), 3);
    assert_int_equal(lease_field("late", "nonce"), 5);
    /* A later attempt of the same client while it owns the lease (its
     * outcome was unknown to it) is granted again in place, as before. */
    long long t7;
    assert_int_equal(acquire("late", X, 7, &t7), 1);
    assert_true(t7 > t5);
    assert_int_equal(lease_field("late", "nonce"), 7);
    /* The same attempt seen twice (a retry on a new connection after the
     * first copy ran) gets the same grant, not a new token. */
    long long again;
    assert_int_equal(acquire("late", X, 7, &again), 1);
    assert_int_equal(again, t7);
    assert_int_equal(release("late", X, "token", t7), 1);
}

/* A late attempt of a client that no longer waits must not queue it (its
 * turn would stall the others) nor be granted a lease nobody wants. */
static void test_late_attempt_does_not_queue_or_grant(void **state)
{
    (void)state;
    long long ty;
    assert_int_equal(acquire("lq", Y, 1, &ty), 1); /* Y holds */
    assert_int_equal(acquire("lq", X, 10, NULL), 0); /* X queues */
    assert_int_equal(queued("lq", X), 1);
    assert_int_equal(leave("lq", X, 11), 1);          /* X gives up */
    assert_int_equal(queued("lq", X), 0);
    assert_int_equal(acquire("lq", X, 9, NULL), -1); /* a late copy of attempt 9 */
    assert_int_equal(queued("lq", X), 0);
    assert_int_equal(release("lq", Y, "token", ty), 1);
    /* Free now: a late attempt 10 of X is still stale, so not granted. */
    assert_int_equal(acquire("lq", X, 10, NULL), -1);
    assert_int_equal(lease_field("lq", "owner"), -1);
}

/* A release whose first try ran but whose answer was lost is retried: the
 * retry must say released (1), not lost (0). Another grant's token is still
 * not released by it. */
static void test_release_is_idempotent(void **state)
{
    (void)state;
    long long t;
    assert_int_equal(acquire("ri", X, 20, &t), 1);
    assert_int_equal(release("ri", X, "token", t), 1);
    assert_int_equal(release("ri", X, "token", t), 1);
    assert_int_equal(release("ri", X, "token", t + 1), 0);
    /* Once another client holds the name, X's old grant still reads as
     * released, and Y's lease stays. */
    long long ty;
    assert_int_equal(acquire("ri", Y, 1, &ty), 1);
    assert_int_equal(release("ri", X, "token", t), 1);
    assert_int_equal(lease_field("ri", "token"), ty);
    /* An give-back by attempt number is idempotent too. */
    assert_int_equal(release("ri", Y, "token", ty), 1);
    assert_int_equal(acquire("ri", X, 21, NULL), 1);
    assert_int_equal(release("ri", X, "nonce", 21), 1);
    assert_int_equal(release("ri", X, "nonce", 21), 1);
    /* And the acquire that made that grant, arriving again, is stale. */
    assert_int_equal(acquire("ri", X, 21, NULL), -1);
    assert_int_equal(lease_field("ri", "owner"), -1);
}

/* A leave sent late (by the background thread, after Redis failed) must
 * not take out the client if it queued again with a newer attempt. */
static void test_late_leave_is_ignored(void **state)
{
    (void)state;
    long long ty;
    assert_int_equal(acquire("ll", Y, 1, &ty), 1);
    assert_int_equal(acquire("ll", X, 30, NULL), 0);
    assert_int_equal(acquire("ll", X, 32, NULL), 0); /* queued again, newer */
    assert_int_equal(leave("ll", X, 31), 0);          /* the late leave */
    assert_int_equal(queued("ll", X), 1);
    assert_int_equal(leave("ll", X, 33), 1);
    assert_int_equal(queued("ll", X), 0);
    assert_int_equal(release("ll", Y, "token", ty), 1);
}

/* The record of a client expires: nothing is kept per name and client once
 * the client stopped using the name. */
static void test_record_expires(void **state)
{
    (void)state;
    long long t;
    assert_int_equal(acquire("rx", X, 40, &t), 1);
    assert_int_equal(release("rx", X, "token", t), 1);
    redisReply *r = redisCommand(raw, "PTTL ts:{rx}:c:" X);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    assert_true(r->integer > 0 && r->integer <= 20000);
    freeReplyObject(r);
}

/* Keys written by something else (a foreign record value, a lease hash
 * without a nonce, as an operator's tool might leave) never make a script
 * fail: a malformed record counts as none, a missing nonce as attempt 0. */
static void test_foreign_values_do_not_break_scripts(void **state)
{
    (void)state;
    freeReplyObject(redisCommand(raw, "SET ts:{fv}:c:" X " garbage"));
    long long t;
    assert_int_equal(acquire("fv", X, 50, &t), 1);
    assert_int_equal(release("fv", X, "token", t), 1);
    freeReplyObject(redisCommand(raw, "HSET ts:{fn} owner " X " token 5"));
    assert_int_equal(release("fn", X, "nonce", 3), 0);
    assert_int_equal(acquire("fn", X, 60, &t), 1); /* granted again in place */
    assert_true(t > 5);
    assert_int_equal(release("fn", X, "token", t), 1);
    freeReplyObject(redisCommand(raw, "SET ts:{fl}:c:" X " 1-2-3"));
    assert_int_equal(leave("fl", X, 70), 0);
}

/* What the common case costs inside Redis: an acquire of a free name with
 * nobody queued runs 7 commands (HMGET, TIME, MGET, EXISTS, HSET, PEXPIRE,
 * SET of the slot's mark) and a release with nobody queued 7 (HMGET, TIME,
 * DEL, SET, MGET, SET, EXISTS), the first time and with the client's record
 * present; a release whose holder handed out tokens locally sets the mark
 * too. The grant writes neither the fence key nor the record: its
 * reservation is the lease's pl field, and its attempt the lease's nonce. */
static void test_uncontended_costs(void **state)
{
    (void)state;
    for (int round = 0; round < 2; round++) {
        long long t;
        reset_stats();
        assert_int_equal(acquire("cost", X, 80 + round, &t), 1);
        assert_int_equal(inner_calls(), 7);
        if (round == 0) {
            assert_int_equal(key_exists("ts:{cost}:fence"), 0);
            assert_int_equal(key_exists("ts:{cost}:c:" X), 0);
        }
        assert_int_equal(lease_field("cost", "pl"), 16);
        assert_int_equal(lease_field("cost", "nonce"), 80 + round);
        reset_stats();
        assert_int_equal(release("cost", X, "token", t), 1);
        assert_int_equal(inner_calls(), 7); /* with TIME: has the grant expired? */
        assert_int_equal(key_exists("ts:{cost}"), 0);
        assert_int_equal(key_exists("ts:{cost}:fence"), 1);
        assert_int_equal(key_exists("ts:{cost}:c:" X), 1);
    }
    /* tokens handed out locally above the mark: the release raises it */
    long long t;
    assert_int_equal(acquire("cost", X, 90, &t), 1);
    reset_stats();
    assert_int_equal(release_full("cost", X, "token", t, "10000", t + 3), 1);
    assert_int_equal(inner_calls(), 8);
    assert_int_equal(mark_token("cost"), t + 3);
}

/* Polls (10 ms) until name's grant has expired (its key stays a lease time
 * longer, as a fence): generous bound 5 s, against the lease times of a few
 * hundred ms the tests below set. */
static void wait_lease_gone(const char *name)
{
    char key[96];
    snprintf(key, sizeof key, "ts:{%s}", name);
    for (int i = 0; i < 500 && fx_lease_ms(raw, key) != -2; i++)
        fx_sleep_ms(10);
    assert_int_equal(fx_lease_ms(raw, key), -2);
}

/* Server time in us (TIME). */
static long long server_us(void)
{
    redisReply *r = redisCommand(raw, "TIME");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    long long us = atoll(r->element[0]->str) * 1000000LL + atoll(r->element[1]->str);
    freeReplyObject(r);
    return us;
}

static void set_mark(const char *key, long long token, long long clock, int pl)
{
    char v[64];
    snprintf(v, sizeof v, "%lld %lld %d", token, clock, pl);
    redisReply *r = redisCommand(raw, "SET %s %s", key, v);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
}

/* The slot's mark after a step back of the server's clock, set up as the
 * scripts would find it: a grant read the clock a day ahead of the server's
 * time now, with token T and pass limit 500. A name of that slot whose own
 * keys are gone (here: never written) gets a token above T + 500, whatever
 * its own pass limit, and the mark keeps the larger pass limit; a direct
 * grant made by a release does the same. Without the step back (the
 * mark's clock behind the server's) the token is server time. */
static void test_mark_after_step_back(void **state)
{
    (void)state;
    keys k = keys_of("sb", X);
    long long now = server_us(), day = 86400LL * 1000000LL, t = now + day - 5000000;
    set_mark(k.k[6], t, now + day, 500);
    long long t1, ty;
    assert_int_equal(acquire("sb", X, 1, &t1), 1);
    assert_true(t1 > t + 500);
    /* the mark: this token, the clock now, the larger pass limit */
    redisReply *r = redisCommand(raw, "GET %s", k.k[6]);
    long long mt, mc, mp;
    assert_int_equal(sscanf(r->str, "%lld %lld %lld", &mt, &mc, &mp), 3);
    freeReplyObject(r);
    assert_int_equal(mt, t1);
    assert_true(mc >= now && mc <= server_us());
    assert_int_equal(mp, 500);
    /* a waiter granted directly by the release: above the mark again */
    assert_int_equal(acquire_with("sb", Y, 1, "16", "2000", NULL), 0);
    set_mark(k.k[6], t1 + 10, now + day, 700);
    assert_int_equal(release("sb", X, "token", t1), 2);
    ty = lease_field("sb", "token");
    assert_true(ty > t1 + 10 + 700);
    assert_int_equal(release("sb", Y, "token", ty), 1);
    /* the clock past the mark's (and the name's fence gone): server time
     * again, not the mark's token + its pass limit */
    now = server_us();
    set_mark(k.k[6], now - 2000, now - 1000, 700);
    freeReplyObject(redisCommand(raw, "DEL ts:{sb}:fence"));
    long long before = server_us(), t2;
    assert_int_equal(acquire("sb", X, 2, &t2), 1);
    assert_true(t2 >= before && t2 <= server_us());
    assert_int_equal(release("sb", X, "token", t2), 1);
}

/* A mark whose token is ahead of the clock it read: a grant made while the
 * clock was behind (its token above the mark and its pass limit) whose
 * holder may have handed out tokens above it. The clock is set right and
 * steps back again to between the two: the next grant of the slot is
 * still in the stepped-back case, above the token and the pass limit (it
 * took the token + 1 before, at or below that holder's handoffs). */
static void test_mark_ahead_of_its_clock(void **state)
{
    (void)state;
    keys k = keys_of("ah", X);
    long long now = server_us(), t = now + 10000000LL, t1;
    set_mark(k.k[6], t, now - 5000000LL, 128);
    assert_int_equal(acquire("ah", X, 1, &t1), 1);
    assert_true(t1 > t + 128);
    assert_int_equal(release("ah", X, "token", t1), 1);
}

/* A direct grant to a waiter that never takes it lasts the waiter's ttl
 * only; its token is server time, and it leaves nothing ahead of server
 * time behind: the next grant's token is server time again, above it.
 * (Before 0.3 the fence kept the waiter's reservation, token + pass limit,
 * and the next grant took fence + 1: 600 ms ahead of the clock here, which
 * a restart without persistence then undercut.) */
static void test_direct_grant_leaves_nothing_ahead(void **state)
{
    (void)state;
    long long ty, tx, tz;
    assert_int_equal(acquire("dr", Y, 1, &ty), 1);
    assert_int_equal(acquire_with("dr", X, 90, "600000", "100", NULL), 0); /* X queues */
    assert_int_equal(release("dr", Y, "token", ty), 2);                   /* granted to X */
    tx = lease_field("dr", "token");
    assert_true(tx > ty);
    assert_true(tx <= server_us());
    assert_int_equal(lease_field("dr", "pl"), 600000);
    /* X is gone: nothing takes or renews the grant. */
    wait_lease_gone("dr");
    long long before = server_us();
    assert_int_equal(acquire("dr", Y, 2, &tz), 1);
    assert_true(tz > tx);
    assert_true(tz >= before && tz <= server_us()); /* server time: not ahead */
    assert_int_equal(release("dr", Y, "token", tz), 1);
}

/* A client's second attempt on its own lease is granted again with a new
 * token, server time again (not the first grant's reservation + 1); a
 * direct grant after it is above it, and so is the next grant after that
 * one expired untaken. */
static void test_regrant_and_direct_grant_follow_time(void **state)
{
    (void)state;
    long long t1, t2, tz;
    assert_int_equal(acquire_with("da", X, 1, "1000000", "2000", &t1), 1);
    assert_int_equal(acquire_with("da", X, 2, "1000000", "2000", &t2), 1);
    assert_true(t2 > t1);
    assert_true(t2 <= server_us());
    assert_int_equal(acquire_with("da", Y, 1, "16", "100", NULL), 0); /* Y queues */
    assert_int_equal(release("da", X, "token", t2), 2);               /* granted to Y */
    long long ty = lease_field("da", "token");
    assert_true(ty > t2);
    wait_lease_gone("da");
    assert_int_equal(acquire_with("da", X, 3, "16", "2000", &tz), 1);
    assert_true(tz > ty);
    assert_true(tz <= server_us());
    assert_int_equal(release("da", X, "token", tz), 1);
}

/* An give-back told that a newer grant of the client holds the lease
 * (3: no grant of its attempt can appear) must stay right after that grant
 * expires unreleased: a late copy of the give-back's attempt is refused then,
 * not granted a lease nobody will release. */
static void test_superseded_attempt_stays_stale(void **state)
{
    (void)state;
    assert_int_equal(acquire_full("ss", X, 5, "300", "16", "2000", NULL), 1);
    assert_int_equal(release("ss", X, "nonce", 4), 3);
    wait_lease_gone("ss");
    assert_int_equal(acquire("ss", X, 4, NULL), -1);
    assert_int_equal(fx_lease_ms(raw, "ts:{ss}"), -2); /* no grant */
    assert_int_equal(lease_field("ss", "nonce"), 5);   /* the expired one, as a fence */
    assert_int_equal(queued("ss", X), 0);
}

#define A "11111111111111111111111111111111"
#define B "22222222222222222222222222222222"
#define C "33333333333333333333333333333333"
#define D "44444444444444444444444444444444"

/* No chain of unused grants pushes tokens ahead of server time. With lease
 * 1 s and pass limit 0.9 s (legal: below the lease time in us), every
 * client alike and alive: H's release grants W1 directly, W1 gives up (its
 * leave frees the grant and gives W2 the turn), W2 takes it and grants W3
 * directly, W3 gives up, W4 takes it. Every token is above the one before
 * and none is ahead of server time (before 0.3, W2's was 0.9 s ahead and
 * W4's 1.8 s: fence + 1 after each unused reservation). */
static void test_tokens_never_ahead_along_a_chain(void **state)
{
    (void)state;
    long long th, t2, t4, ty;
    assert_int_equal(acquire_full("ch", X, 1, "1000", "900000", "2000", &th), 1);
    assert_int_equal(acquire_full("ch", A, 1, "1000", "900000", "2000", NULL), 0);
    assert_int_equal(acquire_full("ch", B, 1, "1000", "900000", "2000", NULL), 0);
    assert_int_equal(acquire_full("ch", C, 1, "1000", "900000", "2000", NULL), 0);
    assert_int_equal(acquire_full("ch", D, 1, "1000", "900000", "2000", NULL), 0);
    assert_int_equal(release_full("ch", X, "token", th, "1000", th), 2); /* to A */
    long long ta = lease_field("ch", "token");
    assert_int_equal(leave("ch", A, 2), 1);                               /* turn: B */
    assert_int_equal(acquire_full("ch", B, 2, "1000", "900000", "2000", &t2), 1);
    assert_true(t2 > ta && ta > th);
    assert_true(t2 <= server_us());
    assert_int_equal(release_full("ch", B, "token", t2, "1000", t2), 2); /* to C */
    long long tc = lease_field("ch", "token");
    assert_int_equal(leave("ch", C, 2), 1);                               /* turn: D */
    assert_int_equal(acquire_full("ch", D, 2, "1000", "900000", "2000", &t4), 1);
    assert_true(t4 > tc && tc > t2);
    assert_true(t4 <= server_us());
    assert_int_equal(release_full("ch", D, "token", t4, "1000", t4), 1);
    assert_int_equal(acquire_full("ch", Y, 1, "1000", "16", "2000", &ty), 1);
    assert_true(ty > t4);
    assert_int_equal(release("ch", Y, "token", ty), 1);
}

/* The reproduction, on the scripts: H (pass limit 999999) holds;
 * W queues and dies; H's release grants W directly; W's grant expires; C
 * acquires; Redis restarts without persistence (the fence is gone); D
 * acquires. D's token must be above C's (a paused C would otherwise win
 * against D at a store that keeps the highest token). Before 0.3, C's token
 * was fence + 1, W's unused reservation, about 1 s ahead of server time, and
 * D's was below it. */
static void test_restart_never_undercuts(void **state)
{
    (void)state;
    long long th, tc, td;
    assert_int_equal(acquire_full("rs", X, 1, "1000", "999999", "2000", &th), 1);
    assert_int_equal(acquire_full("rs", A, 1, "1000", "999999", "100", NULL), 0); /* W */
    assert_int_equal(release_full("rs", X, "token", th, "1000", th), 2);         /* to W */
    wait_lease_gone("rs"); /* W never takes it: its waiter ttl, 100 ms */
    assert_int_equal(acquire_full("rs", B, 1, "1000", "128", "2000", &tc), 1);
    redisFree(conn);
    redisFree(raw);
    assert_int_equal(fx_redis_restart(&fx_server), 0);
    dlock_conn_cfg cfg = {.host = (char *)"127.0.0.1", .port = fx_server.port,
                          .connect_timeout_ms = 1000, .command_timeout_ms = 2000};
    assert_int_equal(dlock_conn_open(&cfg, &ctr, &conn), DLOCK_OK);
    assert_non_null(raw = fx_connect("127.0.0.1", fx_server.port));
    assert_int_equal(key_exists("ts:{rs}:fence"), 0);
    assert_int_equal(acquire_full("rs", C, 1, "1000", "128", "2000", &td), 1);
    assert_true(td > tc);
}

/* A client whose release failed (Redis never heard of it) acquires again
 * and finds the lease still its own: the new grant's token is above the
 * last token it handed out under the old grant, which it passes as ARGV[9]
 * (here far ahead of the grant, as after a step back of the server clock:
 * before, the new token was the server time or the old token + 1). */
static void test_regrant_above_unconfirmed_last(void **state)
{
    (void)state;
    long long t1;
    assert_int_equal(acquire("uc", X, 1, &t1), 1);
    long long handed = t1 + 5000000; /* 5 s of handoffs, as after a step back */
    char last[24];
    snprintf(last, sizeof last, "%lld", handed);
    keys k = keys_of("uc", X);
    const char *argv[16];
    for (int i = 0; i < NK; i++)
        argv[i] = k.k[i];
    const char *a[9] = {X, "10000", "2", "16", "2000", "1", "20000", "test-client", last};
    memcpy(argv + NK, a, sizeof a);
    redisReply *r = run(DLOCK_SCRIPT_ACQUIRE, argv, 9);
    assert_int_equal(r->element[0]->integer, 1);
    long long t2 = r->element[1]->integer;
    freeReplyObject(r);
    assert_true(t2 > handed);
    assert_int_equal(release("uc", X, "token", t2), 1);
}

/* A single try (not queued) of a queued client is refused; a release then
 * grants the client the lease directly under the attempt of its queue
 * entry, which the client no longer waits in. A late copy of that older
 * attempt must not take the grant as its own (found by sim: it was answered
 * with the grant and stretched it from the waiter ttl to a whole lease). */
static void test_late_copy_does_not_take_old_direct_grant(void **state)
{
    (void)state;
    long long ty, pttl;
    assert_int_equal(acquire("og", Y, 1, &ty), 1);
    assert_int_equal(acquire_with("og", X, 5, "16", "500", NULL), 0); /* queued: attempt 5 */
    keys k = keys_of("og", X);
    const char *argv[15];
    for (int i = 0; i < NK; i++)
        argv[i] = k.k[i];
    const char *a[8] = {X, "10000", "6", "16", "500", "0", "20000", "test-client"};
    memcpy(argv + NK, a, sizeof a);
    redisReply *r = run(DLOCK_SCRIPT_ACQUIRE, argv, 8); /* attempt 6: a single try */
    assert_int_equal(r->element[0]->integer, 0);
    freeReplyObject(r);
    assert_int_equal(release("og", Y, "token", ty), 2); /* granted to X under attempt 5 */
    assert_int_equal(lease_field("og", "nonce"), 5);
    assert_int_equal(acquire("og", X, 5, NULL), -1);    /* the late copy of attempt 5 */
    pttl = fx_lease_ms(raw, "ts:{og}");
    assert_true(pttl > 0 && pttl <= 500); /* still the waiter ttl's grant */
}

/*
 * How the grant before ended (acquire.lua, "End"; dlock_unclean): a
 * release by the holder says nothing; a release for a thread that exited
 * (1) or by an operator (3) says so to the next grant, also through a
 * direct grant (field u); a grant that expired unreleased says 2; a grant
 * nobody used (released by attempt number, or given up by a leave) passes
 * on what it was told; the same attempt seen again is told again.
 */
static void test_unclean_ends(void **state)
{
    (void)state;
    const char *n = "ue";
    assert_int_equal(acquire_end(n, X, 1, "10000"), 0);
    long long tx = lease_field(n, "token");
    assert_int_equal(release_ended(n, X, "token", tx, "1"), 1); /* X's thread exited */
    assert_int_equal(acquire_end(n, Y, 1, "10000"), 1);
    assert_int_equal(lease_field(n, "u"), 1);
    assert_int_equal(acquire_end(n, Y, 1, "10000"), 1); /* the same attempt: told again */
    long long ty = lease_field(n, "token");
    assert_int_equal(release_ended(n, Y, "token", ty, "0"), 1); /* released by Y */
    assert_int_equal(acquire_end(n, X, 2, "1000"), 0);
    assert_int_equal(lease_field(n, "u"), -1);
    /* X's 1 s grant expires unreleased; its key stays another second, and
     * the acquire comes in between (700 ms to spare on a loaded machine) */
    fx_sleep_ms(1300);
    assert_int_equal(acquire_end(n, Y, 2, "10000"), 2);

    /* X waits; Y's release by an operator grants X directly, with u 3 */
    assert_int_equal(acquire_end(n, X, 3, "10000"), -1); /* queued */
    ty = lease_field(n, "token");
    assert_int_equal(release_ended(n, Y, "token", ty, "3"), 2);
    assert_int_equal(lease_field(n, "u"), 3);
    /* X never took it (its attempt's outcome unknown): released by number,
     * it passes the 3 on */
    assert_int_equal(release_ended(n, X, "nonce", 3, "0"), 1);
    assert_int_equal(acquire_end(n, Y, 3, "10000"), 3);

    /* a direct grant that a leave gives up passes its word on too */
    assert_int_equal(acquire_end(n, X, 4, "10000"), -1);
    ty = lease_field(n, "token");
    assert_int_equal(release_ended(n, Y, "token", ty, "1"), 2);
    assert_int_equal(leave(n, X, 5), 1);
    assert_int_equal(acquire_end(n, Y, 4, "10000"), 1);
    ty = lease_field(n, "token");
    assert_int_equal(release_ended(n, Y, "token", ty, "0"), 1);
    assert_int_equal(acquire_end(n, X, 6, "10000"), 0);

    /* A client's own grant whose release never arrived, acquired again by
     * it: the new grant is told how that grant ended (ARGV[10]), not the
     * word that grant itself was told. */
    long long tx6 = lease_field(n, "token");
    assert_int_equal(release_ended(n, X, "token", tx6, "1"), 1);   /* X's thread exits */
    assert_int_equal(acquire_end(n, Y, 7, "10000"), 1);            /* Y is told */
    long long ty7 = lease_field(n, "token");
    /* Y released it, but the release never arrived: its next acquire says
     * so (the last token, and 0: released by its holder) */
    assert_int_equal(acquire_end_after(n, Y, 8, "10000", ty7, "0"), 0);
    /* and keeps no word of the grant before (the same attempt again is
     * told 0 too) */
    assert_int_equal(lease_field(n, "u"), -1);
    assert_int_equal(acquire_end_after(n, Y, 8, "10000", ty7, "0"), 0);
    long long ty8 = lease_field(n, "token");
    assert_true(ty8 > ty7);
    /* this time Y's thread exits and the library's release never arrives */
    assert_int_equal(acquire_end_after(n, Y, 9, "10000", ty8, "1"), 1);
    /* an attempt of unknown outcome (never used) passes its word on */
    assert_int_equal(acquire_end(n, Y, 10, "10000"), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_late_attempt_never_regrants),
        cmocka_unit_test(test_late_attempt_does_not_queue_or_grant),
        cmocka_unit_test(test_release_is_idempotent),
        cmocka_unit_test(test_late_leave_is_ignored),
        cmocka_unit_test(test_record_expires),
        cmocka_unit_test(test_foreign_values_do_not_break_scripts),
        cmocka_unit_test(test_uncontended_costs),
        cmocka_unit_test(test_mark_after_step_back),
        cmocka_unit_test(test_mark_ahead_of_its_clock),
        cmocka_unit_test(test_direct_grant_leaves_nothing_ahead),
        cmocka_unit_test(test_regrant_and_direct_grant_follow_time),
        cmocka_unit_test(test_superseded_attempt_stays_stale),
        cmocka_unit_test(test_tokens_never_ahead_along_a_chain),
        cmocka_unit_test(test_late_copy_does_not_take_old_direct_grant),
        cmocka_unit_test(test_regrant_above_unconfirmed_last),
        cmocka_unit_test(test_restart_never_undercuts),
        cmocka_unit_test(test_unclean_ends),
        cmocka_unit_test(test_other_protocol_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
