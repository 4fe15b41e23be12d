/*
 * Redlock's node set: the set, its node records, the pipelined steps the
 * other parts run on it, the refresh and the server check of a node (see
 * redlock.h for the rule, the invariants and the lock order; the parts:
 * redlock_seed.c, redlock_grant.c, redlock_renew.c; their shared state:
 * redlock_int.h). The calls to the nodes of one step are pipelined: one
 * connection checked out per node, every request appended and flushed,
 * then every reply read by one deadline; no thread per node.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "route/redlock_int.h"

const dlock_conn_cfg *dlock_redlock_node_cfg(const dlock_redlock *rl, unsigned i)
{
    return i < rl->n ? &rl->node[i].cfg : NULL;
}

unsigned dlock_redlock_nodes(const dlock_redlock *rl)
{
    return rl->n;
}

unsigned dlock_redlock_majority(const dlock_redlock *rl)
{
    return rl->m;
}

int64_t dlock_redlock_drift_ns(const dlock_redlock *rl)
{
    return rl->drift_ns;
}

void dlock_redlock_destroy(dlock_redlock *rl)
{
    if (!rl)
        return;
    for (unsigned i = 0; i < rl->n; i++) {
        dlock_pool_destroy(rl->node[i].pool);
        free(rl->node[i].cfg.host);
        free(rl->node[i].conns);
    }
    pthread_mutex_destroy(&rl->mu);
    free(rl->prefix);
    free(rl->seed_key);
    free(rl->hw_match);
    free(rl->any_match);
    free(rl->hw_any);
    free(rl);
}

/* prefix with SCAN's glob characters escaped, then tail (a pattern) */
static char *glob_pattern(const char *prefix, const char *tail)
{
    char *p = malloc(2 * strlen(prefix) + strlen(tail) + 1);
    if (!p)
        return NULL;
    char *o = p;
    for (const char *s = prefix; *s; s++) {
        if (strchr("*?[]\\", *s))
            *o++ = '\\';
        *o++ = *s;
    }
    strcpy(o, tail);
    return p;
}

static char *concat(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (s) {
        memcpy(s, a, la);
        memcpy(s + la, b, lb + 1);
    }
    return s;
}

static void node_saw_info(void *arg, const redisContext *c, const char *info);

