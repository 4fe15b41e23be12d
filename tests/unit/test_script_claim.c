/*
 * Redlock's claim of a semaphore's name (lua/p2/sem_claim.lua) called
 * directly against a real redis-server, as one node runs it: a fresh name
 * claimed (the hash pv 2, k s, l, a time to live), the same limit claimed
 * again (the time to live raised, never lowered), another limit refused
 * with that limit, a lock's hash, a protocol 1 lock's and another key
 * refused with -1, nothing written by a refusal; several names in one call,
 * each answered on its own; bad arguments refused with DLOCKARG. The
 * library runs the text compiled into it; this test reads the source
 * tree's (DLOCK_SOURCE_DIR), as test_script_sem does.
 *
 * No timing: every time to live is read, not waited out.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

static redisContext *raw;
static char sha[48];

static int setup(void **state)
{
    if (fx_group_setup(state) != 0)
        return -1;
    raw = fx_connect("127.0.0.1", fx_server.port);
    if (!raw)
        return -1;
    static char text[1 << 14];
    char path[512];
    snprintf(path, sizeof path, "%s/lua/p2/sem_claim.lua", DLOCK_SOURCE_DIR);
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    text[fread(text, 1, sizeof text - 1, f)] = '\0';
    fclose(f);
    redisReply *r = redisCommand(raw, "SCRIPT LOAD %s", text);
    if (!r || r->type != REDIS_REPLY_STRING)
        return -1;
    snprintf(sha, sizeof sha, "%s", r->str);
    freeReplyObject(r);
    return 0;
}

static int teardown(void **state)
{
    redisFree(raw);
    return fx_group_teardown(state);
}

static redisReply *cmd(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(raw, fmt, ap);
    va_end(ap);
    assert_non_null(r);
    return r;
}

static long long cmd_int(const char *fmt, const char *key)
{
    redisReply *r = cmd(fmt, key);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

/* The claim of one key for limit with time to live ttl: its answer. */
static long long claim(const char *key, const char *ttl, const char *limit)
{
    redisReply *r = cmd("EVALSHA %s 1 %s %s %s", sha, key, ttl, limit);
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 1)
        fail_msg("claim of %s: %s", key, r->type == REDIS_REPLY_ERROR ? r->str : "not {n}");
    long long v = r->element[0]->integer;
    freeReplyObject(r);
    return v;
}

/* The hash of key as "field=value ..." sorted by Redis's order. */
static void dump(const char *key, char *out, size_t n)
{
    redisReply *r = cmd("HGETALL %s", key);
    size_t len = 0;
    out[0] = '\0';
    for (size_t i = 0; i + 1 < r->elements && len < n; i += 2)
        len += (size_t)snprintf(out + len, n - len, "%s=%s ", r->element[i]->str,
                                r->element[i + 1]->str);
    freeReplyObject(r);
}

/* A fresh name is claimed: pv 2, k s, l 3, a time to live of 2000 ms. */
static void test_fresh_claimed(void **state)
{
    (void)state;
    assert_int_equal(claim("tc:{a}", "2000", "3"), 0);
    char h[200];
    dump("tc:{a}", h, sizeof h);
    assert_string_equal(h, "pv=2 k=s l=3 ");
    long long ttl = cmd_int("PTTL %s", "tc:{a}");
    assert_true(ttl > 1000 && ttl <= 2000);
}

/* The same limit again: claimed, the time to live raised to the call's,
 * never lowered by a shorter one; another limit refused with it,
 * nothing written. */
static void test_again_and_other_limit(void **state)
{
    (void)state;
    assert_int_equal(claim("tc:{b}", "1000", "2"), 0);
    assert_int_equal(claim("tc:{b}", "60000", "2"), 0);
    assert_true(cmd_int("PTTL %s", "tc:{b}") > 50000);
    assert_int_equal(claim("tc:{b}", "1000", "2"), 0);
    assert_true(cmd_int("PTTL %s", "tc:{b}") > 50000);
    assert_int_equal(claim("tc:{b}", "1000", "5"), 2);
    char h[200];
    dump("tc:{b}", h, sizeof h);
    assert_string_equal(h, "pv=2 k=s l=2 ");
}

