/*
 * dlockctl list, show and watch across a Redlock deployment's nodes
 * (--redlock-nodes; docs/operations.md, "Redlock"): each node is read as
 * one server is (the read script of the name's protocol, ctl_read_lock),
 * and each name is shown with what every node says (its holder's client
 * id, the node's own token, the lease left there; or free, down, not
 * seeded) and a summary: the holder a majority of the counting nodes
 * agree on, if any, and the highest token those nodes granted it.
 *
 * A node counts when its seed key ("<prefix>redlock:seed") holds the run
 * id of the server that answered (INFO server), as the library counts it
 * (src/route/redlock.h, "counts"). Each node is read in
 * its own steps: the nodes are not read at one instant, and a grant may
 * come or go between two of them.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <uthash.h>

#include "dlockctl.h"
#include "common/error.h"
#include "route/redlock.h"

/* One node of --redlock-nodes, as this command found it. */
typedef struct rl_node {
    char addr[300];       /* "host:port" as listed */
    redisContext *c;      /* NULL: down (err says why) */
    char err[300];
    int counts;           /* its seed key holds its run id */
    dlock_conn_cfg cfg;
} rl_node;

typedef struct rl_set {
    rl_node node[DLOCK_REDLOCK_NODES_MAX];
    unsigned n, m;
    dlock_counters ctr;
} rl_set;

/* The node set of --redlock-nodes, each node connected (or marked down)
 * and its seed key read; a bad list is bad usage's exit 1 (the message
 * says why, as seed-fresh's). */
static void rl_open(rl_set *s)
{
    memset(s, 0, sizeof *s);
    dlock_conn_cfg base;
    memset(&base, 0, sizeof base);
    base.protocol = 2;
    base.connect_timeout_ms = 1000;
    base.command_timeout_ms = 2000;
    dlock_redlock *rl;
    /* the set's own checks of the list (odd, 3 to 15, no address twice) */
    if (dlock_redlock_create(&base, O.redlock_nodes, O.prefix, 1000, 1, &s->ctr, &rl) != DLOCK_OK)
        ctl_die("--redlock-nodes");
    s->n = dlock_redlock_nodes(rl);
    s->m = dlock_redlock_majority(rl);
    dlock_redlock_destroy(rl);
    dlock_addr *a;
    unsigned n;
    if (dlock_addrs_parse(O.redlock_nodes, "--redlock-nodes", &a, &n) != DLOCK_OK || n != s->n)
        ctl_die("--redlock-nodes");
    char seed_key[DLOCK_PREFIX_MAX + 32];
    snprintf(seed_key, sizeof seed_key, "%sredlock:seed", O.prefix);
    for (unsigned i = 0; i < n; i++) {
        rl_node *nd = &s->node[i];
        snprintf(nd->addr, sizeof nd->addr, strchr(a[i].host, ':') ? "[%s]:%d" : "%s:%d",
                 a[i].host, a[i].port);
        nd->cfg.host = strdup(a[i].host);
        if (!nd->cfg.host)
            ctl_die("out of memory");
        nd->cfg.port = a[i].port;
        nd->cfg.username = (char *)O.user;
        nd->cfg.password = (char *)O.password;
        nd->cfg.db = O.db;
        nd->cfg.protocol = 2;
        nd->cfg.connect_timeout_ms = 1000;
        nd->cfg.command_timeout_ms = 2000;
        nd->cfg.client_name = "dlockctl";
        if (dlock_conn_open(&nd->cfg, &s->ctr, &nd->c) != DLOCK_OK) {
            nd->c = NULL;
            snprintf(nd->err, sizeof nd->err, "%s", dlock_last_error());
            continue;
        }
        redisReply *info = redisCommand(nd->c, "INFO server");
        redisReply *seed = info ? redisCommand(nd->c, "GET %s", seed_key) : NULL;
        if (!info || !seed || info->type != REDIS_REPLY_STRING) {
            snprintf(nd->err, sizeof nd->err, "reading its run id: %s",
                     nd->c->err ? nd->c->errstr
                                : info && info->type == REDIS_REPLY_ERROR ? info->str
                                                                          : "no reply");
            redisFree(nd->c);
            nd->c = NULL;
        } else {
            const char *run = strstr(info->str, "run_id:");
            size_t len = run ? strcspn(run + 7, "\r\n") : 0;
            nd->counts = run && seed->type == REDIS_REPLY_STRING && len > 0 &&
                         strlen(seed->str) == len && !strncmp(seed->str, run + 7, len);
        }
        if (info)
            freeReplyObject(info);
        if (seed)
            freeReplyObject(seed);
    }
    dlock_addrs_free(a, n);
}

