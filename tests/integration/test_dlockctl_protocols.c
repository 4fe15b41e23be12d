/*
 * dlockctl on the data of both protocols this release speaks (protocol 2's:
 * lua/p2/LAYOUT.txt), run as a program against the test's redis-server, as
 * test_dlockctl.c runs it on protocol 1's: show, watch, list, release
 * --force and release --client on names whose data is protocol 2's (held,
 * queued for and released), beside protocol 1's names in one listing and
 * one client's release; names held in protocol 2's shared mode (their
 * holders, the waiters' modes; release --force leaves them alone); and data
 * of a protocol this release does not speak (3) still refused and left as
 * it was. The library's clients here write
 * protocol 1; protocol 2's data is made by running its scripts (the ones
 * compiled into the library, which dlockctl runs too) with EVAL, as a
 * client of protocol 2 would.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "common/slot.h"
#include "conn/script.h"
#include "dlock.h"
#include "fixture.h"

#ifndef DLOCKCTL_PATH
#error "DLOCKCTL_PATH: the dlockctl binary, set by tests/CMakeLists.txt"
#endif

#define PREFIX "tc:ctl:"
#define X "0123456789abcdef0123456789abcdef" /* protocol 2 clients' ids */
#define Y "fedcba9876543210fedcba9876543210"
#define Z "33333333333333333333333333333333"

/* Runs dlockctl with the server and prefix options, then args; returns its
 * exit status and its stdout (with its stderr too if with_err) in out
 * (truncated to n). */