/* A lock's hash (pv 2 and a grant), a protocol 1 lock's (no pv), a
 * single-server semaphore's hash with a grant field, and a key of another
 * type: -1 (or Redis's WRONGTYPE for a string), nothing written. */
static void test_not_a_semaphore(void **state)
{
    (void)state;
    freeReplyObject(cmd("HSET tc:{l} pv 2 g x n c1"));
    freeReplyObject(cmd("HSET tc:{p1} owner o token 1"));
    freeReplyObject(cmd("HSET tc:{sg} pv 2 k s l 2 g x"));
    assert_int_equal(claim("tc:{l}", "1000", "2"), -1);
    assert_int_equal(claim("tc:{p1}", "1000", "2"), -1);
    assert_int_equal(claim("tc:{sg}", "1000", "2"), -1);
    char h[200];
    dump("tc:{l}", h, sizeof h);
    assert_string_equal(h, "pv=2 g=x n=c1 ");
    assert_int_equal(cmd_int("PTTL %s", "tc:{l}"), -1);
    freeReplyObject(cmd("SET tc:{s} x"));
    redisReply *r = cmd("EVALSHA %s 1 tc:{s} 1000 2", sha);
    assert_int_equal(r->type, REDIS_REPLY_ERROR);
    assert_non_null(strstr(r->str, "WRONGTYPE"));
    freeReplyObject(r);
}

/* Several names in one call (the renewal's batch), each answered on its
 * own: claimed, another limit, a lock's, claimed. */
static void test_batch(void **state)
{
    (void)state;
    assert_int_equal(claim("tc:{m2}", "5000", "4"), 0);
    freeReplyObject(cmd("HSET tc:{m3} pv 2 g x"));
    redisReply *r = cmd("EVALSHA %s 4 tc:{m1} tc:{m2} tc:{m3} tc:{m4} 5000 3 3 3 1", sha);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, 4);
    assert_int_equal(r->element[0]->integer, 0);
    assert_int_equal(r->element[1]->integer, 4);
    assert_int_equal(r->element[2]->integer, -1);
    assert_int_equal(r->element[3]->integer, 0);
    freeReplyObject(r);
    char h[200];
    dump("tc:{m4}", h, sizeof h);
    assert_string_equal(h, "pv=2 k=s l=1 ");
}

/* A time to live or a limit that is no whole number >= 1: DLOCKARG, and
 * nothing written, in a batch either. */
static void test_bad_arguments(void **state)
{
    (void)state;
    const char *bad[][2] = {{"0", "2"}, {"x", "2"}, {"1000", "0"}, {"1000", "1.5"},
                            {"1000", "-1"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        redisReply *r = cmd("EVALSHA %s 1 tc:{bad} %s %s", sha, bad[i][0], bad[i][1]);
        if (r->type != REDIS_REPLY_ERROR || strncmp(r->str, "DLOCKARG", 8))
            fail_msg("ttl %s, limit %s: not refused with DLOCKARG", bad[i][0], bad[i][1]);
        freeReplyObject(r);
    }
    assert_int_equal(cmd_int("EXISTS %s", "tc:{bad}"), 0);
    /* a batch whose second limit is bad: the first name not claimed either */
    redisReply *r = cmd("EVALSHA %s 2 tc:{ok} tc:{bad} 1000 2 0", sha);
    assert_int_equal(r->type, REDIS_REPLY_ERROR);
    freeReplyObject(r);
    assert_int_equal(cmd_int("EXISTS %s", "tc:{ok}"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fresh_claimed),
        cmocka_unit_test(test_again_and_other_limit),
        cmocka_unit_test(test_not_a_semaphore),
        cmocka_unit_test(test_batch),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
