/*
 * Protocol 2's Lua scripts (lua/p2/, data layout lua/p2/LAYOUT.txt) called
 * directly against a real redis-server, as test_script.c calls protocol 1's:
 * the same ordering and idempotence rules, on the one hash per name. The
 * library does not load them yet: they are read from the source tree at run
 * time (DLOCK_SOURCE_DIR), loaded with SCRIPT LOAD (force.lua with
 * release.lua's text in place of its line "--@release.lua") and run with
 * EVALSHA. After every p2 script, check_life checks the hash's lifetime:
 * it has a time to live, never longer than the longest of the record
 * lifetime, 2 x the lease time and 2 x the waiter ttl that calls on the
 * name passed (plus what a test allows for tokens ahead of server time),
 * and no field counts (its <until>, g's exp) past the hash's end.
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
#define A "11111111111111111111111111111111"
#define B "22222222222222222222222222222222"
#define C "33333333333333333333333333333333"
#define D "44444444444444444444444444444444"

static redisContext *conn; /* protocol 1's scripts (dlock_conn_eval) */
static redisContext *raw;  /* protocol 2's scripts (EVALSHA), plain commands */
static dlock_counters ctr;

enum { P2_ACQUIRE, P2_RELEASE, P2_LEAVE, P2_RENEW, P2_FORCE, P2_CTL, P2_N };
static const char *p2_file[P2_N] = {"acquire", "release", "leave", "renew", "force", "ctl_read"};
static char sha[P2_N][48];

static char *slurp(const char *file)
{
    char path[512];
    static char buf[1 << 16];
    snprintf(path, sizeof path, "%s/lua/p2/%s.lua", DLOCK_SOURCE_DIR, file);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot read %s", path);
    buf[fread(buf, 1, sizeof buf - 1, f)] = '\0';
    fclose(f);
    return strdup(buf);
}

/* SCRIPT LOADs the p2 scripts; sha[] their digests. */
static void load_p2(void)
{
    static const char mark[] = "--@release.lua\n";
    char *rel = slurp("release");
    for (int s = 0; s < P2_N; s++) {
        char *text = slurp(p2_file[s]), *at = strstr(text, mark);
        if (s == P2_FORCE) {
            assert_non_null(at);
            size_t n = strlen(text) + strlen(rel) + 2;
            char *all = malloc(n);
            snprintf(all, n, "%.*s%s\n%s", (int)(at - text), text, rel, at + sizeof mark - 1);
            free(text);
            text = all;
        }
        redisReply *r = redisCommand(raw, "SCRIPT LOAD %s", text);
        assert_non_null(r);
        if (r->type != REDIS_REPLY_STRING)
            fail_msg("SCRIPT LOAD of lua/p2/%s.lua: %s", p2_file[s], r->str ? r->str : "?");
        snprintf(sha[s], sizeof sha[s], "%s", r->str);
        freeReplyObject(r);
        free(text);
    }
    free(rel);
}

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

/* A plain command (an error fails the test); cmd_int: its integer, or a
 * string's leading number, -1 for nil. */
static redisReply *cmd(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(raw, fmt, ap);
    va_end(ap);
    assert_non_null(r);
    if (r->type == REDIS_REPLY_ERROR)
        fail_msg("%s: %s", fmt, r->str);
    return r;
}

static long long reply_int(redisReply *r)
{
    long long v = r->type == REDIS_REPLY_INTEGER  ? r->integer
                  : r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10)
                                                  : -1;
    freeReplyObject(r);
    return v;
}
#define cmd_int(...) reply_int(cmd(__VA_ARGS__))

/* SET key to one value (spaces and all), for px ms (0: no expiry). */
static void set_value(const char *key, const char *value, long long px)
{
    freeReplyObject(px ? cmd("SET %s %s PX %lld", key, value, px) : cmd("SET %s %s", key, value));
}

static long long server_us(void)
{
    redisReply *r = cmd("TIME");
    long long us = atoll(r->element[0]->str) * 1000000LL + atoll(r->element[1]->str);
    freeReplyObject(r);
    return us;
}

/* Each name's bound on its hash's time to live (see the head). */
static struct {
    char name[16];
    long long ms;
} life[64];
static int checking = 1; /* 0 while counting a script's commands */

static void allow(const char *name, long long ms)
{
    int i = 0;
    while (i < 63 && life[i].name[0] && strcmp(life[i].name, name))
        i++;
    snprintf(life[i].name, sizeof life[i].name, "%s", name);
    if (ms > life[i].ms)
        life[i].ms = ms;
}

/* The hash of name after a script: none, or one whose PTTL is within its
 * bound (20 ms of slack: the scripts' ceil and +1) and which no field
 * outlives. */
static void check_life(const char *name)
{
    long long pttl = checking ? cmd_int("PTTL ts:{%s}", name) : -2, bound = 0;
    if (pttl == -2)
        return;
    for (int i = 0; i < 64 && life[i].name[0]; i++)
        if (!strcmp(life[i].name, name))
            bound = life[i].ms;
    if (pttl < 0 || pttl > bound + 20)
        fail_msg("hash of %s: PTTL %lld, bound %lld", name, pttl, bound);
    long long now = server_us() / 1000, g[6];
    redisReply *r = cmd("HGETALL ts:{%s}", name);
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const char *f = r->element[i]->str, *v = r->element[i + 1]->str, *sp = strrchr(v, ' ');
        long long until = -1;
        if (!strcmp(f, "g") && sscanf(v, "%lld %lld %lld %lld %lld %lld", &g[0], &g[1], &g[2],
                                      &g[3], &g[4], &g[5]) == 6)
            until = g[3];
        else if ((!strncmp(f, "c:", 2) || !strcmp(f, "u") || !strcmp(f, "t")) && sp)
            until = atoll(sp + 1);
        if (until > now + pttl + 2)
            fail_msg("hash of %s: field %s '%s' outlives it (PTTL %lld)", name, f, v, pttl);
    }
    freeReplyObject(r);
}

/* EVALSHA of p2 script s on name's keys for client id: the reply. */
static redisReply *p2_eval(int s, const char *name, const char *id, const char **a, int na)
{
    keys k = keys_of(name, id);
    const char *argv[3 + NK + 10] = {"EVALSHA", sha[s], "7"};
    for (int i = 0; i < NK; i++)
        argv[3 + i] = k.k[i];
    memcpy(argv + 3 + NK, a, (size_t)na * sizeof *a);
    redisReply *r = redisCommandArgv(raw, 3 + NK + na, argv, NULL);
    assert_non_null(r);
    return r;
}

/* The same for a script that answers an integer (an error fails), then
 * check_life. */
static long long p2_int(int s, const char *name, const char *id, const char **a, int na)
{
    redisReply *r = p2_eval(s, name, id, a, na);
    if (r->type != REDIS_REPLY_INTEGER)
        fail_msg("lua/p2/%s.lua on %s: %s", p2_file[s], name, r->str ? r->str : "not a number");
    long long out = r->integer;
    freeReplyObject(r);
    check_life(name);
    return out;
}

/* An acquire's or a release's arguments; NULL or 0: the default (lease
 * 10 s, pass limit 16, waiter ttl 2 s, queueing, record lifetime 20 s,
 * nothing unconfirmed or handed out, released by its holder). */
typedef struct opt {
    const char *lease, *pl, *ttl, *queue, *keep, *how;
    long long last; /* acquire ARGV[9], release ARGV[5] */
} opt;
#define DEF(v, d) ((v) ? (v) : (d))

/* Attempt n of id on name. Returns the reply's first element (1 granted, 0
 * refused, -1 stale), *second its second (token, or pttl), *end the third
 * of a grant (acquire.lua, "End"; -1 when not granted). */
