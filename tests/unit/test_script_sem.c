/*
 * Protocol 2's counting semaphore scripts (lua/p2/sem_*.lua, data layout
 * lua/p2/SEM.txt) called directly against a real redis-server: never more
 * permits than the limit, the limit rule, FIFO between clients with dead
 * waiters pruned, permits of a client that stopped renewing counting no
 * more after its lease, nor again after a step back of the clock, renewal
 * in batches, direct grants with their messages (never stretching the
 * permits a waiter holds), idempotent retries and late copies refused, a
 * leave giving back a grant it never took, the hash's lifetime and
 * pruning, and each kind refusing the other's data. The library does not
 * load these scripts yet: they are read from the source tree at run time
 * (DLOCK_SOURCE_DIR), loaded with SCRIPT LOAD and run with EVALSHA (the
 * forced release with lua/p2/release.lua's text in its place, as
 * dlockctl runs it). After every semaphore script, check_life checks the
 * hash's lifetime: it has a time to live no longer than the longest of the
 * record lifetime, the lease time and 2 x the waiter ttl that calls on the
 * name passed, and no client's field counts (its <until>) past the hash's
 * end.
 *
 * Time bounds: leases and waiter ttls that must end are of 1 s or 1.5 s,
 * and the tests sleep 1.2 s or 2 s past them (a busy machine only sleeps
 * longer); the calls that must fall within one follow each other at once,
 * so only a stall of most of a second on the 2-core machines would fail
 * them. Renewals come every 300 ms against a lease of 1.5 s.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

#define A "11111111111111111111111111111111"
#define B "22222222222222222222222222222222"
#define C "33333333333333333333333333333333"
#define D "44444444444444444444444444444444"
#define E "55555555555555555555555555555555"

static redisContext *raw;

enum {
    S_ACQUIRE,
    S_RELEASE,
    S_LEAVE,
    S_RENEW,
    S_CTL,
    L2_ACQUIRE,
    L1_ACQUIRE,
    L1_RENEW,
    L2_RELEASE,
    L2_LEAVE,
    L2_FORCE,
    L2_CTL,
    L2_ACQUIRE_SHARED,
    L2_RELEASE_SHARED,
    S_N
};
static const char *file[S_N] = {"p2/sem_acquire", "p2/sem_release",        "p2/sem_leave",
                                "p2/sem_renew",   "p2/sem_ctl_read",       "p2/acquire",
                                "acquire",        "renew",                 "p2/release",
                                "p2/leave",       "p2/force",              "p2/ctl_read",
                                "p2/acquire_shared", "p2/release_shared"};
static char sha[S_N][48];

static void read_lua(const char *name, char *buf, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/lua/%s.lua", DLOCK_SOURCE_DIR, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot read %s", path);
    buf[fread(buf, 1, n - 1, f)] = '\0';
    fclose(f);
}

/* SCRIPT LOADs the scripts (lua/p2/force.lua with lua/p2/release.lua's
 * text in place of its line "--@release.lua", as dlockctl runs it). */