int dlock_redlock_create(const dlock_conn_cfg *base, const char *nodes, const char *prefix,
                         uint32_t lease_ms, unsigned pool_size, dlock_counters *ctr,
                         dlock_redlock **out)
{
    *out = NULL;
    if (base->protocol != 2)
        return dlock_err_set(DLOCK_EINVAL, "redlock_nodes: Redlock runs protocol 2's scripts "
                             "(protocol is %d)", base->protocol);
    if (lease_ms < 10)
        return dlock_err_set(DLOCK_EINVAL, "redlock: a lease of %" PRIu32 " ms is too short "
                             "(at least 10 ms)", lease_ms);
    dlock_addr *a;
    unsigned n;
    int rc = dlock_addrs_parse(nodes, "redlock_nodes", &a, &n);
    if (rc != DLOCK_OK)
        return rc;
    if (n < 3 || n % 2 == 0 || n > DLOCK_REDLOCK_NODES_MAX) {
        dlock_addrs_free(a, n);
        return dlock_err_set(DLOCK_EINVAL, "redlock_nodes: %u nodes; Redlock needs an odd number "
                             "of independent masters, at least 3 and at most %d", n,
                             DLOCK_REDLOCK_NODES_MAX);
    }
    /* the same address twice would be one server with two votes (the same
     * server under two names is caught later: two nodes that report one run
     * id do not both count) */
    for (unsigned i = 0; i < n; i++)
        for (unsigned j = 0; j < i; j++)
            if (a[i].port == a[j].port && strcmp(a[i].host, a[j].host) == 0) {
                rc = dlock_err_set(DLOCK_EINVAL, "redlock_nodes: %s:%d is listed twice; Redlock "
                                   "needs independent masters", a[i].host, a[i].port);
                dlock_addrs_free(a, n);
                return rc;
            }
    dlock_redlock *rl = calloc(1, sizeof *rl);
    if (!rl) {
        dlock_addrs_free(a, n);
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&rl->mu, NULL);
    rl->floor_margin_us = DLOCK_REDLOCK_FLOOR_MIN_US;
    DLOCK_LOCKSTAT_NAME(&rl->mu, "redlock");
    rl->ctr = ctr;
    rl->n = n;
    rl->m = n / 2 + 1;
    rl->lease_ms = lease_ms;
    rl->lease_ns = (int64_t)lease_ms * DLOCK_NS_PER_MS;
    rl->drift_ns = rl->lease_ns / 100 + 2 * DLOCK_NS_PER_MS;
    snprintf(rl->lease_str, sizeof rl->lease_str, "%" PRIu32, lease_ms);
    rl->prefix = strdup(prefix);
    rl->seed_key = concat(prefix, "redlock:seed");
    rl->hw_match = glob_pattern(prefix, "hw:{*}");
    rl->any_match = glob_pattern(prefix, "*");
    rl->hw_any = concat(prefix, "hw:{0}");
    rl->pool_size = pool_size ? pool_size : 1;
    int ok = rl->prefix && rl->seed_key && rl->hw_match && rl->any_match && rl->hw_any;
    for (unsigned i = 0; ok && i < n; i++) {
        rl_node *nd = &rl->node[i];
        nd->cfg = *base;
        nd->cfg.cluster = NULL;
        nd->cfg.route = NULL;
        nd->cfg.sentinels = NULL;
        nd->cfg.nsentinels = 0;
        nd->cfg.unix_path = NULL;
        nd->cfg.host = strdup(a[i].host);
        nd->cfg.port = a[i].port;
        snprintf(nd->addr, sizeof nd->addr, "%s:%d", a[i].host, a[i].port);
        nd->set = rl;
        nd->idx = i;
        nd->cfg.saw_info = node_saw_info;
        nd->cfg.saw_info_arg = nd;
        /* room for the pool's connections, the subscriber's and a
         * release's own (they record here too) */
        nd->nconns = 4 * rl->pool_size + 16;
        nd->conns = calloc(nd->nconns, sizeof nd->conns[0]);
        nd->pool = nd->cfg.host && nd->conns ? dlock_pool_create(&nd->cfg, pool_size, ctr) : NULL;
        ok = nd->pool != NULL;
    }
    dlock_addrs_free(a, n);
    if (!ok) {
        dlock_redlock_destroy(rl);
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    }
    *out = rl;
    return DLOCK_OK;
}

/* ------------------------------------------------------------------ */
/* The node records. */

/* Records that node i's server has run id run (a connection's INFO said
 * so): a run id not seen before starts its count now. */
static void saw_run(dlock_redlock *rl, unsigned i, const char *run)
{
    if (!run[0])
        return;
    rl_node *nd = &rl->node[i];
    pthread_mutex_lock(&rl->mu);
    if (strcmp(nd->run, run) != 0) {
        snprintf(nd->run, sizeof nd->run, "%s", run);
        nd->seen_boot = dlock_boot_ns();
        nd->seeded = 0;
    }
    pthread_mutex_unlock(&rl->mu);
}

/* The run id in INFO's text into run ("" if none). */
static void parse_run_text(const char *info, char *run)
{
    run[0] = '\0';
    const char *s = info ? strstr(info, "run_id:") : NULL;
    if (!s)
        return;
    s += 7;
    size_t k = 0;
    while (k < RUN_ID_MAX - 1 && ((s[k] >= '0' && s[k] <= '9') || (s[k] >= 'a' && s[k] <= 'f')))
        k++;
    memcpy(run, s, k);
    run[k] = '\0';
}

/* The two entries of node nd's table where connection c may be (a
 * two-way cache by address: a connection that fell out of it, or never
 * got in, reads INFO again). */
static unsigned conn_slot(const rl_node *nd, const redisContext *c)
{
    uintptr_t h = (uintptr_t)c;
    h ^= h >> 17;
    h *= (uintptr_t)0x9e3779b97f4a7c15ULL;
    return (unsigned)((h >> 8) % (nd->nconns - 1));
}

/* Records that connection c of node i reached run id run (its setup's INFO,
 * or an INFO read on it later). */
