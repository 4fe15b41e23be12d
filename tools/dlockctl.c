/*
 * dlockctl: who holds a dlock lock, who waits for it, and a forced release,
 * for operators.
 *
 *   dlockctl [connection options] [--json] list [PATTERN]
 *   dlockctl [connection options] [--json] show NAME
 *   dlockctl [connection options] [--json] release NAME --force
 *   dlockctl [connection options] [--json] release --client ID --force
 *   dlockctl [connection options] [--json] watch NAME [--interval MS] [--count N]
 *
 * It connects as the library does (host and port, a Unix socket, an ACL user
 * and password, Sentinel, Cluster; the same key prefix) and reads the data
 * the library keeps per lock name (docs/design.md: How it works): the lease hash
 * <prefix>{<name>} (owner id, token, name of the owner's client, time of
 * the grant), its remaining time, the wait queue <prefix>{<name>}:q and the
 * waiters' liveness <prefix>{<name>}:qd. `list` walks the keys with SCAN
 * (never KEYS), on every master in Cluster mode.
 *
 * A forced release runs the library's own release script as the holder
 * (so the next live waiter is granted the lease and told, as after any
 * release) with a fence far enough ahead that no token the holder may have
 * handed to its threads is reached again, then tells the holder on its
 * channel ("f <token> <name>"): the holder checks with Redis at once, its
 * dlock_held() drops to 0, on_lost runs and its on_log callback says an
 * operator did it.
 *
 * Exit status: 0 done; 1 the name is not held (show, release) or Redis
 * failed; 2 bad usage.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "cluster.h"
#include "conn.h"
#include "dlock.h"
#include "error.h"
#include "script.h"
#include "sentinel.h"

static struct {
    char host[256];
    int port;
    const char *unix_path, *user, *password, *prefix, *cluster, *sentinels, *master;
    const char *sentinel_password;
    const char *client; /* release --client ID */
    int db, json, force;
    long interval_ms, count;
} O = {.host = "127.0.0.1", .port = 6379, .prefix = "dlock:", .interval_ms = 500, .count = -1};

static dlock_conn_cfg CFG;
static dlock_master MASTER;
static dlock_cluster *CL;
static dlock_counters CTR;

static void usage(FILE *f)
{
    fprintf(f,
"usage: dlockctl [options] COMMAND [ARGS]\n"
"Shows who holds dlock locks and who waits for them; releases one by force.\n"
"\n"
"commands:\n"
"  list [PATTERN]        held locks whose name matches PATTERN (a glob, default *):\n"
"                        name, holder (client name and id), token, remaining\n"
"                        lease, held for, waiting clients\n"
"  show NAME             one lock: its holder and its wait queue (each waiter's\n"
"                        client, name, time in the queue, alive or not)\n"
"  release NAME --force  removes the lease now, tells the holder at once (its\n"
"                        dlock_held() drops to 0, on_lost runs, its log says so)\n"
"                        and hands the lock to the next live waiter, which is told\n"
"                        (dlock_unclean: DLOCK_UNCLEAN_FORCED)\n"
"  release --client ID --force\n"
"                        the same for every lock the client ID holds (a dead\n"
"                        process's: its id is in list's HOLDER column and in\n"
"                        dlock_client_id())\n"
"  watch NAME            shows NAME again every --interval MS (default 500) until\n"
"                        interrupted, or --count N times\n"
"  doctor                checks the server (every master of a cluster) against\n"
"                        what dlock needs: version, eviction policy, role,\n"
"                        persistence, replicas; says what to change\n"
"\n"
"Each lock is read in one step (a script: a consistent snapshot); a waiter is\n"
"alive by the server's clock; names are printed with control characters\n"
"escaped (\\xNN); list is sorted by name.\n"
"\n"
"connection (as the library's dlock_config):\n"
"  -h, --host HOST:PORT   the server (default 127.0.0.1:6379)\n"
"  -s, --socket PATH      a Unix socket instead\n"
"      --cluster LIST     Redis Cluster seed nodes \"host:port,...\"\n"
"      --sentinels LIST   Sentinel mode: the sentinels \"host:port,...\", with\n"
"      --master NAME      the master's name (and --sentinel-password PW)\n"
"  -u, --user USER        an ACL user (with --password)\n"
"  -a, --password PW      AUTH password (or the DLOCK_PASSWORD environment variable)\n"
"  -n, --db N             the database (default 0)\n"
"  -p, --prefix PREFIX    the key_prefix of the clients (default dlock:)\n"
"      --json             JSON instead of text (list: an array; show, release: an\n"
"                         object; watch: one object per line)\n"
"      --help             this text\n"
"      --version          dlockctl's version (the library's) and protocol\n"
"Exit status: 0 done; 1 not held (show, release), nothing released (release\n"
"--client), something to change (doctor), or a Redis failure; 2 bad usage.\n");
}

static void die_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "dlockctl: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (dlockctl --help)\n");
    exit(2);
}

static void die(const char *what)
{
    fprintf(stderr, "dlockctl: %s: %s\n", what, dlock_last_error());
    exit(1);
}

/* ------------------------------------------------------------------ */
/* Connections                                                          */

/* A pooled connection to node n (Cluster mode). */
static redisContext *conn_for_node(dlock_cluster_node *n)
{
    redisContext *c;
    if (dlock_pool_get(n->pool, DLOCK_NEVER, &c) != DLOCK_OK)
        die("connect");
    return c;
}

static redisContext *single_conn;

/* A connection to the server that serves key: in Cluster mode its slot's
 * master (*node set: give it back with conn_done), else the one server. */
static redisContext *conn_for(const char *key, dlock_cluster_node **node)
{
    *node = NULL;
    if (CL) {
        unsigned slot = dlock_cluster_slot(key, strlen(key));
        *node = dlock_cluster_route(CL, slot, DLOCK_NEVER);
        if (!*node)
            die("cluster");
        return conn_for_node(*node);
    }
    if (!single_conn && dlock_conn_open(&CFG, &CTR, &single_conn) != DLOCK_OK)
        die("connect");
    return single_conn;
}

static void conn_done(redisContext *c, dlock_cluster_node *node)
{
    if (node)
        dlock_pool_put(node->pool, c, c->err != 0);
    else if (c->err) {
        fprintf(stderr, "dlockctl: redis: %s\n", c->errstr);
        exit(1);
    }
}

