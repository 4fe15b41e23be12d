/*
 * The shared (read) mode of protocol 2 (lua/p2/acquire_shared.lua,
 * lua/p2/release_shared.lua, and what the exclusive scripts of lua/p2/ do
 * with shared holders: lua/p2/LAYOUT.txt, "Shared mode") called directly
 * against a real redis-server, as test_script_p2.c calls the exclusive
 * scripts, with the same helpers: the scripts are read from the source
 * tree at run time (DLOCK_SOURCE_DIR) and run with EVALSHA, and after each
 * one check_life checks the hash's lifetime (no field, a shared lease's
 * s:<id> and r included, counts past the hash's end).
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

enum { P2_ACQUIRE, P2_RELEASE, P2_LEAVE, P2_RENEW, P2_FORCE, P2_CTL, P2_ACQUIRE_S, P2_RELEASE_S,
       P2_N };
static const char *p2_file[P2_N] = {"acquire", "release",  "leave",          "renew",
                                    "force",   "ctl_read", "acquire_shared", "release_shared"};
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
        else if ((!strncmp(f, "c:", 2) || !strncmp(f, "s:", 2) || !strcmp(f, "u") ||
                  !strcmp(f, "t")) &&
                 sp)
            until = atoll(sp + 1);
        else if (!strcmp(f, "r"))
            until = atoll(v);
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

/* Attempt n of id on name by script s (exclusive or shared). Returns the reply's first element (1 granted, 0
 * refused, -1 stale), *second its second (token, or pttl), *end the third
 * of a grant (acquire.lua, "End"; -1 when not granted). */
static long long acq(int s, const char *name, const char *id, long long n, opt o,
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
    redisReply *r = p2_eval(s, name, id, a, 10);
    if (r->type != REDIS_REPLY_ARRAY)
        fail_msg("lua/p2/%s.lua on %s: %s", p2_file[s], name, r->str ? r->str : "not an array");
    long long first = r->element[0]->integer;
    if (second)
        *second = r->element[1]->integer;
    if (end)
        *end = first == 1 ? r->element[2]->integer : -1;
    freeReplyObject(r);
    check_life(name);
    return first;
}

#define acquire_o(...) acq(P2_ACQUIRE, __VA_ARGS__)
#define shared_o(...) acq(P2_ACQUIRE_S, __VA_ARGS__)

static long long acquire(const char *name, const char *id, long long n, long long *second)
{
    return acquire_o(name, id, n, (opt){0}, second, NULL);
}