static long long acquire_o(const char *name, const char *id, long long n, opt o,
                           long long *second, long long *end)
{
    char nonce[24], last[24];
    snprintf(nonce, sizeof nonce, "%lld", n);
    snprintf(last, sizeof last, "%lld", o.last);
    const char *a[10] = {id, DEF(o.lease, "10000"), nonce, DEF(o.pl, "16"), DEF(o.ttl, "2000"),
                         DEF(o.queue, "1"), DEF(o.keep, "20000"), "test-client", last,
                         DEF(o.how, "0")};
    allow(name, atoll(a[6]));
    allow(name, 2 * atoll(a[1]));
    allow(name, 2 * atoll(a[4]));
    redisReply *r = p2_eval(P2_ACQUIRE, name, id, a, 10);
    if (r->type != REDIS_REPLY_ARRAY)
        fail_msg("lua/p2/acquire.lua on %s: %s", name, r->str ? r->str : "not an array");
    long long first = r->element[0]->integer;
    if (second)
        *second = r->element[1]->integer;
    if (end)
        *end = first == 1 ? r->element[2]->integer : -1;
    freeReplyObject(r);
    check_life(name);
    return first;
}

static long long acquire(const char *name, const char *id, long long n, long long *second)
{
    return acquire_o(name, id, n, (opt){0}, second, NULL);
}

/* Release of id's grant of name by field ("token" or "nonce"); o.how is
 * ARGV[10], o.last the last token handed out (ARGV[5]). rel: release.lua,
 * or force.lua (dlockctl passes lease 1 h, the token as last, record 60 s,
 * end 3). */
static long long rel(int script, const char *name, const char *id, const char *field,
                     long long value, opt o)
{
    char v[24], h[24];
    snprintf(v, sizeof v, "%lld", value);
    snprintf(h, sizeof h, "%lld", o.last);
    const char *a[10] = {id, field, v, DEF(o.lease, "10000"), h, "ts:wake:", name, "2000",
                         DEF(o.keep, "20000"), DEF(o.how, "0")};
    allow(name, 2 * atoll(a[3]));
    allow(name, atoll(a[8]));
    return p2_int(script, name, id, a, 10);
}
#define release_o(...) rel(P2_RELEASE, __VA_ARGS__)

static long long release(const char *name, const char *id, const char *field, long long value)
{
    return release_o(name, id, field, value, (opt){0});
}

/* Leave of id from name's queue, as call n (waiter ttl 2 s, record 20 s). */
static long long leave(const char *name, const char *id, long long n)
{
    char num[24];
    snprintf(num, sizeof num, "%lld", n);
    const char *a[6] = {id, "ts:wake:", name, "2000", num, "20000"};
    allow(name, 20000);
    return p2_int(P2_LEAVE, name, id, a, 6);
}

static long long force(const char *name, const char *id, long long token)
{
    return rel(P2_FORCE, name, id, "token", token,
               (opt){.lease = "3600000", .last = token, .keep = "60000", .how = "3"});
}

/* The grant in name's hash (fields g and o): present 0 when none or ''. */
typedef struct grant {
    int present;
    long long token, nonce, pl, exp, dur, u;
    char owner[40];
} grant;

static grant grant_of(const char *name)
{
    grant g = {0};
    redisReply *r = cmd("HMGET ts:{%s} g o", name);
    if (r->element[0]->type == REDIS_REPLY_STRING)
        g.present = sscanf(r->element[0]->str, "%lld %lld %lld %lld %lld %lld", &g.token,
                           &g.nonce, &g.pl, &g.exp, &g.dur, &g.u) == 6;
    if (r->element[1]->type == REDIS_REPLY_STRING)
        snprintf(g.owner, sizeof g.owner, "%s", r->element[1]->str);
    freeReplyObject(r);
    return g;
}

/* The grant's time left in ms by the server's clock; -2 when there is none
 * or it expired (it stays in g, bounding the next grant's token). */
static long long lease_left(const char *name)
{
    grant g = grant_of(name);
    long long now = server_us() / 1000;
    return g.present && g.exp >= now ? g.exp - now : -2;
}

/* Polls (10 ms) until name's grant has expired: at most 5 s, against the
 * lease times of a few hundred ms the tests set. */
static void wait_lease_gone(const char *name)
{
    for (int i = 0; i < 500 && lease_left(name) != -2; i++)
        fx_sleep_ms(10);
    assert_int_equal(lease_left(name), -2);
}

static long long queued(const char *name, const char *id)
{
    return cmd_int("ZSCORE ts:{%s}:q %s", name, id) >= 0;
}

static void set_mark(const char *name, long long token, long long clock, int pl)
{
    char v[80];
    snprintf(v, sizeof v, "%lld %lld %d", token, clock, pl);
    set_value(keys_of(name, X).k[6], v, 0);
}

/* A second connection subscribed to id's wake channel; expect_message
 * reads the next message on it and closes it. */
static redisContext *subscribe(const char *id)
{
    redisContext *s = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(s);
    redisReply *r = redisCommand(s, "SUBSCRIBE ts:wake:%s", id);
    assert_non_null(r);
    freeReplyObject(r);
    return s;
}

static void expect_message(redisContext *s, const char *want)
{
    redisReply *r = NULL;
    assert_int_equal(redisGetReply(s, (void **)&r), REDIS_OK);
    assert_true(r->type == REDIS_REPLY_ARRAY && r->elements == 3);
    assert_string_equal(r->element[2]->str, want);
    freeReplyObject(r);
    redisFree(s);
}

/* Commands run inside scripts since the last CONFIG RESETSTAT. */
static long long inner_calls(void)
{
    redisReply *r = cmd("INFO commandstats");
    long long n = 0;
    for (const char *p = r->str; (p = strstr(p, "cmdstat_")); p++)
        if (strncmp(p, "cmdstat_evalsha:", 16) && strncmp(p, "cmdstat_info:", 13) &&
            strncmp(p, "cmdstat_config", 14))
            n += strtoll(strstr(p, "calls=") + 6, NULL, 10);
    freeReplyObject(r);
    return n;
}

/* The DUMP of every key of name (the 7 of X, and Y's record) as hex, and
 * the hash's PTTL: what a refused script leaves exactly as it was. */
static void dump_keys(const char *name, char *out, size_t n, long long *pttl)
{
    keys k = keys_of(name, X);
    snprintf(k.k[1], sizeof k.k[1], "ts:{%s}:c:" Y, name); /* (no fence in these tests) */
    size_t used = 0;
    for (int i = 0; i < NK; i++) {
        redisReply *r = cmd("DUMP %s", k.k[i]);
        used += (size_t)snprintf(out + used, n - used, "%d:", i);
        for (size_t j = 0; r->type == REDIS_REPLY_STRING && j < r->len; j++)
            used += (size_t)snprintf(out + used, n - used, "%02x", (unsigned char)r->str[j]);
        assert_true(used + 8 < n);
        freeReplyObject(r);
    }
    *pttl = cmd_int("PTTL ts:{%s}", name);
}

/* Runs call (a stale attempt, a late leave), which must change nothing:
 * every key's DUMP is the same after it. */
#define UNCHANGED(name, call)                                                                     \
    do {                                                                                          \
        static char b_[16384], a_[16384];                                                         \
        long long p_;                                                                             \
        dump_keys(name, b_, sizeof b_, &p_);                                                      \
        call;                                                                                     \
        dump_keys(name, a_, sizeof a_, &p_);                                                      \
        assert_string_equal(b_, a_);                                                              \
    } while (0)

static int setup(void **state)
{
    if (fx_group_setup(state) != 0)
        return -1;
    dlock_conn_cfg cfg = {.host = (char *)"127.0.0.1", .port = fx_server.port,
                          .connect_timeout_ms = 1000, .command_timeout_ms = 2000};
    if (dlock_conn_open(&cfg, &ctr, &conn) != DLOCK_OK)
        return -1;
    raw = fx_connect("127.0.0.1", fx_server.port);
    if (!raw)
        return -1;
    load_p2();
    return 0;
}

