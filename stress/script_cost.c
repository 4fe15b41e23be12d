/*
 * script_cost: what one uncontended acquire and one release cost inside
 * Redis, beside the simplest lock's SET NX PX and compare-and-delete, with
 * nothing else running against the server.
 *
 * One client id takes L names (pipelined, B calls per write) and releases
 * them, R rounds, so that the keys are warm as in a running server (the
 * names' fence keys and the client's records exist after the first round).
 * Per operation it reads from the server's INFO, around each phase:
 *   - commands run inside the call (every command's calls in commandstats,
 *     less the top-level call itself and the tool's INFO);
 *   - the call's own time in commandstats (usec of EVALSHA, or SET and
 *     EVAL): the script's run, inner commands included;
 *   - the server's CPU (used_cpu_user + used_cpu_sys) per operation: the
 *     call plus reading, parsing and answering it, with B calls per read.
 * Single-threaded and alone on the server, so the times are CPU times (an
 * INFO usec figure is wall time: under a storm that shares the cores with
 * Redis it also counts the server's preemptions).
 *
 * With --parts it then measures, the same way, each piece that scripts are
 * made of alone in a script (run_parts): the pieces of protocol 1's
 * scripts, on protocol 1's layout, whatever --protocol says.
 *
 * With --also ACQ REL it runs two other scripts (Lua files taking the same
 * keys, arguments and replies as lua/acquire.lua and lua/release.lua, on
 * names of their own, prefix "sk:") round by round beside dlock's and the
 * naive lock, and prints their rows and their ratio to dlock's: the cost
 * of a change to the scripts, measured in one run before it is made
 * (lua/p2/, protocol 2's scripts, is such a pair). Then, for each, what
 * the released names keep in Redis: keys and bytes (used_memory) per name.
 *
 * "dlock" is the scripts of the protocol the library writes by default
 * (protocol 2: lua/p2/), or of --protocol's.
 *
 * Starts a private redis-server on a free loopback port unless --redis is
 * given (then it uses db 0 of that server and deletes its keys after).
 */
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "conn/script.h"
#include "common/slot.h"

#define ID "0123456789abcdef0123456789abcdef"

static redisContext *rc;

static void die(const char *what)
{
    fprintf(stderr, "script_cost: %s%s%s\n", what, rc && rc->err ? ": " : "",
            rc && rc->err ? rc->errstr : "");
    exit(2);
}

/* SCRIPT LOAD of body into sha; dies, naming what, on failure. */
static void load(const char *body, char sha[41], const char *what)
{
    redisReply *r = redisCommand(rc, "SCRIPT LOAD %s", body);
    if (!r || r->type != REDIS_REPLY_STRING || r->len != 40) {
        fprintf(stderr, "script_cost: SCRIPT LOAD of %s: %s\n", what,
                r && r->type == REDIS_REPLY_ERROR ? r->str : "failed");
        exit(2);
    }
    memcpy(sha, r->str, 41);
    freeReplyObject(r);
}

/* One snapshot of the server's counters. */
typedef struct snap {
    long long calls;    /* every command's calls but INFO's */
    long long top;      /* calls of the top-level command(s) measured */
    long long top_usec; /* their usec */
    double cpu;         /* used_cpu_user + used_cpu_sys, s */
} snap;

static long long field_of(const char *text, const char *cmd, const char *field)
{
    char tag[64];
    snprintf(tag, sizeof tag, "\ncmdstat_%s:", cmd);
    const char *p = strstr(text, tag);
    if (!p)
        return 0;
    const char *f = strstr(p, field);
    const char *eol = strchr(p + 1, '\n');
    return f && (!eol || f < eol) ? strtoll(f + strlen(field), NULL, 10) : 0;
}