static void conn_saw_run(dlock_redlock *rl, unsigned i, const redisContext *c, const char *run)
{
    rl_node *nd = &rl->node[i];
    unsigned k = conn_slot(nd, c);
    pthread_mutex_lock(&rl->mu);
    if (nd->conns[k].c != c && nd->conns[k].c) {
        if (nd->conns[k + 1].c == c || !nd->conns[k + 1].c) {
            k++;
        } else {
            nd->next ^= 1; /* both taken by others: one of them goes, in turn */
            k += nd->next;
        }
    }
    nd->conns[k].c = c;
    snprintf(nd->conns[k].run, sizeof nd->conns[k].run, "%s", run);
    pthread_mutex_unlock(&rl->mu);
}

/* The run id connection c of node i reached, into run: 1, or 0 if not known,
 * or not the node's record's (the record was last set from another run:
 * an INFO read on c sets it right, dlock_rl_append_one). */
static int conn_run(dlock_redlock *rl, unsigned i, const redisContext *c, char *run)
{
    rl_node *nd = &rl->node[i];
    unsigned k = conn_slot(nd, c);
    int found = 0;
    pthread_mutex_lock(&rl->mu);
    for (unsigned j = k; j <= k + 1 && !found; j++)
        if (nd->conns[j].c == c && nd->conns[j].run[0] && strcmp(nd->conns[j].run, nd->run) == 0) {
            memcpy(run, nd->conns[j].run, RUN_ID_MAX);
            found = 1;
        }
    pthread_mutex_unlock(&rl->mu);
    return found;
}

/* A new connection's setup read INFO (conn.h, saw_info): its run id is
 * seen, and kept for the connection's life. */
static void node_saw_info(void *arg, const redisContext *c, const char *info)
{
    rl_node *nd = arg;
    char run[RUN_ID_MAX];
    parse_run_text(info, run);
    saw_run(nd->set, nd->idx, run);
    conn_saw_run(nd->set, nd->idx, c, run); /* ("": not known, an entry of c's
                                               address before forgotten) */
}

/* (redlock_int.h) */
int dlock_rl_counts_now(dlock_redlock *rl, unsigned i, const char *run, const char *seed,
                        int64_t at)
{
    (void)at;
    rl_node *nd = &rl->node[i];
    if (!run[0])
        return 0;
    pthread_mutex_lock(&rl->mu);
    int same = strcmp(nd->run, run) == 0;
    if (same)
        nd->seeded = strcmp(seed, run) == 0;
    int c = same && nd->seeded;
    pthread_mutex_unlock(&rl->mu);
    return c;
}

int dlock_redlock_counts(dlock_redlock *rl, unsigned i)
{
    if (i >= rl->n)
        return 0;
    rl_node *nd = &rl->node[i];
    pthread_mutex_lock(&rl->mu);
    int c = nd->run[0] && nd->seeded;
    pthread_mutex_unlock(&rl->mu);
    return c;
}

/* ------------------------------------------------------------------ */
/* Steps: every node's connection, pipelined calls, replies by a deadline. */

/* (redlock_int.h) */
void dlock_rl_peer_fail(peer *p, const char *fmt, const char *what)
{
    if (p->failed)
        return;
    p->failed = 1;
    snprintf(p->why, sizeof p->why, fmt, what);
}

/* (redlock_int.h) */
void dlock_rl_peer_broke(peer *p, const char *fmt, const char *what)
{
    p->broken = 1;
    dlock_rl_peer_fail(p, fmt, what);
}

/* (redlock_int.h) */
int dlock_rl_same_run(const dlock_redlock *rl, const peer *p, unsigned i)
{
    if (!p[i].run[0])
        return -1;
    for (unsigned j = 0; j < i && j < rl->n; j++)
        if (strcmp(p[j].run, p[i].run) == 0)
            return (int)j;
    return -1;
}

/* 1 if c failed because it was closed or reset under the exchange (an idle
 * timeout, a restart): another connection may succeed. */
static int conn_was_closed(const redisContext *c)
{
    return c->err == REDIS_ERR_EOF ||
           (c->err == REDIS_ERR_IO &&
            (strstr(c->errstr, "reset") || strstr(c->errstr, "Broken pipe")));
}

