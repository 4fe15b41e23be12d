/*
 * dlockctl list, show and watch (dlockctl.h): held locks found with SCAN
 * (never KEYS), on every master in Cluster mode, each read in one script.
 * Both protocols keep a name's lease hash at <prefix>{<name>} while it is
 * held (protocol 2 keeps it after a release too: lua/p2/LAYOUT.txt), so
 * the scan finds each held name by that one key, whatever its protocol;
 * a counting semaphore's hash lives at that key too (lua/p2/SEM.txt), and
 * one with permits in use is listed among the locks.
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

#include <uthash.h>

#include "dlockctl.h"
#include "common/error.h"
#include "conn/script.h"

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

/* The names a scan has passed to its callback: SCAN may return a key more
 * than once (while the server rehashes), and a slot being migrated may
 * show its keys on two masters; each name is read and passed once. */
typedef struct seen_name {
    UT_hash_handle hh;
    char name[]; /* the key of hh */
} seen_name;

/* 1 if name is in *seen already; else adds it and returns 0. */
static int seen_before(seen_name **seen, const char *name)
{
    seen_name *s;
    size_t n = strlen(name);
    HASH_FIND(hh, *seen, name, n, s);
    if (s)
        return 1;
    s = malloc(sizeof *s + n + 1);
    if (!s)
        ctl_die("out of memory");
    memcpy(s->name, name, n + 1);
    HASH_ADD_KEYPTR(hh, *seen, s->name, n, s);
    return 0;
}

/* Calls fn for every lock of c held (exclusively or shared) whose name
 * matches pattern and is not
 * in *seen (then added). Each name is read first in the protocol of the
 * name before it (*first): a key the scan saw exists, so either order reads
 * it the same, and a fleet on one protocol costs one script per name. */