static int vctl(int with_err, char *out, size_t n, const char *fmt, va_list ap)
{
    char args[600], command[900];
    vsnprintf(args, sizeof args, fmt, ap);
    snprintf(command, sizeof command, "%s -h 127.0.0.1:%d --prefix " PREFIX " %s %s",
             DLOCKCTL_PATH, fx_server.port, args, with_err ? "2>&1" : "2>/dev/null");
    FILE *f = popen(command, "r");
    assert_non_null(f);
    size_t got = fread(out, 1, n - 1, f);
    out[got] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int ctl(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vctl(0, out, n, fmt, ap);
    va_end(ap);
    return rc;
}

static int ctl_err(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vctl(1, out, n, fmt, ap);
    va_end(ap);
    return rc;
}

/* How many times s occurs in out. */
static int count_of(const char *out, const char *s)
{
    int n = 0;
    for (const char *p = out; (p = strstr(p, s)) != NULL; p++)
        n++;
    return n;
}

/* Protocol 2's script `id` (DLOCK_SCRIPT_ACQUIRE, _RELEASE) on name's keys
 * for client `client` (lua/keys.lua's order) with args a[0 .. na): its
 * reply (an error fails the test). */
static redisReply *p2_eval(dlock_script_id id, const char *name, const char *client,
                           const char **a, int na)
{
    char k[DLOCK_KEYS][160];
    for (int i = 0; i < DLOCK_KEY_CLIENT; i++)
        snprintf(k[i], sizeof k[i], PREFIX "{%s}%s", name, dlock_script_key_suffix(i));
    snprintf(k[DLOCK_KEY_CLIENT], sizeof k[0], PREFIX "{%s}%s%s", name,
             dlock_script_key_suffix(DLOCK_KEY_CLIENT), client);
    snprintf(k[DLOCK_KEY_HW], sizeof k[0], PREFIX "%s{%s}", dlock_script_key_suffix(DLOCK_KEY_HW),
             dlock_slot_tag(dlock_cluster_slot(k[0], strlen(k[0]))));
    const char *argv[3 + DLOCK_KEYS + 10] = {"EVAL", dlock_script_body(dlock_script_in(id, 2)),
                                              "7"};
    for (int i = 0; i < DLOCK_KEYS; i++)
        argv[3 + i] = k[i];
    memcpy(argv + 3 + DLOCK_KEYS, a, (size_t)na * sizeof *a);
    redisContext *c = fx_connect("127.0.0.1", fx_server.port);
    redisReply *r = redisCommandArgv(c, 3 + DLOCK_KEYS + na, argv, NULL);
    redisFree(c);
    assert_non_null(r);
    if (r->type == REDIS_REPLY_ERROR)
        fail_msg("lua/p2 script %d on %s: %s", (int)id, name, r->str);
    return r;
}

/* lua/p2/<file>.lua, read from the source tree (the library does not
 * load the shared mode's scripts yet), on name's keys for client with
 * args a[0 .. na), as p2_eval. */
static redisReply *p2_eval_file(const char *file, const char *name, const char *client,
                                const char **a, int na)
{
    char path[512];
    static char body[1 << 16];
    snprintf(path, sizeof path, "%s/lua/p2/%s.lua", DLOCK_SOURCE_DIR, file);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot read %s", path);
    body[fread(body, 1, sizeof body - 1, f)] = '\0';
    fclose(f);
    char k[DLOCK_KEYS][160];
    for (int i = 0; i < DLOCK_KEY_CLIENT; i++)
        snprintf(k[i], sizeof k[i], PREFIX "{%s}%s", name, dlock_script_key_suffix(i));
    snprintf(k[DLOCK_KEY_CLIENT], sizeof k[0], PREFIX "{%s}%s%s", name,
             dlock_script_key_suffix(DLOCK_KEY_CLIENT), client);
    snprintf(k[DLOCK_KEY_HW], sizeof k[0], PREFIX "%s{%s}", dlock_script_key_suffix(DLOCK_KEY_HW),
             dlock_slot_tag(dlock_cluster_slot(k[0], strlen(k[0]))));
    const char *argv[3 + DLOCK_KEYS + 10] = {"EVAL", body, "7"};
    for (int i = 0; i < DLOCK_KEYS; i++)
        argv[3 + i] = k[i];
    memcpy(argv + 3 + DLOCK_KEYS, a, (size_t)na * sizeof *a);
    redisContext *c = fx_connect("127.0.0.1", fx_server.port);
    redisReply *r = redisCommandArgv(c, 3 + DLOCK_KEYS + na, argv, NULL);
    redisFree(c);
    assert_non_null(r);
    if (r->type == REDIS_REPLY_ERROR)
        fail_msg("lua/p2/%s.lua on %s: %s", file, name, r->str);
    return r;
}

static long long attempts; /* each call's attempt number: increasing */

/* A shared acquire of name by client (lua/p2/acquire_shared.lua), with the
 * arguments of p2_acquire. Returns the token granted, or 0 if queued (with
 * queue) or refused. */
static long long p2_acquire_shared(const char *name, const char *client, const char *cname,
                                   int queue)
{
    char n[24];
    snprintf(n, sizeof n, "%lld", ++attempts);
    const char *a[10] = {client, "60000", n, "16", "20000", queue ? "1" : "0", "600000",
                         cname, "0", "0"};
    redisReply *r = p2_eval_file("acquire_shared", name, client, a, 10);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    long long tok = r->element[0]->integer == 1 ? r->element[1]->integer : 0;
    freeReplyObject(r);
    return tok;
}

/* An acquire of name by client (named cname) in protocol 2, with a lease
 * of a minute (no renewal runs) and a waiter ttl of 20 s (a queued waiter
 * stays alive through the test, however loaded the machine). Returns the
 * token granted, or 0 if queued (with queue) or refused. */
static long long p2_acquire(const char *name, const char *client, const char *cname, int queue)
{
    char n[24];
    snprintf(n, sizeof n, "%lld", ++attempts);
    const char *a[10] = {client, "60000", n, "16", "20000", queue ? "1" : "0", "600000",
                         cname, "0", "0"};
    redisReply *r = p2_eval(DLOCK_SCRIPT_ACQUIRE, name, client, a, 10);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    long long tok = r->element[0]->integer == 1 ? r->element[1]->integer : 0;
    freeReplyObject(r);
    return tok;
}

/* The holder's own release of its grant `token` of name, in protocol 2:
 * lua/release.lua's answer (1 released, 0 not its grant). */
static long long p2_release(const char *name, const char *client, long long token)
{
    char t[24];
    snprintf(t, sizeof t, "%lld", token);
    const char *a[10] = {client, "token", t, "60000", t, PREFIX "wake:", name, "20000",
                         "600000", "0"};
    redisReply *r = p2_eval(DLOCK_SCRIPT_RELEASE, name, client, a, 10);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    long long rc = r->integer;
    freeReplyObject(r);
    return rc;
}

/* Field f of name's hash into out ("" if absent). */
static void hget(const char *name, const char *f, char *out, size_t n)
{
    redisReply *r = fx_cmd_at(fx_server.port, "HGET " PREFIX "{%s} %s", name, f);
    snprintf(out, n, "%s", r->type == REDIS_REPLY_STRING ? r->str : "");
    freeReplyObject(r);
}

/* Everything of name: its hash, protocol 1's fence and record of client,
 * the queue and the liveness hash, as one string: what a refusal must
 * leave as it was. */
static void data_of(const char *name, const char *client, char *out, size_t n)
{
    static const char *const cmds[] = {"HGETALL " PREFIX "{%s}", "GET " PREFIX "{%s}:fence",
                                       "GET " PREFIX "{%s}:c:%s", "ZRANGE " PREFIX "{%s}:q 0 -1",
                                       "HGETALL " PREFIX "{%s}:qd"};
    size_t used = 0;
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        redisReply *r = fx_cmd_at(fx_server.port, cmds[i], name, client);
        if (r->type == REDIS_REPLY_ARRAY)
            for (size_t j = 0; j < r->elements; j++)
                used += (size_t)snprintf(out + used, n - used, "%s ", r->element[j]->str);
        else
            used += (size_t)snprintf(out + used, n - used, "%s ",
                                     r->type == REDIS_REPLY_STRING ? r->str : "-");
        used += (size_t)snprintf(out + used, n - used, "| ");
        freeReplyObject(r);
    }
}

/* A client of the library (protocol 1) named cname, with a lease of 60 s:
 * renewal rounds 20 s apart, far from the few seconds a test takes even on
 * a loaded machine (a round would find a lease marked with protocol 3 not
 * renewed, and the client's release would then say ELOST). */