static void load_scripts(void)
{
    static char buf[1 << 17], rel[1 << 16], text[1 << 16];
    static const char mark[] = "--@release.lua\n";
    read_lua("p2/release", rel, sizeof rel);
    for (int s = 0; s < S_N; s++) {
        read_lua(file[s], text, sizeof text);
        char *at = strstr(text, mark);
        if (s == L2_FORCE && at)
            snprintf(buf, sizeof buf, "%.*s%s\n%s", (int)(at - text), text, rel,
                     at + sizeof mark - 1);
        else
            snprintf(buf, sizeof buf, "%s", text);
        redisReply *r = redisCommand(raw, "SCRIPT LOAD %s", buf);
        assert_non_null(r);
        if (r->type != REDIS_REPLY_STRING)
            fail_msg("SCRIPT LOAD of lua/%s.lua: %s", file[s], r->str ? r->str : "?");
        snprintf(sha[s], sizeof sha[s], "%s", r->str);
        freeReplyObject(r);
    }
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

static long long server_ms(void)
{
    redisReply *r = cmd("TIME");
    long long ms = atoll(r->element[0]->str) * 1000LL + atoll(r->element[1]->str) / 1000;
    freeReplyObject(r);
    return ms;
}

/* Each name's bound on its hash's time to live (see the head). */
static struct {
    char name[16];
    long long ms;
} life[64];

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
 * bound (20 ms of slack: the scripts' rounding) and which no client's
 * field outlives. */
static void check_life(const char *name)
{
    long long pttl = cmd_int("PTTL ts:{%s}", name), bound = 0;
    int known = 0;
    for (int i = 0; i < 64 && life[i].name[0]; i++)
        if (!strcmp(life[i].name, name))
            bound = life[i].ms, known = 1;
    if (pttl == -2 || !known)
        return; /* (no hash, or not a semaphore's) */
    if (pttl < 0 || pttl > bound + 20)
        fail_msg("hash of %s: PTTL %lld, bound %lld", name, pttl, bound);
    long long now = server_ms();
    redisReply *r = cmd("HGETALL ts:{%s}", name);
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const char *f = r->element[i]->str, *v = r->element[i + 1]->str, *sp = strrchr(v, ' ');
        if (!strncmp(f, "c:", 2) && sp && atoll(sp + 1) > now + pttl + 2)
            fail_msg("hash of %s: field %s '%s' outlives it (PTTL %lld)", name, f, v, pttl);
        long long n, exp, until;
        if (!strncmp(f, "c:", 2) &&
            sscanf(v, "%lld %lld %*d %*c %*d %*d %lld", &n, &exp, &until) == 3 && n > 0 &&
            until < exp)
            fail_msg("hash of %s: field %s '%s' ends before its permits", name, f, v);
    }
    freeReplyObject(r);
}

/* EVALSHA of script s on name's 7 keys (lua/keys.lua) for client id. */
static redisReply *eval_keys(int s, const char *name, const char *id, const char **a, int na)
{
    char k[7][96];
    const char *suffix[5] = {"", ":fence", ":q", ":qd", ":turn"};
    for (int i = 0; i < 5; i++)
        snprintf(k[i], sizeof k[i], "ts:{%s}%s", name, suffix[i]);
    snprintf(k[5], sizeof k[5], "ts:{%s}:c:%s", name, id);
    snprintf(k[6], sizeof k[6], "ts:hw:{%s}", name); /* (a key of its own: never compared) */
    const char *argv[3 + 7 + 16] = {"EVALSHA", sha[s], "7"};
    for (int i = 0; i < 7; i++)
        argv[3 + i] = k[i];
    memcpy(argv + 10, a, (size_t)na * sizeof *a);
    redisReply *r = redisCommandArgv(raw, 10 + na, argv, NULL);
    assert_non_null(r);
    return r;
}

/* An acquire's arguments; NULL: the default (lease 10 s, 1 permit, waiter
 * ttl 2 s, queueing, record lifetime 20 s, limit 3, nothing in doubt). */
typedef struct opt {
    const char *lease, *k, *ttl, *queue, *keep, *limit, *doubt;
} opt;
#define DEF(v, d) ((v) ? (v) : (d))

static redisReply *acquire_r(const char *name, const char *id, long long n, opt o)
{
    char num[24];
    snprintf(num, sizeof num, "%lld", n);
    const char *a[12] = {id, DEF(o.lease, "10000"), num, DEF(o.k, "1"), DEF(o.ttl, "2000"),
                         DEF(o.queue, "1"), DEF(o.keep, "20000"), "test-client",
                         DEF(o.limit, "3"), DEF(o.doubt, "0"), "ts:wake:", name};
    allow(name, atoll(a[6]));
    allow(name, atoll(a[1]));
    allow(name, 2 * atoll(a[4]));
    return eval_keys(S_ACQUIRE, name, id, a, 12);
}

/* Attempt n of id on name: the reply's first element (1 granted, 0
 * refused, -1 stale); *second its second (permits held, or free ones). */
static long long acquire_o(const char *name, const char *id, long long n, opt o, long long *second)
{
    redisReply *r = acquire_r(name, id, n, o);
    if (r->type != REDIS_REPLY_ARRAY)
        fail_msg("sem_acquire.lua on %s: %s", name, r->str ? r->str : "not an array");
    long long first = r->element[0]->integer;
    if (second)
        *second = r->element[1]->integer;
    freeReplyObject(r);
    check_life(name);
    return first;
}

static long long acquire(const char *name, const char *id, long long n)
{
    return acquire_o(name, id, n, (opt){0}, NULL);
}

static long long int_reply(int s, redisReply *r, const char *name)
{
    if (r->type != REDIS_REPLY_INTEGER)
        fail_msg("lua/%s.lua on %s: %s", file[s], name, r->str ? r->str : "not a number");
    long long v = r->integer;
    freeReplyObject(r);
    check_life(name);
    return v;
}

/* The record lifetime releases and leaves pass (a test may shorten it). */
static const char *rkeep = "20000";

static redisReply *release_r(const char *name, const char *id, long long n, long long count,
                             long long attempt)
{
    char num[24], k[24], at[24];
    snprintf(num, sizeof num, "%lld", n);
    snprintf(k, sizeof k, "%lld", count);
    snprintf(at, sizeof at, "%lld", attempt);
    const char *a[7] = {id, num, k, at, "ts:wake:", name, rkeep};
    allow(name, atoll(rkeep));
    return eval_keys(S_RELEASE, name, id, a, 7);
}

/* Release, as call n, of count permits (count 0: those of attempt). */
static long long release(const char *name, const char *id, long long n, long long count,
                         long long attempt)
{
    return int_reply(S_RELEASE, release_r(name, id, n, count, attempt), name);
}

static redisReply *leave_r(const char *name, const char *id, long long n, long long gave_up)
{
    char num[24], g[24];
    snprintf(num, sizeof num, "%lld", n);
    snprintf(g, sizeof g, "%lld", gave_up);
    const char *a[7] = {id, "ts:wake:", name, "2000", num, rkeep, g};
    allow(name, atoll(rkeep));
    return eval_keys(S_LEAVE, name, id, a, 7);
}

static long long leave(const char *name, const char *id, long long n, long long gave_up)
{
    return int_reply(S_LEAVE, leave_r(name, id, n, gave_up), name);
}

/* sem_renew.lua of id for the hashes of names[0..n-1]: out[i] its replies. */
static void renew(const char *id, const char *lease, const char **names, int n, long long *out)
{
    char keys[8][96];
    const char *argv[3 + 8 + 2] = {"EVALSHA", sha[S_RENEW]};
    char nk[8];
    snprintf(nk, sizeof nk, "%d", n);
    argv[2] = nk;
    for (int i = 0; i < n; i++) {
        snprintf(keys[i], sizeof keys[i], "ts:{%s}", names[i]);
        argv[3 + i] = keys[i];
    }
    argv[3 + n] = id;
    argv[4 + n] = lease;
    redisReply *r = redisCommandArgv(raw, 5 + n, argv, NULL);
    assert_non_null(r);
    if (r->type != REDIS_REPLY_ARRAY || (int)r->elements != n)
        fail_msg("sem_renew.lua: %s", r->str ? r->str : "not an array of one per key");
    for (int i = 0; i < n; i++)
        out[i] = r->element[i]->integer;
    freeReplyObject(r);
    for (int i = 0; i < n; i++)
        check_life(names[i]);
}

/* id's field of name: n permits (counted only while exp has not passed),
 * a, x, g, gk; present 0 when none. */
typedef struct field {
    int present;
    long long n, exp, a, g, gk, until;
    char x;
} field;

static field field_of(const char *name, const char *id)
{
    field f = {0};
    redisReply *r = cmd("HGET ts:{%s} c:%s", name, id);
    if (r->type == REDIS_REPLY_STRING)
        f.present = sscanf(r->str, "%lld %lld %lld %c %lld %lld %lld", &f.n, &f.exp, &f.a, &f.x,
                           &f.g, &f.gk, &f.until) == 7;
    freeReplyObject(r);
    return f;
}

/* Permits of name in use, and id's share, by sem_ctl_read.lua. */
static long long in_use(const char *name, const char *id, long long *mine)
{
    char k[3][96];
    snprintf(k[0], sizeof k[0], "ts:{%s}", name);
    snprintf(k[1], sizeof k[1], "ts:{%s}:q", name);
    snprintf(k[2], sizeof k[2], "ts:{%s}:qd", name);
    redisReply *r = cmd("EVALSHA %s 3 %s %s %s", sha[S_CTL], k[0], k[1], k[2]);
    long long used = r->element[2]->integer, holders = r->element[3]->integer;
    if (mine) {
        *mine = 0;
        for (long long i = 0; i < holders; i++)
            if (id && !strcmp(r->element[4 + 3 * i]->str, id))
                *mine = r->element[5 + 3 * i]->integer;
    }
    freeReplyObject(r);
    return used;
}

static redisReply *ctl_r(const char *name)
{
    redisReply *r = redisCommand(raw, "EVALSHA %s 3 ts:{%s} ts:{%s}:q ts:{%s}:qd", sha[S_CTL],
                                 name, name, name);
    assert_non_null(r);
    return r;
}

static int queued(const char *name, const char *id)
{
    return cmd_int("ZSCORE ts:{%s}:q %s", name, id) >= 0;
}

/* A second connection subscribed to id's wake channel; expect_message
 * reads the next message on it (at most 2 s: a message a script published
 * is already there) and closes it. */
static redisContext *subscribe(const char *id)
{
    redisContext *s = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(s);
    redisReply *r = redisCommand(s, "SUBSCRIBE ts:wake:%s", id);
    assert_non_null(r);
    freeReplyObject(r);
    struct timeval tv = {2, 0};
    redisSetTimeout(s, tv);
    return s;
}

static void expect_message(redisContext *s, const char *want)
{
    redisReply *r = NULL;
    if (redisGetReply(s, (void **)&r) != REDIS_OK)
        fail_msg("no message '%s'", want);
    assert_true(r->type == REDIS_REPLY_ARRAY && r->elements == 3);
    assert_string_equal(r->element[2]->str, want);
    freeReplyObject(r);
    redisFree(s);
}

/* No message on s (within 200 ms), then closes it. */
static void expect_none(redisContext *s)
{
    struct timeval tv = {0, 200000};
    redisSetTimeout(s, tv);
    redisReply *r = NULL;
    if (redisGetReply(s, (void **)&r) == REDIS_OK) {
        const char *m = r && r->type == REDIS_REPLY_ARRAY && r->elements == 3 ? r->element[2]->str
                                                                               : "?";
        fail_msg("an unexpected message '%s'", m);
    }
    redisFree(s);
}

/* The DUMP of the name's hash and queue keys as hex, and the hash's PTTL:
 * what a refused call leaves exactly as it was. */
static void dump_keys(const char *name, char *out, size_t n)
{
    const char *suffix[3] = {"", ":q", ":qd"};
    size_t used = 0;
    for (int i = 0; i < 3; i++) {
        redisReply *r = cmd("DUMP ts:{%s}%s", name, suffix[i]);
        used += (size_t)snprintf(out + used, n - used, "%d:", i);
        for (size_t j = 0; r->type == REDIS_REPLY_STRING && j < r->len; j++)
            used += (size_t)snprintf(out + used, n - used, "%02x", (unsigned char)r->str[j]);
        assert_true(used + 8 < n);
        freeReplyObject(r);
    }
}

#define UNCHANGED(name, call)                                                                     \
    do {                                                                                          \
        static char b_[16384], a_[16384];                                                         \
        dump_keys(name, b_, sizeof b_);                                                           \
        long long p_ = cmd_int("PTTL ts:{%s}", name);                                             \
        call;                                                                                     \
        dump_keys(name, a_, sizeof a_);                                                           \
        assert_string_equal(b_, a_);                                                              \
        assert_true(cmd_int("PTTL ts:{%s}", name) <= p_);                                         \
    } while (0)

/* An error reply starting with prefix (and containing also, if given). */
static void assert_error(redisReply *r, const char *prefix, const char *also)
{
    if (r->type != REDIS_REPLY_ERROR || strncmp(r->str, prefix, strlen(prefix)) ||
        (also && !strstr(r->str, also)))
        fail_msg("wanted an error '%s...%s', got %s", prefix, also ? also : "",
                 r->type == REDIS_REPLY_ERROR ? r->str : "a reply");
    freeReplyObject(r);
}

static int setup(void **state)
{
    if (fx_group_setup(state) != 0)
        return -1;
    raw = fx_connect("127.0.0.1", fx_server.port);
    if (!raw)
        return -1;
    load_scripts();
    return 0;
}

static int teardown(void **state)
{
    redisFree(raw);
    return fx_group_teardown(state);
}

/* Never more than the limit: 3 permits taken by A (2) and B (1), C's single
 * try and D's are refused, a count above the free ones too; a release
 * frees exactly what it gives back. */
static void test_never_more_than_limit(void **state)
{
    (void)state;
    long long held, free;
    opt once = {.queue = "0"};
    assert_int_equal(acquire_o("lm", A, 1, (opt){0}, &held), 1);
    assert_int_equal(held, 1);
    assert_int_equal(acquire_o("lm", A, 2, (opt){0}, &held), 1);
    assert_int_equal(held, 2);
    assert_int_equal(acquire_o("lm", B, 1, once, &held), 1);
    assert_int_equal(held, 1);
    assert_int_equal(acquire_o("lm", C, 1, once, &free), 0);
    assert_int_equal(free, 0);
    assert_int_equal(acquire_o("lm", D, 1, once, NULL), 0);
    assert_int_equal(in_use("lm", NULL, NULL), 3);
    assert_int_equal(release("lm", A, 3, 1, 0), 1);
    assert_int_equal(in_use("lm", A, &held), 2);
    assert_int_equal(held, 1);
    assert_int_equal(acquire_o("lm", C, 2, (opt){.queue = "0", .k = "2"}, &free), 0);
    assert_int_equal(free, 1);
    assert_int_equal(acquire_o("lm", C, 3, once, NULL), 1);
    assert_int_equal(acquire_o("lm", D, 2, once, NULL), 0);
    assert_int_equal(in_use("lm", NULL, NULL), 3);
    /* a count above the limit, or a limit of 0, is refused as an error */
    assert_error(acquire_r("lm", D, 3, (opt){.k = "4"}), "DLOCKARG", NULL);
    assert_error(acquire_r("lm", D, 3, (opt){.limit = "0"}), "DLOCKARG", NULL);
}

/* A limit other than the holders' is refused naming both, changing
 * nothing; also while a live waiter (other than the caller) waits under
 * it; once nobody holds or waits, a new limit takes over. */
static void test_limit_mismatch(void **state)
{
    (void)state;
    assert_int_equal(acquire_o("li", A, 1, (opt){.limit = "1", .lease = "1000"}, NULL), 1);
    UNCHANGED("li", assert_error(acquire_r("li", B, 1, (opt){.limit = "5"}), "DLOCKLIMIT 1 5",
                                 "limit 1"));
    assert_int_equal(acquire_o("li", B, 2, (opt){.limit = "1", .ttl = "5000"}, NULL), 0);
    assert_true(queued("li", B));
    /* A's permit ends unreleased; B still waits under limit 1 */
    fx_sleep_ms(1200);
    assert_int_equal(in_use("li", NULL, NULL), 0);
    UNCHANGED("li", assert_error(acquire_r("li", C, 1, (opt){.limit = "2"}), "DLOCKLIMIT 1 2",
                                 NULL));
    /* B takes it, gives it back and leaves: nobody holds or waits */
    assert_int_equal(acquire_o("li", B, 3, (opt){.limit = "1"}, NULL), 1);
    assert_int_equal(release("li", B, 4, 1, 0), 1);
    assert_int_equal(acquire_o("li", C, 1, (opt){.limit = "2"}, NULL), 1);
    assert_int_equal(cmd_int("HGET ts:{li} l"), 2);
    assert_int_equal(acquire_o("li", D, 1, (opt){.limit = "2"}, NULL), 1);
    assert_error(acquire_r("li", E, 1, (opt){.limit = "1"}), "DLOCKLIMIT 2 1", NULL);
}

/* FIFO: B waits for 2 permits of which 1 is free; C, a newcomer wanting
 * the free one, does not overtake it (single try and queued); A's release
 * grants B its 2 directly, and C stays behind until permits free up. */
static void test_fifo(void **state)
{
    (void)state;
    long long free;
    opt two = {.limit = "2"};
    assert_int_equal(acquire_o("ff", A, 1, two, NULL), 1);
    assert_int_equal(acquire_o("ff", B, 1, (opt){.limit = "2", .k = "2"}, &free), 0);
    assert_int_equal(free, 1);
    assert_int_equal(acquire_o("ff", C, 1, (opt){.limit = "2", .queue = "0"}, &free), 0);
    assert_int_equal(acquire_o("ff", C, 2, two, NULL), 0);
    assert_int_equal(in_use("ff", NULL, NULL), 1);
    /* B refreshes its place (a newer attempt): it stays ahead of C */
    assert_int_equal(acquire_o("ff", B, 2, (opt){.limit = "2", .k = "2"}, NULL), 0);
    redisReply *h = cmd("ZRANGE ts:{ff}:q 0 0");
    assert_string_equal(h->element[0]->str, B);
    freeReplyObject(h);
    redisContext *sb = subscribe(B), *sc = subscribe(C);
    assert_int_equal(release("ff", A, 2, 1, 0), 2);
    expect_message(sb, "P 2 2 ff");
    expect_none(sc);
    long long held;
    assert_int_equal(in_use("ff", B, &held), 2);
    assert_int_equal(held, 2);
    assert_true(!queued("ff", B) && queued("ff", C));
    assert_int_equal(acquire_o("ff", C, 3, two, NULL), 0);
    /* B takes its grant (the same attempt), gives one back: C gets it */
    assert_int_equal(acquire_o("ff", B, 2, (opt){.limit = "2", .k = "2"}, &held), 1);
    assert_int_equal(held, 2);
    sc = subscribe(C);
    assert_int_equal(release("ff", B, 3, 1, 0), 2);
    expect_message(sc, "P 3 1 ff");
    assert_int_equal(in_use("ff", C, &held), 2);
    assert_int_equal(held, 1);
}

/* Dead waiters (deadline passed) leave the queue: met by an acquire that
 * finds permits free (the newcomer is then granted), and by a release,
 * which grants the next live waiter instead. */
static void test_dead_waiter_pruned(void **state)
{
    (void)state;
    opt two = {.limit = "2"};
    assert_int_equal(acquire_o("dw", A, 1, two, NULL), 1);
    assert_int_equal(acquire_o("dw", B, 1, (opt){.limit = "2", .k = "2", .ttl = "1000"}, NULL),
                     0);
    assert_int_equal(acquire_o("dw", C, 1, two, NULL), 0); /* behind B */
    fx_sleep_ms(1200);
    /* B is dead: C, now at the head, takes the free permit */
    assert_int_equal(acquire_o("dw", C, 2, two, NULL), 1);
    assert_false(queued("dw", B));
    assert_int_equal(cmd_int("HEXISTS ts:{dw}:qd %s", B), 0);
    /* a release: D dead at the head, E live behind it gets the permit */
    assert_int_equal(acquire_o("dw", D, 1, (opt){.limit = "2", .ttl = "1000"}, NULL), 0);
    assert_int_equal(acquire_o("dw", E, 1, two, NULL), 0);
    fx_sleep_ms(1200);
    redisContext *se = subscribe(E);
    assert_int_equal(release("dw", A, 2, 1, 0), 2);
    expect_message(se, "P 1 1 dw");
    assert_false(queued("dw", D));
    assert_int_equal(cmd_int("ZCARD ts:{dw}:q"), 0);
    assert_int_equal(cmd_int("HEXISTS ts:{dw} q"), 0); /* nobody queued */
}

/* A client that stops renewing: its permits count no more after its lease
 * time (no leak), its renewal then brings nothing back. */
static void test_dead_holder_freed(void **state)
{
    (void)state;
    opt one = {.limit = "1", .lease = "1000"};
    long long out[1];
    const char *n[1] = {"dh"};
    assert_int_equal(acquire_o("dh", A, 1, one, NULL), 1);
    assert_int_equal(acquire_o("dh", B, 1, (opt){.limit = "1", .queue = "0"}, NULL), 0);
    fx_sleep_ms(1200);
    assert_int_equal(in_use("dh", NULL, NULL), 0);
    assert_int_equal(acquire_o("dh", B, 2, (opt){.limit = "1"}, NULL), 1);
    renew(A, "1000", n, 1, out);
    assert_int_equal(out[0], 0);
    long long held;
    assert_int_equal(in_use("dh", B, &held), 1);
    assert_int_equal(held, 1);
    /* a holder that ends unreleased while C waits: the next acquire (D's)
     * finds the permit free and grants it to C first, directly */
    assert_int_equal(acquire_o("dh3", A, 1, one, NULL), 1);
    assert_int_equal(acquire_o("dh3", C, 4, (opt){.limit = "1", .ttl = "5000"}, NULL), 0);
    fx_sleep_ms(1200);
    redisContext *sc = subscribe(C);
    assert_int_equal(acquire_o("dh3", D, 1, (opt){.limit = "1"}, NULL), 0);
    expect_message(sc, "P 4 1 dh3");
    assert_int_equal(in_use("dh3", C, &held), 1);
    assert_int_equal(held, 1);
    assert_true(queued("dh3", D) && !queued("dh3", C));
}

/* The hash of name as a step back of the server's clock by ms leaves it:
 * every time in it (each client field's exp, when it has one, and its
 * <until>) and its end are that much ahead of the clock. (The tests that
 * use it have nobody queued then.) */
static void step_back(const char *name, long long ms)
{
    redisReply *r = cmd("HGETALL ts:{%s}", name);
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        long long n, exp, a, g, gk, until;
        char x;
        if (strncmp(r->element[i]->str, "c:", 2) ||
            sscanf(r->element[i + 1]->str, "%lld %lld %lld %c %lld %lld %lld", &n, &exp, &a, &x,
                   &g, &gk, &until) != 7)
            continue;
        char v[160];
        snprintf(v, sizeof v, "%lld %lld %lld %c %lld %lld %lld", n, exp ? exp + ms : 0, a, x, g,
                 gk, until + ms);
        freeReplyObject(cmd("HSET ts:{%s} %s %s", name, r->element[i]->str, v));
    }
    freeReplyObject(r);
    long long pttl = cmd_int("PTTL ts:{%s}", name);
    freeReplyObject(cmd("PEXPIRE ts:{%s} %lld", name, pttl + ms));
    allow(name, pttl + ms);
}