static void scan_locks(redisContext *c, const char *pattern, seen_name **seen, int *first,
                       void (*fn)(const char *name, const lockinfo *li, void *arg), void *arg)
{
    char match[DLOCK_NAME_MAX + 256];
    scan_pattern(match, sizeof match, pattern);
    size_t plen = strlen(O.prefix);
    char cursor[32] = "0";
    do {
        /* (no TYPE filter: Redis 5 has none; the key's shape selects) */
        redisReply *r = ctl_cmd(c, "SCAN %s MATCH %s COUNT 1000", cursor, match);
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        redisReply *keys = r->element[1];
        for (size_t i = 0; i < keys->elements; i++) {
            const char *key = keys->element[i]->str;
            size_t klen = strlen(key);
            /* exactly <prefix>{<name>}, the lease hash of either protocol:
             * not a :qd hash, a record (:c:<id>), nor another prefix */
            if (klen < plen + 2 || strncmp(key, O.prefix, plen) != 0 || key[plen] != '{' ||
                key[klen - 1] != '}')
                continue;
            char name[DLOCK_NAME_MAX + 1];
            snprintf(name, sizeof name, "%.*s", (int)(klen - plen - 2), key + plen + 1);
            if (seen_before(seen, name))
                continue;
            lockinfo li;
            if (ctl_read_lock(c, name, *first, &li) == 0)
                *first = li.protocol;
            /* (over the nodes, a semaphore's claim too: its permits are
             * its slots, which dlockctl_quorum.c reads) */
            if (ctl_is_held(&li) || (O.redlock_nodes && li.semaphore))
                fn(name, &li, arg); /* (else released since the scan saw it, or,
                                       protocol 2's, kept after its release; or a
                                       semaphore with no permit in use) */
            ctl_lock_free(&li);
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
}

/* scan_locks on every master (Cluster mode) or on the server. */
void ctl_scan_all(const char *pattern,
                     void (*fn)(const char *name, const lockinfo *li, void *arg), void *arg)
{
    seen_name *seen = NULL, *s, *tmp;
    int first = DLOCK_PROTOCOL_MIN;
    if (CL) {
        dlock_cluster_node *m[DLOCK_CLUSTER_NODES_MAX];
        unsigned n = dlock_cluster_masters(CL, m, DLOCK_CLUSTER_NODES_MAX);
        for (unsigned i = 0; i < n; i++) {
            redisContext *c = ctl_conn_for_node(m[i]);
            scan_locks(c, pattern, &seen, &first, fn, arg);
            dlock_pool_put(m[i]->pool, c, c->err != 0);
        }
    } else {
        dlock_cluster_node *node;
        redisContext *c = ctl_conn_for("", &node);
        scan_locks(c, pattern, &seen, &first, fn, arg);
    }
    HASH_ITER(hh, seen, s, tmp) {
        HASH_DEL(seen, s);
        free(s);
    }
}

void ctl_scan_conn(redisContext *c, const char *pattern,
                   void (*fn)(const char *name, const lockinfo *li, void *arg), void *arg)
{
    seen_name *seen = NULL, *s, *tmp;
    int first = DLOCK_PROTOCOL_MAX;
    scan_locks(c, pattern, &seen, &first, fn, arg);
    HASH_ITER(hh, seen, s, tmp) {
        HASH_DEL(seen, s);
        free(s);
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
            ctl_die("out of memory");
        a->v = v;
        a->cap = cap;
    }
    snprintf(a->v[a->n].name, sizeof a->v[0].name, "%s", name);
    a->v[a->n].li = *li;
    a->v[a->n].li.queue = NULL; /* the caller frees them (list shows how many share it) */
    a->v[a->n].li.shared = NULL;
    a->v[a->n].li.holders = NULL;
    a->n++;
}

static int by_name(const void *x, const void *y)
{
    return strcmp(((const listed *)x)->name, ((const listed *)y)->name);
}

int ctl_list(const char *pattern)
{
    list_acc a = {NULL, 0, 0};
    ctl_scan_all(pattern, list_one, &a);
    if (a.n)
        qsort(a.v, a.n, sizeof *a.v, by_name);
    if (O.json)
        printf("[");
    else
        ctl_print_header();
    for (size_t i = 0; i < a.n; i++) {
        if (O.json) {
            printf("%s", i ? "," : "");
            ctl_print_lock_json(a.v[i].name, &a.v[i].li, 0);
        } else {
            ctl_print_row(a.v[i].name, &a.v[i].li);
        }
    }
    if (O.json)
        printf("]\n");
    free(a.v);
    return 0;
}

int ctl_show(const char *name, int watch)
{
    char k[DLOCK_NAME_MAX + 128];
    ctl_key_of(k, sizeof k, name, "");
    dlock_cluster_node *node;
    redisContext *c = ctl_conn_for(k, &node);
    lockinfo li;
    /* protocol 1 first: a name without a lease hash (never used, or
     * protocol 1's released name, whose fence and records may live) reads
     * as protocol 1's */
    if (ctl_read_lock(c, name, DLOCK_PROTOCOL_MIN, &li) != 0) {
        ctl_conn_done(c, node);
        return 0; /* (not held, for this dlockctl: exit status 1) */
    }
    char e1[4 * DLOCK_NAME_MAX + 8], e2[4 * DLOCK_CLIENT_NAME_MAX + 8];
    if (O.json) {
        ctl_print_lock_json(name, &li, 1);
        if (!li.semaphore) { /* (a semaphore has no turn: lua/p2/SEM.txt) */
            printf(",\"turn\":");
            if (li.turn[0])
                ctl_json_str(li.turn);
            else
                printf("null");
        }
        printf(",\"queue\":[");
    } else {
        if (watch) {
            char ts[32];
            time_t now = time(NULL);
            strftime(ts, sizeof ts, "%H:%M:%S", localtime(&now));
            printf("-- %s\n", ts);
        }
        if (li.semaphore) {
            if (li.permits > 0)
                printf("%s: %lld of %lld permits in use, by %lld client%s\n",
                       ctl_esc(name, e1, sizeof e1), li.permits, li.limit, li.holding,
                       li.holding == 1 ? "" : "s");
            else
                printf("%s: free\n", ctl_esc(name, e1, sizeof e1));
            for (long long i = 0; i < li.holding; i++) {
                const permit_holder *h = &li.holders[i];
                char rem[32];
                ctl_fmt_ms(rem, sizeof rem, h->remaining_ms);
                if (h->name[0])
                    printf("  held by %s (client id %s), ", ctl_esc(h->name, e2, sizeof e2),
                           h->id);
                else
                    printf("  held by client id %s, ", h->id);
                printf("%lld permit%s, %s of lease left\n", h->permits,
                       h->permits == 1 ? "" : "s", rem);
            }
            printf("  kind: semaphore\n  limit: %lld\n  permits in use: %lld\n", li.limit,
                   li.permits);
        } else if (li.held) {
            char rem[32], held[32];
            ctl_fmt_ms(rem, sizeof rem, li.remaining_ms);
            ctl_fmt_ms(held, sizeof held, li.held_for_ms);
            printf("%s: held by %s (client id %s), token %s, held for %s, %s of lease left\n",
                   ctl_esc(name, e1, sizeof e1),
                   li.holder[0] ? ctl_esc(li.holder, e2, sizeof e2) : "?", li.owner, li.token,
                   held, rem);
        } else if (li.sharing > 0) {
            printf("%s: held shared by %lld client%s\n", ctl_esc(name, e1, sizeof e1),
                   li.sharing, li.sharing == 1 ? "" : "s");
            for (long long i = 0; i < li.sharing; i++) {
                const sharer *s = &li.shared[i];
                char rem[32], held[32];
                ctl_fmt_ms(rem, sizeof rem, s->remaining_ms);
                ctl_fmt_ms(held, sizeof held, s->held_for_ms);
                printf("  shared by client id %s, token %s, held for %s, %s of lease left\n",
                       s->id, s->token, held, rem);
            }
        } else {
            printf("%s: free\n", ctl_esc(name, e1, sizeof e1));
        }
        printf("  protocol: %d\n", li.protocol);
        if (li.turn[0])
            printf("  turn: %s\n", li.turn);
        printf("  %lld waiting\n", li.waiting);
    }
    for (long long i = 0; i < li.waiting; i++) {
        const waiter *w = &li.queue[i];
        if (O.json) {
            printf("%s{\"client\":", i ? "," : "");
            ctl_json_str(w->id);
            printf(",\"name\":");
            ctl_json_str(w->name);
            if (li.semaphore)
                printf(",\"permits\":%lld", w->permits);
            else
                printf(",\"mode\":\"%s\"", w->shared ? "shared" : "exclusive");
            printf(",\"waiting_ms\":%lld,\"alive\":%s}", w->waited_ms,
                   w->alive ? "true" : "false");
        } else {
            char t[32], what[48] = "";
            ctl_fmt_ms(t, sizeof t, w->waited_ms);
            if (li.semaphore)
                snprintf(what, sizeof what, " for %lld permit%s", w->permits,
                         w->permits == 1 ? "" : "s");
            else if (w->shared)
                snprintf(what, sizeof what, " to share it");
            printf("  %2lld. %s (%.8s) waiting %s%s, %s\n", i + 1,
                   w->name[0] ? ctl_esc(w->name, e2, sizeof e2) : "?", w->id, t, what,
                   w->alive ? "alive" : "dead (skipped at the next release)");
        }
    }
    if (O.json)
        printf("]}\n");
    int held = ctl_is_held(&li);
    ctl_lock_free(&li);
    ctl_conn_done(c, node);
    fflush(stdout);
    return held;
}

static volatile sig_atomic_t interrupted;
static void on_int(int sig)
{
    (void)sig;
    interrupted = 1;
}

int ctl_watch(const char *name)
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
        if (O.redlock_nodes)
            ctl_rl_show(name, 1);
        else
            ctl_show(name, 1);
    }
    return 0;
}