static void rl_close(rl_set *s)
{
    for (unsigned i = 0; i < s->n; i++) {
        if (s->node[i].c)
            redisFree(s->node[i].c);
        free(s->node[i].cfg.host);
    }
}

static const char *state_of(const rl_node *nd)
{
    return !nd->c ? "down" : nd->counts ? "counts" : "not seeded";
}

/* One name as every node says. */
typedef struct rl_name {
    char name[DLOCK_NAME_MAX + 1];
    lockinfo li[DLOCK_REDLOCK_NODES_MAX];
    int read[DLOCK_REDLOCK_NODES_MAX]; /* li[i] holds node i's reading */
    /* the summary */
    char owner[64], holder[DLOCK_CLIENT_NAME_MAX + 1];
    unsigned agree;       /* counting nodes that hold it exclusively for owner */
    int majority;         /* agree >= m */
    long long top_token;  /* the highest token counting nodes granted owner; -1 none */
    unsigned shared;      /* counting nodes that hold it shared (shared mode) */
    long long readers;    /* the most clients one of them holds it shared for */
    /* a semaphore's (a node holds its claim, lua/p2/sem_claim.lua): */
    long long limit;      /* the claim's limit (the highest a node says), 0 none */
    unsigned permits;     /* its slots held by a majority */
    struct rl_name *slot; /* slot k read as a lock, limit of them */
} rl_name;

/* A holder's name as its client named it: without the "@<ticket>.<id>"
 * that a grant made in a wait carries (docs/design.md, "Redlock",
 * Waiting), the id the owner's (or its start, where the name was cut). */
static void strip_ticket(char *holder, const char *owner)
{
    char *at = strrchr(holder, '@');
    if (!at || !isdigit((unsigned char)at[1]))
        return;
    char *p = at + 1;
    while (isdigit((unsigned char)*p))
        p++;
    if (*p == '.' && !strncmp(p + 1, owner, strlen(p + 1)))
        *at = '\0';
}

/* Reads the lock of keys "<prefix>{<name>}<tail>..." on every node that is
 * up, and sums it up: the owner most counting nodes hold it exclusively
 * for (a majority's if any). */
static void rl_read_at(rl_set *s, const char *name, const char *tail, rl_name *x)
{
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->top_token = -1;
    for (unsigned i = 0; i < s->n; i++)
        if (s->node[i].c)
            x->read[i] = ctl_read_lock_at(s->node[i].c, name, tail, DLOCK_PROTOCOL_MAX,
                                          &x->li[i]) == 0;
    for (unsigned i = 0; i < s->n; i++)
        if (x->read[i] && x->li[i].held)
            strip_ticket(x->li[i].holder, x->li[i].owner);
    for (unsigned i = 0; i < s->n; i++) {
        if (!x->read[i] || !s->node[i].counts || !x->li[i].held)
            continue;
        unsigned k = 0;
        for (unsigned j = 0; j < s->n; j++)
            k += x->read[j] && s->node[j].counts && x->li[j].held &&
                 !strcmp(x->li[j].owner, x->li[i].owner);
        if (k > x->agree) {
            x->agree = k;
            snprintf(x->owner, sizeof x->owner, "%s", x->li[i].owner);
            snprintf(x->holder, sizeof x->holder, "%s", x->li[i].holder);
        }
    }
    x->majority = x->agree >= s->m;
    for (unsigned i = 0; i < s->n; i++)
        if (x->read[i] && s->node[i].counts && !x->li[i].held && x->li[i].sharing > 0) {
            x->shared++;
            if (x->li[i].sharing > x->readers)
                x->readers = x->li[i].sharing;
        }
    for (unsigned i = 0; x->agree && i < s->n; i++)
        if (x->read[i] && s->node[i].counts && x->li[i].held &&
            !strcmp(x->li[i].owner, x->owner) && atoll(x->li[i].token) > x->top_token)
            x->top_token = atoll(x->li[i].token);
}

/* rl_read_at of the name; a semaphore's (a node holds its claim) with
 * each of its slots too, "<prefix>{<name>}:s<k>..." (src/route/redlock.h,
 * dlock_redlock_slot_keys). */
static void rl_read(rl_set *s, const char *name, rl_name *x)
{
    rl_read_at(s, name, "", x);
    for (unsigned i = 0; i < s->n; i++)
        if (x->read[i] && x->li[i].semaphore && x->li[i].limit > x->limit)
            x->limit = x->li[i].limit;
    if (x->limit > DLOCK_REDLOCK_SEM_MAX)
        x->limit = DLOCK_REDLOCK_SEM_MAX;
    if (!x->limit)
        return;
    x->slot = calloc((size_t)x->limit, sizeof *x->slot);
    if (!x->slot)
        ctl_die("out of memory");
    for (long long k = 0; k < x->limit; k++) {
        char tail[32];
        snprintf(tail, sizeof tail, ":s%lld", k);
        rl_read_at(s, name, tail, &x->slot[k]);
        x->permits += x->slot[k].majority;
    }
}