static snap take(const char *const *tops)
{
    snap s = {0};
    redisReply *r = redisCommand(rc, "INFO commandstats");
    if (!r || r->type != REDIS_REPLY_STRING)
        die("INFO commandstats");
    for (const char *p = r->str; (p = strstr(p, "\ncmdstat_")); p++) {
        if (!strncmp(p, "\ncmdstat_info:", 14))
            continue;
        const char *c = strstr(p, "calls=");
        if (c)
            s.calls += strtoll(c + 6, NULL, 10);
    }
    for (int i = 0; tops[i]; i++) {
        s.top += field_of(r->str, tops[i], "calls=");
        s.top_usec += field_of(r->str, tops[i], "usec=");
    }
    freeReplyObject(r);
    r = redisCommand(rc, "INFO cpu");
    if (!r || r->type != REDIS_REPLY_STRING)
        die("INFO cpu");
    const char *u = strstr(r->str, "used_cpu_user:"), *y = strstr(r->str, "used_cpu_sys:");
    if (!u || !y)
        die("INFO cpu has no used_cpu_user/used_cpu_sys");
    s.cpu = atof(u + 14) + atof(y + 13);
    freeReplyObject(r);
    return s;
}

/* Accumulated cost of one operation over the rounds. */
typedef struct cost {
    const char *what;
    long long ops, inner, usec;
    double cpu;
} cost;

static void add(cost *c, snap a, snap b, long long ops)
{
    c->ops += ops;
    /* the calls between the snapshots (INFO left out): the measured ones
     * and what ran inside them */
    c->inner += (b.calls - a.calls) - (b.top - a.top);
    c->usec += b.top_usec - a.top_usec;
    c->cpu += b.cpu - a.cpu;
}

static const char *prefix = "sc:"; /* the scripts' names: "sk:" for --also's */

static void keys_of(int i, char k[7][64])
{
    static const char *const suffix[6] = {"", ":fence", ":q", ":qd", ":turn", ":c:" ID};
    for (int j = 0; j < 6; j++)
        snprintf(k[j], 64, "%s{n%d}%s", prefix, i, suffix[j]);
    /* the high-water mark of the name's slot (lua/keys.lua, HW) */
    snprintf(k[6], 64, "%shw:{%s}", prefix, dlock_slot_tag(dlock_cluster_slot(k[0], strlen(k[0]))));
}

/* Sends calls [from, to) made by fill() B at a time, reading every reply
 * and checking it with ok(). */
static void run(int n, int batch, void (*fill)(int i), int (*ok)(int i, redisReply *r))
{
    for (int i = 0; i < n; i += batch) {
        int end = i + batch < n ? i + batch : n;
        for (int j = i; j < end; j++)
            fill(j);
        for (int j = i; j < end; j++) {
            redisReply *r;
            if (redisGetReply(rc, (void **)&r) != REDIS_OK)
                die("reply");
            if (!ok(j, r)) {
                fprintf(stderr, "script_cost: unexpected reply to call %d (%s)\n", j,
                        r->type == REDIS_REPLY_ERROR ? r->str : "wrong value");
                exit(1);
            }
            freeReplyObject(r);
        }
    }
}

static char sha_acquire[41], sha_release[41];
static char *cur_acquire = sha_acquire, *cur_release = sha_release; /* the pair running */
static long long *tokens;
static long long attempt;

static void fill_acquire(int i)
{
    char k[7][64], nonce[24];
    keys_of(i, k);
    snprintf(nonce, sizeof nonce, "%lld", ++attempt);
    const char *argv[18] = {"EVALSHA", cur_acquire, "7", k[0], k[1], k[2], k[3], k[4], k[5], k[6],
                            ID, "30000", nonce, "128", "2000", "1", "60000", "host:1"};
    redisAppendCommandArgv(rc, 18, argv, NULL);
}

static int ok_acquire(int i, redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 || r->element[0]->integer != 1)
        return 0;
    tokens[i] = r->element[1]->integer;
    return 1;
}

static void fill_release(int i)
{
    char k[7][64], tok[24], name[24];
    keys_of(i, k);
    snprintf(tok, sizeof tok, "%lld", tokens[i]);
    snprintf(name, sizeof name, "n%d", i);
    const char *argv[20] = {"EVALSHA", cur_release, "7", k[0], k[1], k[2], k[3], k[4], k[5], k[6],
                            ID, "token", tok, "30000", "0", "sc:wake:", name, "2000", "60000", "0"};
    redisAppendCommandArgv(rc, 20, argv, NULL);
}

static int ok_one(int i, redisReply *r)
{
    (void)i;
    return r->type == REDIS_REPLY_INTEGER && r->integer == 1;
}

static void fill_set(int i)
{
    redisAppendCommand(rc, "SET sc:naive:%d tok%d NX PX 30000", i, i);
}