/* A step back of the server's clock brings no ended permits back: each
 * script that finds a client's permits ended (its exp passed) and goes on
 * to write (here, granting them on: an acquire, a release's and a leave's
 * direct grants) leaves that client's field with none, and removes a
 * field past its <until> that still holds permits (sb4: a record lifetime
 * shorter than the lease), so that after the clock steps back to before
 * that exp only the new holders' permits count, within the limit, and the
 * ended ones are not renewed. */
static void test_step_back_no_revival(void **state)
{
    (void)state;
    opt short1 = {.limit = "1", .lease = "1000"}, one = {.limit = "1", .ttl = "5000"};
    long long out[4];
    /* sb1: an acquire takes A's ended permit */
    assert_int_equal(acquire_o("sb1", A, 1, short1, NULL), 1);
    /* sb2: a release's direct grant takes A's (B waits for 2 of 2) */
    opt short2 = {.limit = "2", .lease = "1000"};
    assert_int_equal(acquire_o("sb2", A, 1, short2, NULL), 1);
    assert_int_equal(acquire_o("sb2", D, 1, (opt){.limit = "2"}, NULL), 1);
    assert_int_equal(acquire_o("sb2", B, 1, (opt){.limit = "2", .k = "2", .ttl = "5000"}, NULL),
                     0);
    /* sb3: a leave's direct grant takes A's (B leaves, C behind it) */
    assert_int_equal(acquire_o("sb3", A, 1, short1, NULL), 1);
    assert_int_equal(acquire_o("sb3", B, 1, one, NULL), 0);
    assert_int_equal(acquire_o("sb3", C, 1, one, NULL), 0);
    /* sb4: A's field ends with its permits (<until> = exp) */
    assert_int_equal(acquire_o("sb4", A, 1, (opt){.limit = "1", .lease = "1000", .keep = "500"},
                               NULL),
                     1);
    fx_sleep_ms(1200);
    assert_int_equal(acquire_o("sb4", B, 1, (opt){.limit = "1"}, NULL), 1);
    assert_int_equal(cmd_int("HEXISTS ts:{sb4} c:%s", A), 0);
    assert_int_equal(acquire_o("sb1", B, 1, (opt){.limit = "1"}, NULL), 1);
    assert_int_equal(release("sb2", D, 2, 1, 0), 2);
    assert_int_equal(field_of("sb2", B).n, 2);
    assert_int_equal(leave("sb3", B, 2, 1), 1);
    assert_int_equal(field_of("sb3", C).n, 1);
    const char *names[4] = {"sb1", "sb2", "sb3", "sb4"};
    for (int i = 0; i < 4; i++) {
        step_back(names[i], 1500);
        long long used = in_use(names[i], NULL, NULL), limit = i == 1 ? 2 : 1;
        if (used > limit)
            fail_msg("%s after a step back: %lld permits in use, limit %lld", names[i], used,
                     limit);
        assert_int_equal(field_of(names[i], A).n, 0);
    }
    renew(A, "10000", names, 4, out);
    for (int i = 0; i < 4; i++)
        assert_int_equal(out[i], 0);
    assert_int_equal(acquire_o("sb1", E, 1, (opt){.limit = "1", .queue = "0"}, NULL), 0);
}