/* (redlock_int.h) */
void dlock_rl_peers_open(dlock_redlock *rl, peer *p, int64_t deadline)
{
    for (unsigned i = 0; i < rl->n; i++) {
        p[i].rep = NULL;
        if (p[i].failed || p[i].c)
            continue;
        p[i].used = 0;
        int rc = dlock_pool_get(rl->node[i].pool, deadline, &p[i].c);
        if (rc != DLOCK_OK) {
            p[i].c = NULL;
            p[i].unreach = rc != DLOCK_ETIMEDOUT; /* (not the caller's deadline) */
            dlock_rl_peer_fail(&p[i], "unreachable: %s", dlock_last_error());
        }
    }
}

/* (redlock_int.h) */
void dlock_rl_peers_open_up(dlock_redlock *rl, peer *p, int64_t deadline)
{
    int64_t now = dlock_now_ns();
    pthread_mutex_lock(&rl->mu);
    for (unsigned i = 0; i < rl->n; i++)
        if (!p[i].failed && !p[i].c && now < rl->node[i].down_until)
            dlock_rl_peer_fail(&p[i], "%s", "down: it did not answer an exchange of the last "
                               "second, not asked again yet");
        else
            p[i].judge = 1;
    pthread_mutex_unlock(&rl->mu);
    dlock_rl_peers_open(rl, p, deadline);
}

/* (redlock_int.h) */
void dlock_rl_judge(dlock_redlock *rl, peer *p, int64_t deadline)
{
    int64_t whole = (int64_t)rl->node[0].cfg.command_timeout_ms * DLOCK_NS_PER_MS;
    if (deadline - dlock_now_ns() >= whole - whole / 10)
        return;
    for (unsigned i = 0; i < rl->n; i++)
        p[i].judge = 0;
}

/* (redlock_int.h) */
void dlock_rl_peers_close(dlock_redlock *rl, peer *p)
{
    int64_t now = dlock_now_ns();
    int64_t skip = (int64_t)(rl->lease_ms / 3 < DLOCK_REDLOCK_DOWN_MS ? rl->lease_ms / 3
                                                                      : DLOCK_REDLOCK_DOWN_MS) *
                   DLOCK_NS_PER_MS;
    pthread_mutex_lock(&rl->mu);
    for (unsigned i = 0; i < rl->n; i++) {
        if (p[i].used && !p[i].broken)
            rl->node[i].down_until = 0;
        else if (p[i].judge && (p[i].broken || p[i].unreach))
            rl->node[i].down_until = now + skip;
    }
    pthread_mutex_unlock(&rl->mu);
    for (unsigned i = 0; i < rl->n; i++) {
        if (p[i].c)
            dlock_pool_put(rl->node[i].pool, p[i].c, p[i].broken);
        p[i].c = NULL;
        if (p[i].rep)
            freeReplyObject(p[i].rep);
        p[i].rep = NULL;
    }
}

/* The run id in INFO server's text into run ("" if none). */
static void parse_run(const redisReply *r, char *run)
{
    parse_run_text(r && r->type == REDIS_REPLY_STRING ? r->str : NULL, run);
}

/* (redlock_int.h) */
int dlock_rl_append_one(dlock_redlock *rl, unsigned i, peer *p, int info, dlock_script_id id,
                        int eval, int nkeys, int nargs, const char **argv, int get_seed)
{
    redisContext *c = p->c;
    p->info_sent = 0;
    if (info && conn_run(rl, i, c, p->run))
        info = 0;
    if (info) {
        p->info_sent = 1;
        const char *v[] = {"INFO", "server"};
        if (redisAppendCommandArgv(c, 2, v, NULL) != REDIS_OK)
            return -1;
        dlock_count(&rl->ctr->redis_commands, 1);
    }
    if (get_seed) {
        const char *v[] = {"GET", rl->seed_key};
        if (redisAppendCommandArgv(c, 2, v, NULL) != REDIS_OK)
            return -1;
        dlock_count(&rl->ctr->redis_commands, 1);
    }
    if (dlock_conn_append_eval(c, rl->ctr, id, !eval, nkeys, nargs, argv, NULL) != 0)
        return -1;
    return 0;
}

/* Reads peer i's replies to dlock_rl_append_one by deadline: 1 if the script
 * answered NOSCRIPT (send again with EVAL), 0, or -1 (failed). */