static int teardown(void **state)
{
    redisFree(conn);
    redisFree(raw);
    return fx_group_teardown(state);
}

/* A late copy of an old attempt (3, after 5 was granted) neither grants
 * again nor changes anything (every key's DUMP); the give-back of 3 says it is superseded (3);
 * a newer attempt of the owner is granted again with a new token; the same
 * attempt seen twice gets the same grant. */
static void test_late_attempt_never_regrants(void **state)
{
    (void)state;
    long long t5, t7, again;
    assert_int_equal(acquire("late", X, 5, &t5), 1);
    UNCHANGED("late", assert_int_equal(acquire("late", X, 3, NULL), -1));
    assert_true(grant_of("late").token == t5 && grant_of("late").nonce == 5);
    assert_int_equal(release("late", X, "nonce", 3), 3);
    assert_int_equal(grant_of("late").nonce, 5);
    assert_int_equal(acquire("late", X, 7, &t7), 1);
    assert_true(t7 > t5 && grant_of("late").nonce == 7);
    assert_int_equal(acquire("late", X, 7, &again), 1);
    assert_int_equal(again, t7);
    assert_int_equal(release("late", X, "token", t7), 1);
}

/* A late attempt of a client that stopped waiting neither queues it nor,
 * once the lease is free, is granted it; a late leave cannot take out a
 * client that queued again since. */
static void test_late_attempts_and_leaves(void **state)
{
    (void)state;
    long long ty;
    assert_int_equal(acquire("lq", Y, 1, &ty), 1);
    assert_int_equal(acquire("lq", X, 10, NULL), 0);
    assert_int_equal(queued("lq", X), 1);
    assert_int_equal(leave("lq", X, 11), 1);
    UNCHANGED("lq", assert_int_equal(acquire("lq", X, 9, NULL), -1));
    assert_int_equal(queued("lq", X), 0);
    assert_int_equal(release("lq", Y, "token", ty), 1);
    assert_int_equal(acquire("lq", X, 10, NULL), -1);
    assert_int_equal(grant_of("lq").present, 0);
    assert_int_equal(acquire("ll", Y, 1, &ty), 1);
    assert_int_equal(acquire("ll", X, 30, NULL), 0);
    assert_int_equal(acquire("ll", X, 32, NULL), 0);
    UNCHANGED("ll", assert_int_equal(leave("ll", X, 31), 0));
    assert_int_equal(queued("ll", X), 1);
    assert_int_equal(leave("ll", X, 33), 1);
    assert_int_equal(queued("ll", X), 0);
    assert_int_equal(release("ll", Y, "token", ty), 1);
}

/* A retried release reports released (1), by token and by attempt, also
 * once another client holds the name; another token is not released; the
 * acquire that made a released grant, seen again, is stale. */
static void test_release_is_idempotent(void **state)
{
    (void)state;
    long long t, ty;
    assert_int_equal(acquire("ri", X, 20, &t), 1);
    assert_int_equal(release("ri", X, "token", t), 1);
    assert_int_equal(release("ri", X, "token", t), 1);
    assert_int_equal(release("ri", X, "token", t + 1), 0);
    assert_int_equal(acquire("ri", Y, 1, &ty), 1);
    assert_int_equal(release("ri", X, "token", t), 1);
    assert_int_equal(grant_of("ri").token, ty);
    assert_int_equal(release("ri", Y, "token", ty), 1);
    assert_int_equal(acquire("ri", X, 21, NULL), 1);
    assert_int_equal(release("ri", X, "nonce", 21), 1);
    assert_int_equal(release("ri", X, "nonce", 21), 1);
    UNCHANGED("ri", assert_int_equal(acquire("ri", X, 21, NULL), -1));
    assert_int_equal(grant_of("ri").present, 0);
}

/* The client's record (c:<id>: attempt, token, attempt, until) counts for
 * its lifetime; the hash goes once every lifetime its calls asked for has
 * passed (lease 200 ms, record 300 ms, waiter ttl 300 ms: gone after 1.5 s,
 * generous on a loaded machine). */
static void test_record_and_hash_expire(void **state)
{
    (void)state;
    long long t, a, tok, att, until;
    assert_int_equal(acquire("rx", X, 40, &t), 1);
    assert_int_equal(release("rx", X, "token", t), 1);
    redisReply *r = cmd("HGET ts:{rx} c:" X);
    long long now = server_us() / 1000;
    assert_int_equal(sscanf(r->str, "%lld %lld %lld %lld", &a, &tok, &att, &until), 4);
    freeReplyObject(r);
    assert_true(a == 40 && tok == t && att == 40 && until > now && until <= now + 20000);
    opt o = {.lease = "200", .keep = "300", .ttl = "300"};
    assert_int_equal(acquire_o("rz", X, 1, o, &t, NULL), 1);
    assert_int_equal(release_o("rz", X, "token", t, o), 1);
    fx_sleep_ms(1500);
    assert_int_equal(cmd_int("EXISTS ts:{rz}"), 0);
}

/* Values written by something else never make a script fail: a malformed
 * record, grant or end word counts as none; so must a malformed turn (t)
 * for the release, as it does for the acquire. */
static void test_foreign_values_do_not_break_scripts(void **state)
{
    (void)state;
    long long t, e;
    const char *setup[3] = {"HSET ts:{fv} pv 2 c:" X " garbage u garbage",
                            "HSET ts:{fn} pv 2 g 5 o " X, "HSET ts:{fl} pv 2 c:" X " 1-2-3"};
    const char *names[3] = {"fv", "fn", "fl"};
    for (int i = 0; i < 3; i++) {
        freeReplyObject(cmd(setup[i]));
        freeReplyObject(cmd("PEXPIRE ts:{%s} 60000", names[i]));
        allow(names[i], 60000);
    }
    assert_int_equal(acquire_o("fv", X, 50, (opt){0}, &t, &e), 1);
    assert_int_equal(e, 0);
    assert_int_equal(release("fv", X, "token", t), 1);
    assert_int_equal(release("fn", X, "nonce", 3), 0);
    assert_int_equal(acquire("fn", X, 60, &t), 1);
    assert_true(t > 5);
    assert_int_equal(release("fn", X, "token", t), 1);
    assert_int_equal(leave("fl", X, 70), 0);
    assert_int_equal(acquire("ft", X, 1, &t), 1);
    freeReplyObject(cmd("HSET ts:{ft} t garbage"));
    assert_int_equal(release("ft", X, "token", t), 1);
}

/* What the common case costs inside Redis, as lua/p2's heads say: an
 * acquire on a new hash 8 commands, on a name the client used before (its
 * record in the hash) 6; a release by a client the hash has a record of 4,
 * 2 more (MGET, SET of the mark) when its holder handed out tokens above
 * the mark. */
static void test_uncontended_costs(void **state)
{
    (void)state;
    long long t, calls[5];
    checking = 0;
    for (int round = 0; round < 2; round++) {
        freeReplyObject(cmd("CONFIG RESETSTAT"));
        assert_int_equal(acquire("cost", X, 80 + round, &t), 1);
        calls[2 * round] = inner_calls();
        freeReplyObject(cmd("CONFIG RESETSTAT"));
        assert_int_equal(release("cost", X, "token", t), 1);
        calls[2 * round + 1] = inner_calls();
    }
    assert_int_equal(acquire("cost", X, 90, &t), 1);
    freeReplyObject(cmd("CONFIG RESETSTAT"));
    assert_int_equal(release_o("cost", X, "token", t, (opt){.last = t + 3}), 1);
    calls[4] = inner_calls();
    checking = 1;
    check_life("cost");
    assert_int_equal(cmd_int("GET %s", keys_of("cost", X).k[6]), t + 3); /* the mark */
    assert_int_equal(calls[2], 6);
    assert_int_equal(calls[3], 4);
    assert_int_equal(calls[4], 6);
    /* (the first release, without the holder's record in the hash, also
     * reads protocol 1's record, and HLEN: 6) */
    assert_int_equal(calls[1], 6);
    if (calls[0] != 8)
        fail_msg("acquire on a new hash: %lld commands, lua/p2/acquire.lua says 8", calls[0]);
}