static dlock_client *open_named(const char *cname)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = PREFIX;
    cfg.client_name = cname;
    cfg.lease_ms = 60000;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    return c;
}

/* show, watch and list of protocol 2's names: a held one with a waiter,
 * whose holder, token, queue and protocol are shown (text and JSON), and a
 * released one, whose hash stays: shown free (exit 1), not listed, and no
 * name listed twice. */
static void test_p2_show_list(void **state)
{
    (void)state;
    long long t = p2_acquire("p2:held", X, "p2-holder", 0);
    assert_true(t > 0);
    assert_int_equal(p2_acquire("p2:held", Y, "p2-waiter", 1), 0); /* queued */
    long long t2 = p2_acquire("p2:gone", X, "p2-holder", 0);
    assert_int_equal(p2_release("p2:gone", X, t2), 1);
    char out[8192], tok[40];
    hget("p2:gone", "pv", out, sizeof out);
    assert_string_equal(out, "2"); /* the released name keeps its hash */

    assert_int_equal(ctl(out, sizeof out, "show p2:held"), 0);
    fprintf(stderr, "show: %s", out);
    snprintf(tok, sizeof tok, "token %lld", t);
    assert_non_null(strstr(out, "p2:held: held by p2-holder (client id " X ")"));
    assert_non_null(strstr(out, tok));
    assert_non_null(strstr(out, "  protocol: 2\n"));
    assert_non_null(strstr(out, "p2-waiter (fedcba98) waiting"));
    assert_non_null(strstr(out, "alive"));
    assert_int_equal(ctl(out, sizeof out, "--json show p2:held"), 0);
    fprintf(stderr, "show --json: %s", out);
    snprintf(tok, sizeof tok, "\"token\":%lld,", t);
    assert_non_null(strstr(out, "{\"name\":\"p2:held\",\"protocol\":2,"
                                "\"kind\":\"lock\",\"held\":true,"
                                "\"owner\":\"" X "\",\"holder_name\":\"p2-holder\""));
    assert_non_null(strstr(out, tok));
    assert_non_null(strstr(out, "\"queue\":[{\"client\":\"" Y "\",\"name\":\"p2-waiter\""));
    assert_int_equal(ctl(out, sizeof out, "--count 2 --interval 50 watch p2:held"), 0);
    assert_int_equal(count_of(out, "held by p2-holder"), 2);
    assert_int_equal(count_of(out, "protocol: 2"), 2);

    /* released: free, in protocol 2 */
    assert_int_equal(ctl(out, sizeof out, "show p2:gone"), 1);
    assert_non_null(strstr(out, "p2:gone: free"));
    assert_non_null(strstr(out, "  protocol: 2\n"));
    assert_int_equal(ctl(out, sizeof out, "--json show p2:gone"), 1);
    assert_non_null(strstr(out, "{\"name\":\"p2:gone\",\"protocol\":2,"
                                "\"kind\":\"lock\",\"held\":false,"));

    /* list: the held name once, not the released one */
    assert_int_equal(ctl(out, sizeof out, "list 'p2:*'"), 0);
    fprintf(stderr, "list: %s", out);
    assert_int_equal(count_of(out, "p2:held "), 1);
    assert_non_null(strstr(out, "p2-holder (01234567)"));
    assert_null(strstr(out, "p2:gone"));
    assert_int_equal(ctl(out, sizeof out, "--json list 'p2:*'"), 0);
    assert_int_equal(count_of(out, "\"name\":"), 1);
    assert_non_null(strstr(out, "[{\"name\":\"p2:held\",\"protocol\":2,"
                                "\"kind\":\"lock\",\"held\":true,"));
    assert_non_null(strstr(out, "\"waiting\":1"));
}

/* A name held in protocol 2's shared mode by two clients, with a writer
 * and then a reader queued behind them: show names the mode, each shared
 * holder with its token, and each waiter's mode (text and JSON); list
 * shows it held, shared by 2; release --force takes exclusive grants only,
 * so it says the name is held shared and leaves its data as it was. */
