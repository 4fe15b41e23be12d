/*
 * dlockctl: connections, reading a lock or a semaphore in one script,
 * printing it (dlockctl.h).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dlockctl.h"
#include "common/error.h"
#include "conn/script.h"

/* A pooled connection to node n (Cluster mode). */
redisContext *ctl_conn_for_node(dlock_cluster_node *n)
{
    redisContext *c;
    if (dlock_pool_get(n->pool, DLOCK_NEVER, &c) != DLOCK_OK)
        ctl_die("connect");
    return c;
}

static redisContext *single_conn;

/* A connection to the server that serves key: in Cluster mode its slot's
 * master (*node set: give it back with conn_done), else the one server. */
redisContext *ctl_conn_for(const char *key, dlock_cluster_node **node)
{
    *node = NULL;
    if (CL) {
        unsigned slot = dlock_cluster_slot(key, strlen(key));
        *node = dlock_cluster_route(CL, slot, DLOCK_NEVER);
        if (!*node)
            ctl_die("cluster");
        return ctl_conn_for_node(*node);
    }
    if (!single_conn && dlock_conn_open(&CFG, &CTR, &single_conn) != DLOCK_OK)
        ctl_die("connect");
    return single_conn;
}

void ctl_conn_done(redisContext *c, dlock_cluster_node *node)
{
    if (node)
        dlock_pool_put(node->pool, c, c->err != 0);
    else if (c->err) {
        fprintf(stderr, "dlockctl: redis: %s\n", c->errstr);
        exit(1);
    }
}

/* The protocol number a DLOCKPROTOCOL refusal names: "... the data of this
 * name is dlock protocol P; this ... speaks protocol Q" (the last such
 * phrase: the key before it may hold anything). 0 if r is no refusal or P
 * is not a number. */
static int refusal_protocol(const redisReply *r)
{
    static const char says[] = "the data of this name is dlock protocol ";
    if (!dlock_conn_is_other_protocol(r))
        return 0;
    const char *at = NULL;
    for (const char *p = r->str; (p = strstr(p, says)) != NULL; p++)
        at = p + sizeof says - 1;
    if (!at || !isdigit((unsigned char)*at))
        return 0;
    char *end;
    errno = 0;
    long v = strtol(at, &end, 10);
    return errno || *end != ';' || v > 1000000 ? 0 : (int)v;
}

int ctl_refusal_names(const redisReply *r)
{
    int p = refusal_protocol(r);
    return p >= DLOCK_PROTOCOL_MIN && p <= DLOCK_PROTOCOL_MAX ? p : 0;
}

const char *ctl_protocols(char *out, size_t n, const char *word)
{
    if (DLOCK_PROTOCOL_MIN == DLOCK_PROTOCOL_MAX)
        snprintf(out, n, "%s%s%d", word, *word ? " " : "", DLOCK_PROTOCOL_MIN);
    else
        snprintf(out, n, "%s%s%d and %d", word, *word ? "s " : "", DLOCK_PROTOCOL_MIN,
                 DLOCK_PROTOCOL_MAX);
    return out;
}

/* If r is a script's refusal of another protocol's data (lua/ctl_read.lua,
 * lua/force.lua and their protocol 2 twins: lua/acquire.lua, "Protocol"),
 * says so on stderr and returns 1; else 0. The script names the one
 * protocol it speaks; this dlockctl speaks both, and says so. */
int ctl_refused_protocol(const redisReply *r)
{
    if (!dlock_conn_is_other_protocol(r))
        return 0;
    const char *s = r->str + strlen("DLOCKPROTOCOL"), *tail = NULL;
    s += *s == ' ';
    for (const char *p = s; (p = strstr(p, "; this ")) != NULL; p++)
        tail = p; /* "; this dlockctl speaks protocol Q", the script's */
    char what[2 * (DLOCK_NAME_MAX + DLOCK_PREFIX_MAX) + 256];
    char e[4 * sizeof what];
    snprintf(what, sizeof what, "%.*s", (int)(tail ? (size_t)(tail - s) : strlen(s)), s);
    char speaks[64];
    fprintf(stderr, "dlockctl: %s; this dlockctl speaks %s: use the dlockctl of the release "
                    "that wrote it\n",
            ctl_esc(what, e, sizeof e), ctl_protocols(speaks, sizeof speaks, "protocol"));
    return 1;
}