/* The slot's mark after a step back of the clock (a grant read the clock a
 * day ahead): grants go above its token + pass limit, direct ones too, and
 * the mark keeps the larger pass limit; with the clock past the mark's, a
 * grant's token is server time again. A mark whose token is ahead of its
 * own clock also bounds the next grant by its token + pass limit. */
static void test_mark_after_step_back(void **state)
{
    (void)state;
    long long now = server_us(), day = 86400LL * 1000000LL, t = now + day - 5000000, t1, ty, t2;
    long long mt, mc, mp;
    allow("sb", 2 * day / 1000);
    set_mark("sb", t, now + day, 500);
    assert_int_equal(acquire("sb", X, 1, &t1), 1);
    assert_true(t1 > t + 500);
    redisReply *r = cmd("GET %s", keys_of("sb", X).k[6]);
    assert_int_equal(sscanf(r->str, "%lld %lld %lld", &mt, &mc, &mp), 3);
    freeReplyObject(r);
    assert_true(mt == t1 && mc >= now && mc <= server_us() && mp == 500);
    assert_int_equal(acquire("sb", Y, 1, NULL), 0);
    set_mark("sb", t1 + 10, now + day, 700);
    assert_int_equal(release("sb", X, "token", t1), 2);
    ty = grant_of("sb").token;
    assert_true(ty > t1 + 10 + 700);
    assert_int_equal(release("sb", Y, "token", ty), 1);
    now = server_us();
    set_mark("sb", now - 2000, now - 1000, 700);
    long long before = server_us();
    assert_int_equal(acquire("sb", X, 2, &t2), 1);
    assert_true(t2 >= before && t2 <= server_us());
    assert_int_equal(release("sb", X, "token", t2), 1);
    now = server_us();
    allow("ah", 40000); /* a token 10 s ahead: its hash lives that much longer */
    set_mark("ah", now + 10000000LL, now - 5000000LL, 128);
    assert_int_equal(acquire("ah", X, 1, &t1), 1);
    assert_true(t1 > now + 10000000LL + 128);
}

/* A release grants the lease directly to the first live waiter, under its
 * queued attempt and for its waiter ttl, with "G <attempt> <token> <name>"
 * on its channel ("U <end> ..." when the release says how the grant ended:
 * capitals, protocol 2's direct grant);
 * the waiter's same attempt takes it at a full lease. A liveness value
 * without the grant fields gets the turn instead ("w <name>", field t): a
 * client not queued is then refused (-1), the turn's client is granted. */
static void test_direct_grant_and_turn_messages(void **state)
{
    (void)state;
    long long ty, tx, e, pttl;
    char want[128];
    assert_int_equal(acquire("dg", Y, 1, &ty), 1);
    assert_int_equal(acquire("dg", X, 5, NULL), 0);
    redisContext *s = subscribe(X);
    assert_int_equal(release("dg", Y, "token", ty), 2);
    grant g = grant_of("dg");
    assert_string_equal(g.owner, X);
    assert_true(g.nonce == 5 && g.token > ty && g.dur == 2000 && lease_left("dg") <= 2000);
    assert_int_equal(cmd_int("HEXISTS ts:{dg} q"), 0); /* nobody queued now */
    snprintf(want, sizeof want, "G 5 %lld dg", g.token);
    expect_message(s, want);
    assert_int_equal(acquire("dg", X, 5, &tx), 1);
    assert_true(tx == g.token && lease_left("dg") > 2000);
    assert_int_equal(acquire("dg", Y, 2, NULL), 0);
    s = subscribe(Y);
    assert_int_equal(release_o("dg", X, "token", tx, (opt){.how = "1"}), 2);
    ty = grant_of("dg").token;
    snprintf(want, sizeof want, "U 1 2 %lld dg", ty);
    expect_message(s, want);
    assert_int_equal(acquire_o("dg", Y, 2, (opt){0}, &tx, &e), 1);
    assert_true(tx == ty && e == 1);
    /* the turn */
    assert_int_equal(acquire("dg", X, 7, NULL), 0);
    freeReplyObject(cmd("HSET ts:{dg}:qd %s %lld", X, server_us() / 1000 + 5000));
    s = subscribe(X);
    assert_int_equal(release("dg", Y, "token", ty), 2);
    expect_message(s, "w dg");
    redisReply *r = cmd("HGET ts:{dg} t");
    assert_int_equal(strncmp(r->str, X " ", 33), 0);
    freeReplyObject(r);
    assert_int_equal(acquire("dg", A, 1, &pttl), 0);
    assert_int_equal(pttl, -1);
    assert_int_equal(acquire("dg", X, 8, &tx), 1);
    assert_int_equal(cmd_int("HEXISTS ts:{dg} t"), 0);
    assert_int_equal(leave("dg", A, 2), 1);
    assert_int_equal(release("dg", X, "token", tx), 1);
}

/* A give-back told 3 (a newer grant of the client holds the lease) stays
 * right after that grant expired unreleased: the late copy of its attempt
 * is refused, neither granted nor queued. */
static void test_superseded_attempt_stays_stale(void **state)
{
    (void)state;
    assert_int_equal(acquire_o("ss", X, 5, (opt){.lease = "300"}, NULL, NULL), 1);
    assert_int_equal(release("ss", X, "nonce", 4), 3);
    wait_lease_gone("ss");
    UNCHANGED("ss", assert_int_equal(acquire("ss", X, 4, NULL), -1));
    assert_int_equal(lease_left("ss"), -2);
    assert_int_equal(grant_of("ss").nonce, 5); /* the expired one, bounding tokens */
    assert_int_equal(queued("ss", X), 0);
}

/* No chain of unused grants pushes tokens ahead of server time: H's
 * release grants A directly, A gives up (its leave frees the grant and
 * gives B the turn: "w ch" on B's channel), B takes it and grants C
 * directly, C gives up, D takes it. */
static void test_tokens_never_ahead_along_a_chain(void **state)
{
    (void)state;
    long long th, t2, t4, ty;
    opt o = {.lease = "3000", .pl = "900000"};
    assert_int_equal(acquire_o("ch", X, 1, o, &th, NULL), 1);
    const char *w[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)
        assert_int_equal(acquire_o("ch", w[i], 1, o, NULL, NULL), 0);
    opt r = {.lease = "3000", .last = th}; /* (the last token handed out: its own) */
    assert_int_equal(release_o("ch", X, "token", th, r), 2);
    long long ta = grant_of("ch").token;
    redisContext *s = subscribe(B);
    assert_int_equal(leave("ch", A, 2), 1);
    expect_message(s, "w ch");
    assert_int_equal(acquire_o("ch", B, 2, o, &t2, NULL), 1);
    assert_true(t2 > ta && ta > th && t2 <= server_us());
    r.last = t2;
    assert_int_equal(release_o("ch", B, "token", t2, r), 2);
    long long tc = grant_of("ch").token;
    assert_int_equal(leave("ch", C, 2), 1);
    assert_int_equal(acquire_o("ch", D, 2, o, &t4, NULL), 1);
    assert_true(t4 > tc && tc > t2 && t4 <= server_us());
    r.last = t4;
    assert_int_equal(release_o("ch", D, "token", t4, r), 1);
    assert_int_equal(acquire_o("ch", Y, 1, (opt){.lease = "3000"}, &ty, NULL), 1);
    assert_true(ty > t4);
}