static int read_one(dlock_redlock *rl, unsigned i, peer *p, int info, int get_seed,
                    int64_t deadline)
{
    redisReply *r = NULL;
    if (info && p->info_sent) {
        if (dlock_conn_read(p->c, deadline, &r) != 0)
            return -1;
        p->used = 1;
        parse_run(r, p->run);
        freeReplyObject(r);
        saw_run(rl, i, p->run);
        conn_saw_run(rl, i, p->c, p->run);
    }
    if (get_seed) {
        if (dlock_conn_read(p->c, deadline, &r) != 0)
            return -1;
        p->used = 1;
        snprintf(p->seed, sizeof p->seed, "%s", r->type == REDIS_REPLY_STRING ? r->str : "");
        freeReplyObject(r);
    }
    if (dlock_conn_read(p->c, deadline, &r) != 0)
        return -1;
    p->used = 1;
    int noscript = dlock_conn_is_noscript(r);
    if (p->rep)
        freeReplyObject(p->rep);
    p->rep = r;
    return noscript;
}

/* Sends peer i its requests again with EVAL after a NOSCRIPT (the seed
 * key read again before it: the same order as the first send), and reads
 * the replies by deadline. 0 or -1 (p broke). */
static int resend_eval(dlock_redlock *rl, unsigned i, peer *p, dlock_script_id id, int nkeys,
                       int nargs, const char **argv, int get_seed, int64_t deadline)
{
    dlock_count(&rl->ctr->redis_round_trips, 1);
    if (dlock_rl_append_one(rl, i, p, 0, id, 1, nkeys, nargs, argv, get_seed) != 0) {
        dlock_rl_peer_broke(p, "%s", "out of memory");
        return -1;
    }
    if (dlock_conn_flush(p->c, deadline) != 0 || read_one(rl, i, p, 0, get_seed, deadline) < 0) {
        dlock_rl_peer_broke(p, "%s", p->c->errstr);
        return -1;
    }
    return 0;
}

/* (redlock_int.h) */
void dlock_rl_retry_fresh(dlock_redlock *rl, unsigned i, peer *p, int info, dlock_script_id id,
                          int nkeys, int nargs, const char **argv, int get_seed, int64_t deadline)
{
    for (unsigned t = 0; t <= rl->pool_size; t++) {
        char err[200];
        snprintf(err, sizeof err, "%s", p->c->errstr);
        dlock_pool_put(rl->node[i].pool, p->c, 1);
        p->c = NULL;
        if (dlock_pool_get(rl->node[i].pool, deadline, &p->c) != DLOCK_OK) {
            p->c = NULL;
            dlock_rl_peer_fail(p, "unreachable: %s", dlock_last_error());
            return;
        }
        p->used = 0;
        dlock_count(&rl->ctr->redis_round_trips, 1);
        if (dlock_rl_append_one(rl, i, p, info, id, 0, nkeys, nargs, argv, get_seed) != 0) {
            dlock_rl_peer_broke(p, "%s", "out of memory");
            return;
        }
        int r = -1;
        if (dlock_conn_flush(p->c, deadline) == 0)
            r = read_one(rl, i, p, info, get_seed, deadline);
        if (r == 1) {
            resend_eval(rl, i, p, id, nkeys, nargs, argv, get_seed, deadline);
            return;
        }
        if (r == 0)
            return;
        if (p->used || !conn_was_closed(p->c)) {
            dlock_rl_peer_broke(p, "%s", p->c->errstr);
            return;
        }
    }
    dlock_rl_peer_broke(p, "%s", p->c->errstr);
}