static void test_p2_shared(void **state)
{
    (void)state;
    long long t1 = p2_acquire_shared("sh:r", X, "reader-1", 0);
    long long t2 = p2_acquire_shared("sh:r", Y, "reader-2", 0);
    assert_true(t1 > 0 && t2 > t1);
    assert_int_equal(p2_acquire("sh:r", Z, "writer", 1), 0); /* queued behind them */
    assert_int_equal(p2_acquire_shared("sh:r", "44444444444444444444444444444444", "reader-3", 1),
                     0); /* behind the writer */
    char out[8192], s[128];

    assert_int_equal(ctl(out, sizeof out, "show sh:r"), 0);
    fprintf(stderr, "show: %s", out);
    assert_non_null(strstr(out, "sh:r: held shared by 2 clients\n"));
    snprintf(s, sizeof s, "shared by client id " X ", token %lld,", t1);
    assert_non_null(strstr(out, s));
    snprintf(s, sizeof s, "shared by client id " Y ", token %lld,", t2);
    assert_non_null(strstr(out, s));
    assert_non_null(strstr(out, "  2 waiting\n"));
    assert_non_null(strstr(out, "1. writer (33333333) waiting"));
    assert_null(strstr(out, "writer (33333333) waiting to share"));
    assert_non_null(strstr(out, "2. reader-3 (44444444) waiting"));
    assert_non_null(strstr(out, " to share it, alive"));

    assert_int_equal(ctl(out, sizeof out, "--json show sh:r"), 0);
    fprintf(stderr, "show --json: %s", out);
    assert_non_null(strstr(out, "{\"name\":\"sh:r\",\"protocol\":2,"
                                "\"kind\":\"lock\",\"held\":false,"
                                "\"mode\":\"shared\",\"sharing\":2,\"shared\":[{\"client\":\"" X
                                "\",\"token\":"));
    snprintf(s, sizeof s, "{\"client\":\"" Y "\",\"token\":%lld,", t2);
    assert_non_null(strstr(out, s));
    assert_non_null(strstr(out, "\"name\":\"writer\",\"mode\":\"exclusive\""));
    assert_non_null(strstr(out, "\"name\":\"reader-3\",\"mode\":\"shared\""));

    assert_int_equal(ctl(out, sizeof out, "list 'sh:*'"), 0);
    fprintf(stderr, "list: %s", out);
    assert_int_equal(count_of(out, "sh:r "), 1);
    assert_non_null(strstr(out, "shared by 2 clients"));
    assert_int_equal(ctl(out, sizeof out, "--json list 'sh:*'"), 0);
    assert_non_null(strstr(out, "\"mode\":\"shared\",\"sharing\":2,\"waiting\":2}"));

    char before[4096], after[4096];
    data_of("sh:r", X, before, sizeof before);
    assert_int_equal(ctl(out, sizeof out, "release sh:r --force"), 1);
    fprintf(stderr, "release --force: %s", out);
    assert_non_null(strstr(out, "sh:r is held shared by 2 clients: release --force takes "
                                "exclusive grants only"));
    assert_int_equal(ctl(out, sizeof out, "--json release sh:r --force"), 1);
    assert_non_null(strstr(out, "\"released\":false,\"reason\":\"held shared\""));
    data_of("sh:r", X, after, sizeof after);
    assert_string_equal(before, after);

    /* an exclusive grant of protocol 2 says so in JSON */
    assert_true(p2_acquire("sh:w", X, "p2-holder", 0) > 0);
    assert_int_equal(ctl(out, sizeof out, "--json show sh:w"), 0);
    assert_non_null(strstr(out, "\"mode\":\"exclusive\",\"sharing\":0,"));
}

/* One listing of protocol 1's names (held by a client of the library) and
 * protocol 2's, sorted by name, each once with its protocol; released
 * names of either left out. A scan reads each name in the protocol of the
 * one before first: names of one protocol cost one script each, and one
 * more for the first (counted by INFO commandstats). */