/* A single try of a queued client is refused; the release then grants it
 * directly under its queue entry's attempt: a late copy of that attempt
 * must not take the grant (nor stretch it to a whole lease). */
static void test_late_copy_does_not_take_old_direct_grant(void **state)
{
    (void)state;
    long long ty;
    assert_int_equal(acquire("og", Y, 1, &ty), 1);
    assert_int_equal(acquire("og", X, 5, NULL), 0); /* waiter ttl 2 s */
    assert_int_equal(acquire_o("og", X, 6, (opt){.queue = "0"}, NULL, NULL), 0);
    assert_int_equal(release("og", Y, "token", ty), 2);
    assert_int_equal(grant_of("og").nonce, 5);
    UNCHANGED("og", assert_int_equal(acquire("og", X, 5, NULL), -1));
    long long left = lease_left("og");
    assert_true(left > 0 && left <= 2000); /* the waiter ttl's grant, not a lease's (10 s) */
}

/* Tokens strictly increase across grants, above the last token a holder
 * handed out locally: the unconfirmed last of the client's own grant
 * (acquire ARGV[9]), and a release's ARGV[5], which raises the slot's mark
 * (for the next grant, and for a direct grant). */
static void test_tokens_above_local_handoffs(void **state)
{
    (void)state;
    long long t1, t2, ty, tx;
    allow("uc", 40000); /* tokens up to 12 s ahead: the hash lives that much longer */
    assert_int_equal(acquire("uc", X, 1, &t1), 1);
    assert_int_equal(acquire_o("uc", X, 2, (opt){.last = t1 + 5000000}, &t2, NULL), 1);
    assert_true(t2 > t1 + 5000000);
    assert_int_equal(release_o("uc", X, "token", t2, (opt){.last = t2 + 5000000}), 1);
    assert_int_equal(cmd_int("GET %s", keys_of("uc", X).k[6]), t2 + 5000000);
    assert_int_equal(acquire("uc", Y, 1, &ty), 1);
    assert_true(ty > t2 + 5000000);
    assert_int_equal(acquire("uc", X, 3, NULL), 0);
    assert_int_equal(release_o("uc", Y, "token", ty, (opt){.last = ty + 2000000}), 2);
    tx = grant_of("uc").token;
    assert_true(tx > ty + 2000000);
    assert_int_equal(release("uc", X, "token", tx), 1);
}

/* How the grant before ended (acquire.lua, "End"): a release for an exited
 * thread (1) or by an operator (3) tells the next grant, a direct one too
 * (its g's u); a grant that expired unreleased tells 2; a grant nobody used
 * (released by attempt, or given up by a leave) passes its word on; the
 * same attempt again is told again; the client's own older grant tells its
 * own end (ARGV[9], ARGV[10]). */
static long long end_of(const char *name, const char *id, long long n, const char *lease,
                        long long last, const char *how)
{
    long long e;
    acquire_o(name, id, n, (opt){.lease = lease, .last = last, .how = how}, NULL, &e);
    return e;
}

static long long rel_end(const char *id, const char *field, long long v, const char *how)
{
    return release_o("ue", id, field, v, (opt){.how = how});
}

static void test_unclean_ends(void **state)
{
    (void)state;
    const char *n = "ue";
    assert_int_equal(end_of(n, X, 1, "10000", 0, "0"), 0);
    assert_int_equal(rel_end(X, "token", grant_of(n).token, "1"), 1);
    assert_int_equal(end_of(n, Y, 1, "10000", 0, "0"), 1);
    assert_int_equal(grant_of(n).u, 1);
    assert_int_equal(end_of(n, Y, 1, "10000", 0, "0"), 1); /* told again */
    assert_int_equal(rel_end(Y, "token", grant_of(n).token, "0"), 1);
    assert_int_equal(end_of(n, X, 2, "1000", 0, "0"), 0);
    assert_int_equal(grant_of(n).u, 0);
    /* X's 1 s grant expires unreleased: told for a lease time past its exp
     * (X's 1 s, as protocol 1's key of it lives; 0.7 s to spare) */
    fx_sleep_ms(1300);
    assert_int_equal(end_of(n, Y, 2, "10000", 0, "0"), 2);
    assert_int_equal(end_of(n, X, 3, "10000", 0, "0"), -1); /* queued */
    assert_int_equal(rel_end(Y, "token", grant_of(n).token, "3"), 2);
    assert_int_equal(grant_of(n).u, 3);
    assert_int_equal(rel_end(X, "nonce", 3, "0"), 1); /* never taken: passes 3 on */
    assert_int_equal(end_of(n, Y, 3, "10000", 0, "0"), 3);
    assert_int_equal(end_of(n, X, 4, "10000", 0, "0"), -1);
    assert_int_equal(rel_end(Y, "token", grant_of(n).token, "1"), 2);
    assert_int_equal(leave(n, X, 5), 1); /* gives the direct grant up: passes 1 on */
    assert_int_equal(end_of(n, Y, 4, "10000", 0, "0"), 1);
    assert_int_equal(rel_end(Y, "token", grant_of(n).token, "0"), 1);
    assert_int_equal(end_of(n, X, 6, "10000", 0, "0"), 0);
    assert_int_equal(rel_end(X, "token", grant_of(n).token, "1"), 1);
    assert_int_equal(end_of(n, Y, 7, "10000", 0, "0"), 1);
    long long ty7 = grant_of(n).token;
    assert_int_equal(end_of(n, Y, 8, "10000", ty7, "0"), 0); /* its release never arrived */
    long long ty8 = grant_of(n).token;
    assert_true(ty8 > ty7);
    assert_int_equal(end_of(n, Y, 9, "10000", ty8, "1"), 1);
    assert_int_equal(end_of(n, Y, 10, "10000", 0, "0"), 1); /* unused grant 9 passes it on */
}

/* A grant that expired unreleased is told (2) to a grant made within the
 * holder's lease time past its exp, as protocol 1's key of it lives that
 * long (lua/acquire.lua, "End"), whatever the next client's own lease time:
 * X (lease 2 s) expires, Y (lease 100 ms) acquires 0.6 s after X's exp
 * (1.4 s to spare on a loaded machine). */
static void test_expiry_told_for_holders_lease_time(void **state)
{
    (void)state;
    long long e;
    assert_int_equal(acquire_o("et", X, 1, (opt){.lease = "2000"}, NULL, NULL), 1);
    fx_sleep_ms(2600);
    assert_int_equal(acquire_o("et", Y, 1, (opt){.lease = "100"}, NULL, &e), 1);
    assert_int_equal(e, 2);
}

/* Renewal of X's grants of names n1 and n2 by tokens t1, t2: the replies. */
static void renew2(const char *lease, const char *n1, long long t1, const char *n2, long long t2,
                   long long out[2])
{
    char k1[64], k2[64], a1[24], a2[24];
    snprintf(k1, sizeof k1, "ts:{%s}", n1);
    snprintf(k2, sizeof k2, "ts:{%s}", n2);
    snprintf(a1, sizeof a1, "%lld", t1);
    snprintf(a2, sizeof a2, "%lld", t2);
    const char *argv[] = {"EVALSHA", sha[P2_RENEW], "2", k1, k2, X, lease, a1, a2};
    allow(n1, 2 * atoll(lease));
    allow(n2, 2 * atoll(lease));
    redisReply *r = redisCommandArgv(raw, 9, argv, NULL);
    assert_non_null(r);
    if (r->type != REDIS_REPLY_ARRAY)
        fail_msg("lua/p2/renew.lua: %s", r->str ? r->str : "not an array");
    out[0] = r->element[0]->integer;
    out[1] = r->element[1]->integer;
    freeReplyObject(r);
    check_life(n1);
    check_life(n2);
}