/* A direct grant to a client that still holds permits does not stretch
 * them: one exp covers a client's permits, and the permits granted join
 * the ones held and end with them, so a client that crashed holding one
 * (lease 1 s) while it waited for another (waiter ttl 5 s) holds none
 * after its lease, the direct grant included; likewise a leave's direct
 * grant (ds2: E, wanting 2, leaves from ahead of A) and an acquire's (ds3:
 * E, ahead of A, dies; C's acquire walks). To a client holding none, a
 * direct grant lasts its waiter ttl (test_direct_grants). */
static void test_direct_grant_does_not_stretch(void **state)
{
    (void)state;
    opt two = {.limit = "2"};
    assert_int_equal(acquire_o("ds", A, 1, (opt){.limit = "2", .lease = "1000"}, NULL), 1);
    assert_int_equal(acquire_o("ds", B, 1, two, NULL), 1);
    assert_int_equal(acquire_o("ds", A, 2, (opt){.limit = "2", .ttl = "5000"}, NULL), 0);
    long long exp = field_of("ds", A).exp;
    assert_int_equal(release("ds", B, 2, 1, 0), 2); /* A's 2nd, directly */
    field a = field_of("ds", A);
    assert_true(a.n == 2 && a.g == 2 && a.gk == 1);
    if (a.exp != exp)
        fail_msg("the direct grant moved A's exp by %lld ms", a.exp - exp);
    /* ds2, ds3: A holds 1 of 2, B 1; E waits for 2 at the head, A for 1
     * behind it; B gives its permit back (E still blocked) */
    const char *ns[2] = {"ds2", "ds3"};
    long long exps[2];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(acquire_o(ns[i], A, 1, (opt){.limit = "2", .lease = "1000"}, NULL), 1);
        assert_int_equal(acquire_o(ns[i], B, 1, two, NULL), 1);
        assert_int_equal(
            acquire_o(ns[i], E, 1, (opt){.limit = "2", .k = "2", .ttl = i ? "300" : "5000"}, NULL),
            0);
        assert_int_equal(acquire_o(ns[i], A, 2, (opt){.limit = "2", .ttl = "5000"}, NULL), 0);
        assert_int_equal(release(ns[i], B, 2, 1, 0), 1);
        exps[i] = field_of(ns[i], A).exp;
    }
    assert_int_equal(leave("ds2", E, 2, 1), 1); /* A's 2nd, directly */
    fx_sleep_ms(400);                            /* E (ttl 300 ms) dies */
    assert_int_equal(acquire_o("ds3", C, 1, two, NULL), 0); /* A's 2nd, directly; C waits */
    for (int i = 0; i < 2; i++) {
        a = field_of(ns[i], A);
        assert_true(a.n == 2 && a.g == 2 && a.gk == 1);
        if (a.exp != exps[i])
            fail_msg("%s: the direct grant moved A's exp by %lld ms", ns[i], a.exp - exps[i]);
    }
    fx_sleep_ms(1200); /* A renewed nothing */
    assert_int_equal(in_use("ds", NULL, NULL), 0);
    assert_int_equal(acquire_o("ds", C, 1, (opt){.limit = "2", .k = "2", .queue = "0"}, NULL),
                     1);
    assert_int_equal(in_use("ds2", NULL, NULL), 0);
    assert_int_equal(in_use("ds3", NULL, NULL), 0);
}