redisReply *ctl_cmd(redisContext *c, const char *fmt, ...)
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

void ctl_setup(void)
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
            ctl_die_usage("%s", "--sentinels needs --master");
        if (dlock_addrs_parse(O.sentinels, "--sentinels", &CFG.sentinels, &CFG.nsentinels) !=
            DLOCK_OK)
            ctl_die("--sentinels");
        CFG.sentinel_master = (char *)O.master;
        CFG.sentinel_password = (char *)O.sentinel_password;
        CFG.route = &dlock_sentinel_route;
    }
    if (O.cluster) {
        if (dlock_cluster_create(&CFG, O.cluster, 1, 0, &CTR, &CL) != DLOCK_OK)
            ctl_die("--cluster");
        if (dlock_cluster_refresh(CL, 1, DLOCK_NEVER) != DLOCK_OK)
            ctl_die("cluster map");
    }
}

/* ------------------------------------------------------------------ */

void ctl_key_of(char *out, size_t n, const char *name, const char *suffix)
{
    snprintf(out, n, "%s{%s}%s", O.prefix, name, suffix);
}

static const char *str_or(const redisReply *r, const char *dflt)
{
    return r->type == REDIS_REPLY_STRING ? r->str : dflt;
}

void ctl_lock_free(lockinfo *li)
{
    free(li->queue);
    li->queue = NULL;
    free(li->shared);
    li->shared = NULL;
    free(li->holders);
    li->holders = NULL;
}

int ctl_is_held(const lockinfo *li)
{
    return li->semaphore ? li->permits > 0 : li->held || li->sharing > 0;
}

/* 1 if r is a read script's refusal of the name's kind: protocol 2's lock
 * read on a semaphore's data, or the semaphore's read on a lock's
 * (DLOCKKIND: lua/p2/SEM.txt, "Wrong data"). */
static int refused_kind(const redisReply *r)
{
    return r->type == REDIS_REPLY_ERROR && strncmp(r->str, "DLOCKKIND", 9) == 0;
}

static void unexpected_reply(const char *name)
{
    fprintf(stderr, "dlockctl: redis: unexpected reply reading %s\n", name);
    exit(1);
}

/* The wait queue, e[at ..] of a read's reply of n elements: 4 per waiter
 * {client id, arrival (us), liveness value, alive}. The liveness value is
 * "<deadline> <attempt> <x> <ttl> <name>", x the lock's pass limit ("s" for
 * a shared waiter: lua/p2/LAYOUT.txt) or a semaphore's permits wanted
 * (lua/p2/SEM.txt). */
static void read_waiters(redisReply **e, size_t n, size_t at, lockinfo *li)
{
    size_t m = at <= n ? (n - at) / 4 : 0;
    li->waiting = (long long)m;
    li->queue = calloc(m ? m : 1, sizeof *li->queue);
    if (!li->queue)
        ctl_die("out of memory");
    for (size_t i = 0; i < m; i++) {
        redisReply **w = e + at + 4 * i;
        waiter *x = &li->queue[i];
        snprintf(x->id, sizeof x->id, "%s", str_or(w[0], ""));
        x->waited_ms = li->now_ms - atoll(str_or(w[1], "0")) / 1000;
        const char *p = str_or(w[2], "");
        for (int f = 0; f < 4 && p; f++) {
            p = strchr(p, ' ');
            if (p)
                p++;
            if (f == 1 && p && li->semaphore)
                x->permits = atoll(p);
            else if (f == 1 && p && p[0] == 's' && p[1] == ' ')
                x->shared = 1;
        }
        snprintf(x->name, sizeof x->name, "%s", p ? p : "");
        x->alive = w[3]->type == REDIS_REPLY_INTEGER && w[3]->integer == 1;
    }
}