/* (redlock_int.h) */
void dlock_rl_peers_call_each(dlock_redlock *rl, peer *p, const int *only, int info,
                              dlock_script_id id, int nkeys, int nargs, const char **const *argv,
                            int get_seed, int64_t deadline)
{
    int again[DLOCK_REDLOCK_NODES_MAX] = {0}, retry[DLOCK_REDLOCK_NODES_MAX] = {0}, any = 0;
#define IN(i) (!p[i].failed && p[i].c && (!only || only[i]))
    for (unsigned i = 0; i < rl->n; i++) {
        if (!IN(i))
            continue;
        if (dlock_rl_append_one(rl, i, &p[i], info, id, 0, nkeys, nargs, argv[i], get_seed) != 0)
            dlock_rl_peer_broke(&p[i], "%s", "out of memory");
        else
            any = 1;
    }
    if (!any)
        return;
    dlock_count(&rl->ctr->redis_round_trips, 1);
    for (unsigned i = 0; i < rl->n; i++) {
        if (!IN(i))
            continue;
        p[i].sent = 1; /* (even a failed flush may have sent a part) */
        if (dlock_conn_flush(p[i].c, deadline) != 0) {
            if (!p[i].used && conn_was_closed(p[i].c))
                retry[i] = 1;
            else
                dlock_rl_peer_broke(&p[i], "%s", p[i].c->errstr);
        }
    }
    for (unsigned i = 0; i < rl->n; i++) {
        if (!IN(i) || retry[i])
            continue;
        int fresh = !p[i].used;
        int r = read_one(rl, i, &p[i], info, get_seed, deadline);
        if (r < 0) {
            if (fresh && !p[i].used && conn_was_closed(p[i].c))
                retry[i] = 1;
            else
                dlock_rl_peer_broke(&p[i], "%s", p[i].c->errstr);
        } else if (r == 1) {
            again[i] = 1;
            dlock_count(&rl->ctr->redis_round_trips, 1);
            if (dlock_rl_append_one(rl, i, &p[i], 0, id, 1, nkeys, nargs, argv[i], get_seed) != 0)
                dlock_rl_peer_broke(&p[i], "%s", "out of memory");
            else if (dlock_conn_flush(p[i].c, deadline) != 0)
                dlock_rl_peer_broke(&p[i], "%s", p[i].c->errstr);
        }
    }
    for (unsigned i = 0; i < rl->n; i++)
        if (again[i] && IN(i) && read_one(rl, i, &p[i], 0, get_seed, deadline) < 0)
            dlock_rl_peer_broke(&p[i], "%s", p[i].c->errstr);
    for (unsigned i = 0; i < rl->n; i++)
        if (retry[i] && IN(i))
            dlock_rl_retry_fresh(rl, i, &p[i], info, id, nkeys, nargs, argv[i], get_seed, deadline);
#undef IN
}

/* (redlock_int.h) */
void dlock_rl_peers_call(dlock_redlock *rl, peer *p, const int *only, int info, dlock_script_id id,
                         int nkeys, int nargs, const char **argv, int get_seed, int64_t deadline)
{
    const char **each[DLOCK_REDLOCK_NODES_MAX];
    for (unsigned i = 0; i < rl->n; i++)
        each[i] = argv;
    dlock_rl_peers_call_each(rl, p, only, info, id, nkeys, nargs, (const char **const *)each,
                             get_seed,
                             deadline);
}

/* (redlock_int.h) */
int64_t dlock_rl_step_deadline(dlock_redlock *rl, int64_t caller)
{
    int64_t d = dlock_conn_deadline(rl->node[0].cfg.command_timeout_ms);
    return caller < d ? caller : d;
}

/* (redlock_int.h) */
void dlock_rl_why_not(dlock_redlock *rl, unsigned i, const peer *ps, char *out, size_t size)
{
    rl_node *nd = &rl->node[i];
    const peer *p = &ps[i];
    if (p->failed) {
        snprintf(out, size, "%s %s", nd->addr, p->why);
        return;
    }
    int j = dlock_rl_same_run(rl, ps, i);
    if (j >= 0) {
        snprintf(out, size, "%s reports the run id of %s (one server listed twice?): counted "
                 "once", nd->addr, rl->node[j].addr);
        return;
    }
    snprintf(out, size, "%s not seeded in its run %.12s (restarted?)", nd->addr, p->run);
}

/* ------------------------------------------------------------------ */
/* Refresh, and the server check of a node. */

int dlock_redlock_refresh(dlock_redlock *rl, int64_t deadline)
{
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    dlock_rl_peers_open(rl, p, deadline);
    int64_t d = dlock_rl_step_deadline(rl, deadline);
    /* mark.lua with token 0 writes nothing and replies with the seed key */
    const char *argv[] = {rl->hw_any, rl->seed_key, "0", ""};
    int64_t at = dlock_boot_ns();
    dlock_rl_peers_call(rl, p, NULL, 1, DLOCK_SCRIPT_MARK, 2, 2, argv, 1, d);
    char msg[600] = "";
    size_t len = 0;
    for (unsigned i = 0; i < rl->n; i++) {
        if (!p[i].failed)
            dlock_rl_counts_now(rl, i, p[i].run, p[i].seed, at);
        else if (len < sizeof msg)
            len += (size_t)snprintf(msg + len, sizeof msg - len, "%s%s %s", len ? "; " : "",
                                    rl->node[i].addr, p[i].why);
    }
    dlock_rl_peers_close(rl, p);
    return msg[0] ? dlock_err_set(DLOCK_EREDIS, "redlock: %s", msg) : DLOCK_OK;
}