/* Shared attempt n of id on name (defaults as acquire's). */
static long long shared(const char *name, const char *id, long long n, long long *second)
{
    return shared_o(name, id, n, (opt){0}, second, NULL);
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
#define unshare_o(...) rel(P2_RELEASE_S, __VA_ARGS__)

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

static long long unshare(const char *name, const char *id, const char *field, long long value)
{
    return unshare_o(name, id, field, value, (opt){0});
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

/* id's shared lease of name (field s:<id>): present 0 when none. */
typedef struct slease {
    int present;
    long long token, nonce, dur, end, exp;
} slease;

static slease shared_of(const char *name, const char *id)
{
    slease s = {0};
    redisReply *r = cmd("HGET ts:{%s} s:%s", name, id);
    if (r->type == REDIS_REPLY_STRING)
        s.present = sscanf(r->str, "%lld %lld %lld %lld %lld", &s.token, &s.nonce, &s.dur,
                           &s.end, &s.exp) == 5;
    freeReplyObject(r);
    return s;
}

static long long mark_token(const char *name)
{
    return cmd_int("GET %s", keys_of(name, X).k[6]);
}

/* Renewal by id of its grant of name with token tok: the reply (1 or 0). */
static long long renew1(const char *name, const char *id, const char *lease, long long tok)
{
    char k[64], a[24];
    snprintf(k, sizeof k, "ts:{%s}", name);
    snprintf(a, sizeof a, "%lld", tok);
    const char *argv[] = {"EVALSHA", sha[P2_RENEW], "1", k, id, lease, a};
    allow(name, 2 * atoll(lease));
    redisReply *r = redisCommandArgv(raw, 7, argv, NULL);
    assert_non_null(r);
    if (r->type != REDIS_REPLY_ARRAY)
        fail_msg("lua/p2/renew.lua: %s", r->str ? r->str : "not an array");
    long long out = r->element[0]->integer;
    freeReplyObject(r);
    check_life(name);
    return out;
}

/* Attempt n of id on name by script s, queueing: the raw reply (an error
 * too), then check_life. */
static redisReply *acq_reply(int s, const char *name, const char *id, long long n)
{
    char nonce[24];
    snprintf(nonce, sizeof nonce, "%lld", n);
    const char *a[10] = {id, "10000", nonce, "16", "2000", "1", "20000", "test-client", "0", "0"};
    allow(name, 20000);
    redisReply *r = p2_eval(s, name, id, a, 10);
    check_life(name);
    return r;
}

/* r is a DLOCKMODE error reply (freed). */
static void assert_mode_error(redisReply *r)
{
    if (r->type != REDIS_REPLY_ERROR)
        fail_msg("expected a DLOCKMODE error, got reply type %d", r->type);
    assert_int_equal(strncmp(r->str, "DLOCKMODE ", 10), 0);
    assert_non_null(strstr(r->str, "release"));
    freeReplyObject(r);
}

/* Two clients hold a name shared at once, each its own lease (field
 * s:<id>) with its own token, the later above the earlier; r covers both;
 * the hash keeps its listpack encoding; an exclusive acquire is refused
 * while they live (pttl: the time to the latest exp) and queued. */
static void test_shared_with_shared(void **state)
{
    (void)state;
    long long ta, tb, pttl;
    assert_int_equal(shared("ss", A, 1, &ta), 1);
    assert_int_equal(shared("ss", B, 1, &tb), 1);
    assert_true(tb > ta);
    slease a = shared_of("ss", A), b = shared_of("ss", B);
    assert_true(a.present && a.token == ta && a.nonce == 1 && b.present && b.token == tb);
    assert_int_equal(cmd_int("HGET ts:{ss} r"), b.exp);
    assert_int_equal(grant_of("ss").present, 0);
    redisReply *r = cmd("OBJECT ENCODING ts:{ss}");
    assert_string_equal(r->str, "listpack");
    freeReplyObject(r);
    assert_int_equal(acquire("ss", X, 1, &pttl), 0);
    assert_true(pttl > 0 && pttl <= 10001);
    assert_int_equal(queued("ss", X), 1);
    /* the caller's own shared lease: no upgrade (test_exclusive_by_shared_holder_refused) */
    assert_mode_error(acq_reply(P2_ACQUIRE, "ss", A, 2));
    assert_int_equal(unshare("ss", A, "token", ta), 1);
    assert_int_equal(unshare("ss", B, "token", tb), 2);
}

/* Shared leases block an exclusive waiter until the last of them is
 * released; that release grants it directly ("G <attempt> <token>
 * <name>"), with a token above both shared tokens; the first release
 * changes nothing for the waiter. */
static void test_last_shared_release_grants_writer(void **state)
{
    (void)state;
    long long ta, tb;
    char want[128];
    assert_int_equal(shared("lw", A, 1, &ta), 1);
    assert_int_equal(shared("lw", B, 1, &tb), 1);
    assert_int_equal(acquire("lw", X, 5, NULL), 0);
    assert_int_equal(unshare("lw", A, "token", ta), 1);
    assert_int_equal(grant_of("lw").present, 0);
    assert_int_equal(queued("lw", X), 1);
    assert_true(cmd_int("HGET ts:{lw} r") == shared_of("lw", B).exp);
    redisContext *s = subscribe(X);
    assert_int_equal(unshare("lw", B, "token", tb), 2);
    grant g = grant_of("lw");
    assert_true(g.present && g.nonce == 5 && g.token > tb && g.dur == 2000);
    assert_string_equal(g.owner, X);
    snprintf(want, sizeof want, "G 5 %lld lw", g.token);
    expect_message(s, want);
    assert_int_equal(cmd_int("HEXISTS ts:{lw} r"), 0);
    assert_int_equal(queued("lw", X), 0);
    long long tx;
    assert_int_equal(acquire("lw", X, 5, &tx), 1);
    assert_int_equal(tx, g.token);
    assert_int_equal(release("lw", X, "token", tx), 1);
}

/* An exclusive grant refuses shared acquires (pttl: its time left); its
 * release grants at once every shared waiter at the head of the queue up
 * to the first live exclusive waiter, one token above its own, each with
 * "S <end> <attempt> <token> <name>"; the shared waiter behind the
 * exclusive one stays queued, and is refused while that waiter lives; the
 * last of the run's releases grants the exclusive waiter. */
static void test_exclusive_release_grants_shared_run(void **state)
{
    (void)state;
    long long tx, pttl, ty;
    char want[128];
    assert_int_equal(acquire("er", X, 1, &tx), 1);
    assert_int_equal(shared("er", A, 3, &pttl), 0);
    assert_true(pttl > 0 && pttl <= 10001);
    assert_int_equal(shared("er", B, 4, NULL), 0);
    assert_int_equal(acquire("er", Y, 1, NULL), 0);
    assert_int_equal(shared("er", C, 2, NULL), 0);
    redisReply *lv = cmd("HGET ts:{er}:qd %s", A);
    assert_non_null(strstr(lv->str, " 3 s 2000 test-client"));
    freeReplyObject(lv);
    redisContext *sa = subscribe(A), *sb = subscribe(B), *sc = subscribe(C);
    assert_int_equal(release("er", X, "token", tx), 2);
    slease a = shared_of("er", A), b = shared_of("er", B);
    assert_true(a.present && b.present && a.token == b.token && a.token > tx);
    assert_true(a.nonce == 3 && b.nonce == 4 && a.dur == 2000 && a.end == 0);
    assert_int_equal(grant_of("er").present, 0);
    snprintf(want, sizeof want, "S 0 3 %lld er", a.token);
    expect_message(sa, want);
    snprintf(want, sizeof want, "S 0 4 %lld er", a.token);
    expect_message(sb, want);
    redisFree(sc);
    assert_int_equal(cmd_int("HGET ts:{er} r"), a.exp > b.exp ? a.exp : b.exp);
    assert_int_equal(acquire_o("er", D, 1, (opt){.queue = "0"}, &pttl, NULL), 0);
    assert_true(pttl > 0 && pttl <= 2001);
    assert_int_equal(shared_of("er", C).present, 0);
    assert_int_equal(queued("er", A), 0);
    assert_int_equal(queued("er", Y), 1);
    assert_int_equal(queued("er", C), 1);
    assert_int_equal(shared("er", C, 5, &pttl), 0); /* Y, alive, is ahead */
    assert_int_equal(pttl, -1);
    long long t;
    assert_int_equal(shared("er", A, 3, &t), 1); /* the same attempt: its grant */
    assert_int_equal(t, a.token);
    assert_true(shared_of("er", A).exp > a.exp);
    assert_int_equal(unshare("er", A, "nonce", 3), 1);
    assert_int_equal(unshare("er", B, "token", b.token), 2);
    grant g = grant_of("er");
    assert_true(g.present && g.token > a.token);
    assert_string_equal(g.owner, Y);
    assert_int_equal(acquire("er", Y, 1, &ty), 1);
    /* Y's release: C, the one shared waiter left, is granted */
    assert_int_equal(release("er", Y, "token", ty), 2);
    assert_int_equal(shared_of("er", C).nonce, 5);
    assert_true(shared_of("er", C).token > ty);
}

/* Writers do not starve: with an exclusive waiter queued, a new shared
 * acquire of another client is refused (-1) and queued behind it; the
 * client that holds the name shared is granted again (newer attempt: a
 * new token, its field replaced; same attempt: the same grant), adding no
 * holder; its release then grants the writer. A shared waiter ahead of the
 * exclusive waiter is granted (FIFO), a dead exclusive waiter refuses
 * nobody. */
static void test_queued_writer_stops_new_readers(void **state)
{
    (void)state;
    long long ta, ta2, again, pttl, tb;
    assert_int_equal(shared("wp", A, 1, &ta), 1);
    assert_int_equal(acquire("wp", X, 1, NULL), 0);
    assert_int_equal(shared("wp", B, 1, &pttl), 0);
    assert_int_equal(pttl, -1);
    assert_int_equal(queued("wp", B), 1);
    assert_int_equal(shared("wp", A, 2, &ta2), 1);
    assert_true(ta2 > ta && shared_of("wp", A).nonce == 2);
    assert_int_equal(shared("wp", A, 2, &again), 1);
    assert_int_equal(again, ta2);
    assert_int_equal(shared_of("wp", B).present, 0);
    assert_int_equal(unshare("wp", A, "token", ta2), 2);
    assert_string_equal(grant_of("wp").owner, X);
    assert_int_equal(queued("wp", B), 1);
    /* FIFO: a shared waiter queued before an exclusive one comes first */
    long long tx;
    assert_int_equal(acquire_o("fi", X, 1, (opt){.lease = "300"}, &tx, NULL), 1);
    assert_int_equal(shared("fi", A, 1, NULL), 0);
    assert_int_equal(acquire("fi", Y, 1, NULL), 0);
    wait_lease_gone("fi"); /* X's grant expires unreleased: no direct grant */
    assert_int_equal(acquire("fi", Y, 2, &pttl), 0); /* A is ahead */
    assert_int_equal(pttl, -1);
    long long e;
    assert_int_equal(shared_o("fi", A, 2, (opt){0}, &ta, &e), 1);
    assert_int_equal(e, 2); /* the exclusive grant before expired unreleased */
    assert_int_equal(shared("fi", B, 1, &pttl), 0); /* Y is queued */
    /* a dead exclusive waiter refuses nobody */
    assert_int_equal(shared("dw", A, 1, NULL), 1);
    assert_int_equal(acquire_o("dw", X, 1, (opt){.ttl = "200"}, NULL, NULL), 0);
    assert_int_equal(shared("dw", B, 1, &pttl), 0);
    fx_sleep_ms(400); /* X's liveness (200 ms) passes */
    assert_int_equal(shared("dw", B, 2, &tb), 1);
    assert_int_equal(queued("dw", B), 0);
}

/* Tokens: a shared grant's is above every token handed out before it (an
 * exclusive grant's local handoffs too) and writes the slot's mark; every
 * later exclusive grant's, by acquire or by direct grant, is above it.
 * After a step back of the clock (a mark a day ahead) a shared token goes
 * above the mark's token + pass limit, and the next exclusive above it. */
static void test_shared_tokens(void **state)
{
    (void)state;
    long long tx, ta, tb, ty, tz;
    assert_int_equal(acquire("tk", X, 1, &tx), 1);
    assert_int_equal(release_o("tk", X, "token", tx, (opt){.last = tx + 5000000}), 1);
    assert_int_equal(shared("tk", A, 1, &ta), 1);
    assert_true(ta > tx + 5000000);
    assert_int_equal(mark_token("tk"), ta);
    assert_int_equal(shared("tk", B, 1, &tb), 1);
    assert_true(tb > ta && mark_token("tk") == tb);
    assert_int_equal(acquire("tk", Y, 1, NULL), 0);
    assert_int_equal(unshare("tk", A, "token", ta), 1);
    assert_int_equal(unshare("tk", B, "token", tb), 2);
    ty = grant_of("tk").token;
    assert_true(ty > tb);
    assert_int_equal(acquire("tk", Y, 1, &ty), 1);
    assert_int_equal(release("tk", Y, "token", ty), 1);
    assert_int_equal(shared("tk", C, 1, &ta), 1);
    assert_int_equal(unshare("tk", C, "token", ta), 1);
    assert_int_equal(acquire("tk", D, 1, &tz), 1);
    assert_true(ta > ty && tz > ta);
    /* a step back: the mark read the clock a day ahead */
    long long now = server_us(), day = 86400LL * 1000000LL;
    allow("ts", 2 * day / 1000);
    set_mark("ts", now + day, now + day, 500);
    assert_int_equal(shared("ts", A, 1, &ta), 1);
    assert_true(ta > now + day + 500);
    assert_int_equal(shared("ts", B, 1, &tb), 1);
    assert_true(tb > ta);
    assert_int_equal(acquire("ts", X, 1, NULL), 0);
    assert_int_equal(unshare("ts", A, "token", ta), 1);
    assert_int_equal(unshare("ts", B, "token", tb), 2);
    assert_true(grant_of("ts").token > tb);
}

/* A shared holder that stops renewing (its client died) holds the name
 * until its lease's end, no longer: the exclusive acquire is refused for
 * at most that time and then granted, removing r; a renewed shared lease
 * is not lost, an unrenewed one beside it ends. */
static void test_dead_shared_holder_expires(void **state)
{
    (void)state;
    long long ta, tb, pttl, tx;
    opt o = {.lease = "600"};
    assert_int_equal(shared_o("dh", A, 1, o, &ta, NULL), 1);
    assert_int_equal(shared_o("dh", B, 1, o, &tb, NULL), 1);
    assert_int_equal(acquire("dh", X, 1, &pttl), 0);
    assert_true(pttl > 0 && pttl <= 601);
    fx_sleep_ms(400);
    assert_int_equal(renew1("dh", B, "600", tb), 1);
    assert_int_equal(renew1("dh", B, "600", ta), 0); /* A's token: not B's lease */
    assert_int_equal(renew1("dh", A, "600", tb), 0);
    fx_sleep_ms(300); /* A's lease has ended, B's renewed one not */
    assert_int_equal(shared_of("dh", B).exp, cmd_int("HGET ts:{dh} r"));
    assert_int_equal(acquire("dh", X, 2, &pttl), 0);
    assert_true(pttl > 0);
    fx_sleep_ms(600);
    assert_int_equal(renew1("dh", B, "600", tb), 0); /* ended: never brought back */
    assert_int_equal(acquire("dh", X, 3, &tx), 1);
    assert_true(tx > tb);
    assert_int_equal(cmd_int("HEXISTS ts:{dh} r"), 0);
    assert_int_equal(unshare("dh", B, "token", tb), 0);
    assert_int_equal(release("dh", X, "token", tx), 1);
}

/* Renewal of a shared lease by its token (the same call as an exclusive
 * grant's, one batch for both): a whole lease from now, r raised with it;
 * a released lease is not renewed. */
static void test_renew_shared(void **state)
{
    (void)state;
    long long ta, tx;
    assert_int_equal(shared_o("rn", A, 1, (opt){.lease = "1000"}, &ta, NULL), 1);
    assert_int_equal(acquire("rn2", A, 2, &tx), 1);
    slease before = shared_of("rn", A);
    fx_sleep_ms(20);
    char k1[32] = "ts:{rn}", k2[32] = "ts:{rn2}", a1[24], a2[24];
    snprintf(a1, sizeof a1, "%lld", ta);
    snprintf(a2, sizeof a2, "%lld", tx);
    const char *argv[] = {"EVALSHA", sha[P2_RENEW], "2", k1, k2, A, "5000", a1, a2};
    allow("rn", 10000);
    allow("rn2", 10000);
    redisReply *r = redisCommandArgv(raw, 9, argv, NULL);
    assert_true(r->type == REDIS_REPLY_ARRAY && r->elements == 2);
    assert_true(r->element[0]->integer == 1 && r->element[1]->integer == 1);
    freeReplyObject(r);
    check_life("rn");
    slease after = shared_of("rn", A);
    assert_true(after.token == ta && after.nonce == 1 && after.exp > before.exp + 3000);
    assert_int_equal(after.exp - after.dur, before.exp - before.dur); /* since kept */
    assert_int_equal(cmd_int("HGET ts:{rn} r"), after.exp);
    assert_int_equal(unshare("rn", A, "token", ta), 1);
    assert_int_equal(renew1("rn", A, "5000", ta), 0);
    assert_int_equal(release("rn2", A, "token", tx), 1);
}

/* Idempotence as for exclusive grants: a late copy of an older attempt
 * (shared or exclusive) changes nothing; a give-back of an older attempt
 * says it is superseded (3); a retried release reports released (1), by
 * token and by attempt; another token is not released (0); the attempt of
 * a released shared lease, seen again, is stale. */
static void test_late_copies_refused(void **state)
{
    (void)state;
    long long t5, again;
    assert_int_equal(shared("lc", A, 5, &t5), 1);
    UNCHANGED("lc", assert_int_equal(shared("lc", A, 3, NULL), -1));
    UNCHANGED("lc", assert_int_equal(acquire("lc", A, 4, NULL), -1));
    assert_int_equal(shared("lc", A, 5, &again), 1);
    assert_int_equal(again, t5);
    assert_int_equal(unshare("lc", A, "nonce", 4), 3);
    assert_int_equal(unshare("lc", A, "token", t5 + 1), 0);
    assert_int_equal(unshare("lc", B, "token", t5), 0);
    assert_int_equal(shared_of("lc", A).nonce, 5);
    assert_int_equal(unshare("lc", A, "token", t5), 1);
    assert_int_equal(unshare("lc", A, "token", t5), 1);
    assert_int_equal(unshare("lc", A, "nonce", 5), 1);
    UNCHANGED("lc", assert_int_equal(shared("lc", A, 5, NULL), -1));
    assert_int_equal(shared_of("lc", A).present, 0);
    /* by attempt: the grant of an attempt whose outcome was unknown */
    assert_int_equal(shared("lc", A, 7, NULL), 1);
    assert_int_equal(unshare("lc", A, "nonce", 7), 1);
    assert_int_equal(unshare("lc", A, "nonce", 7), 1);
    assert_int_equal(shared_of("lc", A).present, 0);
    /* a late copy of an older attempt of an exclusive holder */
    long long tx;
    assert_int_equal(acquire("lc", X, 9, &tx), 1);
    UNCHANGED("lc", assert_int_equal(shared("lc", X, 8, NULL), -1));
    assert_int_equal(release("lc", X, "token", tx), 1);
}

/* A shared waiter that gives up waiting after a release granted it the
 * name directly gives the grant up (leave.lua): its field goes; the last
 * one leaving passes the turn to the first live waiter ("w <name>"); one
 * leaving beside another live shared lease leaves the name to it. */
static void test_shared_leave_gives_up_direct_grant(void **state)
{
    (void)state;
    long long tx;
    assert_int_equal(acquire("lv", X, 1, &tx), 1);
    assert_int_equal(shared("lv", A, 2, NULL), 0);
    assert_int_equal(shared("lv", B, 2, NULL), 0);
    assert_int_equal(acquire("lv", Y, 1, NULL), 0);
    assert_int_equal(release("lv", X, "token", tx), 2);
    assert_int_equal(shared_of("lv", A).nonce, 2);
    assert_int_equal(leave("lv", A, 3), 1);
    assert_int_equal(shared_of("lv", A).present, 0);
    assert_int_equal(cmd_int("HGET ts:{lv} r"), shared_of("lv", B).exp);
    assert_int_equal(cmd_int("HEXISTS ts:{lv} t"), 0);
    redisContext *s = subscribe(Y);
    assert_int_equal(leave("lv", B, 3), 1);
    expect_message(s, "w lv");
    assert_int_equal(cmd_int("HEXISTS ts:{lv} r"), 0);
    assert_int_equal(acquire("lv", Y, 2, &tx), 1);
    assert_int_equal(release("lv", Y, "token", tx), 1);
}

/* dlockctl's read with 'modes': the mode and each live shared holder (id,
 * token, since, exp), then the waiters (a shared one with 's'); without
 * it, the reply as before (no holder shown for shared leases). */
static void test_ctl_read_modes(void **state)
{
    (void)state;
    long long ta, tb, tx;
    keys k = keys_of("cm", X);
    assert_int_equal(shared("cm", A, 1, &ta), 1);
    assert_int_equal(shared("cm", B, 1, &tb), 1);
    assert_int_equal(acquire("cm", X, 1, NULL), 0);
    redisReply *r = cmd("EVALSHA %s 4 %s %s %s %s modes", sha[P2_CTL], k.k[0], k.k[2], k.k[3],
                        k.k[4]);
    assert_int_equal(r->elements, 8 + 2 + 8 + 4);
    assert_int_equal(r->element[1]->type, REDIS_REPLY_NIL);
    assert_string_equal(r->element[8]->str, "shared");
    assert_int_equal(r->element[9]->integer, 2);
    assert_string_equal(r->element[10]->str, A);
    assert_int_equal(strtoll(r->element[11]->str, NULL, 10), ta);
    slease a = shared_of("cm", A);
    assert_int_equal(strtoll(r->element[12]->str, NULL, 10), a.exp - a.dur);
    assert_int_equal(strtoll(r->element[13]->str, NULL, 10), a.exp);
    assert_string_equal(r->element[14]->str, B);
    assert_string_equal(r->element[18]->str, X);
    freeReplyObject(r);
    r = cmd("EVALSHA %s 4 %s %s %s %s", sha[P2_CTL], k.k[0], k.k[2], k.k[3], k.k[4]);
    assert_int_equal(r->elements, 12);
    freeReplyObject(r);
    assert_int_equal(unshare("cm", A, "token", ta), 1);
    assert_int_equal(unshare("cm", B, "token", tb), 2);
    assert_int_equal(acquire("cm", X, 1, &tx), 1);
    assert_int_equal(shared("cm", A, 2, NULL), 0);
    r = cmd("EVALSHA %s 4 %s %s %s %s modes", sha[P2_CTL], k.k[0], k.k[2], k.k[3], k.k[4]);
    assert_int_equal(r->elements, 8 + 2 + 4);
    assert_string_equal(r->element[1]->str, X);
    assert_string_equal(r->element[8]->str, "exclusive");
    assert_int_equal(r->element[9]->integer, 0);
    assert_non_null(strstr(r->element[12]->str, " 2 s "));
    freeReplyObject(r);
    assert_int_equal(leave("cm", A, 3), 1);
    assert_int_equal(release("cm", X, "token", tx), 1);
    r = cmd("EVALSHA %s 4 %s %s %s %s modes", sha[P2_CTL], k.k[0], k.k[2], k.k[3], k.k[4]);
    assert_string_equal(r->element[8]->str, "free");
    freeReplyObject(r);
}

/* Memory: shared leases past their end go with the next shared release's
 * scan (and as records go: past their time, in a hash of more than 16
 * fields); the hash stays listpack-encoded. */
static void test_shared_fields_pruned(void **state)
{
    (void)state;
    char id[40];
    long long t;
    for (int i = 0; i < 20; i++) {
        snprintf(id, sizeof id, "%032x", 0x100 + i);
        assert_int_equal(shared_o("pr", id, 1, (opt){.lease = "100", .keep = "100"}, &t, NULL), 1);
    }
    assert_int_equal(shared("pr", A, 1, &t), 1);
    fx_sleep_ms(300);
    assert_true(cmd_int("HLEN ts:{pr}") >= 22);
    assert_int_equal(unshare("pr", A, "token", t), 1);
    assert_int_equal(cmd_int("HLEN ts:{pr}"), 2); /* pv and A's record */
    redisReply *r = cmd("OBJECT ENCODING ts:{pr}");
    assert_string_equal(r->str, "listpack");
    freeReplyObject(r);
}

/* End: readers granted after an exclusive hold that ended uncleanly (the
 * library released it for an exiting thread: 1) are told so ("S 1 ...",
 * their field's end, the same attempt again), and leave the end word for
 * the next exclusive grant, which the last reader's release grants with
 * "U 1 <attempt> <token> <name>", consuming it. */
static void test_end_told_to_readers_and_writer(void **state)
{
    (void)state;
    long long tx, t, e;
    char want[128];
    assert_int_equal(acquire("en", X, 1, &tx), 1);
    assert_int_equal(shared("en", A, 2, NULL), 0);
    redisContext *s = subscribe(A);
    assert_int_equal(release_o("en", X, "token", tx, (opt){.how = "1"}), 2);
    slease a = shared_of("en", A);
    assert_int_equal(a.end, 1);
    snprintf(want, sizeof want, "S 1 2 %lld en", a.token);
    expect_message(s, want);
    assert_int_equal(shared_o("en", A, 2, (opt){0}, &t, &e), 1);
    assert_true(t == a.token && e == 1);
    assert_int_equal(cmd_int("HEXISTS ts:{en} u"), 1);
    assert_int_equal(acquire("en", Y, 1, NULL), 0);
    s = subscribe(Y);
    assert_int_equal(unshare("en", A, "token", a.token), 2);
    grant g = grant_of("en");
    assert_true(g.present && g.u == 1 && g.token > a.token);
    snprintf(want, sizeof want, "U 1 1 %lld en", g.token);
    expect_message(s, want);
    assert_int_equal(cmd_int("HEXISTS ts:{en} u"), 0);
}

/* A turn given to a shared waiter (an exclusive waiter gave up its direct
 * grant: leave.lua) refuses other clients' shared acquires (-1) until that
 * waiter takes it; then, no exclusive waiter queued, others are granted
 * beside it. */
static void test_turn_to_shared_waiter(void **state)
{
    (void)state;
    long long tx, pttl, ta, tb;
    assert_int_equal(acquire("tw", X, 1, &tx), 1);
    assert_int_equal(acquire("tw", Y, 1, NULL), 0);
    assert_int_equal(shared("tw", A, 1, NULL), 0);
    assert_int_equal(release("tw", X, "token", tx), 2);
    assert_string_equal(grant_of("tw").owner, Y);
    redisContext *s = subscribe(A);
    assert_int_equal(leave("tw", Y, 2), 1);
    expect_message(s, "w tw");
    assert_int_equal(shared("tw", B, 1, &pttl), 0);
    assert_int_equal(pttl, -1);
    assert_int_equal(shared("tw", A, 1, &ta), 1);
    assert_int_equal(cmd_int("HEXISTS ts:{tw} t"), 0);
    assert_int_equal(shared("tw", B, 2, &tb), 1);
    assert_true(tb > ta && ta > tx);
}

/* No mixing of modes within one client: an exclusive acquire by a client
 * holding a live shared lease of the name is refused with a DLOCKMODE
 * error, writing nothing and queueing nothing (it used to be queued behind
 * its own lease, and its leave then gave that lease up as a direct grant
 * never taken: a writer was granted beside the reader). The lease stands:
 * a writer queued meanwhile is refused until its release grants it. */
static void test_exclusive_by_shared_holder_refused(void **state)
{
    (void)state;
    long long tc, pttl;
    assert_int_equal(shared("mx", C, 1, &tc), 1);
    UNCHANGED("mx", assert_mode_error(acq_reply(P2_ACQUIRE, "mx", C, 2)));
    assert_int_equal(queued("mx", C), 0);
    assert_int_equal(acquire("mx", Y, 1, NULL), 0);
    assert_int_equal(shared_of("mx", C).token, tc);
    assert_int_equal(acquire("mx", Y, 2, &pttl), 0);
    assert_true(pttl > 0);
    assert_int_equal(grant_of("mx").present, 0);
    assert_int_equal(unshare("mx", C, "token", tc), 2);
    assert_string_equal(grant_of("mx").owner, Y);
}

/* The other way: a shared acquire by the client holding the live exclusive
 * grant is refused with DLOCKMODE too, queueing nothing; and a shared
 * holder's exclusive attempt, refused, leaves no queue entry for its next
 * shared attempt to take away: the writer queued after it keeps its place
 * (FIFO) and is granted by that holder's release. */
static void test_shared_by_exclusive_holder_refused(void **state)
{
    (void)state;
    long long tx, tc, tc3;
    assert_int_equal(acquire("mx2", X, 1, &tx), 1);
    UNCHANGED("mx2", assert_mode_error(acq_reply(P2_ACQUIRE_S, "mx2", X, 2)));
    assert_int_equal(queued("mx2", X), 0);
    assert_int_equal(release("mx2", X, "token", tx), 1);
    assert_int_equal(shared("mx2", C, 1, &tc), 1);
    assert_mode_error(acq_reply(P2_ACQUIRE, "mx2", C, 2));
    assert_int_equal(acquire("mx2", Y, 1, NULL), 0);
    assert_int_equal(shared("mx2", C, 3, &tc3), 1);
    assert_true(tc3 > tc);
    assert_int_equal(queued("mx2", C), 0);
    assert_int_equal(queued("mx2", Y), 1);
    assert_int_equal(cmd_int("ZCARD ts:{mx2}:q"), 1);
    assert_int_equal(unshare("mx2", C, "token", tc3), 2);
    assert_string_equal(grant_of("mx2").owner, Y);
}

/* A step back of the server's clock cannot bring a shared lease back
 * beside an exclusive grant: the grant made with r present (past) removes
 * every s:<id> field; and a shared field that counts again beside a live
 * exclusive grant (written here as a step back would leave it) is neither
 * renewed (0) nor granted again to its attempt (refused, the grant's time
 * left). */
static void test_step_back_no_reader_beside_writer(void **state)
{
    (void)state;
    long long ta, tb, tx, pttl;
    char v[128];
    assert_int_equal(shared("sb", A, 1, &ta), 1);
    assert_int_equal(shared("sb", B, 1, &tb), 1);
    /* both leases (and r) end in the past, as if their time had passed */
    long long now = server_us() / 1000;
    slease a = shared_of("sb", A), b = shared_of("sb", B);
    snprintf(v, sizeof v, "%lld %lld %lld %lld %lld", a.token, a.nonce, a.dur, a.end, now - 100);
    freeReplyObject(cmd("HSET ts:{sb} s:%s %s", A, v));
    snprintf(v, sizeof v, "%lld %lld %lld %lld %lld", b.token, b.nonce, b.dur, b.end, now - 100);
    freeReplyObject(cmd("HSET ts:{sb} s:%s %s", B, v));
    freeReplyObject(cmd("HSET ts:{sb} r %lld", now - 100));
    assert_int_equal(acquire("sb", X, 1, &tx), 1);
    assert_int_equal(cmd_int("HEXISTS ts:{sb} r"), 0);
    assert_int_equal(shared_of("sb", A).present, 0);
    assert_int_equal(shared_of("sb", B).present, 0);
    /* the clock steps back before A's exp: its field counts again */
    now = server_us() / 1000;
    snprintf(v, sizeof v, "%lld %lld %lld %lld %lld", a.token, a.nonce, a.dur, a.end, now + 5000);
    freeReplyObject(cmd("HSET ts:{sb} s:%s %s", A, v));
    assert_int_equal(renew1("sb", A, "10000", ta), 0);
    assert_int_equal(shared_of("sb", A).exp, now + 5000);
    assert_int_equal(shared_o("sb", A, 1, (opt){.queue = "0"}, &pttl, NULL), 0);
    assert_true(pttl > 5000 && pttl <= 10001);
    assert_int_equal(release("sb", X, "token", tx), 1);
}

/* A give-back by attempt (release.lua or release_shared.lua, by nonce) of
 * an attempt older than the client's live lease of the other mode says it
 * is superseded (3), as for a lease of its own mode: no grant of that
 * attempt can appear; the lease stands. */
static void test_giveback_superseded_across_modes(void **state)
{
    (void)state;
    long long ta, tx;
    assert_int_equal(shared("gb", A, 5, &ta), 1);
    assert_int_equal(release("gb", A, "nonce", 4), 3);
    assert_int_equal(release("gb", A, "nonce", 4), 3);
    assert_int_equal(shared_of("gb", A).token, ta);
    assert_int_equal(unshare("gb", A, "token", ta), 1);
    assert_int_equal(acquire("gb", A, 7, &tx), 1);
    assert_int_equal(unshare("gb", A, "nonce", 6), 3);
    assert_int_equal(unshare("gb", A, "nonce", 6), 3);
    assert_int_equal(grant_of("gb").token, tx);
    assert_int_equal(release("gb", A, "token", tx), 1);
}

/* The reverse: a shared grant made beside an exclusive grant that expired
 * unreleased empties g, so that a step back of the server's clock to
 * before that grant's exp cannot make it count again beside the reader
 * (it did: renew.lua renewed it, and a late copy of its attempt was
 * granted it again; found by the simulator's shared worlds, sim/replays.txt).
 * The word that it expired unreleased moves into u for as long as g would
 * have told it: the next exclusive grant is told 2. */
static void test_step_back_no_writer_beside_readers(void **state)
{
    (void)state;
    long long tx, ta, ty, e;
    char v[128];
    assert_int_equal(acquire("wb", X, 1, &tx), 1);
    /* X's grant ends in the past, unreleased, as if its time had passed */
    long long now = server_us() / 1000;
    grant g = grant_of("wb");
    snprintf(v, sizeof v, "%lld %lld %lld %lld %lld %lld 10000", g.token, g.nonce, g.pl, now - 100,
             g.dur, g.u);
    freeReplyObject(cmd("HSET ts:{wb} g %s", v));
    assert_int_equal(shared("wb", A, 1, &ta), 1);
    assert_true(ta > tx);
    /* the clock steps back before X's exp: a grant left in g counts again */
    g = grant_of("wb");
    if (g.present) {
        now = server_us() / 1000;
        snprintf(v, sizeof v, "%lld %lld %lld %lld %lld %lld 10000", g.token, g.nonce, g.pl,
                 now + 5000, g.dur, g.u);
        freeReplyObject(cmd("HSET ts:{wb} g %s", v));
    }
    assert_int_equal(renew1("wb", X, "10000", tx), 0);
    assert_int_equal(acquire_o("wb", X, 1, (opt){.queue = "0"}, NULL, NULL), 0);
    assert_int_equal(grant_of("wb").present, 0);
    assert_int_equal(shared_of("wb", A).token, ta);
    assert_int_equal(unshare("wb", A, "token", ta), 1);
    assert_int_equal(acquire_o("wb", Y, 1, (opt){0}, &ty, &e), 1);
    assert_true(ty > ta);
    assert_int_equal(e, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_with_shared),
        cmocka_unit_test(test_last_shared_release_grants_writer),
        cmocka_unit_test(test_exclusive_release_grants_shared_run),
        cmocka_unit_test(test_queued_writer_stops_new_readers),
        cmocka_unit_test(test_shared_tokens),
        cmocka_unit_test(test_dead_shared_holder_expires),
        cmocka_unit_test(test_renew_shared),
        cmocka_unit_test(test_late_copies_refused),
        cmocka_unit_test(test_shared_leave_gives_up_direct_grant),
        cmocka_unit_test(test_ctl_read_modes),
        cmocka_unit_test(test_shared_fields_pruned),
        cmocka_unit_test(test_end_told_to_readers_and_writer),
        cmocka_unit_test(test_turn_to_shared_waiter),
        cmocka_unit_test(test_exclusive_by_shared_holder_refused),
        cmocka_unit_test(test_shared_by_exclusive_holder_refused),
        cmocka_unit_test(test_step_back_no_reader_beside_writer),
        cmocka_unit_test(test_giveback_superseded_across_modes),
        cmocka_unit_test(test_step_back_no_writer_beside_readers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