static int ok_set(int i, redisReply *r)
{
    (void)i;
    return r->type == REDIS_REPLY_STATUS;
}

static void fill_cad(int i)
{
    redisAppendCommand(rc, "EVAL %s 1 sc:naive:%d tok%d",
                       "if redis.call('get', KEYS[1]) == ARGV[1] then "
                       "return redis.call('del', KEYS[1]) else return 0 end",
                       i, i);
}

/* --parts: the pieces scripts are made of, each alone in a script run
 * over the names as above, so that the cost of a design can be added up
 * before it is written. Each body runs with KEYS[1] a hash of nine fields
 * (the shape of a lease), KEYS[2] and KEYS[3] strings of 16 digits, and,
 * where it says so, the acquire's keys and arguments around it. */
typedef struct part {
    const char *what;
    const char *body;
    int nkeys; /* 0: the acquire's seven keys and ten arguments */
} part;

static const part parts[] = {
    {"empty script, 1 key", "return 1", 1},
    {"empty script, the acquire's 7 keys and 10 arguments", "return 1", 0},
    {"HMGET of 9 fields of a hash",
     "redis.call('HMGET', KEYS[1], 'owner', 'token', 'nonce', 'pl', 'exp', 'since', 'u', "
     "'name', 'pv') return 1",
     1},
    {"HSET of 8 fields (the hash exists)",
     "redis.call('HSET', KEYS[1], 'owner', '" ID "', 'token', '1764000000000001', "
     "'nonce', '17', 'pl', '128', 'since', '1764000000000', 'name', 'host:1', "
     "'exp', '1764000030000', 'pv', '1') return 1",
     1},
    {"TIME, made a number of us",
     "local t = redis.call('TIME') local us = tonumber(t[1]) * 1000000 + tonumber(t[2]) "
     "return 1",
     1},
    {"GET of a string", "redis.call('GET', KEYS[2]) return 1", 2},
    {"MGET of 2 strings", "redis.call('MGET', KEYS[2], KEYS[3]) return 1", 3},
    {"SET of a string", "redis.call('SET', KEYS[2], '1764000000000001') return 1", 2},
    {"SET of a string with PX",
     "redis.call('SET', KEYS[2], '1764000000000001', 'PX', 60000) return 1", 2},
    {"PEXPIRE of the hash", "redis.call('PEXPIRE', KEYS[1], 60000) return 1", 1},
    {"EXISTS of 2 missing keys", "redis.call('EXISTS', KEYS[2] .. 'x', KEYS[3] .. 'x') return 1",
     3},
    {"string.format('%.0f') of a token",
     "local s = string.format('%.0f', 1764000000000001 + #KEYS) return 1", 1},
};
#define NPARTS (sizeof parts / sizeof parts[0])

static char part_sha[41];
static const part *part_now;

static void fill_part(int i)
{
    char k[7][64];
    keys_of(i, k);
    if (part_now->nkeys == 0) {
        const char *argv[20] = {"EVALSHA", part_sha, "7", k[0], k[1], k[2], k[3], k[4], k[5], k[6],
                                ID, "30000", "17", "128", "2000", "1", "60000", "host:1",
                                "0", "0"};
        redisAppendCommandArgv(rc, 20, argv, NULL);
        return;
    }
    /* the hash is the lease key; the strings are the fence and the record */
    static const char *const nk[] = {"0", "1", "2", "3"};
    const char *argv[6] = {"EVALSHA", part_sha, nk[part_now->nkeys], k[0], k[1], k[5]};
    redisAppendCommandArgv(rc, 3 + part_now->nkeys, argv, NULL);
}

static int ok_part(int i, redisReply *r)
{
    (void)i;
    return r->type == REDIS_REPLY_INTEGER && r->integer == 1;
}

static long long used_memory(void)
{
    redisReply *r = redisCommand(rc, "INFO memory");
    if (!r || r->type != REDIS_REPLY_STRING)
        die("INFO memory");
    const char *m = strstr(r->str, "used_memory:");
    if (!m)
        die("INFO memory has no used_memory");
    long long v = atoll(m + 12);
    freeReplyObject(r);
    return v;
}