static const char *esc(const char *s, char *out, size_t n);

/* If r is a script's refusal of another protocol's data (READ_LUA,
 * FORCE_HEAD: lua/acquire.lua, "Protocol"), says so on stderr and returns
 * 1; else 0. */
static int refused_protocol(const redisReply *r)
{
    if (!dlock_conn_is_other_protocol(r))
        return 0;
    char e[4 * (DLOCK_NAME_MAX + DLOCK_PREFIX_MAX) + 512];
    fprintf(stderr, "dlockctl: %s: use the dlockctl of the release that wrote it\n",
            esc(r->str + strlen("DLOCKPROTOCOL "), e, sizeof e));
    return 1;
}

static redisReply *cmd(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (!r) {
        fprintf(stderr, "dlockctl: redis: %s\n", c->errstr);
        exit(1);
    }
    if (r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "dlockctl: redis: %s\n", r->str);
        exit(1);
    }
    return r;
}

static void setup(void)
{
    CFG.host = O.unix_path || O.sentinels || O.cluster ? NULL : O.host;
    CFG.port = O.port;
    CFG.unix_path = (char *)O.unix_path;
    CFG.username = (char *)O.user;
    CFG.password = (char *)O.password;
    CFG.db = O.db;
    CFG.connect_timeout_ms = 1000;
    CFG.command_timeout_ms = 2000;
    CFG.client_name = "dlockctl";
    dlock_master_init(&MASTER);
    CFG.master = &MASTER;
    if (O.sentinels) {
        if (!O.master)
            die_usage("%s", "--sentinels needs --master");
        if (dlock_addrs_parse(O.sentinels, "--sentinels", &CFG.sentinels, &CFG.nsentinels) !=
            DLOCK_OK)
            die("--sentinels");
        CFG.sentinel_master = (char *)O.master;
        CFG.sentinel_password = (char *)O.sentinel_password;
        CFG.route = &dlock_sentinel_route;
    }
    if (O.cluster) {
        if (dlock_cluster_create(&CFG, O.cluster, 1, 0, &CTR, &CL) != DLOCK_OK)
            die("--cluster");
        if (dlock_cluster_refresh(CL, 1, DLOCK_NEVER) != DLOCK_OK)
            die("cluster map");
    }
}

/* ------------------------------------------------------------------ */
/* Reading a lock                                                       */

/* A waiting client, as the read script saw it. */
typedef struct waiter {
    char id[64], name[DLOCK_CLIENT_NAME_MAX + 1];
    long long waited_ms;
    int alive; /* the server's verdict: its liveness deadline is ahead of server time */
} waiter;

typedef struct lockinfo {
    int held;
    char owner[64], holder[DLOCK_CLIENT_NAME_MAX + 1];
    char token[32];
    char turn[64];             /* the client whose turn it is, "" if none */
    long long remaining_ms, held_for_ms, since_ms, now_ms;
    long long waiting;
    waiter *queue;             /* the wait queue in order (free with lock_free) */
} lockinfo;

static void key_of(char *out, size_t n, const char *name, const char *suffix)
{
    snprintf(out, n, "%s{%s}%s", O.prefix, name, suffix);
}

/* One lock read in one step (a script runs alone: a consistent snapshot),
 * with the server's clock: the lease, its time left, the turn, and the
 * queue with each waiter's liveness value and the server's verdict on it.
 * Data of another protocol is refused, not misread (lua/acquire.lua,
 * "Protocol"). */
static const char READ_LUA[] =
    "local l = redis.call('HMGET', KEYS[1], 'owner', 'token', 'name', 'since', 'exp', 'pv')\n"
    "if l[6] and l[6] ~= '1' then\n"
    "  return redis.error_reply('DLOCKPROTOCOL ' .. KEYS[1] .. ': the data of this name is '\n"
    "    .. 'dlock protocol ' .. l[6] .. '; this dlockctl speaks protocol 1')\n"
    "end\n"
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local out = {now, l[1], l[2], l[3], l[4], l[5], redis.call('PTTL', KEYS[1]),\n"
    "  redis.call('GET', KEYS[4])}\n"
    "local q = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')\n"
    "for i = 1, #q, 2 do\n"
    "  local d = redis.call('HGET', KEYS[3], q[i]) or ''\n"
    "  local deadline = tonumber(string.match(d, '^%d+')) or 0\n"
    "  out[#out + 1] = q[i]\n"
    "  out[#out + 1] = q[i + 1]\n"
    "  out[#out + 1] = d\n"
    "  out[#out + 1] = deadline > now and 1 or 0\n"
    "end\n"
    "return out\n";

static const char *str_or(const redisReply *r, const char *dflt)
{
    return r->type == REDIS_REPLY_STRING ? r->str : dflt;
}

static void lock_free(lockinfo *li)
{
    free(li->queue);
    li->queue = NULL;
}

/* Reads lock `name` into li. Returns 0, or 1 if its data is another
 * protocol's: refused (said on stderr), li then holds nothing. */
static int read_lock(redisContext *c, const char *name, lockinfo *li)
{
    char k[4][DLOCK_NAME_MAX + 128];
    memset(li, 0, sizeof *li);
    key_of(k[0], sizeof k[0], name, "");
    key_of(k[1], sizeof k[1], name, ":q");
    key_of(k[2], sizeof k[2], name, ":qd");
    key_of(k[3], sizeof k[3], name, ":turn");
    redisReply *r = redisCommand(c, "EVAL %s 4 %s %s %s %s", READ_LUA, k[0], k[1], k[2], k[3]);
    if (!r) {
        fprintf(stderr, "dlockctl: redis: %s\n", c->errstr);
        exit(1);
    }
    if (refused_protocol(r)) {
        freeReplyObject(r);
        li->remaining_ms = li->held_for_ms = -1;
        return 1;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "dlockctl: redis: %s\n", r->str);
        exit(1);
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 8) {
        fprintf(stderr, "dlockctl: redis: unexpected reply reading %s\n", name);
        exit(1);
    }
    redisReply **e = r->element;
    li->now_ms = e[0]->integer;
    /* A grant past its exp (server ms) has expired: its key stays a lease
     * time longer, as a fence, but nobody holds the name. */
    long long exp = e[5]->type == REDIS_REPLY_STRING ? atoll(e[5]->str) : -1;
    if (e[1]->type == REDIS_REPLY_STRING && (exp < 0 || exp >= li->now_ms)) {
        li->held = 1;
        snprintf(li->owner, sizeof li->owner, "%s", e[1]->str);
        snprintf(li->token, sizeof li->token, "%s", str_or(e[2], ""));
        snprintf(li->holder, sizeof li->holder, "%s", str_or(e[3], ""));
        li->since_ms = e[4]->type == REDIS_REPLY_STRING ? atoll(e[4]->str) : 0;
        li->held_for_ms = li->since_ms ? li->now_ms - li->since_ms : -1;
        li->remaining_ms = exp >= 0 ? exp - li->now_ms : e[6]->integer;
    } else {
        li->remaining_ms = li->held_for_ms = -1;
    }
    snprintf(li->turn, sizeof li->turn, "%s", str_or(e[7], ""));
    size_t n = (r->elements - 8) / 4;
    li->waiting = (long long)n;
    li->queue = calloc(n ? n : 1, sizeof *li->queue);
    if (!li->queue)
        die("out of memory");
    for (size_t i = 0; i < n; i++) {
        redisReply **w = e + 8 + 4 * i;
        waiter *x = &li->queue[i];
        snprintf(x->id, sizeof x->id, "%s", str_or(w[0], ""));
        x->waited_ms = li->now_ms - atoll(str_or(w[1], "0")) / 1000;
        /* "<deadline> <attempt> <pass limit> <ttl> <name>" */
        const char *p = str_or(w[2], "");
        for (int f = 0; f < 4 && p; f++) {
            p = strchr(p, ' ');
            if (p)
                p++;
        }
        snprintf(x->name, sizeof x->name, "%s", p ? p : "");
        x->alive = w[3]->type == REDIS_REPLY_INTEGER && w[3]->integer == 1;
    }
    freeReplyObject(r);
    return 0;
}