static int holder_by_id(const void *x, const void *y)
{
    return strcmp(((const permit_holder *)x)->id, ((const permit_holder *)y)->id);
}

/* The reply of lua/p2/sem_ctl_read.lua into li: {server ms, limit (nil
 * without a hash), permits in use, m, then m x {client id, permits, end},
 * then the waiters}. A name without a hash (its data gone since the lock's
 * read refused it) is free and no semaphore. */
static void read_semaphore(const redisReply *r, const char *name, lockinfo *li)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 4 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[3]->type != REDIS_REPLY_INTEGER)
        unexpected_reply(name);
    redisReply **e = r->element;
    long long m = e[3]->integer;
    if (m < 0 || (size_t)m > (r->elements - 4) / 3)
        unexpected_reply(name);
    li->now_ms = e[0]->integer;
    li->remaining_ms = li->held_for_ms = -1;
    li->mode = "free";
    li->protocol = 2;
    if (e[1]->type != REDIS_REPLY_STRING)
        return; /* (no hash: no holder, no waiter) */
    li->semaphore = 1;
    li->limit = atoll(e[1]->str);
    li->permits = e[2]->type == REDIS_REPLY_INTEGER ? e[2]->integer : 0;
    li->holding = m;
    li->holders = calloc(m ? (size_t)m : 1, sizeof *li->holders);
    if (!li->holders)
        ctl_die("out of memory");
    for (long long i = 0; i < m; i++) {
        redisReply **h = e + 4 + 3 * i;
        permit_holder *x = &li->holders[i];
        snprintf(x->id, sizeof x->id, "%s", str_or(h[0], ""));
        x->permits = h[1]->type == REDIS_REPLY_INTEGER ? h[1]->integer : 0;
        x->remaining_ms = (h[2]->type == REDIS_REPLY_INTEGER ? h[2]->integer : 0) - li->now_ms;
        if (x->remaining_ms > li->remaining_ms)
            li->remaining_ms = x->remaining_ms; /* list's row: the longest lease left */
    }
    if (m > 1)
        qsort(li->holders, (size_t)m, sizeof *li->holders, holder_by_id);
    read_waiters(e, r->elements, 4 + 3 * (size_t)m, li);
    /* a holder's name, if it waits for more permits too */
    for (long long i = 0; i < m; i++)
        for (long long j = 0; j < li->waiting; j++)
            if (!strcmp(li->holders[i].id, li->queue[j].id))
                snprintf(li->holders[i].name, sizeof li->holders[i].name, "%s",
                         li->queue[j].name);
}

/* Reads lock `name` into li (dlockctl.h). Returns 0, or 1 if its data is
 * of a protocol this dlockctl does not speak: refused (said on stderr), li
 * then holds nothing. */
int ctl_read_lock(redisContext *c, const char *name, int first, lockinfo *li)
{
    return ctl_read_lock_at(c, name, "", first, li);
}