/* A renewal extends only the caller's own live grant, by its token (not
 * another client's, not another token), never moves exp back, and never
 * brings an expired or released grant back. */
static void test_renew_only_own_grant(void **state)
{
    (void)state;
    long long tx, ty, tz, out[2];
    assert_int_equal(acquire("rn", X, 1, &tx), 1);
    assert_int_equal(acquire("rn2", Y, 1, &ty), 1);
    grant gx = grant_of("rn"), gy = grant_of("rn2");
    renew2("30000", "rn", tx, "rn2", ty, out);
    assert_true(out[0] == 1 && out[1] == 0);
    assert_int_equal(grant_of("rn2").exp, gy.exp);
    grant g = grant_of("rn");
    assert_true(g.token == tx && g.nonce == 1 && g.exp > gx.exp + 15000);
    renew2("100", "rn", tx, "rn", tx + 1, out); /* never back; not another token */
    assert_true(out[0] == 1 && out[1] == 0 && grant_of("rn").exp == g.exp);
    assert_int_equal(acquire_o("rn3", X, 1, (opt){.lease = "200"}, &tz, NULL), 1);
    wait_lease_gone("rn3");
    g = grant_of("rn3");
    renew2("10000", "rn3", tz, "rn3", tz, out);
    assert_true(out[0] == 0 && grant_of("rn3").exp == g.exp);
    assert_int_equal(release("rn", X, "token", tx), 1);
    renew2("10000", "rn", tx, "rn", tx, out);
    assert_int_equal(out[0], 0);
}

/* The forced release (force.lua around release.lua) releases only the
 * grant named (holder and token), telling the next grant 3 (a waiter
 * directly: "U 3 ..."); the holder's own release of that token then finds
 * it taken (0); a reservation ahead of server time is waited out (-N,
 * nothing changed). */
static void test_force_release(void **state)
{
    (void)state;
    long long tx, ty, tz, e;
    char want[96];
    assert_int_equal(acquire("fo", X, 1, &tx), 1);
    assert_int_equal(force("fo", Y, tx), 0);
    assert_int_equal(force("fo", X, tx + 1), 0);
    assert_int_equal(force("fo", X, tx), 1);
    assert_int_equal(grant_of("fo").present, 0);
    assert_int_equal(release("fo", X, "token", tx), 0);
    assert_int_equal(acquire_o("fo", Y, 1, (opt){0}, &ty, &e), 1);
    assert_int_equal(e, 3);
    assert_int_equal(acquire("fo", X, 2, NULL), 0);
    redisContext *s = subscribe(X);
    assert_int_equal(force("fo", Y, ty), 2);
    snprintf(want, sizeof want, "U 3 2 %lld fo", grant_of("fo").token);
    expect_message(s, want);
    assert_int_equal(acquire_o("fp", X, 1, (opt){.pl = "5000000"}, &tz, NULL), 1);
    long long w = force("fp", X, tz); /* 5 s reserved ahead */
    assert_true(w < 0 && w >= -5001 && grant_of("fp").token == tz);
    assert_int_equal(release("fp", X, "token", tz), 1);
}

/* r is a DLOCKPROTOCOL error naming both protocols. */
static void assert_refused(redisReply *r, const char *data, const char *speaks)
{
    assert_int_equal(r->type, REDIS_REPLY_ERROR);
    assert_int_equal(strncmp(r->str, "DLOCKPROTOCOL", 13), 0);
    assert_non_null(strstr(r->str, data));
    assert_non_null(strstr(r->str, speaks));
    freeReplyObject(r);
}

/* A protocol 1 script (dlock_conn_eval) on name's keys for client id. */
static redisReply *p1_eval(dlock_script_id s, const char *name, const char *id, const char **a,
                           int na)
{
    keys k = keys_of(name, id);
    const char *argv[NK + 10];
    for (int i = 0; i < NK; i++)
        argv[i] = k.k[i];
    memcpy(argv + NK, a, (size_t)na * sizeof *a);
    redisReply *r = dlock_conn_eval(conn, &ctr, dlock_conn_deadline(2000), s, NK, na, argv, NULL);
    assert_non_null(r);
    return r;
}

/* (a) Protocol 1's data (its grant, hash without pv, or with pv 1; pv 3, a
 * later protocol's, says "upgrade it") is refused by p2's acquire, leave,
 * release and forced release with a DLOCKPROTOCOL error naming both, and
 * not renewed (0); nothing changes (every key's DUMP; the hash's PTTL). */
static void test_p1_data_refused_by_p2(void **state)
{
    (void)state;
    const char *acq[10] = {Y, "10000", "1", "16", "2000", "1", "20000", "p1", "0", "0"};
    redisReply *r = p1_eval(DLOCK_SCRIPT_ACQUIRE, "pa", Y, acq, 10);
    assert_int_equal(r->element[0]->integer, 1); /* protocol 1 grants Y */
    char ty[24];
    snprintf(ty, sizeof ty, "%lld", r->element[1]->integer);
    freeReplyObject(r);
    acq[0] = X;
    r = p1_eval(DLOCK_SCRIPT_ACQUIRE, "pa", X, acq, 10);
    assert_int_equal(r->element[0]->integer, 0); /* X queued, with a record */
    freeReplyObject(r);
    static char before[16384], after[16384];
    for (int v = 0; v < 3; v++) {
        freeReplyObject(v ? cmd("HSET ts:{pa} pv %d", v == 1 ? 1 : 3) : cmd("HDEL ts:{pa} pv"));
        long long pb, pa;
        dump_keys("pa", before, sizeof before, &pb);
        const char *is = v == 2 ? "dlock protocol 3" : "dlock protocol 1";
        const char *speaks = v == 2 ? "speaks protocol 2: upgrade it" : "speaks protocol 2";
        const char *a[10] = {X, "10000", "9", "16", "2000", "1", "20000", "t", "0", "0"};
        assert_refused(p2_eval(P2_ACQUIRE, "pa", X, a, 10), is, speaks);
        const char *lv[6] = {X, "ts:wake:", "pa", "2000", "9", "20000"};
        assert_refused(p2_eval(P2_LEAVE, "pa", X, lv, 6), is, speaks);
        const char *rl[10] = {Y, "token", ty, "10000", "0", "ts:wake:", "pa", "2000", "20000", "0"};
        assert_refused(p2_eval(P2_RELEASE, "pa", Y, rl, 10), is, speaks);
        rl[3] = "3600000", rl[4] = ty, rl[9] = "3";
        assert_refused(p2_eval(P2_FORCE, "pa", Y, rl, 10), is, "speaks protocol 2");
        const char *rn[7] = {"EVALSHA", sha[P2_RENEW], "1", "ts:{pa}", Y, "10000", ty};
        r = redisCommandArgv(raw, 7, rn, NULL);
        assert_true(r->type == REDIS_REPLY_ARRAY && r->element[0]->integer == 0);
        freeReplyObject(r);
        dump_keys("pa", after, sizeof after, &pa);
        assert_string_equal(before, after);
        assert_true(pa <= pb);
    }
}

/* (a) Protocol 1's scripts refuse p2's hash (pv 2) the same way, changing
 * nothing; its renewal does not renew it. */