/* What the names of `pfx` keep in Redis once released (their slots' marks,
 * shared by the names of a slot, left out): keys per name, and bytes per
 * name as the server's used_memory falls when they are deleted (keys,
 * values, expiry entries and the allocator's rounding: what a user's
 * server holds). Deletes them. */
static void footprint(const char *pfx, int names, double *keys, double *bytes)
{
    const char *was = prefix;
    long long nk = 0;
    prefix = pfx;
    for (int i = 0; i < names; i++) {
        char k[7][64];
        keys_of(i, k);
        redisReply *r = redisCommand(rc, "EXISTS %s %s %s %s %s %s", k[0], k[1], k[2], k[3], k[4],
                                     k[5]);
        if (!r || r->type != REDIS_REPLY_INTEGER)
            die("EXISTS");
        nk += r->integer;
        freeReplyObject(r);
    }
    long long before = used_memory();
    for (int i = 0; i < names; i++) {
        char k[7][64];
        keys_of(i, k);
        freeReplyObject(redisCommand(rc, "DEL %s %s %s %s %s %s", k[0], k[1], k[2], k[3], k[4], k[5]));
    }
    long long after = used_memory();
    prefix = was;
    *keys = (double)nk / names;
    *bytes = (double)(before - after) / names;
}

static void print(const cost *c)
{
    printf("| %s | %.1f | %.2f | %.2f |\n", c->what, (double)c->inner / (double)c->ops,
           (double)c->usec / (double)c->ops, c->cpu * 1e6 / (double)c->ops);
}

static void setup_part_keys(int i)
{
    char k[7][64];
    keys_of(i, k);
    redisAppendCommand(rc, "HSET %s owner %s token 1764000000000001 nonce 17 pl 128 since "
                           "1764000000000 name host:1 exp 1764000030000 pv 1 u 0",
                       k[0], ID);
    redisAppendCommand(rc, "SET %s 1764000000000001 PX 600000", k[1]);
    redisAppendCommand(rc, "SET %s 1764000000000001 PX 600000", k[5]);
}

/* --parts: each piece alone, interleaved round by round so that a drift of
 * the machine's speed falls on every row alike. */
static void run_parts(int names, int rounds, int batch)
{
    for (int i = 0; i < names; i++) {
        setup_part_keys(i);
        for (int j = 0; j < 3; j++) {
            redisReply *r;
            if (redisGetReply(rc, (void **)&r) != REDIS_OK)
                die("setting up the parts' keys");
            freeReplyObject(r);
        }
    }
    char shas[NPARTS][41];
    for (size_t p = 0; p < NPARTS; p++)
        load(parts[p].body, shas[p], parts[p].what);
    static const char *const evalsha[] = {"evalsha", NULL};
    cost c[NPARTS];
    memset(c, 0, sizeof c);
    for (int round = 0; round < rounds; round++) {
        for (size_t p = 0; p < NPARTS; p++) {
            part_now = &parts[p];
            memcpy(part_sha, shas[p], 41);
            snap a = take(evalsha);
            run(names, batch, fill_part, ok_part);
            snap b = take(evalsha);
            if (round > 0)
                add(&c[p], a, b, names);
        }
    }
    printf("\nWhat scripts are made of: each piece alone in a script, run as above\n\n");
    printf("| piece | its own time us | over an empty script | server CPU us | over an empty "
           "script |\n");
    printf("|---|---:|---:|---:|---:|\n");
    double own0 = (double)c[0].usec / (double)c[0].ops, cpu0 = c[0].cpu * 1e6 / (double)c[0].ops;
    for (size_t p = 0; p < NPARTS; p++) {
        double own = (double)c[p].usec / (double)c[p].ops, cpu = c[p].cpu * 1e6 / (double)c[p].ops;
        if (p == 0)
            printf("| %s | %.2f | | %.2f | |\n", parts[p].what, own, cpu);
        else
            printf("| %s | %.2f | %+.2f | %.2f | %+.2f |\n", parts[p].what, own, own - own0, cpu,
                   cpu - cpu0);
    }
}