/* Renewal: one call renews a client's permits of several names (1 each),
 * not another client's, nor a lock's hash, nor a name without data (0,
 * nothing written); renewed in time, the permits outlive several lease
 * times; not renewed, they end. */
static void test_renewal(void **state)
{
    (void)state;
    opt s = {.limit = "1", .lease = "1500"};
    long long out[4];
    assert_int_equal(acquire_o("rn1", A, 1, s, NULL), 1);
    assert_int_equal(acquire_o("rn2", A, 2, s, NULL), 1);
    assert_int_equal(acquire_o("rn3", B, 1, s, NULL), 1);
    const char *p2lock[10] = {A, "10000", "1", "16", "2000", "1", "20000", "t", "0", "0"};
    freeReplyObject(eval_keys(L2_ACQUIRE, "rnl", A, p2lock, 10));
    char before[16384], after[16384];
    dump_keys("rnl", before, sizeof before);
    const char *names[4] = {"rn1", "rn2", "rn3", "rnl"};
    const char *none[1] = {"rnx"};
    for (int i = 0; i < 7; i++) {
        fx_sleep_ms(300);
        renew(A, "1500", names, 4, out);
        assert_int_equal(out[0], 1);
        assert_int_equal(out[1], 1);
        assert_int_equal(out[2], 0); /* B's */
        assert_int_equal(out[3], 0); /* a lock */
        renew(A, "1500", none, 1, out);
        assert_int_equal(out[0], 0);
    }
    dump_keys("rnl", after, sizeof after);
    assert_string_equal(before, after);
    assert_int_equal(cmd_int("EXISTS ts:{rnx}"), 0);
    long long held;
    assert_int_equal(in_use("rn1", A, &held), 1); /* 2.1 s after a lease of 1.5 s */
    assert_int_equal(held, 1);
    field f = field_of("rn1", A);
    assert_true(f.exp > server_ms() + 1000);
    assert_int_equal(acquire_o("rn1", C, 1, (opt){.limit = "1", .queue = "0"}, NULL), 0);
    assert_int_equal(in_use("rn3", NULL, NULL), 0); /* B did not renew */
    fx_sleep_ms(1700);
    assert_int_equal(acquire_o("rn1", C, 2, (opt){.limit = "1", .queue = "0"}, NULL), 1);
}

/* A release's direct grants: the permits freed go to the live waiters at
 * the head in order (C 1, D 2), each told by "P <attempt> <count>
 * <name>"; the first that cannot be served (E, 3 with 0 left) stops the
 * walk. A direct grant lasts the waiter's ttl until taken; its attempt
 * again takes it for a lease without another permit. */
static void test_direct_grants(void **state)
{
    (void)state;
    opt four = {.limit = "4"};
    assert_int_equal(acquire_o("dg", A, 1, (opt){.limit = "4", .k = "3"}, NULL), 1);
    assert_int_equal(acquire_o("dg", B, 1, four, NULL), 1);
    assert_int_equal(acquire_o("dg", C, 7, four, NULL), 0);
    assert_int_equal(acquire_o("dg", D, 5, (opt){.limit = "4", .k = "2"}, NULL), 0);
    assert_int_equal(acquire_o("dg", E, 9, (opt){.limit = "4", .k = "3"}, NULL), 0);
    redisContext *sc = subscribe(C), *sd = subscribe(D), *se = subscribe(E);
    assert_int_equal(release("dg", A, 2, 3, 0), 2);
    expect_message(sc, "P 7 1 dg");
    expect_message(sd, "P 5 2 dg");
    expect_none(se);
    assert_true(queued("dg", E) && !queued("dg", C) && !queued("dg", D));
    assert_int_equal(in_use("dg", NULL, NULL), 4);
    field c = field_of("dg", C);
    long long now = server_ms();
    assert_true(c.n == 1 && c.g == 7 && c.gk == 1);
    assert_true(c.exp <= now + 2000); /* its waiter ttl, not a lease */
    long long held;
    assert_int_equal(acquire_o("dg", C, 7, four, &held), 1);
    assert_int_equal(held, 1);
    assert_true(field_of("dg", C).exp > now + 9000); /* a lease */
    assert_int_equal(in_use("dg", NULL, NULL), 4);
    /* the release of B and C: E gets its 3 */
    se = subscribe(E);
    assert_int_equal(release("dg", B, 2, 1, 0), 1);
    assert_int_equal(release("dg", C, 8, 1, 0), 1);
    assert_int_equal(release("dg", D, 6, 1, 0), 2);
    expect_message(se, "P 9 3 dg");
    /* a direct grant to a client whose newer call came since (B, queued in
     * attempt 3, then a release 4 of its other permit, which grants B's
     * queued attempt): the newer call's number stays; B's next attempt,
     * naming 3 in doubt, takes the grant over without another permit */
    assert_int_equal(acquire_o("dh2", B, 1, (opt){.limit = "1"}, NULL), 1);
    assert_int_equal(acquire_o("dh2", B, 3, (opt){.limit = "1"}, NULL), 0);
    sd = subscribe(B);
    assert_int_equal(release("dh2", B, 4, 1, 0), 2);
    expect_message(sd, "P 3 1 dh2");
    field b = field_of("dh2", B);
    assert_true(b.n == 1 && b.a == 4 && b.x == 'r' && b.g == 3 && b.gk == 1);
    UNCHANGED("dh2", assert_int_equal(acquire("dh2", B, 3), -1));
    assert_int_equal(acquire_o("dh2", C, 1, (opt){.limit = "1"}, NULL), 0); /* waits */
    assert_int_equal(acquire_o("dh2", B, 5, (opt){.limit = "1", .doubt = "3"}, &held), 1);
    assert_int_equal(held, 1);
    assert_int_equal(in_use("dh2", NULL, NULL), 1);
    assert_true(queued("dh2", C) && field_of("dh2", C).n == 0);
}

/* Idempotence: the same attempt again is granted without another permit;
 * a late copy of an older attempt is refused changing nothing; a release
 * retried is not applied twice, and a late one is refused; an attempt in
 * doubt is taken over by the next, or given back by attempt. */