static void rl_free(rl_set *s, rl_name *x)
{
    for (unsigned i = 0; i < s->n; i++)
        if (x->read[i])
            ctl_lock_free(&x->li[i]);
    for (long long k = 0; x->slot && k < x->limit; k++)
        rl_free(s, &x->slot[k]);
    free(x->slot);
}

/* What node i says of the name, for the text form. */
static void node_says(const rl_node *nd, const lockinfo *li, int read, char *out, size_t n)
{
    char e[4 * DLOCK_CLIENT_NAME_MAX + 8], rem[32];
    if (!nd->c) {
        snprintf(out, n, "(%s)", nd->err);
    } else if (!read) {
        snprintf(out, n, "data of a protocol this dlockctl does not speak");
    } else if (li->semaphore) {
        /* (over the nodes, a semaphore's name holds its claim: its
         * permits are its slots, below) */
        snprintf(out, n, "a semaphore's claim, limit %lld", li->limit);
    } else if (li->held) {
        ctl_fmt_ms(rem, sizeof rem, li->remaining_ms);
        snprintf(out, n, "held by %s (client id %s), token %s, %s of lease left",
                 li->holder[0] ? ctl_esc(li->holder, e, sizeof e) : "?", li->owner, li->token,
                 rem);
    } else if (li->sharing > 0) {
        snprintf(out, n, "held shared by %lld client%s", li->sharing,
                 li->sharing == 1 ? "" : "s");
    } else {
        snprintf(out, n, "free");
    }
}

static void print_text(rl_set *s, const rl_name *x)
{
    char e1[4 * DLOCK_NAME_MAX + 8], e2[4 * DLOCK_CLIENT_NAME_MAX + 8], line[800];
    if (x->limit)
        printf("%s: a semaphore of limit %lld, %u of its slots held by a majority (permits in "
               "use)\n",
               ctl_esc(x->name, e1, sizeof e1), x->limit, x->permits);
    else if (x->majority)
        printf("%s: held by %s (client id %s) on %u of %u nodes, a majority; highest token "
               "%lld\n",
               ctl_esc(x->name, e1, sizeof e1),
               x->holder[0] ? ctl_esc(x->holder, e2, sizeof e2) : "?", x->owner, x->agree, s->n,
               x->top_token);
    else if (x->shared >= s->m)
        printf("%s: held shared on %u of %u nodes, a majority (up to %lld client%s on one)\n",
               ctl_esc(x->name, e1, sizeof e1), x->shared, s->n, x->readers,
               x->readers == 1 ? "" : "s");
    else if (x->agree)
        printf("%s: no majority holder (client id %s holds it on %u of %u nodes, %u needed)\n",
               ctl_esc(x->name, e1, sizeof e1), x->owner, x->agree, s->n, s->m);
    else
        printf("%s: no majority holder (no counting node holds it, %u of %u needed)\n",
               ctl_esc(x->name, e1, sizeof e1), s->m, s->n);
    for (unsigned i = 0; i < s->n; i++) {
        node_says(&s->node[i], &x->li[i], x->read[i], line, sizeof line);
        printf("  %-22s %-10s %s\n", s->node[i].addr, state_of(&s->node[i]), line);
    }
    for (long long k = 0; k < x->limit; k++) {
        const rl_name *y = &x->slot[k];
        if (y->majority)
            printf("  slot %lld: held by %s (client id %s) on %u of %u nodes\n", k,
                   y->holder[0] ? ctl_esc(y->holder, e2, sizeof e2) : "?", y->owner, y->agree,
                   s->n);
        else if (y->agree)
            printf("  slot %lld: no majority holder (client id %s holds it on %u of %u nodes)\n",
                   k, y->owner, y->agree, s->n);
        else
            printf("  slot %lld: free\n", k);
    }
}