static void test_p2_data_refused_by_p1(void **state)
{
    (void)state;
    long long ty, pb, pa;
    static char before[16384], after[16384];
    assert_int_equal(acquire("pb", Y, 1, &ty), 1);
    assert_int_equal(acquire("pb", X, 5, NULL), 0); /* queued, with a record */
    dump_keys("pb", before, sizeof before, &pb);
    const char *is = "dlock protocol 2", *speaks = "speaks protocol 1";
    const char *acq[10] = {X, "10000", "6", "16", "2000", "1", "20000", "t", "0", "0"};
    assert_refused(p1_eval(DLOCK_SCRIPT_ACQUIRE, "pb", X, acq, 10), is, speaks);
    const char *lv[6] = {X, "ts:wake:", "pb", "2000", "7", "20000"};
    assert_refused(p1_eval(DLOCK_SCRIPT_LEAVE, "pb", X, lv, 6), is, speaks);
    char tok[24];
    snprintf(tok, sizeof tok, "%lld", ty);
    const char *rel[10] = {Y, "token", tok, "10000", "0", "ts:wake:", "pb", "2000", "20000", "0"};
    assert_refused(p1_eval(DLOCK_SCRIPT_RELEASE, "pb", Y, rel, 10), is, speaks);
    const char *rn[4] = {"ts:{pb}", Y, "10000", tok};
    redisReply *r = dlock_conn_eval(conn, &ctr, dlock_conn_deadline(2000), DLOCK_SCRIPT_RENEW, 1,
                                    3, rn, NULL);
    assert_int_equal(r->element[0]->integer, 0);
    freeReplyObject(r);
    dump_keys("pb", after, sizeof after, &pa);
    assert_string_equal(before, after);
    assert_true(pa <= pb);
    assert_int_equal(release("pb", Y, "token", ty), 2); /* p2's own: X gets it */
}

/* (c) A script adding a record field to a hash of more than 16 fields
 * removes the fields past their <until>. 14 single tries leave records of
 * 2 s (adding them takes far less); the test sleeps 3 s (a busy machine
 * only sleeps longer, which changes nothing), then a refused acquire, a
 * release and a leave, each by a client without a record in the hash,
 * prune them; A's record (60 s) and the grant's fields stay. */
static void add_short_records(const char *name)
{
    char id[40];
    for (int i = 0; i < 14; i++) {
        snprintf(id, sizeof id, "%032x", 0xa00 + i);
        assert_int_equal(acquire_o(name, id, 1, (opt){.queue = "0", .keep = "2000"}, NULL, NULL),
                         0);
    }
    assert_true(cmd_int("HLEN ts:{%s}", name) > 16);
    fx_sleep_ms(3000);
}

static void test_pruning(void **state)
{
    (void)state;
    long long tx;
    opt once = {.queue = "0", .keep = "60000"};
    assert_int_equal(acquire("pr", X, 1, &tx), 1);                /* pv g o n */
    assert_int_equal(acquire_o("pr", A, 1, once, NULL, NULL), 0); /* c:A, 60 s */
    add_short_records("pr");
    assert_int_equal(acquire_o("pr", B, 1, once, NULL, NULL), 0);
    assert_int_equal(cmd_int("HLEN ts:{pr}"), 6); /* pv g o n c:A c:B */
    add_short_records("pr");
    assert_int_equal(release("pr", X, "token", tx), 1);
    assert_int_equal(cmd_int("HLEN ts:{pr}"), 7); /* and c:X */
    assert_int_equal(acquire("pr", X, 2, &tx), 1);
    add_short_records("pr");
    assert_int_equal(leave("pr", C, 1), 0);
    assert_int_equal(cmd_int("HLEN ts:{pr}"), 8); /* and c:C */
    assert_true(cmd_int("HEXISTS ts:{pr} c:" A) == 1 && grant_of("pr").token == tx);
}

/* (d) A name protocol 1 used first: p1's record of the client (KEYS[6]) is
 * read while the hash has none (a newer attempt there makes an older one
 * stale, and a late leave void, writing nothing; a release it remembers
 * reads as released); p1's fence's end word is told by the first grant on
 * a new hash, whose token is above the fence's, and only once. */
static void test_p1_record_and_fence_read(void **state)
{
    (void)state;
    long long t, e, ty;
    char v[80];
    set_value("ts:{pc}:c:" X, "9 0 0", 20000);
    assert_int_equal(acquire("pc", X, 5, NULL), -1);
    assert_int_equal(leave("pc", X, 8), 0);
    assert_int_equal(cmd_int("EXISTS ts:{pc}"), 0); /* nothing written */
    assert_int_equal(acquire("pc", X, 10, &t), 1);
    assert_int_equal(acquire("pd", Y, 1, &ty), 1); /* a hash without X's record */
    set_value("ts:{pd}:c:" X, "9 777 9", 20000);
    assert_int_equal(acquire("pd", X, 5, NULL), -1);
    assert_int_equal(cmd_int("HEXISTS ts:{pd} c:" X), 0);
    assert_int_equal(release("pd", X, "token", 777), 1); /* released under p1 */
    assert_int_equal(release("pd", X, "nonce", 9), 1);
    long long f = server_us() + 3000000; /* a fence 3 s ahead (after a step back) */
    snprintf(v, sizeof v, "%lld 1", f);
    set_value("ts:{pf}:fence", v, 10000);
    allow("pf", 30000);
    assert_int_equal(acquire_o("pf", X, 1, (opt){0}, &t, &e), 1);
    assert_true(e == 1 && t > f);
    assert_int_equal(release("pf", X, "token", t), 1);
    assert_int_equal(acquire_o("pf", Y, 1, (opt){0}, &t, &e), 1);
    assert_int_equal(e, 0);
}

/* (d) p1's fence's end word when p2's first write on the name is not a
 * grant: p1's live turn (client D) refuses X, whose refusal creates the
 * hash (X queued); once D is gone X is granted, and must still be told the
 * end p1 kept (" 1"), as a grant on a new hash is: a name moves to p2
 * without losing what p1 remembered (lua/p2/LAYOUT.txt). */
static void test_p1_fence_end_after_refusal(void **state)
{
    (void)state;
    long long now = server_us(), pttl, t, e;
    char v[80];
    snprintf(v, sizeof v, "%lld 1", now - 1000);
    set_value("ts:{pg}:fence", v, 10000);
    freeReplyObject(cmd("ZADD ts:{pg}:q 1 " D));
    snprintf(v, sizeof v, "%lld 1 16 1500 w", now / 1000 + 1500);
    freeReplyObject(cmd("HSET ts:{pg}:qd %s %s", D, v));
    set_value("ts:{pg}:turn", D, 1500);
    assert_int_equal(acquire("pg", X, 1, &pttl), 0);
    assert_int_equal(pttl, -1);
    fx_sleep_ms(2500); /* D's liveness (1.5 s) has passed; the fence lives 10 s */
    assert_int_equal(acquire_o("pg", X, 2, (opt){0}, &t, &e), 1);
    assert_int_equal(e, 1);
}

/* dlockctl's read (lua/p2/ctl_read.lua, KEYS lease, queue, liveness, turn):
 * the holder, its token, name, since and exp while a grant stands, nothing
 * once released; the turn while its time lasts; each waiter with its
 * liveness; protocol 1's data refused. */