int dlock_redlock_check_node(dlock_redlock *rl, unsigned i, int64_t deadline)
{
    rl_node *nd = &rl->node[i];
    char why[400];
    redisContext *c;
    /* A connection of its own, opened within the time left (half of it
     * for the connect and its checks, dlock_conn_open: a new connection
     * is checked as it opens), not the pool's, whose connections open
     * with the full timeouts: a stopped node's check ends by the
     * deadline. */
    int64_t left_ms = (deadline - dlock_now_ns()) / DLOCK_NS_PER_MS;
    if (left_ms < 2)
        return dlock_err_set(DLOCK_EREDIS, "redlock node %s: no time left for its check",
                             nd->addr);
    dlock_conn_cfg cfg = nd->cfg;
    if (cfg.connect_timeout_ms > left_ms / 2)
        cfg.connect_timeout_ms = (uint32_t)(left_ms / 2);
    if (cfg.command_timeout_ms > left_ms / 2)
        cfg.command_timeout_ms = (uint32_t)(left_ms / 2);
    int rc = dlock_conn_open(&cfg, rl->ctr, &c);
    if (rc != DLOCK_OK) {
        snprintf(why, sizeof why, "%s", dlock_last_error());
        return dlock_err_set(rc == DLOCK_ESERVER ? DLOCK_ESERVER : DLOCK_EREDIS,
                             "redlock node %s: %s", nd->addr, why);
    }
    const char *argv[1] = {"INFO"};
    int64_t left = (deadline - dlock_now_ns()) / DLOCK_NS_PER_MS;
    uint32_t t = nd->cfg.command_timeout_ms;
    if (left < (int64_t)t)
        t = left > 1 ? (uint32_t)left : 1;
    redisReply *r = dlock_conn_command(c, rl->ctr, t, 1, argv);
    if (!r || (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS)) {
        snprintf(why, sizeof why, "%s", !r ? c->errstr : r->type == REDIS_REPLY_ERROR ? r->str
                                                                                   : "no text");
        rc = dlock_err_set(DLOCK_EREDIS, "redlock node %s: INFO: %s", nd->addr, why);
    } else if ((rc = dlock_conn_check_info(r->str, 2)) != DLOCK_OK) {
        snprintf(why, sizeof why, "%s", dlock_last_error());
        rc = dlock_err_set(rc, "redlock node %s: %s", nd->addr, why);
    }
    redisFree(c);
    if (r)
        freeReplyObject(r);
    return rc;
}

void dlock_redlock_slots_text(const dlock_redlock_slots *h, char *out, size_t size)
{
    size_t at = 0;
    out[0] = '\0';
    for (unsigned i = 0; h && i < h->n && at < size; i++)
        at += (size_t)snprintf(out + at, size - at, "%s%u:%" PRId64, i ? "," : "", h->s[i].k,
                               h->s[i].g.valid_boot);
    if (!out[0])
        snprintf(out, size, "-");
}

size_t dlock_redlock_slot_keys_size(char *const *keys)
{
    size_t total = 0;
    for (int k = 0; k < DLOCK_SCRIPT_KEYS; k++)
        total += strlen(keys[k]) + 1 + (k == DLOCK_KEY_HW ? 0 : 4); /* ":s63" at most */
    return total;
}

void dlock_redlock_slot_keys(char *const *keys, unsigned k, char *buf, char **out)
{
    /* every key but HW begins with the lease key, "<prefix>{<name>}" */
    size_t base = strlen(keys[DLOCK_KEY_LEASE]);
    for (int i = 0; i < DLOCK_SCRIPT_KEYS; i++) {
        out[i] = buf;
        if (i == DLOCK_KEY_HW)
            buf += sprintf(buf, "%s", keys[i]) + 1;
        else
            buf += sprintf(buf, "%.*s:s%u%s", (int)base, keys[i], k, keys[i] + base) + 1;
    }
}