/* s for a terminal: control characters, backslashes and bytes above 126
 * escaped (\n, \xNN), so that a name cannot move the cursor or forge a
 * line. Into out (n bytes; cut short if it does not fit). */
static const char *esc(const char *s, char *out, size_t n)
{
    size_t k = 0;
    for (; *s && k + 5 < n; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '\\') {
            out[k++] = '\\';
            out[k++] = '\\';
        } else if (ch < 0x20 || ch > 0x7e) {
            k += (size_t)snprintf(out + k, n - k, "\\x%02x", ch);
        } else {
            out[k++] = (char)ch;
        }
    }
    out[k] = '\0';
    return out;
}

/* s as a JSON string (quotes and escapes). */
static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20 || ch > 0x7e)
            printf("\\u%04x", ch); /* (a byte above 126 as the code point of that value:
                                      the output stays valid JSON, UTF-8 or not) */
        else
            putchar(ch);
    }
    putchar('"');
}

/* The lock as a JSON object; left open (no closing brace) with `open`. */
static void print_lock_json(const char *name, const lockinfo *li, int open)
{
    printf("{\"name\":");
    json_str(name);
    printf(",\"held\":%s", li->held ? "true" : "false");
    if (li->held) {
        printf(",\"owner\":");
        json_str(li->owner);
        printf(",\"holder_name\":");
        json_str(li->holder);
        printf(",\"token\":%s,\"remaining_ms\":%lld,\"held_for_ms\":%lld", li->token[0] ? li->token : "null",
               li->remaining_ms, li->held_for_ms);
    }
    printf(",\"waiting\":%lld%s", li->waiting, open ? "" : "}");
}

static void fmt_ms(char *out, size_t n, long long ms)
{
    if (ms < 0)
        snprintf(out, n, "-");
    else if (ms < 10000)
        snprintf(out, n, "%lld ms", ms);
    else if (ms < 600000)
        snprintf(out, n, "%.1f s", ms / 1e3);
    else
        snprintf(out, n, "%.1f min", ms / 6e4);
}

static void print_row(const char *name, const lockinfo *li)
{
    char rem[32], held[32], who[4 * DLOCK_CLIENT_NAME_MAX + 20], e1[4 * DLOCK_NAME_MAX + 8],
        e2[4 * DLOCK_CLIENT_NAME_MAX + 8];
    fmt_ms(rem, sizeof rem, li->remaining_ms);
    fmt_ms(held, sizeof held, li->held_for_ms);
    snprintf(who, sizeof who, "%s (%.8s)", li->holder[0] ? esc(li->holder, e2, sizeof e2) : "?",
             li->owner);
    printf("%-30s %-40s %-18s %10s %10s %7lld\n", esc(name, e1, sizeof e1), who, li->token, rem,
           held, li->waiting);
}

static void print_header(void)
{
    printf("%-30s %-40s %-18s %10s %10s %7s\n", "NAME", "HOLDER (ID)", "TOKEN", "REMAINING",
           "HELD FOR", "WAITING");
}

/* ------------------------------------------------------------------ */
/* Commands                                                             */

/* The SCAN pattern for the lease keys of names matching pattern: the
 * prefix with glob characters escaped, then {pattern}. */
static void scan_pattern(char *out, size_t n, const char *pattern)
{
    size_t k = 0;
    for (const char *p = O.prefix; *p && k + 3 < n; p++) {
        if (strchr("*?[]\\", *p))
            out[k++] = '\\';
        out[k++] = *p;
    }
    snprintf(out + k, n - k, "{%s}", pattern);
}