static void test_idempotent(void **state)
{
    (void)state;
    long long held;
    assert_int_equal(acquire_o("id", A, 5, (opt){0}, &held), 1);
    assert_int_equal(acquire_o("id", A, 5, (opt){0}, &held), 1); /* reply lost: again */
    assert_int_equal(held, 1);
    assert_int_equal(in_use("id", NULL, NULL), 1);
    UNCHANGED("id", assert_int_equal(acquire("id", A, 4), -1));
    assert_int_equal(acquire_o("id", A, 6, (opt){0}, &held), 1);
    assert_int_equal(held, 2);
    assert_int_equal(release("id", A, 7, 1, 0), 1);
    assert_int_equal(release("id", A, 7, 1, 0), 1); /* again: not applied twice */
    assert_int_equal(in_use("id", A, &held), 1);
    assert_int_equal(held, 1);
    UNCHANGED("id", assert_int_equal(release("id", A, 6, 1, 0), 3));
    UNCHANGED("id", assert_int_equal(acquire("id", A, 7), -1)); /* a release's number */
    UNCHANGED("id", assert_int_equal(acquire("id", A, 6), -1)); /* superseded */
    /* attempt 8 granted, its reply lost; 9 says 8 is in doubt: takes it over */
    assert_int_equal(acquire("id", A, 8), 1);
    opt doubt8 = {.doubt = "8"};
    assert_int_equal(acquire_o("id", A, 9, doubt8, &held), 1);
    assert_int_equal(held, 2);
    assert_int_equal(in_use("id", NULL, NULL), 2);
    /* 10 granted, in doubt: given back by attempt (call 11), once */
    assert_int_equal(acquire("id", A, 10), 1);
    assert_int_equal(release("id", A, 11, 0, 10), 1);
    assert_int_equal(in_use("id", A, &held), 2);
    assert_int_equal(release("id", A, 11, 0, 10), 1);
    assert_int_equal(release("id", A, 12, 0, 10), 0); /* nothing of 10 left */
    assert_int_equal(in_use("id", A, &held), 2);
    /* a refused attempt in doubt has no grant to take over: 14 takes one */
    assert_int_equal(acquire_o("id", B, 1, (opt){.k = "1"}, NULL), 1);
    assert_int_equal(acquire_o("id", A, 13, (opt){.queue = "0"}, NULL), 0);
    assert_int_equal(release("id", B, 2, 1, 0), 1);
    assert_int_equal(acquire_o("id", A, 14, (opt){.doubt = "13"}, &held), 1);
    assert_int_equal(held, 3);
    /* a release of more than held gives back what is held: 0 */
    assert_int_equal(release("id", A, 15, 5, 0), 0);
    assert_int_equal(in_use("id", NULL, NULL), 0);
}

/* A release by attempt from a client Redis holds no field of (its
 * acquire's reply was lost and the request itself delayed) remembers the
 * call, as a leave does: the late copy of that acquire, arriving once
 * permits are free, is refused instead of taking one the client believes
 * it gave back. */
static void test_release_before_late_acquire(void **state)
{
    (void)state;
    assert_int_equal(acquire_o("rl", B, 1, (opt){.k = "3"}, NULL), 1); /* all 3 */
    /* A's acquire 1 is in flight; A gives it back by attempt (call 2) */
    assert_int_equal(release("rl", A, 2, 0, 1), 0);
    assert_int_equal(release("rl", B, 2, 3, 0), 1);
    assert_int_equal(in_use("rl", NULL, NULL), 0);
    /* the late copy of A's acquire 1 */
    UNCHANGED("rl", assert_int_equal(acquire("rl", A, 1), -1));
    assert_int_equal(in_use("rl", NULL, NULL), 0);
}

/* A leave gives back a direct grant its client never took (and the permit
 * goes on to the next waiter), only for the attempt given up; a late
 * leave changes nothing. */
static void test_leave_gives_back(void **state)
{
    (void)state;
    opt one = {.limit = "1"};
    assert_int_equal(acquire_o("lv", A, 1, one, NULL), 1);
    assert_int_equal(acquire_o("lv", B, 3, one, NULL), 0);
    assert_int_equal(acquire_o("lv", C, 2, one, NULL), 0);
    redisContext *sb = subscribe(B);
    assert_int_equal(release("lv", A, 2, 1, 0), 2);
    expect_message(sb, "P 3 1 lv");
    long long held;
    assert_int_equal(in_use("lv", B, &held), 1);
    /* B gave up attempt 3 before the message came: it leaves */
    redisContext *sc = subscribe(C);
    assert_int_equal(leave("lv", B, 4, 3), 1);
    expect_message(sc, "P 2 1 lv");
    assert_int_equal(in_use("lv", C, &held), 1);
    assert_int_equal(held, 1);
    assert_int_equal(field_of("lv", B).n, 0);
    /* late copies: of B's attempt 3 (refused), of an older leave */
    UNCHANGED("lv", assert_int_equal(acquire("lv", B, 3), -1));
    UNCHANGED("lv", assert_int_equal(leave("lv", B, 2, 1), 0));
    /* a leave of C for an attempt that is not its grant's keeps the permit */
    assert_int_equal(acquire_o("lv", D, 1, one, NULL), 0);
    assert_int_equal(leave("lv", C, 3, 1), 0);
    assert_int_equal(in_use("lv", C, &held), 1);
    assert_int_equal(held, 1);
    assert_int_equal(leave("lv", D, 2, 1), 1);
    assert_false(queued("lv", D));
}

/* The hash's life: it only grows (PEXPIRE GT: a call with a shorter
 * record lifetime does not shorten it) and ends once nobody holds or
 * waits (a record lifetime after the last call); fields of clients past
 * their <until> are pruned from a hash of more than 16 fields. */
static void test_life_and_pruning(void **state)
{
    (void)state;
    opt s = {.limit = "30", .keep = "1500", .lease = "1500", .ttl = "500"};
    assert_int_equal(acquire_o("lp", A, 1, (opt){.limit = "30", .keep = "60000"}, NULL), 1);
    long long p = cmd_int("PTTL ts:{lp}");
    assert_true(p > 55000);
    assert_int_equal(acquire_o("lp", B, 1, s, NULL), 1);
    assert_true(cmd_int("PTTL ts:{lp}") > p - 1000); /* not shortened */
    /* D's permits outlive its record lifetime: its field lasts as long */
    opt d = {.limit = "30", .keep = "500", .lease = "30000"};
    assert_int_equal(acquire_o("lp", D, 1, d, NULL), 1);
    /* Three times 16 clients whose fields end within 1.5 s, then a call
     * of each script that writes (a release by A, an acquire by C, a leave
     * by E) prunes them: left are pv, k, l and the fields of A (60 s) and
     * D (a lease of 30 s), and then C's, and then E's (C's, of 1.5 s,
     * pruned in its turn). */
    char id[40];
    const long long left[3] = {5, 6, 6};
    for (int round = 0; round < 3; round++) {
        rkeep = "1500";
        for (int i = 0; i < 16; i++) {
            snprintf(id, sizeof id, "%032x", 0xa00 + 16 * round + i);
            assert_int_equal(acquire_o("lp", id, 1, s, NULL), 1);
            assert_int_equal(release("lp", id, 2, 1, 0), 1);
        }
        rkeep = "20000";
        assert_true(cmd_int("HLEN ts:{lp}") > 16);
        fx_sleep_ms(2000);
        if (round == 0)
            assert_int_equal(release("lp", A, 2, 1, 0), 1);
        else if (round == 1)
            assert_int_equal(acquire_o("lp", C, 1, s, NULL), 1);
        else
            assert_int_equal(leave("lp", E, 1, 0), 0);
        assert_int_equal(cmd_int("HLEN ts:{lp}"), left[round]);
    }
    assert_int_equal(in_use("lp", NULL, NULL), 1); /* D's; C's ended */
    /* a name whose only client ends: the hash goes after its record */
    opt s1 = {.limit = "1", .keep = "1500", .lease = "1500", .ttl = "300"};
    rkeep = "1500";
    assert_int_equal(acquire_o("le", A, 1, s1, NULL), 1);
    assert_int_equal(acquire_o("le", B, 1, s1, NULL), 0);
    assert_true(cmd_int("PTTL ts:{le}") <= 1520);
    assert_int_equal(leave("le", B, 2, 1), 1);
    assert_int_equal(release("le", A, 2, 1, 0), 1);
    rkeep = "20000";
    assert_int_equal(cmd_int("EXISTS ts:{le}"), 1);
    fx_sleep_ms(2000);
    assert_int_equal(cmd_int("EXISTS ts:{le}"), 0);
}