static void test_ctl_read(void **state)
{
    (void)state;
    long long tx;
    assert_int_equal(acquire("cr", X, 1, &tx), 1);
    assert_int_equal(acquire("cr", Y, 1, NULL), 0); /* queued */
    keys k = keys_of("cr", X);
    redisReply *r = cmd("EVALSHA %s 4 %s %s %s %s", sha[P2_CTL], k.k[0], k.k[2], k.k[3], k.k[4]);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, 12);
    assert_string_equal(r->element[1]->str, X);
    assert_int_equal(strtoll(r->element[2]->str, NULL, 10), tx);
    assert_string_equal(r->element[3]->str, "test-client");
    grant g = grant_of("cr");
    assert_int_equal(strtoll(r->element[4]->str, NULL, 10), g.exp - g.dur);
    assert_int_equal(strtoll(r->element[5]->str, NULL, 10), g.exp);
    assert_int_equal(r->element[7]->type, REDIS_REPLY_NIL); /* no turn */
    assert_string_equal(r->element[8]->str, Y);
    assert_int_equal(r->element[11]->integer, 1); /* alive */
    freeReplyObject(r);
    assert_int_equal(leave("cr", Y, 2), 1);
    assert_int_equal(release("cr", X, "token", tx), 1);
    r = cmd("EVALSHA %s 4 %s %s %s %s", sha[P2_CTL], k.k[0], k.k[2], k.k[3], k.k[4]);
    assert_int_equal(r->elements, 8); /* the server's time, then no holder */
    assert_int_equal(r->element[1]->type, REDIS_REPLY_NIL);
    assert_int_equal(r->element[6]->integer, -2);
    freeReplyObject(r);
    /* a turn, shown until its time */
    char tv[64];
    snprintf(tv, sizeof tv, "%s %lld", Y, server_us() / 1000 + 60000);
    freeReplyObject(cmd("HSET %s t %s", k.k[0], tv));
    r = cmd("EVALSHA %s 4 %s %s %s %s", sha[P2_CTL], k.k[0], k.k[2], k.k[3], k.k[4]);
    assert_true(r->elements == 8 && r->element[7]->type == REDIS_REPLY_STRING);
    assert_string_equal(r->element[7]->str, Y);
    freeReplyObject(r);
    /* protocol 1's data */
    freeReplyObject(cmd("DEL %s", k.k[0]));
    freeReplyObject(cmd("HSET %s owner %s token 1", k.k[0], X));
    r = redisCommand(raw, "EVALSHA %s 4 %s %s %s %s", sha[P2_CTL], k.k[0], k.k[2], k.k[3], k.k[4]);
    assert_true(r && r->type == REDIS_REPLY_ERROR && strstr(r->str, "DLOCKPROTOCOL") &&
                strstr(r->str, "protocol 1"));
    freeReplyObject(r);
    freeReplyObject(cmd("DEL %s", k.k[0]));
}

/* A turn whose client died is dropped by the acquire that passes it over,
 * even when that acquire is refused (the live head comes first): the dead
 * client, back before the turn's time, does not jump the queue (as
 * protocol 1 deletes its turn key). */
static void test_dead_turn_dropped_on_refusal(void **state)
{
    (void)state;
    long long th, tb;
    assert_int_equal(acquire("dt", A, 1, &th), 1);
    assert_int_equal(acquire("dt", B, 1, NULL), 0);
    assert_int_equal(acquire_o("dt", C, 1, (opt){.ttl = "300"}, NULL, NULL), 0);
    assert_int_equal(acquire("dt", D, 1, NULL), 0);
    assert_int_equal(release("dt", A, "token", th), 2); /* a direct grant to B */
    assert_string_equal(grant_of("dt").owner, B);
    tb = grant_of("dt").token;
    (void)tb;
    assert_int_equal(leave("dt", B, 2), 1); /* B gives it up: the turn is C's */
    fx_sleep_ms(600); /* C's liveness (300 ms) passes; the turn (2 s) stands */
    long long pttl;
    assert_int_equal(acquire("dt", X, 1, &pttl), 0); /* D, alive, comes first */
    assert_int_equal(pttl, -1);
    assert_int_equal(acquire("dt", C, 2, &pttl), 0); /* C is back: after D */
    assert_int_equal(pttl, -1);
}

/* A name whose protocol 1 data holds a queue and a turn: a hash made by a
 * refused single try (or a leave) takes them over, so a later acquire is
 * refused while the turn stands, as protocol 1's acquire would be. */
static void test_p1_queue_and_turn_taken_over(void **state)
{
    (void)state;
    for (int by_leave = 0; by_leave < 2; by_leave++) {
        const char *name = by_leave ? "qt2" : "qt1";
        keys k = keys_of(name, X);
        char live[96];
        long long now = server_us() / 1000, pttl;
        snprintf(live, sizeof live, "%lld 3 16 2000 w", now + 5000);
        freeReplyObject(cmd("ZADD %s %lld %s", k.k[2], now * 1000, D));
        freeReplyObject(cmd("HSET %s %s %s", k.k[3], D, live));
        freeReplyObject(cmd("PEXPIRE %s 10000", k.k[2]));
        freeReplyObject(cmd("PEXPIRE %s 10000", k.k[3]));
        set_value(k.k[4], D, 5000); /* protocol 1's turn: D's */
        allow(name, 10000);
        if (by_leave)
            assert_int_equal(leave(name, X, 1), 0);
        else
            assert_int_equal(acquire_o(name, X, 1, (opt){.queue = "0"}, &pttl, NULL), 0);
        assert_int_equal(cmd_int("HEXISTS ts:{%s} q", name), 1);
        assert_int_equal(acquire_o(name, Y, 1, (opt){.queue = "0"}, &pttl, NULL), 0);
        assert_int_equal(pttl, -1);
        assert_int_equal(acquire(name, D, 3, NULL), 1); /* the turn's client */
    }
}

/* Thousands of records past their time are pruned in one call, without
 * the error Redis's Lua gives for unpacking too many values. */
static void test_prune_many(void **state)
{
    (void)state;
    long long th;
    assert_int_equal(acquire("pm", A, 1, &th), 1);
    freeReplyObject(cmd("EVAL %s 1 ts:{pm}",
                        "for i = 1, 9000 do redis.call('HSET', KEYS[1], 'c:' .. "
                        "string.format('%032x', i), '1 0 0 1') end return 1"));
    assert_int_equal(release("pm", A, "token", th), 1); /* a new record: prunes */
    assert_int_equal(cmd_int("HLEN ts:{pm}"), 5); /* pv, g, o, n and A's record */
}

/* A record past its time is no record: a release by attempt that writes a
 * new one keeps none of the old one's fields, so a late release of the
 * old grant's token finds nothing (0, as protocol 1 answers). */
static void test_expired_record_forgotten(void **state)
{
    (void)state;
    long long t1, t5;
    assert_int_equal(acquire("er", A, 1, &t1), 1);
    assert_int_equal(release_o("er", A, "token", t1, (opt){.keep = "100"}), 1);
    fx_sleep_ms(300);
    assert_int_equal(acquire("er", A, 5, &t5), 1);
    assert_int_equal(release("er", A, "nonce", 3), 3);
    assert_int_equal(release("er", A, "token", t1), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_late_attempt_never_regrants),
        cmocka_unit_test(test_late_attempts_and_leaves),
        cmocka_unit_test(test_release_is_idempotent),
        cmocka_unit_test(test_record_and_hash_expire),
        cmocka_unit_test(test_foreign_values_do_not_break_scripts),
        cmocka_unit_test(test_uncontended_costs),
        cmocka_unit_test(test_mark_after_step_back),
        cmocka_unit_test(test_direct_grant_and_turn_messages),
        cmocka_unit_test(test_superseded_attempt_stays_stale),
        cmocka_unit_test(test_tokens_never_ahead_along_a_chain),
        cmocka_unit_test(test_late_copy_does_not_take_old_direct_grant),
        cmocka_unit_test(test_tokens_above_local_handoffs),
        cmocka_unit_test(test_unclean_ends),
        cmocka_unit_test(test_expiry_told_for_holders_lease_time),
        cmocka_unit_test(test_renew_only_own_grant),
        cmocka_unit_test(test_force_release),
        cmocka_unit_test(test_p1_data_refused_by_p2),
        cmocka_unit_test(test_p2_data_refused_by_p1),
        cmocka_unit_test(test_pruning),
        cmocka_unit_test(test_p1_record_and_fence_read),
        cmocka_unit_test(test_p1_fence_end_after_refusal),
        cmocka_unit_test(test_ctl_read),
        cmocka_unit_test(test_dead_turn_dropped_on_refusal),
        cmocka_unit_test(test_p1_queue_and_turn_taken_over),
        cmocka_unit_test(test_prune_many),
        cmocka_unit_test(test_expired_record_forgotten),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