static void test_mixed_list(void **state)
{
    (void)state;
    dlock_client *a = open_named("lib-1");
    assert_int_equal(dlock_acquire(a, "mx:b", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_acquire(a, "mx:d", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_acquire(a, "mx:e", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(a, "mx:e"), DLOCK_OK); /* p1, released */
    assert_true(p2_acquire("mx:a", X, "p2-a", 0) > 0);
    assert_true(p2_acquire("mx:c", Y, "p2-c", 0) > 0);
    long long t = p2_acquire("mx:f", X, "p2-a", 0);
    assert_int_equal(p2_release("mx:f", X, t), 1); /* p2, released */
    char out[8192];
    assert_int_equal(ctl(out, sizeof out, "list 'mx:*'"), 0);
    fprintf(stderr, "list: %s", out);
    const char *pa = strstr(out, "mx:a "), *pb = strstr(out, "mx:b "), *pc = strstr(out, "mx:c "),
               *pd = strstr(out, "mx:d ");
    assert_true(pa && pb && pc && pd && pa < pb && pb < pc && pc < pd);
    assert_null(strstr(out, "mx:e"));
    assert_null(strstr(out, "mx:f"));
    assert_non_null(strstr(out, "p2-c (fedcba98)"));
    assert_non_null(strstr(out, "lib-1 ("));
    assert_int_equal(ctl(out, sizeof out, "--json list 'mx:*'"), 0);
    fprintf(stderr, "list --json: %s", out);
    assert_int_equal(count_of(out, "\"name\":"), 4);
    assert_non_null(strstr(out, "{\"name\":\"mx:a\",\"protocol\":2,"
                                "\"kind\":\"lock\",\"held\":true"));
    char lib[2][100]; /* the library's names: in the protocol it writes by default */
    for (int i = 0; i < 2; i++)
        snprintf(lib[i], sizeof lib[i], "{\"name\":\"mx:%c\",\"protocol\":%d,\"kind\":"
                 "\"lock\",\"held\":true", i ? 'd' : 'b', DLOCK_PROTOCOL_DEFAULT);
    assert_non_null(strstr(out, lib[0]));
    assert_non_null(strstr(out, "{\"name\":\"mx:c\",\"protocol\":2,"
                                "\"kind\":\"lock\",\"held\":true"));
    assert_non_null(strstr(out, lib[1]));
    /* show of the library's name says its protocol */
    assert_int_equal(ctl(out, sizeof out, "show mx:b"), 0);
    char proto[32];
    snprintf(proto, sizeof proto, "  protocol: %d\n", DLOCK_PROTOCOL_DEFAULT);
    assert_non_null(strstr(out, proto));
    /* protocol 2's names alone: one script each, one more for the first
     * (read as protocol 1's first) where dlockctl speaks both */
    long long t3 = p2_acquire("one:a", X, "p2-a", 0);
    assert_true(t3 > 0 && p2_acquire("one:b", X, "p2-a", 0) > 0 &&
                p2_acquire("one:c", X, "p2-a", 0) > 0);
    assert_int_equal(p2_release("one:a", X, t3), 1);
    long long ev0 = fx_info_calls("127.0.0.1", fx_server.port, "eval");
    assert_int_equal(ctl(out, sizeof out, "list 'one:*'"), 0);
    long long evals = fx_info_calls("127.0.0.1", fx_server.port, "eval") - ev0;
    fprintf(stderr, "list of 3 names of protocol 2: %lld scripts\n", evals);
    assert_int_equal(evals, DLOCK_PROTOCOL_MIN == DLOCK_PROTOCOL_MAX ? 3 : 4);
    assert_int_equal(count_of(out, "one:"), 2);
    assert_int_equal(dlock_release(a, "mx:b"), DLOCK_OK);
    assert_int_equal(dlock_release(a, "mx:d"), DLOCK_OK);
    dlock_client_close(a);
}

/* release NAME --force of protocol 2's name: protocol 2's forced release
 * (lua/p2/force.lua around lua/p2/release.lua) hands it to the live
 * waiter, told that an operator ended the grant before (g's u: 3), with a
 * later token; the holder's record says taken, so its own release of that
 * token is refused (0: DLOCK_ELOST). */
static void test_p2_release_force(void **state)
{
    (void)state;
    long long t = p2_acquire("p2:f", X, "p2-holder", 0);
    assert_true(t > 0);
    assert_int_equal(p2_acquire("p2:f", Y, "p2-waiter", 1), 0);
    char out[4096], g[128], o[64], rec[128];
    assert_int_equal(ctl(out, sizeof out, "release p2:f"), 2); /* no --force */
    assert_int_equal(ctl(out, sizeof out, "--json release p2:f --force"), 0);
    fprintf(stderr, "release --force: %s", out);
    assert_non_null(strstr(out, "\"released\":true,\"owner\":\"" X "\""));
    assert_non_null(strstr(out, "\"protocol\":2"));
    assert_non_null(strstr(out, "\"next_waiter_granted\":true"));
    hget("p2:f", "o", o, sizeof o);
    assert_string_equal(o, Y);
    hget("p2:f", "g", g, sizeof g);
    long long tok, nonce, pl, exp, dur, u;
    assert_int_equal(sscanf(g, "%lld %lld %lld %lld %lld %lld", &tok, &nonce, &pl, &exp, &dur, &u),
                     6);
    assert_true(tok > t);
    assert_int_equal(u, 3); /* DLOCK_UNCLEAN_FORCED, for the next holder */
    hget("p2:f", "c:" X, rec, sizeof rec);
    fprintf(stderr, "the holder's record: %s\n", rec);
    long long ra, rt;
    assert_int_equal(sscanf(rec, "%lld %lld", &ra, &rt), 2);
    assert_int_equal(rt, 0); /* taken, not released */
    assert_int_equal(p2_release("p2:f", X, t), 0);
    /* the new holder's grant: released by force too, then nothing held */
    assert_int_equal(ctl(out, sizeof out, "release p2:f --force"), 0);
    assert_non_null(strstr(out, "p2:f released by force: it was held by p2-waiter"));
    assert_non_null(strstr(out, "nobody was waiting"));
    assert_int_equal(ctl(out, sizeof out, "release p2:f --force"), 1);
    assert_non_null(strstr(out, "p2:f is not held"));
    assert_int_equal(p2_release("p2:f", Y, tok), 0);
}

/* release --client ID --force finds the client's holds of both protocols
 * (one id, as a client that speaks both would have): all released, and
 * another client's name of protocol 2 left alone. */
static void test_release_client_both(void **state)
{
    (void)state;
    dlock_client *a = open_named("both-1");
    const char *id = dlock_client_id(a);
    long long t[2];
    assert_int_equal(dlock_acquire(a, "rcb:1", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_acquire(a, "rcb:2", 0, NULL), DLOCK_OK);
    assert_true((t[0] = p2_acquire("rcb:3", id, "both-1", 0)) > 0);
    assert_true((t[1] = p2_acquire("rcb:4", id, "both-1", 0)) > 0);
    assert_true(p2_acquire("rcb:5", Z, "other", 0) > 0);
    char out[8192], o[64];
    assert_int_equal(ctl(out, sizeof out, "release --client %s --force", id), 0);
    fprintf(stderr, "release --client: %s", out);
    assert_non_null(strstr(out, "4 of the 4 locks client"));
    assert_int_equal(count_of(out, "released by force"), 4);
    assert_int_equal(fx_server_lease_ms(PREFIX "{rcb:1}"), -2);
    assert_int_equal(fx_server_lease_ms(PREFIX "{rcb:2}"), -2);
    assert_int_equal(dlock_release(a, "rcb:1"), DLOCK_ELOST);
    assert_int_equal(dlock_release(a, "rcb:2"), DLOCK_ELOST);
    assert_int_equal(p2_release("rcb:3", id, t[0]), 0);
    assert_int_equal(p2_release("rcb:4", id, t[1]), 0);
    hget("rcb:5", "o", o, sizeof o);
    assert_string_equal(o, Z);
    assert_int_equal(ctl(out, sizeof out, "show rcb:5"), 0); /* still held */
    assert_int_equal(ctl(out, sizeof out, "release --client %s --force", id), 1);
    assert_non_null(strstr(out, "holds no lock"));
    dlock_client_close(a);
}

/* Data of protocol 3, which this release does not speak, on a name of
 * either protocol: show and release NAME refuse it (exit 1), naming the
 * protocols dlockctl speaks; list and release --client pass it by with a
 * warning, and still find and release the client's name of protocol 2;
 * nothing of the refused names changes. */
static void test_protocol_3_refused(void **state)
{
    (void)state;
    dlock_client *a = open_named("lib-3");
    const char *id = dlock_client_id(a);
    assert_int_equal(dlock_acquire(a, "pv3:lib", 0, NULL), DLOCK_OK);
    assert_true(p2_acquire("pv3:p2", id, "lib-3", 1) > 0);
    assert_int_equal(p2_acquire("pv3:p2", Y, "p2-waiter", 1), 0);
    long long t = p2_acquire("pv3:ok", id, "lib-3", 0);
    assert_true(t > 0);
    freeReplyObject(fx_cmd_at(fx_server.port, "HSET " PREFIX "{pv3:lib} pv 3"));
    freeReplyObject(fx_cmd_at(fx_server.port, "HSET " PREFIX "{pv3:p2} pv 3"));
    const char *names[] = {"pv3:lib", "pv3:p2"};
    char before[2][2048], after[2048], out[8192], speaks[40];
    if (DLOCK_PROTOCOL_MIN == DLOCK_PROTOCOL_MAX) /* a build of one protocol */
        snprintf(speaks, sizeof speaks, "protocol %d", DLOCK_PROTOCOL_MIN);
    else
        snprintf(speaks, sizeof speaks, "protocols %d and %d", DLOCK_PROTOCOL_MIN,
                 DLOCK_PROTOCOL_MAX);
    for (int i = 0; i < 2; i++)
        data_of(names[i], id, before[i], sizeof before[i]);
    for (int i = 0; i < 2; i++) {
        const char *cmds[] = {"show %s", "--json show %s", "release %s --force",
                              "--json release %s --force"};
        for (int j = 0; j < 4; j++) {
            char args[200];
            snprintf(args, sizeof args, cmds[j], names[i]);
            assert_int_equal(ctl_err(out, sizeof out, "%s", args), 1);
            fprintf(stderr, "%s: %s", args, out);
            char want[300];
            snprintf(want, sizeof want, "dlockctl: " PREFIX "{%s}: the data of this name is "
                     "dlock protocol 3; this dlockctl speaks %s: use the "
                     "dlockctl of the release that wrote it\n", names[i], speaks);
            assert_non_null(strstr(out, want));
        }
    }
    assert_int_equal(ctl_err(out, sizeof out, "list 'pv3:*'"), 0);
    fprintf(stderr, "list: %s", out);
    assert_int_equal(count_of(out, "the data of this name is dlock protocol 3"), 2);
    assert_non_null(strstr(out, "pv3:ok "));
    assert_int_equal(ctl_err(out, sizeof out, "release --client %s --force", id), 0);
    fprintf(stderr, "release --client: %s", out);
    assert_int_equal(count_of(out, "the data of this name is dlock protocol 3"), 2);
    assert_non_null(strstr(out, "pv3:ok released by force"));
    assert_non_null(strstr(out, "1 of the 1 locks client"));
    assert_int_equal(p2_release("pv3:ok", id, t), 0); /* taken */
    for (int i = 0; i < 2; i++) {
        data_of(names[i], id, after, sizeof after);
        assert_string_equal(before[i], after);
    }
    assert_int_equal(dlock_release(a, "pv3:lib"), DLOCK_ESERVER);
    dlock_client_close(a);
}

/* A name whose data changes protocol between dlockctl's read and its
 * forced release (a pause of 1.5 s there, DLOCKCTL_TEST_FORCE_PAUSE_MS):
 * read as protocol 2's, its hash gone (as when its keys expire) and the
 * name then taken by a client of protocol 1. Protocol 2's forced release
 * refuses protocol 1's data: nothing released, "look again", and the new
 * holder keeps it. */
static void test_protocol_changes_before_force(void **state)
{
    (void)state;
    assert_true(p2_acquire("chg", X, "p2-holder", 0) > 0);
    char command[600], out[4096];
    snprintf(command, sizeof command, "DLOCKCTL_TEST_FORCE_PAUSE_MS=1500 %s -h 127.0.0.1:%d "
             "--prefix " PREFIX " release chg --force 2>&1", DLOCKCTL_PATH, fx_server.port);
    FILE *f = popen(command, "r");
    assert_non_null(f);
    fx_sleep_ms(500); /* it has read the lock (0.5 s is plenty on loopback) and now pauses */
    freeReplyObject(fx_cmd_at(fx_server.port, "DEL " PREFIX "{chg}"));
    dlock_client *a = open_named("lib-chg");
    assert_int_equal(dlock_acquire(a, "chg", 0, NULL), DLOCK_OK);
    size_t got = fread(out, 1, sizeof out - 1, f);
    out[got] = '\0';
    int st = pclose(f);
    fprintf(stderr, "release chg --force: %s", out);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    assert_non_null(strstr(out, "chg changed hands meanwhile: nothing released; look again"));
    assert_null(strstr(out, "dlock protocol 1"));
    assert_int_equal(dlock_held(a, "chg"), 1);
    assert_int_equal(dlock_release(a, "chg"), DLOCK_OK);
    dlock_client_close(a);
}

/* A client waiting for a permit of a semaphore, on a thread of its own:
 * takes one (limit 2, up to 30 s) and gives it back. */
typedef struct sem_waiter {
    dlock_client *c;
    const char *name;
    int rc, release_rc;
} sem_waiter;

static void *sem_wait_main(void *arg)
{
    sem_waiter *w = arg;
    w->rc = dlock_sem_acquire(w->c, w->name, 2, 30000);
    if (w->rc == DLOCK_OK)
        w->release_rc = dlock_sem_release(w->c, w->name);
    return NULL;
}

/* A counting semaphore (lua/p2/SEM.txt) with limit 2, a permit held by
 * each of two clients of the library and a third client queued for one,
 * beside a lock: show names its kind, limit, permits in use, each holder
 * with its permits and lease left, and the waiter with the permits it
 * wants (text and JSON; watch too); list shows it with its permits in use
 * of the limit among the locks; release --force leaves its permits alone
 * (exit 1). Once its permits are given back, show says it is a free
 * semaphore (exit 1) and list leaves it out. */
static void test_semaphore(void **state)
{
    (void)state;
    dlock_client *a = open_named("sem-a"), *b = open_named("sem-b"), *w = open_named("sem-w");
    const char *ida = dlock_client_id(a), *idb = dlock_client_id(b), *idw = dlock_client_id(w);
    assert_int_equal(dlock_sem_acquire(a, "sm:pool", 2, 0), DLOCK_OK);
    assert_int_equal(dlock_sem_acquire(b, "sm:pool", 2, 0), DLOCK_OK);
    assert_int_equal(dlock_acquire(a, "sm:lock", 0, NULL), DLOCK_OK);
    sem_waiter sw = {w, "sm:pool", -1, -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, sem_wait_main, &sw), 0);
    long long queued = 0;
    for (int i = 0; i < 2000 && queued < 1; i++) { /* w queued in Redis (20 s at most) */
        redisReply *r = fx_cmd_at(fx_server.port, "ZCARD " PREFIX "{sm:pool}:q");
        queued = r->integer;
        freeReplyObject(r);
        if (queued < 1)
            fx_sleep_ms(10);
    }
    assert_int_equal(queued, 1);
    char out[8192], s[256];

    assert_int_equal(ctl(out, sizeof out, "show sm:pool"), 0);
    fprintf(stderr, "show: %s", out);
    assert_non_null(strstr(out, "sm:pool: 2 of 2 permits in use, by 2 clients\n"));
    snprintf(s, sizeof s, "  held by client id %s, 1 permit, ", ida);
    assert_non_null(strstr(out, s));
    snprintf(s, sizeof s, "  held by client id %s, 1 permit, ", idb);
    assert_non_null(strstr(out, s));
    assert_int_equal(count_of(out, " of lease left\n"), 2);
    assert_non_null(strstr(out, "  kind: semaphore\n  limit: 2\n  permits in use: 2\n"
                                "  protocol: 2\n  1 waiting\n"));
    snprintf(s, sizeof s, "   1. sem-w (%.8s) waiting ", idw);
    assert_non_null(strstr(out, s));
    assert_non_null(strstr(out, " for 1 permit, alive\n"));

    assert_int_equal(ctl(out, sizeof out, "--json show sm:pool"), 0);
    fprintf(stderr, "show --json: %s", out);
    assert_non_null(strstr(out, "{\"name\":\"sm:pool\",\"protocol\":2,\"kind\":\"semaphore\","
                                "\"held\":true,\"limit\":2,\"permits\":2,\"holding\":2,"
                                "\"holders\":[{\"client\":\""));
    snprintf(s, sizeof s, "{\"client\":\"%s\",\"name\":\"\",\"permits\":1,\"remaining_ms\":",
             ida);
    assert_non_null(strstr(out, s));
    snprintf(s, sizeof s, "{\"client\":\"%s\",\"name\":\"\",\"permits\":1,\"remaining_ms\":",
             idb);
    assert_non_null(strstr(out, s));
    snprintf(s, sizeof s, "],\"waiting\":1,\"queue\":[{\"client\":\"%s\",\"name\":\"sem-w\","
             "\"permits\":1,\"waiting_ms\":", idw);
    assert_non_null(strstr(out, s));
    assert_non_null(strstr(out, "\"alive\":true}]}"));
    assert_null(strstr(out, "\"turn\""));

    assert_int_equal(ctl(out, sizeof out, "--count 2 --interval 50 watch sm:pool"), 0);
    assert_int_equal(count_of(out, "2 of 2 permits in use"), 2);

    /* list: the semaphore among the locks, once */
    assert_int_equal(ctl(out, sizeof out, "list 'sm:*'"), 0);
    fprintf(stderr, "list: %s", out);
    const char *pl = strstr(out, "sm:lock "), *pp = strstr(out, "sm:pool ");
    assert_true(pl && pp && pl < pp);
    assert_int_equal(count_of(out, "sm:pool "), 1);
    assert_non_null(strstr(pp, "semaphore: 2 of 2 permits, 2 clients"));
    assert_non_null(strstr(pl, "sem-a ("));
    assert_int_equal(ctl(out, sizeof out, "--json list 'sm:*'"), 0);
    fprintf(stderr, "list --json: %s", out);
    assert_int_equal(count_of(out, "\"name\":"), 2);
    const char *jl = strstr(out, "{\"name\":\"sm:lock\",\"protocol\":");
    assert_non_null(jl); /* (the lock's protocol: the clients' setting) */
    assert_non_null(strstr(jl, ",\"kind\":\"lock\",\"held\":true,"));
    assert_non_null(strstr(out, "{\"name\":\"sm:pool\",\"protocol\":2,\"kind\":\"semaphore\","
                                "\"held\":true,\"limit\":2,\"permits\":2,\"holding\":2,"
                                "\"waiting\":1}"));

    /* release --force: refused, the permits left as they were */
    assert_int_equal(ctl(out, sizeof out, "release sm:pool --force"), 1);
    fprintf(stderr, "release --force: %s", out);
    assert_non_null(strstr(out, "sm:pool is a semaphore (2 of 2 permits in use): release "
                                "--force takes a lock's grants only"));
    assert_int_equal(ctl(out, sizeof out, "--json release sm:pool --force"), 1);
    assert_non_null(strstr(out, "{\"name\":\"sm:pool\",\"released\":false,"
                                "\"reason\":\"a semaphore\"}"));
    assert_int_equal(ctl(out, sizeof out, "--json show sm:pool"), 0);
    assert_non_null(strstr(out, "\"permits\":2,\"holding\":2,"));

    /* a's permit goes to w, which gives it back; then b's: free */
    assert_int_equal(dlock_sem_release(a, "sm:pool"), DLOCK_OK);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(sw.rc, DLOCK_OK);
    assert_int_equal(sw.release_rc, DLOCK_OK);
    assert_int_equal(dlock_sem_release(b, "sm:pool"), DLOCK_OK);
    assert_int_equal(ctl(out, sizeof out, "show sm:pool"), 1);
    fprintf(stderr, "show, given back: %s", out);
    assert_non_null(strstr(out, "sm:pool: free\n  kind: semaphore\n  limit: 2\n"
                                "  permits in use: 0\n"));
    assert_int_equal(ctl(out, sizeof out, "--json show sm:pool"), 1);
    assert_non_null(strstr(out, "\"kind\":\"semaphore\",\"held\":false,\"limit\":2,"
                                "\"permits\":0,\"holding\":0,\"holders\":[],"));
    assert_int_equal(ctl(out, sizeof out, "list 'sm:*'"), 0);
    assert_null(strstr(out, "sm:pool"));
    assert_non_null(strstr(out, "sm:lock "));
    assert_int_equal(dlock_release(a, "sm:lock"), DLOCK_OK);
    dlock_client_close(w);
    dlock_client_close(b);
    dlock_client_close(a);
}

int main(void)
{
    /* the library's clients here write protocol 1 whatever a suite asks
     * (fx_config); protocol 2's data is made by its scripts above */
    unsetenv("DLOCK_TEST_PROTOCOL");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_p2_show_list),
        cmocka_unit_test(test_mixed_list),
        cmocka_unit_test(test_p2_shared),
        cmocka_unit_test(test_p2_release_force),
        cmocka_unit_test(test_release_client_both),
        cmocka_unit_test(test_protocol_3_refused),
        cmocka_unit_test(test_protocol_changes_before_force),
        cmocka_unit_test(test_semaphore),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