/* SCRIPT LOAD of a Lua file's text, for --also; dies on failure. */
static void load_file(const char *path, char sha[41])
{
    FILE *f = fopen(path, "r");
    static char body[1 << 16];
    size_t n = f ? fread(body, 1, sizeof body - 1, f) : 0;
    if (!f || n == 0 || n == sizeof body - 1 || ferror(f)) {
        fprintf(stderr, "script_cost: cannot read %s (or longer than %zu bytes)\n", path,
                sizeof body - 2);
        exit(2);
    }
    fclose(f);
    body[n] = '\0';
    load(body, sha, path);
}

int main(int argc, char **argv)
{
    int names = 1000, rounds = 40, batch = 50, with_parts = 0;
    int protocol = DLOCK_PROTOCOL_DEFAULT; /* whose scripts are "dlock" */
    const char *redis = NULL, *also[2] = {NULL, NULL};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--names") && i + 1 < argc)
            names = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--redis") && i + 1 < argc)
            redis = argv[++i];
        else if (!strcmp(argv[i], "--protocol") && i + 1 < argc)
            protocol = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--parts"))
            with_parts = 1;
        else if (!strcmp(argv[i], "--also") && i + 2 < argc) {
            also[0] = argv[++i];
            also[1] = argv[++i];
        }
        else {
            fprintf(stderr,
                    "usage: script_cost [--names L (1000)] [--rounds R (40)] [--batch B (50)]\n"
                    "                   [--redis HOST:PORT] [--parts] [--also ACQ.lua REL.lua]\n"
                    "                   [--protocol 1|2 (the library's default)]\n"
                    "What an uncontended acquire and a release cost inside Redis, beside the\n"
                    "simplest lock's SET NX PX and compare-and-delete (see the top of\n"
                    "stress/script_cost.c). Prints a Markdown table; with --parts a second\n"
                    "one: what each command and step scripts are made of costs inside one\n"
                    "(protocol 1's pieces, on its layout, whatever --protocol says);\n"
                    "with --also, the rows of two other scripts with the same keys, arguments\n"
                    "and replies, run beside dlock's in the same rounds.\n");
            return 2;
        }
    }
    if (names < 1 || names > 1000000 || rounds < 1 || rounds > 100000 || batch < 1 ||
        batch > 10000)
        die("--names 1..1000000, --rounds 1..100000, --batch 1..10000");
    if (protocol < DLOCK_PROTOCOL_LOWEST || protocol > DLOCK_PROTOCOL_HIGHEST)
        die("--protocol: 1 or 2");
    fx_redis server = {0};
    char host[256] = "127.0.0.1";
    int port;
    if (redis) {
        const char *colon = strrchr(redis, ':');
        if (!colon || (size_t)(colon - redis) >= sizeof host)
            die("--redis HOST:PORT");
        memcpy(host, redis, (size_t)(colon - redis));
        host[colon - redis] = '\0';
        port = atoi(colon + 1);
    } else {
        if (fx_redis_start(&server) != 0)
            die("could not start redis-server");
        port = server.port;
    }
    rc = redisConnect(host, port);
    if (!rc || rc->err)
        die("connect");
    tokens = calloc((size_t)names, sizeof *tokens);
    if (!tokens)
        die("out of memory");
    const dlock_script_id ids[2] = {dlock_script_in(DLOCK_SCRIPT_ACQUIRE, protocol),
                                    dlock_script_in(DLOCK_SCRIPT_RELEASE, protocol)};
    char *shas[2] = {sha_acquire, sha_release};
    for (int s = 0; s < 2; s++)
        load(dlock_script_body(ids[s]), shas[s], s ? "release.lua" : "acquire.lua");
    static char also_acquire[41], also_release[41];
    if (also[0]) {
        load_file(also[0], also_acquire);
        load_file(also[1], also_release);
    }
    static const char *const evalsha[] = {"evalsha", NULL};
    static const char *const set[] = {"set", NULL};
    static const char *const eval[] = {"eval", NULL};
    cost acq = {"dlock acquire (free name, nobody queued)", 0, 0, 0, 0};
    cost rel = {"dlock release (nobody queued)", 0, 0, 0, 0};
    cost nset = {"simplest lock: SET NX PX", 0, 0, 0, 0};
    cost ncad = {"simplest lock: EVAL compare-and-delete", 0, 0, 0, 0};
    cost aacq = {"--also acquire", 0, 0, 0, 0}, arel = {"--also release", 0, 0, 0, 0};
    for (int round = 0; round < rounds; round++) {
        snap a = take(evalsha);
        run(names, batch, fill_acquire, ok_acquire);
        snap b = take(evalsha);
        run(names, batch, fill_release, ok_one);
        snap c = take(evalsha);
        if (round > 0) { /* the first round creates the keys: warm-up */
            add(&acq, a, b, names);
            add(&rel, b, c, names);
        }
        if (also[0]) {
            cur_acquire = also_acquire, cur_release = also_release, prefix = "sk:";
            a = take(evalsha);
            run(names, batch, fill_acquire, ok_acquire);
            b = take(evalsha);
            run(names, batch, fill_release, ok_one);
            c = take(evalsha);
            cur_acquire = sha_acquire, cur_release = sha_release, prefix = "sc:";
            if (round > 0) {
                add(&aacq, a, b, names);
                add(&arel, b, c, names);
            }
        }
        a = take(set);
        run(names, batch, fill_set, ok_set);
        b = take(set);
        snap b2 = take(eval);
        run(names, batch, fill_cad, ok_one);
        c = take(eval);
        if (round > 0) {
            add(&nset, a, b, names);
            add(&ncad, b2, c, names);
        }
    }
    printf("dlock: protocol %d's scripts\n", protocol);
    printf("%d names, %d rounds (the first not counted), %d calls per write\n\n", names,
           rounds, batch);
    printf("| operation | commands inside | its own time us | server CPU us |\n");
    printf("|---|---:|---:|---:|\n");
    print(&acq);
    print(&rel);
    print(&nset);
    print(&ncad);
    double own = (double)(acq.usec + rel.usec) / (double)acq.ops;
    double cpu = (acq.cpu + rel.cpu) * 1e6 / (double)acq.ops;
    printf("| dlock acquire + release | | %.2f | %.2f |\n", own, cpu);
    double nown = (double)(nset.usec + ncad.usec) / (double)nset.ops;
    double ncpu = (nset.cpu + ncad.cpu) * 1e6 / (double)nset.ops;
    printf("| simplest lock SET + compare-and-delete | | %.2f | %.2f |\n", nown, ncpu);
    printf("| ratio, dlock / simplest lock | | %.2fx | %.2fx |\n", nown > 0 ? own / nown : 0.0,
           ncpu > 0 ? cpu / ncpu : 0.0);
    if (also[0]) {
        print(&aacq);
        print(&arel);
        double aown = (double)(aacq.usec + arel.usec) / (double)aacq.ops;
        double acpu = (aacq.cpu + arel.cpu) * 1e6 / (double)aacq.ops;
        printf("| --also acquire + release | | %.2f | %.2f |\n", aown, acpu);
        printf("| ratio, --also / simplest lock | | %.2fx | %.2fx |\n",
               nown > 0 ? aown / nown : 0.0, ncpu > 0 ? acpu / ncpu : 0.0);
        printf("| ratio, --also / dlock | | %.2fx | %.2fx |\n", own > 0 ? aown / own : 0.0,
               cpu > 0 ? acpu / cpu : 0.0);
    }
    double fk, fb;
    footprint("sc:", names, &fk, &fb);
    printf("\n| released names keep | keys per name | bytes per name |\n|---|---:|---:|\n");
    printf("| dlock | %.2f | %.0f |\n", fk, fb);
    if (also[0]) {
        footprint("sk:", names, &fk, &fb);
        printf("| --also | %.2f | %.0f |\n", fk, fb);
    }
    printf("| simplest lock | 0.00 | 0 |\n");
    if (with_parts)
        run_parts(names, rounds, batch);
    if (redis) {
        /* the tool's keys go: sc:* and sk:* */
        for (int i = 0; i < names; i++) {
            char k[7][64];
            keys_of(i, k);
            freeReplyObject(redisCommand(rc, "DEL %s %s %s %s sc:naive:%d", k[0], k[1], k[5], k[6], i));
            prefix = "sk:";
            keys_of(i, k);
            freeReplyObject(redisCommand(rc, "DEL %s %s %s %s", k[0], k[1], k[5], k[6]));
            prefix = "sc:";
        }
    }
    redisFree(rc);
    free(tokens);
    if (!redis)
        fx_redis_stop(&server);
    return 0;
}