int ctl_read_lock_at(redisContext *c, const char *name, const char *tail, int first,
                     lockinfo *li)
{
    char k[4][DLOCK_NAME_MAX + 128], sfx[4][64];
    memset(li, 0, sizeof *li);
    /* one step (lua/ctl_read.lua: a script runs alone, a consistent
     * snapshot), with the server's clock */
    static const int which[4] = {DLOCK_KEY_LEASE, DLOCK_KEY_QUEUE, DLOCK_KEY_LIVE, DLOCK_KEY_TURN};
    for (int i = 0; i < 4; i++) {
        snprintf(sfx[i], sizeof sfx[i], "%s%s", tail, dlock_script_key_suffix(which[i]));
        ctl_key_of(k[i], sizeof k[i], name, sfx[i]);
    }
    /* Protocol `first`'s script; refused as the other's data, the other's;
     * protocol 2's lock read refused as a semaphore's data (another kind),
     * the semaphore's read (lua/p2/sem_ctl_read.lua), which refuses a
     * lock's data the same way, and protocol 1's as protocol 1's. And back
     * again, a few times at most, if the name's data changed between two
     * reads: its keys all expired and a client of the other protocol or
     * kind made them anew. */
    int pv = first, sem = 0;
    redisReply *r;
    for (int tries = 0;; tries++) {
        /* (protocol 2's read adds the mode and the shared holders when
         * asked: ARGV[1] "modes"; protocol 1's has no shared mode) */
        if (sem)
            r = redisCommand(c, "EVAL %s 3 %s %s %s", dlock_script_sem_ctl_read(), k[0], k[1],
                             k[2]);
        else
            r = redisCommand(c, "EVAL %s 4 %s %s %s %s %s", dlock_script_ctl_read(pv), k[0],
                             k[1], k[2], k[3], pv == 2 ? "modes" : "");
        if (!r) {
            fprintf(stderr, "dlockctl: redis: %s\n", c->errstr);
            exit(1);
        }
        if (tries == 3)
            break;
        if (refused_kind(r)) {
            freeReplyObject(r);
            sem = !sem;
            pv = 2; /* (the semaphore is protocol 2's only) */
            continue;
        }
        int named = ctl_refusal_names(r);
        if (!named || (named == pv && !sem))
            break;
        freeReplyObject(r);
        pv = named;
        sem = 0;
    }
    li->protocol = sem ? 2 : pv;
    if (ctl_refused_protocol(r)) {
        freeReplyObject(r);
        li->remaining_ms = li->held_for_ms = -1;
        return 1;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "dlockctl: redis: %s\n", r->str);
        exit(1);
    }
    if (sem) {
        read_semaphore(r, name, li);
        freeReplyObject(r);
        return 0;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 8)
        unexpected_reply(name);
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
    size_t at = 8; /* the waiters' first element */
    li->mode = li->held ? "exclusive" : "free";
    if (pv == 2) {
        /* the mode, the number m of shared holders, then m x {client id,
         * token, since, exp} (lua/p2/ctl_read.lua) */
        long long m = r->elements >= 10 && e[9]->type == REDIS_REPLY_INTEGER ? e[9]->integer : -1;
        if (m < 0 || (size_t)m > (r->elements - 10) / 4)
            unexpected_reply(name);
        const char *mode = str_or(e[8], "");
        li->mode = !strcmp(mode, "shared") ? "shared" : !strcmp(mode, "exclusive") ? "exclusive"
                                                                                   : "free";
        li->sharing = m;
        li->shared = calloc(m ? (size_t)m : 1, sizeof *li->shared);
        if (!li->shared)
            ctl_die("out of memory");
        for (long long i = 0; i < m; i++) {
            redisReply **s = e + 10 + 4 * i;
            sharer *x = &li->shared[i];
            snprintf(x->id, sizeof x->id, "%s", str_or(s[0], ""));
            snprintf(x->token, sizeof x->token, "%s", str_or(s[1], ""));
            x->held_for_ms = li->now_ms - atoll(str_or(s[2], "0"));
            x->remaining_ms = atoll(str_or(s[3], "0")) - li->now_ms;
            if (!li->held) {
                /* the row of list: the longest hold and lease left */
                if (x->held_for_ms > li->held_for_ms)
                    li->held_for_ms = x->held_for_ms;
                if (x->remaining_ms > li->remaining_ms)
                    li->remaining_ms = x->remaining_ms;
            }
        }
        at = 10 + 4 * (size_t)m;
    }
    read_waiters(e, r->elements, at, li);
    freeReplyObject(r);
    return 0;
}

/* s for a terminal: control characters, backslashes and bytes above 126
 * escaped (\n, \xNN), so that a name cannot move the cursor or forge a
 * line. Into out (n bytes; cut short if it does not fit). */