/* Each kind refuses the other's data: a protocol 2 lock's hash (pv 2, a
 * grant g, no k) and protocol 1's are refused by every semaphore script
 * with an error (renew: 0), changing nothing; a semaphore's hash is refused
 * by protocol 1's lock scripts. */
static void test_wrong_kind_refused(void **state)
{
    (void)state;
    const char *p2lock[10] = {A, "10000", "1", "16", "2000", "1", "20000", "t", "0", "0"};
    redisReply *r = eval_keys(L2_ACQUIRE, "wk", A, p2lock, 10);
    assert_int_equal(r->element[0]->integer, 1);
    freeReplyObject(r);
    UNCHANGED("wk", assert_error(acquire_r("wk", B, 1, (opt){0}), "DLOCKKIND", "a lock"));
    UNCHANGED("wk", assert_error(release_r("wk", A, 2, 1, 0), "DLOCKKIND", NULL));
    UNCHANGED("wk", assert_error(leave_r("wk", A, 2, 1), "DLOCKKIND", NULL));
    UNCHANGED("wk", assert_error(ctl_r("wk"), "DLOCKKIND", NULL));
    long long out[1];
    const char *n[1] = {"wk"};
    UNCHANGED("wk", renew(A, "10000", n, 1, out));
    assert_int_equal(out[0], 0);
    /* a hash of pv 2 without k (a lock's, once released), with a field of
     * A in the semaphore's form: not renewed */
    long long far = server_ms() + 15000;
    freeReplyObject(cmd("HSET ts:{wk2} pv 2 c:%s %s", A, "x"));
    freeReplyObject(cmd("HSET ts:{wk2} c:%s %lld", B, far));
    char v[96];
    snprintf(v, sizeof v, "1 %lld 1 g 1 1 %lld", far, far);
    freeReplyObject(redisCommand(raw, "HSET ts:{wk2} c:%s %s", A, v));
    freeReplyObject(cmd("PEXPIRE ts:{wk2} 20000"));
    UNCHANGED("wk2", assert_error(acquire_r("wk2", B, 1, (opt){0}), "DLOCKKIND", NULL));
    n[0] = "wk2";
    UNCHANGED("wk2", renew(A, "90000", n, 1, out));
    assert_int_equal(out[0], 0);
    /* a semaphore's hash with a grant field g in it (the lock's scripts
     * refuse it: test_lock_scripts_refuse_semaphore; written here as a
     * release before them left it): refused as a lock's */
    assert_int_equal(acquire("wg", A, 1), 1);
    freeReplyObject(cmd("HSET ts:{wg} g %s", "1 1 16 1 1 0 1"));
    UNCHANGED("wg", assert_error(acquire_r("wg", C, 1, (opt){0}), "DLOCKKIND", NULL));
    UNCHANGED("wg", assert_error(release_r("wg", A, 2, 1, 0), "DLOCKKIND", NULL));
    n[0] = "wg";
    UNCHANGED("wg", renew(A, "90000", n, 1, out));
    assert_int_equal(out[0], 0);
    /* a name without a hash whose protocol 1 fence lives: a lock's */
    freeReplyObject(cmd("SET ts:{wf}:fence %s PX 20000", "123 0"));
    assert_error(acquire_r("wf", B, 1, (opt){0}), "DLOCKKIND", NULL);
    assert_error(leave_r("wf", B, 1, 0), "DLOCKKIND", NULL);
    assert_int_equal(cmd_int("EXISTS ts:{wf}"), 0);
    /* protocol 1's */
    const char *p1lock[10] = {A, "10000", "1", "16", "2000", "1", "20000", "t", "0", "0"};
    freeReplyObject(eval_keys(L1_ACQUIRE, "wk1", A, p1lock, 10));
    UNCHANGED("wk1", assert_error(acquire_r("wk1", B, 1, (opt){0}), "DLOCKPROTOCOL", "1"));
    /* and the other way: protocol 1's scripts refuse a semaphore */
    assert_int_equal(acquire("ws", A, 1), 1);
    UNCHANGED("ws", assert_error(eval_keys(L1_ACQUIRE, "ws", B, p1lock, 10), "DLOCKPROTOCOL",
                                 "protocol 2"));
    const char *rn[7] = {"EVALSHA", sha[L1_RENEW], "1", "ts:{ws}", A, "10000", "1"};
    redisReply *q = redisCommandArgv(raw, 7, rn, NULL);
    assert_true(q->type == REDIS_REPLY_ARRAY && q->element[0]->integer == 0);
    freeReplyObject(q);
}

/* Protocol 2's exclusive lock scripts on name, a semaphore's hash: each
 * refuses it with DLOCKKIND, changing nothing (acquire by C, release and
 * forced release of token 1 by rel_id, leave by lv_id as call lv_num,
 * dlockctl's read). */
static void refused_by_lock_scripts(const char *name, const char *rel_id, const char *lv_id,
                                    const char *lv_num)
{
    const char *acq[10] = {C, "10000", "1", "16", "2000", "1", "20000", "t", "0", "0"};
    const char *rel[10] = {rel_id, "token", "1", "10000", "0", "ts:wake:", name, "2000", "20000",
                           "0"};
    const char *lv[6] = {lv_id, "ts:wake:", name, "2000", lv_num, "20000"};
    const char *frc[10] = {rel_id,    "token", "1",     "3600000", "1",
                           "ts:wake:", name,    "2000", "60000",   "3"};
    UNCHANGED(name, assert_error(eval_keys(L2_ACQUIRE, name, C, acq, 10), "DLOCKKIND",
                                 "a semaphore"));
    UNCHANGED(name, assert_error(eval_keys(L2_ACQUIRE_SHARED, name, C, acq, 10), "DLOCKKIND",
                                 "a semaphore"));
    UNCHANGED(name, assert_error(eval_keys(L2_RELEASE_SHARED, name, rel_id, rel, 10),
                                 "DLOCKKIND", "a semaphore"));
    UNCHANGED(name, assert_error(eval_keys(L2_RELEASE, name, rel_id, rel, 10), "DLOCKKIND",
                                 "a semaphore"));
    UNCHANGED(name, assert_error(eval_keys(L2_LEAVE, name, lv_id, lv, 6), "DLOCKKIND",
                                 "a semaphore"));
    UNCHANGED(name, assert_error(eval_keys(L2_FORCE, name, rel_id, frc, 10), "DLOCKKIND",
                                 "a semaphore"));
    UNCHANGED(name, assert_error(redisCommand(raw, "EVALSHA %s 4 ts:{%s} ts:{%s}:q ts:{%s}:qd "
                                                   "ts:{%s}:turn",
                                              sha[L2_CTL], name, name, name, name),
                                 "DLOCKKIND", "a semaphore"));
}

/* Protocol 2's exclusive lock scripts refuse a semaphore's hash (k 's'),
 * while a client holds permits and another waits, and once nobody does
 * (the hash holds records only). */
static void test_lock_scripts_refuse_semaphore(void **state)
{
    (void)state;
    opt one = {.limit = "1"};
    assert_int_equal(acquire_o("ks", A, 1, one, NULL), 1);
    assert_int_equal(acquire_o("ks", B, 1, one, NULL), 0); /* queued */
    refused_by_lock_scripts("ks", A, B, "2");
    assert_int_equal(leave("ks", B, 2, 1), 1);
    assert_int_equal(release("ks", A, 2, 1, 0), 1);
    assert_int_equal(in_use("ks", NULL, NULL), 0);
    assert_int_equal(cmd_int("EXISTS ts:{ks}:q"), 0);
    refused_by_lock_scripts("ks", A, B, "3");
    assert_int_equal(acquire_o("ks", C, 2, one, NULL), 1); /* still a semaphore */
}

/* A name without a hash whose protocol 1 lock has waiters (its holder's
 * lease key ended, the queue lives on): the semaphore scripts refuse it
 * (DLOCKKIND) instead of reading protocol 1's waiters as a semaphore's
 * (their pass limit as a count: direct grants of permits to a lock's
 * waiters), and dlockctl's read of the semaphore lists no waiters. */