/* Calls fn for every held lock of c whose name matches pattern. */
static void scan_locks(redisContext *c, const char *pattern,
                       void (*fn)(const char *name, const lockinfo *li, void *arg), void *arg)
{
    char match[DLOCK_NAME_MAX + 256];
    scan_pattern(match, sizeof match, pattern);
    size_t plen = strlen(O.prefix);
    char cursor[32] = "0";
    do {
        /* (no TYPE filter: Redis 5 has none; the key's shape selects) */
        redisReply *r = cmd(c, "SCAN %s MATCH %s COUNT 1000", cursor, match);
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        redisReply *keys = r->element[1];
        for (size_t i = 0; i < keys->elements; i++) {
            const char *key = keys->element[i]->str;
            size_t klen = strlen(key);
            /* exactly <prefix>{<name>}: not a :qd hash, nor another prefix */
            if (klen < plen + 2 || strncmp(key, O.prefix, plen) != 0 || key[plen] != '{' ||
                key[klen - 1] != '}')
                continue;
            char name[DLOCK_NAME_MAX + 1];
            snprintf(name, sizeof name, "%.*s", (int)(klen - plen - 2), key + plen + 1);
            lockinfo li;
            read_lock(c, name, &li);
            if (li.held)
                fn(name, &li, arg); /* (else released since the scan saw it) */
            lock_free(&li);
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
}

/* scan_locks on every master (Cluster mode) or on the server. */
static void scan_all(const char *pattern,
                     void (*fn)(const char *name, const lockinfo *li, void *arg), void *arg)
{
    if (CL) {
        dlock_cluster_node *m[DLOCK_CLUSTER_NODES_MAX];
        unsigned n = dlock_cluster_masters(CL, m, DLOCK_CLUSTER_NODES_MAX);
        for (unsigned i = 0; i < n; i++) {
            redisContext *c = conn_for_node(m[i]);
            scan_locks(c, pattern, fn, arg);
            dlock_pool_put(m[i]->pool, c, c->err != 0);
        }
    } else {
        dlock_cluster_node *node;
        redisContext *c = conn_for("", &node);
        scan_locks(c, pattern, fn, arg);
    }
}

/* The held locks list gathers, to print them sorted by name. */
typedef struct listed {
    char name[DLOCK_NAME_MAX + 1];
    lockinfo li; /* (its queue freed) */
} listed;

typedef struct list_acc {
    listed *v;
    size_t n, cap;
} list_acc;

static void list_one(const char *name, const lockinfo *li, void *arg)
{
    list_acc *a = arg;
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 64;
        listed *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            die("out of memory");
        a->v = v;
        a->cap = cap;
    }
    snprintf(a->v[a->n].name, sizeof a->v[0].name, "%s", name);
    a->v[a->n].li = *li;
    a->v[a->n].li.queue = NULL; /* the caller frees it */
    a->n++;
}

static int by_name(const void *x, const void *y)
{
    return strcmp(((const listed *)x)->name, ((const listed *)y)->name);
}

static int cmd_list(const char *pattern)
{
    list_acc a = {NULL, 0, 0};
    scan_all(pattern, list_one, &a);
    if (a.n)
        qsort(a.v, a.n, sizeof *a.v, by_name);
    if (O.json)
        printf("[");
    else
        print_header();
    for (size_t i = 0; i < a.n; i++) {
        if (O.json) {
            printf("%s", i ? "," : "");
            print_lock_json(a.v[i].name, &a.v[i].li, 0);
        } else {
            print_row(a.v[i].name, &a.v[i].li);
        }
    }
    if (O.json)
        printf("]\n");
    free(a.v);
    return 0;
}

static int show_once(const char *name, int watch)
{
    char k[DLOCK_NAME_MAX + 128];
    key_of(k, sizeof k, name, "");
    dlock_cluster_node *node;
    redisContext *c = conn_for(k, &node);
    lockinfo li;
    if (read_lock(c, name, &li) != 0) {
        conn_done(c, node);
        return 0; /* (not held, for this dlockctl: exit status 1) */
    }
    char e1[4 * DLOCK_NAME_MAX + 8], e2[4 * DLOCK_CLIENT_NAME_MAX + 8];
    if (O.json) {
        print_lock_json(name, &li, 1);
        printf(",\"turn\":");
        if (li.turn[0])
            json_str(li.turn);
        else
            printf("null");
        printf(",\"queue\":[");
    } else {
        if (watch) {
            char ts[32];
            time_t now = time(NULL);
            strftime(ts, sizeof ts, "%H:%M:%S", localtime(&now));
            printf("-- %s\n", ts);
        }
        if (li.held) {
            char rem[32], held[32];
            fmt_ms(rem, sizeof rem, li.remaining_ms);
            fmt_ms(held, sizeof held, li.held_for_ms);
            printf("%s: held by %s (client id %s), token %s, held for %s, %s of lease left\n",
                   esc(name, e1, sizeof e1), li.holder[0] ? esc(li.holder, e2, sizeof e2) : "?",
                   li.owner, li.token, held, rem);
        } else {
            printf("%s: free\n", esc(name, e1, sizeof e1));
        }
        if (li.turn[0])
            printf("  turn: %s\n", li.turn);
        printf("  %lld waiting\n", li.waiting);
    }
    for (long long i = 0; i < li.waiting; i++) {
        const waiter *w = &li.queue[i];
        if (O.json) {
            printf("%s{\"client\":", i ? "," : "");
            json_str(w->id);
            printf(",\"name\":");
            json_str(w->name);
            printf(",\"waiting_ms\":%lld,\"alive\":%s}", w->waited_ms,
                   w->alive ? "true" : "false");
        } else {
            char t[32];
            fmt_ms(t, sizeof t, w->waited_ms);
            printf("  %2lld. %s (%.8s) waiting %s, %s\n", i + 1,
                   w->name[0] ? esc(w->name, e2, sizeof e2) : "?", w->id, t,
                   w->alive ? "alive" : "dead (skipped at the next release)");
        }
    }
    if (O.json)
        printf("]}\n");
    int held = li.held;
    lock_free(&li);
    conn_done(c, node);
    fflush(stdout);
    return held;
}

static volatile sig_atomic_t interrupted;
static void on_int(int sig)
{
    (void)sig;
    interrupted = 1;
}

static int cmd_watch(const char *name)
{
    signal(SIGINT, on_int);
    signal(SIGTERM, on_int);
    for (long i = 0; !interrupted && (O.count < 0 || i < O.count); i++) {
        if (i) {
            struct timespec ts = {O.interval_ms / 1000, (O.interval_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
            if (interrupted)
                break;
        }
        show_once(name, 1);
    }
    return 0;
}

/* The wrapper around release.lua for a forced release (KEYS and ARGV as
 * release.lua's; ARGV[5] and ARGV[9] adjusted here). It answers a negative
 * number -N, having changed nothing, while the holder's reservation is ahead
 * of server time: the caller waits N ms and tries again. */
static const char FORCE_HEAD[] =
    "local lease = redis.call('HMGET', KEYS[1], 'owner', 'token', 'pl', 'exp', 'pv')\n"
    "if lease[5] and lease[5] ~= '1' then\n"
    "  return redis.error_reply('DLOCKPROTOCOL ' .. KEYS[1] .. ': the data of this name is '\n"
    "    .. 'dlock protocol ' .. lease[5] .. '; this dlockctl speaks protocol 1')\n"
    "end\n"
    "if lease[1] ~= ARGV[1] or lease[2] ~= ARGV[3] then return 0 end\n"
    /* the holder's reservation for its threads (token + pass limit): it may
     * go on handing them out until it learns of this release, so the fence
     * keeps it as the last token; and it waits until server time has passed
     * it, so that the fence is not ahead of the server's clock (a restart
     * that lost it could not undercut the holder's tokens then) */
    "local res = tonumber(lease[2]) + (tonumber(lease[3]) or 0)\n"
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
    /* a grant past its exp has expired: nobody holds it (acquire.lua) */
    "if lease[4] and math.floor(now / 1000) > tonumber(lease[4]) then return 0 end\n"
    "if res >= now then return -(math.floor((res - now) / 1000) + 1) end\n"
    "local fence = tonumber(string.match(redis.call('GET', KEYS[2]) or '0', '^%d+') or '0') or 0\n"
    "if fence > res then res = fence end\n"
    "if res > tonumber(ARGV[3]) then ARGV[5] = string.format('%.0f', res) end\n"
    /* the holder's record keeps a longer lifetime than ARGV[9] */
    "local kt = redis.call('PTTL', KEYS[6])\n"
    "if kt > tonumber(ARGV[9]) then ARGV[9] = tostring(kt) end\n"
    "local function release_as_holder()\n";
static const char FORCE_TAIL[] =
    "\nend\n"
    "local rc = release_as_holder()\n"
    /* refused (another protocol's data: release.lua, Protocol): nothing
     * written, here neither (no double quotes in these comments: sim/world.lua
     * reads the literals) */
    "if type(rc) == 'table' and rc.err then return rc end\n"
    /* taken, not released: the holder's release of this token finds no
     * record of it (DLOCK_ELOST); its attempts stay ordered */
    "local rec = redis.call('GET', KEYS[6])\n"
    "local a, _, r = string.match(rec or '', '^(%d+) (%d+) (%d+)$')\n"
    "if a then\n"
    "  redis.call('SET', KEYS[6], a .. ' 0 ' .. r, 'PX', math.max(redis.call('PTTL', KEYS[6]), 1))\n"
    "end\n"
    "return rc\n";

/* In release --client's JSON array: the separator before each object. */
static int json_items = -1; /* -1: not in an array */
static void json_item(void)
{
    if (json_items > 0)
        printf(",");
    if (json_items >= 0)
        json_items++;
}

/* release NAME --force; with O.client set, only if that client holds it
 * (the lease may have changed hands since the scan). */
static int cmd_release(const char *name)
{
    char en[4 * DLOCK_NAME_MAX + 8], eh[4 * DLOCK_CLIENT_NAME_MAX + 8];
    if (!O.force) {
        fprintf(stderr, "dlockctl: release takes the lease from its holder while it may still "
                        "be working: say --force\n");
        return 2;
    }
    char k[DLOCK_SCRIPT_KEYS][DLOCK_NAME_MAX + 128];
    key_of(k[0], sizeof k[0], name, "");
    dlock_cluster_node *node;
    redisContext *c = conn_for(k[0], &node);
    lockinfo li;
    if (read_lock(c, name, &li) != 0) {
        if (O.json) {
            json_item();
            printf("{\"name\":");
            json_str(name);
            printf(",\"released\":false,\"reason\":\"data of another protocol\"}\n");
        }
        conn_done(c, node);
        return 1;
    }
    lock_free(&li); /* (its queue is not needed here) */
    int other = li.held && O.client && strcmp(li.owner, O.client) != 0;
    if (!li.held || other) {
        if (O.json) {
            json_item();
            printf("{\"name\":");
            json_str(name);
            printf(",\"released\":false,\"reason\":\"%s\"}\n",
                   other ? "held by another client now" : "not held");
        } else if (other) {
            printf("%s is held by another client now (%s): left alone\n",
                   esc(name, en, sizeof en), li.owner);
        } else {
            printf("%s is not held\n", esc(name, en, sizeof en));
        }
        conn_done(c, node);
        return 1;
    }
    const char *suffix[DLOCK_SCRIPT_KEYS - 1] = {":fence", ":q", ":qd", ":turn"};
    for (int i = 1; i < DLOCK_SCRIPT_KEYS - 1; i++)
        key_of(k[i], sizeof k[i], name, suffix[i - 1]);
    char rec[80];
    snprintf(rec, sizeof rec, ":c:%s", li.owner);
    key_of(k[DLOCK_SCRIPT_KEYS - 1], sizeof k[0], name, rec);
    char wake[DLOCK_PREFIX_MAX + 8];
    snprintf(wake, sizeof wake, "%swake:", O.prefix);
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS];
    for (int i = 0; i < DLOCK_SCRIPT_KEYS; i++)
        argv[i] = k[i];
    const char *a[DLOCK_RELEASE_ARGS] = {
        li.owner, "token", li.token,
        "3600000",  /* the fence's lifetime: an hour, as no lease time of the holder
                       is known (a longer fence only keeps tokens higher) */
        li.token,   /* the last token handed out: the script takes the fence's */
        wake, name,
        "2000",     /* a turn waits this long for its client (the default waiter ttl) */
        "60000",    /* the holder's record of the name, at least (the script keeps a
                       longer lifetime it already has) */
        "3"};       /* an operator's release: the next holder is told (dlock_unclean) */
    memcpy(argv + DLOCK_SCRIPT_KEYS, a, sizeof a);
    /* The library's release script, run as the holder inside a wrapper
     * (one script, so atomic): only the grant read above is released, the
     * holder's reservation of tokens for its threads (the fence) is kept as
     * the last token, and the holder's record says the grant was taken, not
     * released, so that its own release then returns DLOCK_ELOST. */
    size_t blen = strlen(dlock_script_body(DLOCK_SCRIPT_RELEASE));
    size_t slen = blen + sizeof FORCE_HEAD + sizeof FORCE_TAIL;
    char *script = malloc(slen);
    if (!script) {
        fprintf(stderr, "dlockctl: out of memory\n");
        return 1;
    }
    snprintf(script, slen, "%s%s%s", FORCE_HEAD, dlock_script_body(DLOCK_SCRIPT_RELEASE),
             FORCE_TAIL);
    /* tests only: a pause between the read and the release, in which the
     * data may change (test_dlockctl) */
    const char *pause = getenv("DLOCKCTL_TEST_FORCE_PAUSE_MS");
    if (pause && atol(pause) > 0) {
        struct timespec ts = {atol(pause) / 1000, (atol(pause) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    const char *ev[3 + DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS] = {"EVAL", script, "6"};
    memcpy(ev + 3, argv, sizeof argv);
    long long rc;
    for (int tries = 0;; tries++) {
        redisReply *r = redisCommandArgv(c, 3 + DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS, ev, NULL);
        if (!r) {
            free(script);
            fprintf(stderr, "dlockctl: redis: %s\n", c->errstr);
            return 1;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            free(script);
            if (!refused_protocol(r))
                fprintf(stderr, "dlockctl: redis: %s\n", r->str);
            freeReplyObject(r);
            conn_done(c, node);
            return 1;
        }
        rc = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
        freeReplyObject(r);
        /* Negative: the holder's reservation is ahead of server time by up
         * to its pass limit in us (at most a lease time): wait, again. */
        if (rc >= 0)
            break;
        if (tries == 100) {
            free(script);
            fprintf(stderr, "dlockctl: %s: the holder's reservation of tokens is still ahead of "
                            "the server's clock after 100 tries; nothing released\n", name);
            conn_done(c, node);
            return 1;
        }
        long long ms = -rc > 1000 ? 1000 : -rc;
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    free(script);
    if (rc != 1 && rc != 2) {
        /* 0: the grant changed between the read and the release */
        if (O.json) {
            json_item();
            printf("{\"name\":");
            json_str(name);
            printf(",\"released\":false,\"reason\":\"the holder changed; look again\"}\n");
        } else {
            printf("%s changed hands meanwhile: nothing released; look again\n",
                   esc(name, en, sizeof en));
        }
        conn_done(c, node);
        return 1;
    }
    /* tell the holder (PUBLISH reaches every node of a cluster) */
    char msg[DLOCK_NAME_MAX + 64];
    snprintf(msg, sizeof msg, "f %s %s", li.token, name);
    redisReply *r = cmd(c, "PUBLISH %s%s %s", wake, li.owner, msg);
    long long told = r->integer;
    freeReplyObject(r);
    if (O.json) {
        json_item();
        printf("{\"name\":");
        json_str(name);
        printf(",\"released\":true,\"owner\":");
        json_str(li.owner);
        printf(",\"holder_name\":");
        json_str(li.holder);
        printf(",\"token\":%s,\"holder_told\":%s,\"next_waiter_granted\":%s}\n", li.token,
               told > 0 ? "true" : "false", rc == 2 ? "true" : "false");
    } else {
        printf("%s released by force: it was held by %s (client id %s, token %s); the holder "
               "%s; %s\n",
               esc(name, en, sizeof en), li.holder[0] ? esc(li.holder, eh, sizeof eh) : "?",
               li.owner, li.token,
               told > 0 ? "was told" : "was not listening (it finds out at its next renewal)",
               rc == 2 ? "the next waiter has it" : "nobody was waiting");
    }
    conn_done(c, node);
    return 0;
}

/* The names a client holds, gathered by scan_all. */
typedef struct names {
    char (*v)[DLOCK_NAME_MAX + 1];
    size_t n, cap;
} names;

static void held_by_client(const char *name, const lockinfo *li, void *arg)
{
    names *l = arg;
    if (strcmp(li->owner, O.client) != 0)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        void *v = realloc(l->v, cap * sizeof *l->v);
        if (!v)
            die("out of memory");
        l->v = v;
        l->cap = cap;
    }
    snprintf(l->v[l->n++], DLOCK_NAME_MAX + 1, "%s", name);
}

/* release --client ID --force: every lock the client holds, one by one
 * (each as release NAME --force). 0 if one was released, else 1. */
static int cmd_release_client(void)
{
    if (!O.force) {
        fprintf(stderr, "dlockctl: release takes the leases from their holder while it may "
                        "still be working: say --force\n");
        return 2;
    }
    names l = {NULL, 0, 0};
    scan_all("*", held_by_client, &l);
    /* tests only: a pause between the scan and the releases, in which a
     * name may change hands (test_dlockctl) */
    const char *pause = getenv("DLOCKCTL_TEST_PAUSE_MS");
    if (pause && atol(pause) > 0) {
        struct timespec ts = {atol(pause) / 1000, (atol(pause) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (O.json) {
        printf("[");
        json_items = 0;
    }
    int released = 0;
    for (size_t i = 0; i < l.n; i++)
        released += cmd_release(l.v[i]) == 0;
    if (O.json)
        printf("]\n");
    else if (l.n == 0)
        printf("client %s holds no lock\n", O.client);
    else
        printf("%d of the %zu locks client %s held released\n", released, l.n, O.client);
    free(l.v);
    return released > 0 ? 0 : 1;
}

/* ------------------------------------------------------------------ */
/* doctor: the server's settings against what dlock needs               */

/* The value of "field:" in INFO's text into out ("" if absent). */
static void info_get(const char *info, const char *field, char *out, size_t n)
{
    out[0] = '\0';
    size_t fl = strlen(field);
    for (const char *p = info; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, field, fl) && p[fl] == ':') {
            size_t k = strcspn(p + fl + 1, "\r\n");
            snprintf(out, n, "%.*s", (int)(k < n ? k : n - 1), p + fl + 1);
            return;
        }
}

static int doctor_fails, doctor_first = 1;

/* One finding: status "ok", "warn" or "FAIL". */
static void finding(const char *server, const char *status, const char *check, const char *fmt,
                    ...) __attribute__((format(printf, 4, 5)));
static void finding(const char *server, const char *status, const char *check, const char *fmt,
                    ...)
{
    char detail[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    doctor_fails += !strcmp(status, "FAIL");
    if (O.json) {
        printf("%s{\"server\":", doctor_first ? "" : ",");
        json_str(server);
        printf(",\"check\":");
        json_str(check);
        printf(",\"status\":\"%s\",\"detail\":", status);
        json_str(detail);
        printf("}");
        doctor_first = 0;
    } else {
        printf("%-4s  %-12s %s\n", status, check, detail);
    }
}

/* Checks one server (a connection without dlock's own setup check, which
 * would refuse an unfit server before it could be looked at). */
static void doctor_one(const char *host, int port, const char *unix_path)
{
    char where[300];
    if (unix_path)
        snprintf(where, sizeof where, "unix:%s", unix_path);
    else
        snprintf(where, sizeof where, "%s:%d", host, port);
    if (!O.json)
        printf("%s\n", where);
    redisContext *c = dlock_conn_connect(host, port, unix_path, CFG.connect_timeout_ms,
                                         CFG.command_timeout_ms);
    if (!c || c->err) {
        finding(where, "FAIL", "connect", "cannot connect: %s", c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return;
    }
    if (CFG.password) {
        redisReply *r = CFG.username ? redisCommand(c, "AUTH %s %s", CFG.username, CFG.password)
                                     : redisCommand(c, "AUTH %s", CFG.password);
        int bad = !r || r->type == REDIS_REPLY_ERROR;
        if (bad)
            finding(where, "FAIL", "auth", "AUTH refused: %s", r ? r->str : c->errstr);
        if (r)
            freeReplyObject(r);
        if (bad) {
            redisFree(c);
            return;
        }
    }
    redisReply *r = redisCommand(c, "INFO");
    if (!r || r->type == REDIS_REPLY_ERROR) {
        finding(where, "FAIL", "info", "INFO refused (dlock reads it on every connection; an ACL "
                "user needs +info): %s", r ? r->str : c->errstr);
        if (r)
            freeReplyObject(r);
        redisFree(c);
        return;
    }
    const char *info = r->str;
    char v[128], mm[64], pol[64], aof[16], role[32], slaves[16], cluster[16], minrep[16];
    info_get(info, "redis_version", v, sizeof v);
    info_get(info, "maxmemory", mm, sizeof mm);
    info_get(info, "maxmemory_policy", pol, sizeof pol);
    info_get(info, "aof_enabled", aof, sizeof aof);
    info_get(info, "role", role, sizeof role);
    info_get(info, "connected_slaves", slaves, sizeof slaves);
    info_get(info, "cluster_enabled", cluster, sizeof cluster);
    if (atoi(v) >= 5)
        finding(where, "ok", "version", "Redis %s (dlock needs 5 or later)", v);
    else
        finding(where, "FAIL", "version", "Redis %s: dlock needs Redis 5 or later (its scripts "
                "read TIME before writing); upgrade the server", v[0] ? v : "(unknown)");
    if (!mm[0] || strtoull(mm, NULL, 10) == 0 || !strcmp(pol, "noeviction"))
        finding(where, "ok", "eviction", "maxmemory %s, maxmemory-policy %s: no lease is evicted",
                mm[0] ? mm : "0", pol[0] ? pol : "(unknown)");
    else
        finding(where, "FAIL", "eviction", "maxmemory %s with maxmemory-policy %s may evict a "
                "live lease and grant it again: CONFIG SET maxmemory-policy noeviction (or "
                "maxmemory 0), and put it in redis.conf", mm, pol);
    if (!strcmp(role, "master"))
        finding(where, "ok", "role", "a master");
    else
        finding(where, "FAIL", "role", "a %s: the clients must talk to the master (Sentinel "
                "mode finds it: --sentinels)", role[0] ? role : "server of unknown role");
    /* RDB snapshots: the "save" setting, if CONFIG may be read */
    char save[128] = "";
    int save_known = 0;
    redisReply *cs = redisCommand(c, "CONFIG GET save");
    if (cs && cs->type == REDIS_REPLY_ARRAY && cs->elements == 2 &&
        cs->element[1]->type == REDIS_REPLY_STRING) {
        snprintf(save, sizeof save, "%s", cs->element[1]->str);
        save_known = 1;
    }
    if (cs)
        freeReplyObject(cs);
    if (!strcmp(aof, "1"))
        finding(where, "ok", "persistence", "AOF on: a restart keeps the leases written before "
                "its last fsync");
    else if (save[0])
        finding(where, "warn", "persistence", "RDB snapshots only (save %s): a restart loses the "
                "leases granted since the last snapshot, and a second holder may run while "
                "the first still works (fencing tokens keep its writes out; docs/guide.md: Semantics); "
                "appendonly yes keeps them", save);
    else
        finding(where, "warn", "persistence", "no AOF%s: a restart loses every lease, and a "
                "second holder may run while the first still works (fencing tokens keep its "
                "writes out; docs/guide.md: Semantics); appendonly yes keeps them",
                save_known ? " and no RDB snapshots" : "");
    int n = atoi(slaves);
    snprintf(minrep, sizeof minrep, "%d", n);
    if (n > 0)
        finding(where, "warn", "replicas", "%d replica%s: a failover may promote one that missed "
                "a grant, and two clients hold the name; min_replicas %s in the clients keeps "
                "every lease across a failover, at a cost in availability while a replica is "
                "down (docs/deployments.md)", n, n == 1 ? "" : "s", minrep);
    else if (!strcmp(cluster, "1"))
        finding(where, "warn", "replicas", "a cluster master without replicas: its slots are "
                "down while it is (no failover)");
    else
        finding(where, "ok", "replicas", "none: nothing to wait for");
    freeReplyObject(r);
    redisFree(c);
}

/* doctor: every server the clients would use. 0 if nothing failed, 1 if
 * something must change. */
static int cmd_doctor(void)
{
    if (O.json)
        printf("[");
    if (CL) {
        dlock_cluster_node *m[DLOCK_CLUSTER_NODES_MAX];
        unsigned n = dlock_cluster_masters(CL, m, DLOCK_CLUSTER_NODES_MAX);
        for (unsigned i = 0; i < n; i++)
            doctor_one(m[i]->cfg.host, m[i]->cfg.port, NULL);
    } else if (CFG.nsentinels) {
        char host[256];
        int port;
        if (dlock_sentinel_master(&CFG, &CTR, host, sizeof host, &port) != DLOCK_OK)
            finding("sentinels", "FAIL", "sentinels", "no master from the sentinels: %s",
                    dlock_last_error());
        else
            doctor_one(host, port, NULL);
    } else {
        doctor_one(CFG.host, CFG.port, CFG.unix_path);
    }
    if (O.json)
        printf("]\n");
    else
        printf("%s\n", doctor_fails ? "something must change (FAIL above)"
                                     : "fit for dlock (see any warn above)");
    return doctor_fails ? 1 : 0;
}

int main(int argc, char **argv)
{
    enum { O_CLUSTER = 256, O_SENTINELS, O_MASTER, O_SPW, O_JSON, O_FORCE, O_INTERVAL, O_COUNT,
           O_HELP, O_CLIENT, O_VERSION };
    static const struct option lo[] = {
        {"host", required_argument, 0, 'h'},       {"socket", required_argument, 0, 's'},
        {"user", required_argument, 0, 'u'},       {"password", required_argument, 0, 'a'},
        {"db", required_argument, 0, 'n'},         {"prefix", required_argument, 0, 'p'},
        {"cluster", required_argument, 0, O_CLUSTER},
        {"sentinels", required_argument, 0, O_SENTINELS},
        {"master", required_argument, 0, O_MASTER},
        {"sentinel-password", required_argument, 0, O_SPW},
        {"json", no_argument, 0, O_JSON},          {"force", no_argument, 0, O_FORCE},
        {"interval", required_argument, 0, O_INTERVAL},
        {"count", required_argument, 0, O_COUNT},  {"help", no_argument, 0, O_HELP},
        {"client", required_argument, 0, O_CLIENT},
        {"version", no_argument, 0, O_VERSION},
        {0, 0, 0, 0}};
    O.password = getenv("DLOCK_PASSWORD");
    int opt, where = 0;
    while ((opt = getopt_long(argc, argv, "+h:s:u:a:n:p:", lo, NULL)) != -1) {
        switch (opt) {
        case 'h': {
            const char *colon = strrchr(optarg, ':');
            if (!colon || colon == optarg || atoi(colon + 1) <= 0 || atoi(colon + 1) > 65535)
                die_usage("--host wants HOST:PORT, not '%s'", optarg);
            snprintf(O.host, sizeof O.host, "%.*s", (int)(colon - optarg), optarg);
            O.port = atoi(colon + 1);
            where++;
            break;
        }
        case 's': O.unix_path = optarg; where++; break;
        case 'u': O.user = optarg; break;
        case 'a': O.password = optarg; break;
        case 'n': O.db = atoi(optarg); break;
        case 'p': O.prefix = optarg; break;
        case O_CLUSTER: O.cluster = optarg; where++; break;
        case O_SENTINELS: O.sentinels = optarg; where++; break;
        case O_MASTER: O.master = optarg; break;
        case O_SPW: O.sentinel_password = optarg; break;
        case O_JSON: O.json = 1; break;
        case O_FORCE: O.force = 1; break;
        case O_INTERVAL: O.interval_ms = atol(optarg); break;
        case O_COUNT: O.count = atol(optarg); break;
        case O_CLIENT: O.client = optarg; break;
        case O_VERSION:
            printf("dlockctl %s (protocol %d)\n", dlock_version(), DLOCK_PROTOCOL_VERSION);
            return 0;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (where > 1)
        die_usage("%s", "--host, --socket, --cluster and --sentinels each name the server: "
                        "give one");
    if (O.user && !O.password)
        die_usage("%s", "--user needs --password (or DLOCK_PASSWORD)");
    if (strlen(O.prefix) > DLOCK_PREFIX_MAX)
        die_usage("--prefix '%s' is longer than the library allows", O.prefix);
    if (O.interval_ms < 10)
        die_usage("%s", "--interval is at least 10 ms");
    if (optind >= argc) {
        usage(stderr);
        return 2;
    }
    const char *command = argv[optind++];
    /* options may also follow the command's arguments: release NAME --force */
    const char *arg = NULL;
    for (; optind < argc; optind++) {
        if (!strcmp(argv[optind], "--force"))
            O.force = 1;
        else if (!strcmp(argv[optind], "--json"))
            O.json = 1;
        else if (!strcmp(argv[optind], "--interval") && optind + 1 < argc)
            O.interval_ms = atol(argv[++optind]);
        else if (!strcmp(argv[optind], "--count") && optind + 1 < argc)
            O.count = atol(argv[++optind]);
        else if (!strcmp(argv[optind], "--client") && optind + 1 < argc)
            O.client = argv[++optind];
        else if (!arg)
            arg = argv[optind];
        else
            die_usage("unexpected argument '%s'", argv[optind]);
    }
    if (O.client && strcmp(command, "release") != 0)
        die_usage("--client goes with release, not %s", command);
    if (O.client && arg)
        die_usage("release takes a name or --client ID, not both ('%s')", arg);
    if (O.client && (strlen(O.client) != 32 || strspn(O.client, "0123456789abcdef") != 32))
        die_usage("--client wants a client id, 32 hex digits, not '%s'", O.client);
    int needs_name = strcmp(command, "list") != 0 && strcmp(command, "doctor") != 0 && !O.client;
    if (needs_name && (!arg || !*arg))
        die_usage("%s needs a lock name", command);
    if (arg && strlen(arg) > DLOCK_NAME_MAX)
        die_usage("the name is longer than %s bytes", "DLOCK_NAME_MAX");
    if (strcmp(command, "list") && strcmp(command, "show") && strcmp(command, "release") &&
        strcmp(command, "doctor") &&
        strcmp(command, "watch"))
        die_usage("unknown command '%s'", command);
    setup();
    int rc;
    if (!strcmp(command, "list"))
        rc = cmd_list(arg ? arg : "*");
    else if (!strcmp(command, "doctor"))
        rc = cmd_doctor();
    else if (!strcmp(command, "show"))
        rc = show_once(arg, 0) ? 0 : 1;
    else if (!strcmp(command, "release"))
        rc = O.client ? cmd_release_client() : cmd_release(arg);
    else
        rc = cmd_watch(arg);
    if (single_conn)
        redisFree(single_conn);
    return rc;
}