static void print_json(rl_set *s, const rl_name *x)
{
    printf("{\"name\":");
    ctl_json_str(x->name);
    printf(",\"kind\":\"redlock\",\"majority\":%u,\"held\":%s,\"owner\":", s->m,
           x->majority ? "true" : "false");
    if (x->majority)
        ctl_json_str(x->owner);
    else
        printf("null");
    printf(",\"holder_name\":");
    if (x->majority)
        ctl_json_str(x->holder);
    else
        printf("null");
    printf(",\"agree\":%u,\"highest_token\":", x->agree);
    if (x->majority)
        printf("%lld", x->top_token);
    else
        printf("null");
    printf(",\"shared_nodes\":%u,\"nodes\":[", x->shared);
    for (unsigned i = 0; i < s->n; i++) {
        const rl_node *nd = &s->node[i];
        printf("%s{\"node\":", i ? "," : "");
        ctl_json_str(nd->addr);
        printf(",\"state\":\"%s\",\"counts\":%s", state_of(nd), nd->counts ? "true" : "false");
        if (!nd->c) {
            printf(",\"error\":");
            ctl_json_str(nd->err);
        } else if (x->read[i]) {
            printf(",\"lock\":");
            ctl_print_lock_json(x->name, &x->li[i], 0);
        } else {
            printf(",\"lock\":null");
        }
        printf("}");
    }
    printf("],\"semaphore\":");
    if (!x->limit) {
        printf("null}");
        return;
    }
    printf("{\"limit\":%lld,\"permits\":%u,\"slots\":[", x->limit, x->permits);
    for (long long k = 0; k < x->limit; k++) {
        const rl_name *y = &x->slot[k];
        printf("%s{\"slot\":%lld,\"held\":%s,\"owner\":", k ? "," : "", k,
               y->majority ? "true" : "false");
        if (y->majority)
            ctl_json_str(y->owner);
        else
            printf("null");
        printf(",\"holder_name\":");
        if (y->majority)
            ctl_json_str(y->holder);
        else
            printf("null");
        printf(",\"agree\":%u}", y->agree);
    }
    printf("]}}");
}

/* The names, for list: held on any node, each once. */
typedef struct rl_seen {
    UT_hash_handle hh;
    char name[];
} rl_seen;

static void collect(const char *name, const lockinfo *li, void *arg)
{
    (void)li;
    rl_seen **seen = arg, *e;
    size_t n = strlen(name);
    HASH_FIND(hh, *seen, name, n, e);
    if (e)
        return;
    e = malloc(sizeof *e + n + 1);
    if (!e)
        ctl_die("out of memory");
    memcpy(e->name, name, n + 1);
    HASH_ADD_KEYPTR(hh, *seen, e->name, n, e);
}

static int by_name(const void *x, const void *y)
{
    return strcmp(*(char *const *)x, *(char *const *)y);
}

int ctl_rl_list(const char *pattern)
{
    rl_set s;
    rl_open(&s);
    rl_seen *seen = NULL, *e, *tmp;
    for (unsigned i = 0; i < s.n; i++)
        if (s.node[i].c)
            ctl_scan_conn(s.node[i].c, pattern, collect, &seen);
    size_t n = HASH_COUNT(seen), k = 0;
    char **names = calloc(n ? n : 1, sizeof *names);
    if (!names)
        ctl_die("out of memory");
    HASH_ITER(hh, seen, e, tmp) names[k++] = e->name;
    qsort(names, n, sizeof *names, by_name);
    if (O.json) {
        printf("[");
    } else {
        printf("nodes (%u needed):", s.m);
        for (unsigned i = 0; i < s.n; i++)
            printf(" %s %s%s", s.node[i].addr, state_of(&s.node[i]), i + 1 < s.n ? "," : "\n");
    }
    rl_name *x = malloc(sizeof *x);
    if (!x)
        ctl_die("out of memory");
    for (size_t i = 0; i < n; i++) {
        rl_read(&s, names[i], x);
        if (O.json) {
            printf("%s", i ? "," : "");
            print_json(&s, x);
        } else {
            print_text(&s, x);
        }
        rl_free(&s, x);
    }
    if (O.json)
        printf("]\n");
    free(x);
    free(names);
    HASH_ITER(hh, seen, e, tmp) {
        HASH_DEL(seen, e);
        free(e);
    }
    rl_close(&s);
    return 0;
}

int ctl_rl_show(const char *name, int watch)
{
    rl_set s;
    rl_open(&s);
    rl_name *x = malloc(sizeof *x);
    if (!x)
        ctl_die("out of memory");
    rl_read(&s, name, x);
    if (O.json) {
        print_json(&s, x);
        printf("\n");
    } else {
        if (watch) {
            char ts[32];
            time_t now = time(NULL);
            strftime(ts, sizeof ts, "%H:%M:%S", localtime(&now));
            printf("-- %s\n", ts);
        }
        print_text(&s, x);
    }
    int held = x->majority || x->shared >= s.m || x->permits > 0;
    rl_free(&s, x);
    free(x);
    rl_close(&s);
    fflush(stdout);
    return held;
}