static void test_p1_queue_not_a_semaphore(void **state)
{
    (void)state;
    const char *p1lock[10] = {A, "10000", "1", "2", "5000", "1", "20000", "t", "0", "0"};
    redisReply *r = eval_keys(L1_ACQUIRE, "kq", A, p1lock, 10);
    assert_int_equal(r->element[0]->integer, 1);
    freeReplyObject(r);
    p1lock[0] = B;
    r = eval_keys(L1_ACQUIRE, "kq", B, p1lock, 10);
    assert_int_equal(r->element[0]->integer, 0); /* queued in protocol 1 */
    freeReplyObject(r);
    freeReplyObject(cmd("DEL ts:{kq}")); /* A's lease key ended */
    assert_int_equal(cmd_int("EXISTS ts:{kq}:fence"), 0);
    redisContext *sb = subscribe(B);
    UNCHANGED("kq", assert_error(acquire_r("kq", C, 1, (opt){0}), "DLOCKKIND", "a lock"));
    UNCHANGED("kq", assert_error(leave_r("kq", C, 2, 0), "DLOCKKIND", "a lock"));
    UNCHANGED("kq", assert_error(release_r("kq", C, 3, 1, 0), "DLOCKKIND", "a lock"));
    expect_none(sb);
    assert_int_equal(cmd_int("EXISTS ts:{kq}"), 0);
    r = ctl_r("kq");
    assert_int_equal(r->elements, 4);
    assert_int_equal(r->element[1]->type, REDIS_REPLY_NIL);
    freeReplyObject(r);
}

/* dlockctl's read: the limit, the permits in use, each holder with its
 * count and end, each waiter with its liveness value and verdict. */
static void test_ctl_read(void **state)
{
    (void)state;
    opt two = {.limit = "2"};
    assert_int_equal(acquire_o("ct", A, 1, two, NULL), 1);
    assert_int_equal(acquire_o("ct", A, 2, two, NULL), 1);
    assert_int_equal(acquire_o("ct", B, 4, two, NULL), 0);
    assert_int_equal(acquire_o("ct", C, 1, (opt){.limit = "2", .ttl = "100"}, NULL), 0);
    fx_sleep_ms(200);
    redisReply *r = cmd("EVALSHA %s 3 ts:{ct} ts:{ct}:q ts:{ct}:qd", sha[S_CTL]);
    long long now = server_ms();
    assert_int_equal(r->elements, 4 + 3 + 8);
    assert_true(r->element[0]->integer <= now && r->element[0]->integer > now - 1000);
    assert_string_equal(r->element[1]->str, "2");
    assert_int_equal(r->element[2]->integer, 2);
    assert_int_equal(r->element[3]->integer, 1);
    assert_string_equal(r->element[4]->str, A);
    assert_int_equal(r->element[5]->integer, 2);
    assert_true(r->element[6]->integer > now + 9000);
    assert_string_equal(r->element[7]->str, B);
    assert_true(strstr(r->element[9]->str, " 4 1 2000 test-client") != NULL);
    assert_int_equal(r->element[10]->integer, 1);
    assert_string_equal(r->element[11]->str, C);
    assert_int_equal(r->element[14]->integer, 0); /* dead */
    freeReplyObject(r);
    r = cmd("EVALSHA %s 3 ts:{cx} ts:{cx}:q ts:{cx}:qd", sha[S_CTL]);
    assert_int_equal(r->elements, 4);
    assert_int_equal(r->element[1]->type, REDIS_REPLY_NIL);
    freeReplyObject(r);
}

/* Random calls of 5 clients on one name (limit 4: acquires of 1 or 2
 * permits, queued or single tries, releases, leaves, and each call now
 * and then sent twice, as a retry): after every call the permits in use
 * are within the limit and are the sum of the clients' fields, and the
 * first live waiter wants more than is free (the walk served every waiter
 * it could, FIFO). Lease and waiter ttl are long: nothing ends on its own
 * during the run. The seed is printed: srand(seed) replays it. */
static void test_random_calls(void **state)
{
    (void)state;
    const char *ids[5] = {A, B, C, D, E};
    long long num[5] = {0}, wait_att[5] = {0};
    unsigned seed = (unsigned)server_ms();
    print_message("seed %u\n", seed);
    srand(seed);
    opt o = {.limit = "4", .lease = "60000", .ttl = "60000", .keep = "60000"};
    for (int step = 0; step < 1500; step++) {
        int c = rand() % 5, op = rand() % 10, twice = rand() % 8 == 0;
        const char *id = ids[c];
        char d[24];
        field f = field_of("rc", id);
        int wasq = queued("rc", id);
        long long first = -9, held = -1, h;
        num[c]++;
        for (int t = 0; t <= twice; t++) {
            long long r;
            if (op < 5) {
                if (!t) {
                    o.k = rand() % 3 == 0 ? "2" : "1";
                    o.queue = op < 4 ? "1" : "0";
                    snprintf(d, sizeof d, "%lld", wait_att[c]);
                    o.doubt = rand() % 4 == 0 ? d : "0";
                }
                r = acquire_o("rc", id, num[c], o, &h);
                /* again: the same answer, no permit more */
                assert_true(t ? r == first && (r != 1 || h == held) : r == 1 || r == 0);
                held = h;
                wait_att[c] = r == 0 && op < 4 ? num[c] : 0;
            } else if (op < 8) {
                r = release("rc", id, num[c], 1, 0);
                if (f.n == 0)
                    assert_int_equal(r, 0);
                else
                    assert_true(t ? r == 1 : r == 1 || r == 2);
            } else {
                r = leave("rc", id, num[c], wait_att[c]);
                assert_true(!t || r == 0);
                wait_att[c] = 0;
            }
            if (!t)
                first = r;
            /* the retry took or gave back nothing more (a release of a
             * client that also waits may have granted it permits) */
            if (t && op < 5 && r == 1)
                assert_int_equal(field_of("rc", id).n, held);
            if (t && op >= 5 && op < 8 && !wasq)
                assert_int_equal(field_of("rc", id).n, f.n - (f.n > 0));
        }
        long long used = in_use("rc", NULL, NULL), sum = 0;
        for (int i = 0; i < 5; i++)
            sum += field_of("rc", ids[i]).n;
        if (used > 4 || used != sum)
            fail_msg("step %d (seed %u): %lld permits in use, fields %lld", step, seed, used, sum);
        redisReply *q = cmd("ZRANGE ts:{rc}:q 0 0");
        if (q->elements == 1) {
            redisReply *v = cmd("HGET ts:{rc}:qd %s", q->element[0]->str);
            long long dl, at, k;
            assert_int_equal(sscanf(v->str, "%lld %lld %lld", &dl, &at, &k), 3);
            if (k <= 4 - used)
                fail_msg("step %d (seed %u): waiter %s wants %lld with %lld free", step, seed,
                         q->element[0]->str, k, 4 - used);
            freeReplyObject(v);
        }
        freeReplyObject(q);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_never_more_than_limit),
        cmocka_unit_test(test_limit_mismatch),
        cmocka_unit_test(test_fifo),
        cmocka_unit_test(test_dead_waiter_pruned),
        cmocka_unit_test(test_dead_holder_freed),
        cmocka_unit_test(test_renewal),
        cmocka_unit_test(test_step_back_no_revival),
        cmocka_unit_test(test_direct_grant_does_not_stretch),
        cmocka_unit_test(test_direct_grants),
        cmocka_unit_test(test_idempotent),
        cmocka_unit_test(test_release_before_late_acquire),
        cmocka_unit_test(test_leave_gives_back),
        cmocka_unit_test(test_life_and_pruning),
        cmocka_unit_test(test_wrong_kind_refused),
        cmocka_unit_test(test_lock_scripts_refuse_semaphore),
        cmocka_unit_test(test_p1_queue_not_a_semaphore),
        cmocka_unit_test(test_ctl_read),
        cmocka_unit_test(test_random_calls),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