const char *ctl_esc(const char *s, char *out, size_t n)
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
void ctl_json_str(const char *s)
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
void ctl_print_lock_json(const char *name, const lockinfo *li, int open)
{
    printf("{\"name\":");
    ctl_json_str(name);
    if (li->semaphore) {
        /* (no mode, token nor grant time: permits have none) */
        printf(",\"protocol\":%d,\"kind\":\"semaphore\",\"held\":%s,\"limit\":%lld,"
               "\"permits\":%lld,\"holding\":%lld",
               li->protocol, ctl_is_held(li) ? "true" : "false", li->limit, li->permits,
               li->holding);
        if (li->holders) { /* (list leaves them out, as it does shared holders) */
            printf(",\"holders\":[");
            for (long long i = 0; i < li->holding; i++) {
                const permit_holder *h = &li->holders[i];
                printf("%s{\"client\":", i ? "," : "");
                ctl_json_str(h->id);
                printf(",\"name\":"); /* ("" unless it waits too: Redis keeps none) */
                ctl_json_str(h->name);
                printf(",\"permits\":%lld,\"remaining_ms\":%lld}", h->permits,
                       h->remaining_ms);
            }
            printf("]");
        }
        printf(",\"waiting\":%lld%s", li->waiting, open ? "" : "}");
        return;
    }
    printf(",\"protocol\":%d,\"kind\":\"lock\",\"held\":%s", li->protocol,
           li->held ? "true" : "false");
    if (li->held) {
        printf(",\"owner\":");
        ctl_json_str(li->owner);
        printf(",\"holder_name\":");
        ctl_json_str(li->holder);
        printf(",\"token\":%s,\"remaining_ms\":%lld,\"held_for_ms\":%lld", li->token[0] ? li->token : "null",
               li->remaining_ms, li->held_for_ms);
    }
    printf(",\"mode\":\"%s\",\"sharing\":%lld", li->mode ? li->mode : "free", li->sharing);
    if (li->shared) {
        printf(",\"shared\":[");
        for (long long i = 0; i < li->sharing; i++) {
            const sharer *s = &li->shared[i];
            printf("%s{\"client\":", i ? "," : "");
            ctl_json_str(s->id);
            printf(",\"token\":%s,\"remaining_ms\":%lld,\"held_for_ms\":%lld}",
                   s->token[0] ? s->token : "null", s->remaining_ms, s->held_for_ms);
        }
        printf("]");
    }
    printf(",\"waiting\":%lld%s", li->waiting, open ? "" : "}");
}

void ctl_fmt_ms(char *out, size_t n, long long ms)
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

void ctl_print_row(const char *name, const lockinfo *li)
{
    char rem[32], held[32], who[4 * DLOCK_CLIENT_NAME_MAX + 20], e1[4 * DLOCK_NAME_MAX + 8],
        e2[4 * DLOCK_CLIENT_NAME_MAX + 8];
    ctl_fmt_ms(rem, sizeof rem, li->remaining_ms);
    ctl_fmt_ms(held, sizeof held, li->held_for_ms);
    if (li->semaphore)
        snprintf(who, sizeof who, "semaphore: %lld of %lld permits, %lld client%s", li->permits,
                 li->limit, li->holding, li->holding == 1 ? "" : "s"); /* (show lists them) */
    else if (li->held)
        snprintf(who, sizeof who, "%s (%.8s)",
                 li->holder[0] ? ctl_esc(li->holder, e2, sizeof e2) : "?", li->owner);
    else
        snprintf(who, sizeof who, "shared by %lld client%s", li->sharing,
                 li->sharing == 1 ? "" : "s"); /* (show lists them) */
    printf("%-30s %-40s %-18s %10s %10s %7lld\n", ctl_esc(name, e1, sizeof e1), who,
           li->held ? li->token : "-", rem, held, li->waiting);
}

void ctl_print_header(void)
{
    printf("%-30s %-40s %-18s %10s %10s %7s\n", "NAME", "HOLDER (ID)", "TOKEN", "REMAINING",
           "HELD FOR", "WAITING");
}

void ctl_teardown(void)
{
    if (single_conn)
        redisFree(single_conn);
}
