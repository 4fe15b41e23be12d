/*
 * Redlock's node set, its quorum acquire and release, and the seeding of
 * restarted nodes (see redlock.h for the rule, the invariants and the
 * lock order). The calls to the nodes of one step are pipelined: one
 * connection checked out per node, every request appended and flushed,
 * then every reply read by one deadline; no thread per node.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "route/redlock.h"
#include "common/error.h"

#define RUN_ID_MAX 48

typedef struct rl_node {
    dlock_conn_cfg cfg; /* base's, with this node's address */
    dlock_pool *pool;
    char addr[280];     /* "host:port", for messages */
    /* under rl->mu */
    char run[RUN_ID_MAX]; /* the run id last seen, "" none yet */
    int64_t seen_boot;  /* when this client first saw it (CLOCK_BOOTTIME) */
    int seeded;         /* its seed key held it at the last reading */
    int seeding;        /* a seeding of this node is under way */
} rl_node;

struct dlock_redlock {
    dlock_counters *ctr;
    unsigned n, m;
    unsigned pool_size;
    uint32_t lease_ms;
    int64_t lease_ns, drift_ns;
    char lease_str[16];
    char *prefix;
    char *seed_key;   /* "<prefix>redlock:seed" */
    char *hw_match;   /* SCAN pattern of every slot's mark: "<prefix, escaped>hw:{*}" */
    char *any_match;  /* SCAN pattern of every key of the prefix: "<prefix, escaped>*" */
    char *hw_any;     /* "<prefix>hw:{0}": mark.lua's KEYS[1] when only the seed is written */
    pthread_mutex_t mu;
    rl_node node[DLOCK_REDLOCK_NODES_MAX];
};

/* One node's side of a step. */
typedef struct peer {
    redisContext *c; /* checked out for the step, NULL if none */
    int failed;      /* no connection, or it failed, or an unusable reply: no more calls */
    int broken;      /* its connection failed (closed, timed out, out of step): not pooled */
    int used;        /* a reply was read on c since it was checked out */
    int sent;        /* a request of this step was flushed to it (it may have run) */
    char run[RUN_ID_MAX]; /* the run id this connection reported, "" unknown */
    char seed[RUN_ID_MAX]; /* the seed key as last read on it */
    redisReply *rep; /* the last script's reply (owned), NULL none */
    char why[200];   /* failed: why */
} peer;

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
        nd->pool = nd->cfg.host ? dlock_pool_create(&nd->cfg, pool_size, ctr) : NULL;
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

/* Whether a reply of node i through a connection to run id run, with seed
 * key seed as read at or before the script's instant, counts: its seed
 * key holds its run id (a seeding comes a lease + the drift allowance
 * after its run began, so the server was up a lease at least when the
 * script ran). Records whether the seed key held the run id. `at`, the
 * request's send (CLOCK_BOOTTIME), is not needed by the rule: kept so
 * that every caller names the instant it judges. */
static int counts_now(dlock_redlock *rl, unsigned i, const char *run, const char *seed,
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

/* Peer p takes no more calls this step (its connection stays usable: an
 * unusable reply was read whole). */
static void peer_fail(peer *p, const char *fmt, const char *what)
{
    if (p->failed)
        return;
    p->failed = 1;
    snprintf(p->why, sizeof p->why, fmt, what);
}

/* Peer p's connection failed (closed, timed out, a request half written):
 * no more calls this step, and it is closed, not pooled. */
static void peer_broke(peer *p, const char *fmt, const char *what)
{
    p->broken = 1;
    peer_fail(p, fmt, what);
}

/* The first node before i that reported i's run id (the same server
 * listed under two names), or -1: its replies count once. */
static int same_run(const dlock_redlock *rl, const peer *p, unsigned i)
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

/* Checks out a connection to every node not failed yet, waiting for one
 * at most until the caller's deadline (a node's pool is this set's own,
 * rarely all busy). */
static void peers_open(dlock_redlock *rl, peer *p, int64_t deadline)
{
    for (unsigned i = 0; i < rl->n; i++) {
        p[i].rep = NULL;
        if (p[i].failed || p[i].c)
            continue;
        p[i].used = 0;
        if (dlock_pool_get(rl->node[i].pool, deadline, &p[i].c) != DLOCK_OK) {
            p[i].c = NULL;
            peer_fail(&p[i], "unreachable: %s", dlock_last_error());
        }
    }
}

/* Gives every connection back (a broken one is closed) and frees replies. */
static void peers_close(dlock_redlock *rl, peer *p)
{
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
    run[0] = '\0';
    if (!r || r->type != REDIS_REPLY_STRING)
        return;
    const char *s = strstr(r->str, "run_id:");
    if (!s)
        return;
    s += 7;
    size_t k = 0;
    while (k < RUN_ID_MAX - 1 && ((s[k] >= '0' && s[k] <= '9') || (s[k] >= 'a' && s[k] <= 'f')))
        k++;
    memcpy(run, s, k);
    run[k] = '\0';
}

/* Appends peer p's requests: INFO server if info, GET of the seed key if
 * get_seed, then the script (EVALSHA unless eval). The seed key is read
 * BEFORE the script, in the same pipeline on the same connection: a node's
 * seed key changes within one run of its server only from another run's id
 * (or none) to this run's id (mark.lua writes the run id its caller read
 * from this very server, and only a restart, which changes the run id,
 * loses data), so a reading that holds the run id before the script proves
 * it held it when the script ran. A reading after the script could see a
 * seeding made in between, and count a vote made on a node not seeded
 * yet. (A node wiped without a restart, FLUSHALL or an eviction, is
 * outside this assumption: docs/design.md, "Redlock".) 0 or -1. */
static int append_one(dlock_redlock *rl, peer *p, int info, dlock_script_id id, int eval,
                      int nkeys, int nargs, const char **argv, int get_seed)
{
    redisContext *c = p->c;
    if (info) {
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

/* Reads peer i's replies to append_one by deadline: 1 if the script
 * answered NOSCRIPT (send again with EVAL), 0, or -1 (failed). */
static int read_one(dlock_redlock *rl, unsigned i, peer *p, int info, int get_seed,
                    int64_t deadline)
{
    redisReply *r = NULL;
    if (info) {
        if (dlock_conn_read(p->c, deadline, &r) != 0)
            return -1;
        p->used = 1;
        parse_run(r, p->run);
        freeReplyObject(r);
        saw_run(rl, i, p->run);
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
    if (append_one(rl, p, 0, id, 1, nkeys, nargs, argv, get_seed) != 0) {
        peer_broke(p, "%s", "out of memory");
        return -1;
    }
    if (dlock_conn_flush(p->c, deadline) != 0 || read_one(rl, i, p, 0, get_seed, deadline) < 0) {
        peer_broke(p, "%s", p->c->errstr);
        return -1;
    }
    return 0;
}

/* Peer i's pooled connection was closed under it while idle (a restart, an
 * idle timeout: it failed at once with EOF or a reset, before any reply):
 * its requests again on another connection, as often as the pool holds
 * connections + 1 (each may be as stale). Safe although the first send may
 * have run: every script here is idempotent for its caller (an acquire
 * with the same attempt is granted again in place, a release matches its
 * grant, mark.lua raises to a value). */
static void retry_fresh(dlock_redlock *rl, unsigned i, peer *p, int info, dlock_script_id id,
                        int nkeys, int nargs, const char **argv, int get_seed, int64_t deadline)
{
    for (unsigned t = 0; t <= rl->pool_size; t++) {
        char err[200];
        snprintf(err, sizeof err, "%s", p->c->errstr);
        dlock_pool_put(rl->node[i].pool, p->c, 1);
        p->c = NULL;
        if (dlock_pool_get(rl->node[i].pool, deadline, &p->c) != DLOCK_OK) {
            p->c = NULL;
            peer_fail(p, "unreachable: %s", dlock_last_error());
            return;
        }
        p->used = 0;
        dlock_count(&rl->ctr->redis_round_trips, 1);
        if (append_one(rl, p, info, id, 0, nkeys, nargs, argv, get_seed) != 0) {
            peer_broke(p, "%s", "out of memory");
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
            peer_broke(p, "%s", p->c->errstr);
            return;
        }
    }
    peer_broke(p, "%s", p->c->errstr);
}

/* Runs one script on every peer of `only` (NULL: every peer) not failed,
 * peer i with argv[i]: appended, flushed, then read by deadline. A
 * NOSCRIPT answer (a restarted server) is sent again with EVAL (the seed
 * key's GET before it again) as soon as it is read, before the next peer's
 * replies are waited for, and its reply read after the others'. A pooled
 * connection closed while idle is replaced (retry_fresh). Each peer's
 * reply in rep (an error reply included), or the peer failed. */
static void peers_call_each(dlock_redlock *rl, peer *p, const int *only, int info,
                            dlock_script_id id, int nkeys, int nargs, const char **const *argv,
                            int get_seed, int64_t deadline)
{
    int again[DLOCK_REDLOCK_NODES_MAX] = {0}, retry[DLOCK_REDLOCK_NODES_MAX] = {0}, any = 0;
#define IN(i) (!p[i].failed && p[i].c && (!only || only[i]))
    for (unsigned i = 0; i < rl->n; i++) {
        if (!IN(i))
            continue;
        if (append_one(rl, &p[i], info, id, 0, nkeys, nargs, argv[i], get_seed) != 0)
            peer_broke(&p[i], "%s", "out of memory");
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
                peer_broke(&p[i], "%s", p[i].c->errstr);
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
                peer_broke(&p[i], "%s", p[i].c->errstr);
        } else if (r == 1) {
            again[i] = 1;
            dlock_count(&rl->ctr->redis_round_trips, 1);
            if (append_one(rl, &p[i], 0, id, 1, nkeys, nargs, argv[i], get_seed) != 0)
                peer_broke(&p[i], "%s", "out of memory");
            else if (dlock_conn_flush(p[i].c, deadline) != 0)
                peer_broke(&p[i], "%s", p[i].c->errstr);
        }
    }
    for (unsigned i = 0; i < rl->n; i++)
        if (again[i] && IN(i) && read_one(rl, i, &p[i], 0, get_seed, deadline) < 0)
            peer_broke(&p[i], "%s", p[i].c->errstr);
    for (unsigned i = 0; i < rl->n; i++)
        if (retry[i] && IN(i))
            retry_fresh(rl, i, &p[i], info, id, nkeys, nargs, argv[i], get_seed, deadline);
#undef IN
}

/* peers_call_each with the same argv for every peer. */
static void peers_call(dlock_redlock *rl, peer *p, const int *only, int info, dlock_script_id id,
                       int nkeys, int nargs, const char **argv, int get_seed, int64_t deadline)
{
    const char **each[DLOCK_REDLOCK_NODES_MAX];
    for (unsigned i = 0; i < rl->n; i++)
        each[i] = argv;
    peers_call_each(rl, p, only, info, id, nkeys, nargs, (const char **const *)each, get_seed,
                    deadline);
}

/* The deadline of one exchange: a command timeout from now, at most the
 * caller's. */
static int64_t step_deadline(dlock_redlock *rl, int64_t caller)
{
    int64_t d = dlock_conn_deadline(rl->node[0].cfg.command_timeout_ms);
    return caller < d ? caller : d;
}

/* Why node i (of peers ps) does not count, for a message. */
static void why_not(dlock_redlock *rl, unsigned i, const peer *ps, char *out, size_t size)
{
    rl_node *nd = &rl->node[i];
    const peer *p = &ps[i];
    if (p->failed) {
        snprintf(out, size, "%s %s", nd->addr, p->why);
        return;
    }
    int j = same_run(rl, ps, i);
    if (j >= 0) {
        snprintf(out, size, "%s reports the run id of %s (one server listed twice?): counted "
                 "once", nd->addr, rl->node[j].addr);
        return;
    }
    snprintf(out, size, "%s not seeded in its run %.12s (restarted?)", nd->addr, p->run);
}

/* ------------------------------------------------------------------ */
/* Refresh, seeding. */

int dlock_redlock_refresh(dlock_redlock *rl, int64_t deadline)
{
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    peers_open(rl, p, deadline);
    int64_t d = step_deadline(rl, deadline);
    /* mark.lua with token 0 writes nothing and replies with the seed key */
    const char *argv[] = {rl->hw_any, rl->seed_key, "0", ""};
    int64_t at = dlock_boot_ns();
    peers_call(rl, p, NULL, 1, DLOCK_SCRIPT_MARK, 2, 2, argv, 1, d);
    char msg[600] = "";
    size_t len = 0;
    for (unsigned i = 0; i < rl->n; i++) {
        if (!p[i].failed)
            counts_now(rl, i, p[i].run, p[i].seed, at);
        else if (len < sizeof msg)
            len += (size_t)snprintf(msg + len, sizeof msg - len, "%s%s %s", len ? "; " : "",
                                    rl->node[i].addr, p[i].why);
    }
    peers_close(rl, p);
    return msg[0] ? dlock_err_set(DLOCK_EREDIS, "redlock: %s", msg) : DLOCK_OK;
}

int dlock_redlock_check_node(dlock_redlock *rl, unsigned i, int64_t deadline)
{
    rl_node *nd = &rl->node[i];
    char why[400];
    redisContext *c;
    /* (a new connection is checked as it opens: dlock_conn_open) */
    int rc = dlock_pool_get(nd->pool, deadline, &c);
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
    dlock_pool_put(nd->pool, c, !r || c->err != 0);
    if (r)
        freeReplyObject(r);
    return rc;
}

/* Whether key is a slot's mark of rl's prefix: exactly
 * "<prefix>hw:{<tag>}", the tag without braces (SCAN's pattern also
 * matches, say, "<prefix>hw:{a}b}" or another client's keys under the
 * prefix "<prefix>hw:"). */
static int is_mark_key(const dlock_redlock *rl, const char *key)
{
    size_t lp = strlen(rl->prefix), lk = strlen(key);
    if (lk < lp + 6 || strncmp(key, rl->prefix, lp) != 0 || strncmp(key + lp, "hw:{", 4) != 0 ||
        key[lk - 1] != '}')
        return 0;
    for (size_t k = lp + 4; k < lk - 1; k++)
        if (key[k] == '{' || key[k] == '}')
            return 0;
    return 1;
}

/* The keys of a SCAN reply's page into *keys (grown; only slots' marks if
 * rl is not NULL), with the cursor into cursor. 0 or -1. */
static int scan_page(const dlock_redlock *rl, const redisReply *r, char *cursor, size_t csize,
                     char ***keys, size_t *nk, size_t *cap)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY)
        return -1;
    snprintf(cursor, csize, "%s", r->element[0]->str);
    const redisReply *a = r->element[1];
    for (size_t k = 0; k < a->elements; k++) {
        if (a->element[k]->type != REDIS_REPLY_STRING)
            return -1;
        if (rl && !is_mark_key(rl, a->element[k]->str))
            continue;
        if (*nk == *cap) {
            size_t nc = *cap ? 2 * *cap : 64;
            char **nkeys = realloc(*keys, nc * sizeof *nkeys);
            if (!nkeys)
                return -1;
            *keys = nkeys;
            *cap = nc;
        }
        if (!((*keys)[*nk] = strdup(a->element[k]->str)))
            return -1;
        (*nk)++;
    }
    return 0;
}

/* Every key matching `match` on peer p's server (marks: only the string
 * keys of a slot's mark's exact form), appended to *keys, until at least
 * stop_after were found; each page by its own command timeout (at most
 * deadline). 0, or -1 (p failed). */
static int scan_all(dlock_redlock *rl, peer *p, const char *match, int marks, int64_t deadline,
                    char ***keys, size_t *nk, size_t *cap, size_t stop_after)
{
    char cursor[32] = "0";
    size_t start = *nk;
    do {
        const char *v[] = {"SCAN", cursor, "MATCH", match, "COUNT", "1000", "TYPE", "string"};
        redisReply *r = NULL;
        int64_t d = step_deadline(rl, deadline);
        dlock_count(&rl->ctr->redis_commands, 1);
        dlock_count(&rl->ctr->redis_round_trips, 1);
        if (redisAppendCommandArgv(p->c, marks ? 8 : 6, v, NULL) != REDIS_OK ||
            dlock_conn_flush(p->c, d) != 0 || dlock_conn_read(p->c, d, &r) != 0) {
            peer_broke(p, "%s", p->c->errstr);
            return -1;
        }
        int bad = scan_page(marks ? rl : NULL, r, cursor, sizeof cursor, keys, nk, cap);
        freeReplyObject(r);
        if (bad) {
            peer_fail(p, "%s", "SCAN failed");
            return -1;
        }
    } while (strcmp(cursor, "0") != 0 && *nk - start < stop_after);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void keys_free(char **keys, size_t nk)
{
    for (size_t k = 0; k < nk; k++)
        free(keys[k]);
    free(keys);
}

/* Marks read or written per pipelined exchange. */
enum { SEED_BATCH = 256 };

/* mark.lua on peer p for keys[from .. to) with tokens toks (NULL: "0"),
 * pipelined, by one command timeout (at most deadline); each reply's mark
 * before into before[] (may be NULL), and its seed key into p->seed. A
 * WRONGTYPE reply (the key holds no string there: not a mark of this
 * prefix but another client's key of the same name) reads as no mark and
 * writes nothing. 0, or -1 (p failed). */
static int marks_on(dlock_redlock *rl, peer *p, char **keys, size_t from, size_t to,
                    char (*toks)[24], uint64_t *before, int64_t deadline)
{
    deadline = step_deadline(rl, deadline);
    for (size_t k = from; k < to; k++) {
        const char *argv[] = {keys[k], rl->seed_key, toks ? toks[k - from] : "0", ""};
        if (dlock_conn_append_eval(p->c, rl->ctr, DLOCK_SCRIPT_MARK, 0, 2, 2, argv, NULL) != 0) {
            peer_broke(p, "%s", "out of memory");
            return -1;
        }
    }
    dlock_count(&rl->ctr->redis_round_trips, 1);
    if (dlock_conn_flush(p->c, deadline) != 0) {
        peer_broke(p, "%s", p->c->errstr);
        return -1;
    }
    int bad = 0;
    for (size_t k = from; k < to; k++) {
        redisReply *r = NULL;
        if (dlock_conn_read(p->c, deadline, &r) != 0) {
            peer_broke(p, "%s", p->c->errstr);
            return -1;
        }
        if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "WRONGTYPE", 9) == 0) {
            if (before)
                before[k - from] = 0;
        } else if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING)
            bad = 1;
        else {
            if (before)
                before[k - from] = strtoull(r->element[0]->str, NULL, 10);
            snprintf(p->seed, sizeof p->seed, "%s", r->element[1]->str);
        }
        freeReplyObject(r);
    }
    if (bad)
        peer_fail(p, "%s", "mark.lua failed");
    return bad ? -1 : 0;
}

/* The seeding of node i, with its connection and the others' in p, the
 * seeding flag set. */
static int seed_with(dlock_redlock *rl, unsigned i, peer *p, int64_t deadline)
{
    rl_node *nd = &rl->node[i];
    int64_t d = step_deadline(rl, deadline);
    const char *argv0[] = {rl->hw_any, rl->seed_key, "0", ""};
    int64_t at = dlock_boot_ns();
    peers_call(rl, p, NULL, 1, DLOCK_SCRIPT_MARK, 2, 2, argv0, 1, d);
    if (p[i].failed)
        return dlock_err_set(DLOCK_EREDIS, "redlock: seeding %s: %s", nd->addr, p[i].why);
    if (counts_now(rl, i, p[i].run, p[i].seed, at))
        return DLOCK_OK; /* seeded meanwhile */
    pthread_mutex_lock(&rl->mu);
    int64_t seen = strcmp(nd->run, p[i].run) == 0 ? at - nd->seen_boot : 0;
    int seeded = nd->seeded;
    pthread_mutex_unlock(&rl->mu);
    if (!seeded && seen < rl->lease_ns + rl->drift_ns)
        return dlock_err_set(DLOCK_EBUSY, "redlock: %s (run %.12s) seen for %" PRId64 " ms: not "
                             "seeded before a lease + the drift allowance (%" PRId64 " ms)",
                             nd->addr, p[i].run, (int64_t)(seen / DLOCK_NS_PER_MS),
                             (int64_t)((rl->lease_ns + rl->drift_ns) / DLOCK_NS_PER_MS));
    if (seeded)
        return DLOCK_OK; /* (seeded by another meanwhile) */
    /* the sources: every other node that counts */
    int src[DLOCK_REDLOCK_NODES_MAX] = {0};
    unsigned nsrc = 0;
    char why[700] = "";
    size_t wl = 0;
    for (unsigned j = 0; j < rl->n; j++) {
        if (j == i)
            continue;
        if (!p[j].failed && same_run(rl, p, j) < 0 && strcmp(p[j].run, p[i].run) != 0 &&
            counts_now(rl, j, p[j].run, p[j].seed, at)) {
            src[j] = 1;
            nsrc++;
        } else if (wl < sizeof why) {
            char w[300];
            why_not(rl, j, p, w, sizeof w);
            wl += (size_t)snprintf(why + wl, sizeof why - wl, "; %s", w);
        }
    }
    if (nsrc < rl->m)
        return dlock_err_set(DLOCK_EREDIS, "redlock: seeding %s needs %u other nodes that count; "
                             "%u do%s", nd->addr, rl->m, nsrc, why);
    /* every slot's mark any source holds (one that holds none reads 0 on
     * all m sources, as a mark never written) */
    char **keys = NULL;
    size_t nk = 0, cap = 0;
    for (unsigned j = 0; j < rl->n; j++)
        if (src[j] &&
            scan_all(rl, &p[j], rl->hw_match, 1, deadline, &keys, &nk, &cap, SIZE_MAX) != 0)
            src[j] = 0, nsrc--;
    if (nsrc < rl->m) {
        keys_free(keys, nk);
        return dlock_err_set(DLOCK_EREDIS, "redlock: seeding %s: fewer than %u sources answered "
                             "the scan of the marks", nd->addr, rl->m);
    }
    if (nk > 1)
        qsort(keys, nk, sizeof *keys, cmp_str);
    size_t u = 0;
    for (size_t k = 0; k < nk; k++) {
        if (u && strcmp(keys[u - 1], keys[k]) == 0)
            free(keys[k]);
        else
            keys[u++] = keys[k];
    }
    nk = u;
    uint64_t *top = calloc(nk ? nk : 1, sizeof *top);
    char (*toks)[24] = malloc((nk ? nk : 1) * sizeof *toks);
    int rc = top && toks ? DLOCK_OK : dlock_err_set(DLOCK_ENOMEM, "out of memory");
    uint64_t before[SEED_BATCH];
    for (size_t from = 0; rc == DLOCK_OK && from < nk; from += SEED_BATCH) {
        size_t to = from + SEED_BATCH < nk ? from + SEED_BATCH : nk;
        for (unsigned j = 0; j < rl->n; j++) {
            if (!src[j])
                continue;
            /* a source restarted meanwhile fails (its connection closed);
             * one whose seed key changed stops counting */
            int64_t bat = dlock_boot_ns();
            if (marks_on(rl, &p[j], keys, from, to, NULL, before, deadline) != 0 ||
                !counts_now(rl, j, p[j].run, p[j].seed, bat)) {
                src[j] = 0;
                nsrc--;
                continue;
            }
            for (size_t k = from; k < to; k++)
                if (before[k - from] > top[k])
                    top[k] = before[k - from];
        }
        if (nsrc < rl->m)
            rc = dlock_err_set(DLOCK_EREDIS, "redlock: seeding %s: fewer than %u sources answered "
                               "the reads of the marks", nd->addr, rl->m);
    }
    /* the marks, then (every write answered) the run id */
    for (size_t from = 0; rc == DLOCK_OK && from < nk; from += SEED_BATCH) {
        size_t to = from + SEED_BATCH < nk ? from + SEED_BATCH : nk;
        for (size_t k = from; k < to; k++)
            snprintf(toks[k - from], sizeof toks[0], "%" PRIu64, top[k]);
        if (marks_on(rl, &p[i], keys, from, to, toks, NULL, deadline) != 0)
            rc = dlock_err_set(DLOCK_EREDIS, "redlock: seeding %s: %s", nd->addr, p[i].why);
    }
    if (rc == DLOCK_OK) {
        const char *argv[] = {rl->hw_any, rl->seed_key, "0", p[i].run};
        int only[DLOCK_REDLOCK_NODES_MAX] = {0};
        only[i] = 1;
        peers_call(rl, p, only, 0, DLOCK_SCRIPT_MARK, 2, 2, argv, 0, step_deadline(rl, deadline));
        const redisReply *r = p[i].rep;
        if (p[i].failed || !r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[1]->type != REDIS_REPLY_STRING)
            rc = dlock_err_set(DLOCK_EREDIS, "redlock: seeding %s: the write of its run id "
                               "failed%s%s", nd->addr, p[i].failed ? ": " : "", p[i].why);
        else
            counts_now(rl, i, p[i].run, r->element[1]->str, at);
    }
    free(top);
    free(toks);
    keys_free(keys, nk);
    return rc;
}

int dlock_redlock_seed(dlock_redlock *rl, unsigned i, int64_t deadline)
{
    if (i >= rl->n)
        return dlock_err_set(DLOCK_EINVAL, "redlock: no node %u", i);
    pthread_mutex_lock(&rl->mu);
    int busy = rl->node[i].seeding;
    rl->node[i].seeding = 1;
    pthread_mutex_unlock(&rl->mu);
    if (busy)
        return dlock_err_set(DLOCK_EBUSY, "redlock: %s is being seeded", rl->node[i].addr);
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    peers_open(rl, p, deadline);
    int rc = seed_with(rl, i, p, deadline);
    peers_close(rl, p);
    pthread_mutex_lock(&rl->mu);
    rl->node[i].seeding = 0;
    pthread_mutex_unlock(&rl->mu);
    return rc;
}

int dlock_redlock_seed_due(dlock_redlock *rl, int64_t deadline)
{
    dlock_redlock_refresh(rl, deadline); /* a node that did not answer is not due */
    int seeded = 0, rc = DLOCK_OK;
    for (unsigned i = 0; i < rl->n; i++) {
        rl_node *nd = &rl->node[i];
        pthread_mutex_lock(&rl->mu);
        int due = nd->run[0] && !nd->seeded &&
                  dlock_boot_ns() - nd->seen_boot >= rl->lease_ns + rl->drift_ns;
        pthread_mutex_unlock(&rl->mu);
        if (!due)
            continue;
        int r = dlock_redlock_seed(rl, i, deadline);
        if (r == DLOCK_OK)
            seeded++;
        else if (r != DLOCK_EBUSY)
            rc = r;
    }
    return rc == DLOCK_OK ? seeded : rc;
}

int dlock_redlock_seed_fresh(dlock_redlock *rl, int64_t deadline)
{
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    peers_open(rl, p, deadline);
    /* each step (the run ids, each node's scan, each write) by its own
     * command timeout, at most the caller's deadline */
    const char *argv0[] = {rl->hw_any, rl->seed_key, "0", ""};
    int64_t at = dlock_boot_ns();
    peers_call(rl, p, NULL, 1, DLOCK_SCRIPT_MARK, 2, 2, argv0, 1, step_deadline(rl, deadline));
    int rc = DLOCK_OK;
    for (unsigned i = 0; rc == DLOCK_OK && i < rl->n; i++) {
        if (p[i].failed || !p[i].run[0]) {
            rc = dlock_err_set(DLOCK_EREDIS, "redlock: a fresh seeding needs every node; %s %s",
                               rl->node[i].addr, p[i].failed ? p[i].why : "told no run id");
            break;
        }
        /* empty, or (a fresh seeding that failed part way, run again) its
         * only key of the prefix is its seed key holding its own run id */
        char **keys = NULL;
        size_t nk = 0, cap = 0;
        if (scan_all(rl, &p[i], rl->any_match, 0, deadline, &keys, &nk, &cap, 2) != 0)
            rc = dlock_err_set(DLOCK_EREDIS, "redlock: a fresh seeding needs every node; %s %s",
                               rl->node[i].addr, p[i].why);
        else if (nk && !(nk == 1 && strcmp(keys[0], rl->seed_key) == 0 &&
                         strcmp(p[i].seed, p[i].run) == 0))
            rc = dlock_err_set(DLOCK_EINVAL, "redlock: %s already holds keys of prefix '%s' (such "
                               "as '%s'): a node with data is seeded from the others, never "
                               "fresh", rl->node[i].addr, rl->prefix,
                               strcmp(keys[0], rl->seed_key) == 0 && nk > 1 ? keys[1] : keys[0]);
        keys_free(keys, nk);
    }
    for (unsigned i = 0; rc == DLOCK_OK && i < rl->n; i++) {
        const char *argv[] = {rl->hw_any, rl->seed_key, "0", p[i].run};
        int only[DLOCK_REDLOCK_NODES_MAX] = {0};
        only[i] = 1;
        peers_call(rl, p, only, 0, DLOCK_SCRIPT_MARK, 2, 2, argv, 0, step_deadline(rl, deadline));
        const redisReply *r = p[i].rep;
        if (p[i].failed || !r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[1]->type != REDIS_REPLY_STRING)
            rc = dlock_err_set(DLOCK_EREDIS, "redlock: the fresh seeding of %s failed%s%s (the "
                               "nodes written hold only their seed key: it may run again)",
                               rl->node[i].addr, p[i].failed ? ": " : "", p[i].why);
        else
            counts_now(rl, i, p[i].run, r->element[1]->str, at);
    }
    peers_close(rl, p);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Acquire and release. */

/* The release script on every peer that has a connection and did not
 * fail, by the node's token where known (tok[i] != 0), else by attempt;
 * replies read by deadline. How many answered; *gone (if not NULL) how
 * many of them answered that the grant was not there (0). */
static unsigned release_on(dlock_redlock *rl, peer *p, const dlock_redlock_req *q,
                           const uint64_t *tok, int64_t deadline, unsigned *gone)
{
    dlock_script_args a = *q->args;
    a.lease_ms = rl->lease_str;
    char att[24];
    snprintf(att, sizeof att, "%" PRIu64, q->attempt);
    /* by attempt where no token is known, by token elsewhere, each node
     * its own argv, all pipelined together (one deadline: a stopped node
     * costs the release one command timeout, not one per kind) */
    char t[DLOCK_REDLOCK_NODES_MAX][24], ended[8];
    /* (by token: the word for the next grant; by attempt the node passes on
     * the word its grant got, release.lua) */
    snprintf(ended, sizeof ended, "%d", q->ended > 0 && q->ended <= 3 ? q->ended : 0);
    const char *argv[DLOCK_REDLOCK_NODES_MAX][DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS];
    const char **each[DLOCK_REDLOCK_NODES_MAX];
    for (unsigned i = 0; i < rl->n; i++) {
        int by_token = tok && tok[i];
        snprintf(t[i], sizeof t[i], "%" PRIu64, by_token ? tok[i] : 0);
        dlock_script_release_argv(&a, q->keys, q->name, by_token ? "token" : "nonce",
                                  by_token ? t[i] : att, "0", ended, argv[i]);
        each[i] = argv[i];
    }
    peers_call_each(rl, p, NULL, 0, dlock_script_in(DLOCK_SCRIPT_RELEASE, 2), DLOCK_SCRIPT_KEYS,
                    DLOCK_RELEASE_ARGS, (const char **const *)each, 0, deadline);
    unsigned answered = 0;
    if (gone)
        *gone = 0;
    for (unsigned i = 0; i < rl->n; i++)
        if (!p[i].failed && p[i].c && p[i].rep && p[i].rep->type == REDIS_REPLY_INTEGER) {
            answered++;
            if (gone && p[i].rep->integer < 1)
                (*gone)++;
        }
    return answered;
}

int dlock_redlock_release(dlock_redlock *rl, const dlock_redlock_req *q,
                          const dlock_redlock_grant *g)
{
    return dlock_redlock_release_past(rl, q, g, NULL);
}

int dlock_redlock_release_past(dlock_redlock *rl, const dlock_redlock_req *q,
                               const dlock_redlock_grant *g, int *down)
{
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    for (unsigned i = 0; down && i < rl->n; i++)
        if (down[i])
            peer_fail(&p[i], "%s", "failed an earlier release of this batch");
    peers_open(rl, p, q->deadline);
    int64_t d = step_deadline(rl, q->deadline);
    dlock_redlock_req r = *q;
    r.attempt = g->attempt;
    unsigned gone;
    unsigned answered = release_on(rl, p, &r, g->node_token, d, &gone);
    char msg[600] = "";
    size_t len = 0;
    for (unsigned i = 0; down && i < rl->n; i++)
        down[i] |= p[i].failed;
    for (unsigned i = 0; i < rl->n; i++)
        if (p[i].failed && len < sizeof msg)
            len += (size_t)snprintf(msg + len, sizeof msg - len, "; %s %s", rl->node[i].addr,
                                    p[i].why);
    peers_close(rl, p);
    /* More than n - m nodes without the grant: no majority held it to the
     * end (it ran out, or was taken meanwhile): lost while held, as a
     * single server's release that finds its grant gone. */
    if (gone > rl->n - rl->m)
        return dlock_err_set(DLOCK_ELOST, "redlock release of '%s': %u of %u nodes no longer "
                             "held the grant: it was lost while held", q->name, gone, rl->n);
    if (answered >= rl->m)
        return DLOCK_OK;
    return dlock_err_set(DLOCK_EREDIS, "redlock: the release of '%s' reached %u of %u nodes "
                         "(%u needed; the others' grants end within a lease)%s", q->name,
                         answered, rl->n, rl->m, msg);
}

int dlock_redlock_give_back(dlock_redlock *rl, const dlock_redlock_req *q)
{
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    peers_open(rl, p, q->deadline);
    unsigned answered = release_on(rl, p, q, NULL, step_deadline(rl, q->deadline), NULL);
    char msg[600] = "";
    size_t len = 0;
    for (unsigned i = 0; i < rl->n; i++)
        if (p[i].failed && len < sizeof msg)
            len += (size_t)snprintf(msg + len, sizeof msg - len, "; %s %s", rl->node[i].addr,
                                    p[i].why);
    peers_close(rl, p);
    if (answered == rl->n)
        return DLOCK_OK;
    return dlock_err_set(DLOCK_EREDIS, "redlock give-back of attempt %" PRIu64 " of '%s' "
                         "reached %u of %u nodes%s", q->attempt, q->name, answered, rl->n, msg);
}

/* A release by attempt of q on node i over a connection of its own,
 * opened with timeouts that end by deadline, then closed. */
static void release_fresh(dlock_redlock *rl, unsigned i, const dlock_redlock_req *q,
                          int64_t deadline)
{
    int64_t left = (deadline - dlock_now_ns()) / DLOCK_NS_PER_MS;
    if (left < 2)
        return;
    dlock_conn_cfg cfg = rl->node[i].cfg;
    uint32_t ms = (uint32_t)(left / 2); /* a connect and a setup at most */
    if (cfg.connect_timeout_ms > ms)
        cfg.connect_timeout_ms = ms;
    if (cfg.command_timeout_ms > ms)
        cfg.command_timeout_ms = ms;
    peer one[DLOCK_REDLOCK_NODES_MAX];
    memset(one, 0, sizeof one);
    for (unsigned j = 0; j < rl->n; j++)
        one[j].failed = j != i;
    if (dlock_conn_open(&cfg, rl->ctr, &one[i].c) != DLOCK_OK)
        return;
    one[i].used = 1; /* (not the pool's: never replaced by retry_fresh) */
    release_on(rl, one, q, NULL, deadline, NULL);
    if (one[i].rep)
        freeReplyObject(one[i].rep);
    redisFree(one[i].c);
}

/* Ends a failed acquire: a release by attempt on every node its votes'
 * request was sent to (may[i]: it may have granted, whatever it answered,
 * if anything), within one command timeout from now, even past the
 * caller's deadline: over the step's connection while that is in step (a
 * node that answered an error, or did not count), else over a fresh one
 * (its reply or the write-back's timed out, or its connection failed).
 * Then the connections back. Returns rc, its message kept. */
static int acq_failed(dlock_redlock *rl, peer *p, const dlock_redlock_req *q, const int *may,
                      int rc)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dlock_last_error());
    int64_t d = dlock_conn_deadline(rl->node[0].cfg.command_timeout_ms);
    int fresh[DLOCK_REDLOCK_NODES_MAX] = {0};
    for (unsigned i = 0; i < rl->n; i++) {
        if (!may[i])
            p[i].failed = 1;
        else if (p[i].c && !p[i].broken)
            p[i].failed = 0;
        else
            fresh[i] = 1;
    }
    release_on(rl, p, q, NULL, d, NULL);
    for (unsigned i = 0; i < rl->n; i++)
        if (fresh[i])
            release_fresh(rl, i, q, d);
    peers_close(rl, p);
    return dlock_err_set(rc, "%s", msg);
}

int dlock_redlock_acquire(dlock_redlock *rl, const dlock_redlock_req *q, dlock_redlock_grant *g,
                          dlock_redlock_busy *busy)
{
    memset(g, 0, sizeof *g);
    busy->refused = 0;
    busy->pttl_ms = -1;
    busy->holder[0] = '\0';
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    char att[24];
    snprintf(att, sizeof att, "%" PRIu64, q->attempt);
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_ACQUIRE_ARGS];
    for (int k = 0; k < DLOCK_SCRIPT_KEYS; k++)
        argv[k] = q->keys[k];
    const char **a = argv + DLOCK_SCRIPT_KEYS;
    a[0] = q->args->client_id;
    a[1] = rl->lease_str;
    a[2] = att;
    char pl[16];
    snprintf(pl, sizeof pl, "%" PRIu32, q->pass_limit);
    a[3] = pl; /* the node reserves the handoffs in its own mark too (acquire.lua) */
    a[4] = q->args->waiter_ttl_ms;
    a[5] = "0"; /* a single try: no wait queue in this step */
    a[6] = q->args->keep_ms;
    a[7] = q->client_name;
    a[8] = "0";
    a[9] = "0";

    /* 1. Votes, read until a command timeout, the caller's deadline or the
     * validity, whichever comes first; the validity counts from the first
     * send, once every node's connection is open (opening one costs up to
     * a connect and a command timeout, node after node). */
    peers_open(rl, p, q->deadline);
    int64_t first = dlock_boot_ns(), mono = dlock_now_ns();
    int64_t valid = first + rl->lease_ns - rl->drift_ns;
    int64_t d = step_deadline(rl, q->deadline);
    if (mono + (valid - first) < d)
        d = mono + (valid - first);
    g->first_boot = first;
    g->valid_boot = valid;
    g->attempt = q->attempt;
    peers_call(rl, p, NULL, 1, dlock_script_in(DLOCK_SCRIPT_ACQUIRE, 2), DLOCK_SCRIPT_KEYS,
               DLOCK_ACQUIRE_ARGS, argv, 1, d);
    /* may[i]: the request reached node i, perhaps (a release goes there on
     * a failure); counted[i]: node i counts for this acquire, judged at the
     * first send (its seed key read before the script: append_one) */
    int may[DLOCK_REDLOCK_NODES_MAX], counted[DLOCK_REDLOCK_NODES_MAX] = {0};
    for (unsigned i = 0; i < rl->n; i++)
        may[i] = p[i].sent;
    unsigned votes = 0, counting = 0;
    unsigned ends[4] = {0}; /* votes by the end they report (acquire.lua, End) */
    uint64_t top = 0;
    char why[900] = "", err[300] = "";
    size_t wl = 0;
    for (unsigned i = 0; i < rl->n; i++) {
        const redisReply *r = p[i].rep;
        if (!p[i].failed && r && r->type == REDIS_REPLY_ARRAY && r->elements >= 2 &&
            r->element[0]->type == REDIS_REPLY_INTEGER &&
            r->element[1]->type == REDIS_REPLY_INTEGER) {
            if (r->element[0]->integer == 1)
                g->node_token[i] = (uint64_t)r->element[1]->integer;
            if (same_run(rl, p, i) < 0 && counts_now(rl, i, p[i].run, p[i].seed, first)) {
                counted[i] = 1;
                counting++;
                if (r->element[0]->integer == 1) {
                    votes++;
                    if ((uint64_t)r->element[1]->integer > top)
                        top = (uint64_t)r->element[1]->integer;
                    if (r->elements >= 3 && r->element[2]->type == REDIS_REPLY_INTEGER &&
                        r->element[2]->integer > 0 && r->element[2]->integer <= 3)
                        ends[r->element[2]->integer]++;
                } else if (r->element[0]->integer == 0) {
                    busy->refused++;
                    if (r->element[1]->integer > busy->pttl_ms)
                        busy->pttl_ms = r->element[1]->integer;
                    if (r->elements >= 3 && r->element[2]->type == REDIS_REPLY_STRING &&
                        r->element[2]->str[0] && !busy->holder[0])
                        snprintf(busy->holder, sizeof busy->holder, "%s", r->element[2]->str);
                }
            } else if (wl < sizeof why) {
                char w[300];
                why_not(rl, i, p, w, sizeof w);
                wl += (size_t)snprintf(why + wl, sizeof why - wl, "; %s", w);
            }
        } else {
            if (!p[i].failed && r && r->type == REDIS_REPLY_ERROR && !err[0])
                snprintf(err, sizeof err, "; %s refused: %s", rl->node[i].addr, r->str);
            if (!p[i].failed)
                peer_fail(&p[i], "answered %s", r && r->type == REDIS_REPLY_ERROR ? r->str
                                                                                 : "no vote");
            if (wl < sizeof why) {
                char w[300];
                why_not(rl, i, p, w, sizeof w);
                wl += (size_t)snprintf(why + wl, sizeof why - wl, "; %s", w);
            }
        }
    }
    if (counting < rl->m)
        return acq_failed(rl, p, q, may, dlock_err_set(DLOCK_EREDIS, "redlock acquire of '%s': "
                          "%u of %u nodes count and answered, %u needed%s%s", q->name, counting,
                          rl->n, rl->m, why, err));
    if (votes < rl->m)
        return acq_failed(rl, p, q, may, dlock_err_set(DLOCK_EBUSY, "redlock acquire of '%s': "
                          "%u of %u nodes granted, %u needed; held by '%s' for %" PRId64
                          " ms more", q->name, votes, rl->n, rl->m, busy->holder,
                          busy->pttl_ms));
    if (dlock_boot_ns() >= valid)
        return acq_failed(rl, p, q, may, dlock_err_set(DLOCK_EREDIS, "redlock acquire of '%s': "
                          "the votes came after the validity (%" PRIu32 " ms lease)",
                          q->name, rl->lease_ms));

    /* 2., 3. The token, and its write-back. */
    uint64_t T = top + 1;
    int confirmed = 0, met = 0;
    unsigned acks = 0;
    for (int round = 0; round < DLOCK_REDLOCK_ROUNDS && !confirmed; round++) {
        /* T + the pass limit: the holder's local handoffs hand out up to it */
        char t[24];
        snprintf(t, sizeof t, "%" PRIu64, T + q->pass_limit);
        const char *wargv[] = {q->keys[DLOCK_KEY_HW], rl->seed_key, t, ""};
        int64_t wd = step_deadline(rl, q->deadline);
        if (mono + (valid - first) < wd)
            wd = mono + (valid - first);
        /* once per server: a server listed twice would meet its own T */
        int once[DLOCK_REDLOCK_NODES_MAX];
        for (unsigned i = 0; i < rl->n; i++)
            once[i] = same_run(rl, p, i) < 0;
        peers_call(rl, p, once, 0, DLOCK_SCRIPT_MARK, 2, 2, wargv, 0, wd);
        uint64_t high = 0;
        met = 0;
        acks = 0;
        for (unsigned i = 0; i < rl->n; i++) {
            const redisReply *r = p[i].rep;
            if (p[i].failed || !r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
                r->element[0]->type != REDIS_REPLY_STRING ||
                r->element[1]->type != REDIS_REPLY_STRING)
                continue;
            if (!once[i])
                continue; /* (its reply is still the vote's) */
            uint64_t before = strtoull(r->element[0]->str, NULL, 10);
            if (before >= T) {
                met = 1;
                if (before > high)
                    high = before;
            } else if (counts_now(rl, i, p[i].run, r->element[1]->str, first) && counted[i]) {
                acks++; /* (its seed key as the write-back's script read it) */
            }
        }
        if (met)
            T = high + 1;
        else
            confirmed = acks >= rl->m;
        if (!met)
            break;
    }
    if (!confirmed) {
        if (met)
            return acq_failed(rl, p, q, may, dlock_err_set(DLOCK_EBUSY, "redlock acquire of "
                              "'%s': the write-back met higher marks in %d rounds (contended)",
                              q->name, DLOCK_REDLOCK_ROUNDS));
        return acq_failed(rl, p, q, may, dlock_err_set(DLOCK_EREDIS, "redlock acquire of '%s': "
                          "the token's write-back reached %u counting nodes, %u needed",
                          q->name, acks, rl->m));
    }
    /* 4. The hand-out, only within the validity. */
    if (dlock_boot_ns() >= valid)
        return acq_failed(rl, p, q, may, dlock_err_set(DLOCK_EREDIS, "redlock acquire of '%s': "
                          "confirmed after the validity (%" PRIu32 " ms lease); released",
                          q->name, rl->lease_ms));
    g->token = T;
    /* How the hold before ended: only what a majority of the nodes say
     * alike (a node that missed a release, or never held the grant
     * before, tells another word than the rest; a minority's word is
     * none). */
    for (int k = 1; k <= 3; k++)
        if (ends[k] >= rl->m)
            g->unclean = k;
    g->votes = votes;
    peers_close(rl, p);
    return DLOCK_OK;
}

/* ------------------------------------------------------------------ */
/* Renewal. */

int dlock_redlock_renew(dlock_redlock *rl, const dlock_redlock_req *q,
                        const dlock_redlock_grant *g, int64_t *valid_boot)
{
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    int only[DLOCK_REDLOCK_NODES_MAX] = {0};
    for (unsigned i = 0; i < rl->n; i++) {
        only[i] = g->node_token[i] != 0;
        if (!only[i])
            peer_fail(&p[i], "%s", "granted nothing");
    }
    peers_open(rl, p, q->deadline);
    int64_t first = dlock_boot_ns();
    int64_t valid = first + rl->lease_ns - rl->drift_ns;
    int64_t d = step_deadline(rl, q->deadline);
    /* One call per node, each its own grant's token, pipelined. */
    char tok[DLOCK_REDLOCK_NODES_MAX][24];
    const char *argv[DLOCK_REDLOCK_NODES_MAX][4];
    const char **each[DLOCK_REDLOCK_NODES_MAX];
    for (unsigned i = 0; i < rl->n; i++) {
        snprintf(tok[i], sizeof tok[i], "%" PRIu64, g->node_token[i]);
        argv[i][0] = q->keys[DLOCK_KEY_LEASE];
        argv[i][1] = q->args->client_id;
        argv[i][2] = rl->lease_str;
        argv[i][3] = tok[i];
        each[i] = argv[i];
    }
    peers_call_each(rl, p, only, 1, dlock_script_in(DLOCK_SCRIPT_RENEW, 2), 1, 3,
                    (const char **const *)each, 1, d);
    unsigned ok = 0, gone = 0;
    char msg[600] = "";
    size_t len = 0;
    for (unsigned i = 0; i < rl->n; i++) {
        const redisReply *r = p[i].rep;
        int one = !p[i].failed && r && r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
                  r->element[0]->type == REDIS_REPLY_INTEGER;
        if (one && r->element[0]->integer == 1 && counts_now(rl, i, p[i].run, p[i].seed, first))
            ok++;
        else if (one && r->element[0]->integer != 1)
            gone++;
        else if (len < sizeof msg)
            len += (size_t)snprintf(msg + len, sizeof msg - len, "; %s %s", rl->node[i].addr,
                                    p[i].failed ? p[i].why : "does not count");
    }
    peers_close(rl, p);
    if (ok >= rl->m && dlock_boot_ns() < valid) {
        *valid_boot = valid;
        return DLOCK_OK;
    }
    if (gone > rl->n - rl->m)
        return dlock_err_set(DLOCK_ELOST, "redlock renewal of '%s': %u of %u nodes no longer "
                             "hold the grant", q->name, gone, rl->n);
    return dlock_err_set(DLOCK_EREDIS, "redlock renewal of '%s': %u of %u counting nodes "
                         "renewed it, %u needed%s", q->name, ok, rl->n, rl->m, msg);
}

/* One exchange of renew_many: leases l[0 .. k), every node asked for all
 * of them (token "0" where it granted none: renew.lua answers 0, not
 * counted). */
/* Re-grants l[0 .. k) after their renewal's exchange (first: its first
 * send): acquire.lua under each lease's attempt on the nodes that hold no
 * grant of it, one exchange per lease, at most DLOCK_REDLOCK_REGRANTS
 * leases; a node that failed the renewal's exchange (skip[i]), or fails
 * one here, is not asked (again). Adds to acks[j] each counting node that
 * granted lease j; its grants in l[j].regrant. */
static void regrant_chunk(dlock_redlock *rl, const dlock_script_args *args,
                          const char *client_name, dlock_redlock_lease *l, size_t k,
                          int64_t first, int64_t deadline, const int *skip, unsigned *acks)
{
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    int need[DLOCK_REDLOCK_NODES_MAX] = {0}, any = 0;
    for (size_t j = 0; j < k; j++)
        for (unsigned i = 0; i < rl->n; i++)
            need[i] |= !l[j].g->node_token[i];
    for (unsigned i = 0; i < rl->n; i++) {
        need[i] &= !skip[i];
        any |= need[i];
        if (!need[i])
            peer_fail(&p[i], "%s", "not asked");
    }
    if (!any)
        return;
    peers_open(rl, p, deadline);
    char pl[16], att[24];
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_ACQUIRE_ARGS];
    const char **a = argv + DLOCK_SCRIPT_KEYS;
    for (size_t j = 0, done = 0; j < k && done < DLOCK_REDLOCK_REGRANTS; j++) {
        int only[DLOCK_REDLOCK_NODES_MAX], some = 0;
        for (unsigned i = 0; i < rl->n; i++)
            some |= only[i] = !l[j].g->node_token[i] && !p[i].failed;
        if (!some)
            continue;
        done++;
        for (int x = 0; x < DLOCK_SCRIPT_KEYS; x++)
            argv[x] = l[j].keys[x];
        snprintf(att, sizeof att, "%" PRIu64, l[j].g->attempt);
        snprintf(pl, sizeof pl, "%s", args->pass_limit);
        /* as the acquire's (dlock_redlock_acquire), a single try */
        a[0] = args->client_id;
        a[1] = rl->lease_str;
        a[2] = att;
        a[3] = pl;
        a[4] = args->waiter_ttl_ms;
        a[5] = "0";
        a[6] = args->keep_ms;
        a[7] = client_name;
        a[8] = "0";
        a[9] = "0";
        peers_call(rl, p, only, 1, dlock_script_in(DLOCK_SCRIPT_ACQUIRE, 2), DLOCK_SCRIPT_KEYS,
                   DLOCK_ACQUIRE_ARGS, argv, 1, step_deadline(rl, deadline));
        for (unsigned i = 0; i < rl->n; i++) {
            const redisReply *r = p[i].rep;
            if (!only[i] || p[i].failed || !r || r->type != REDIS_REPLY_ARRAY ||
                r->elements < 2 || r->element[0]->type != REDIS_REPLY_INTEGER ||
                r->element[1]->type != REDIS_REPLY_INTEGER || r->element[0]->integer != 1)
                continue;
            l[j].regrant[i] = (uint64_t)r->element[1]->integer;
            if (same_run(rl, p, i) < 0 && counts_now(rl, i, p[i].run, p[i].seed, first))
                acks[j]++;
        }
    }
    peers_close(rl, p);
}

static void renew_chunk(dlock_redlock *rl, const dlock_script_args *args,
                        const char *client_name, dlock_redlock_lease *l, size_t k,
                        int64_t deadline)
{
    const char *client_id = args->client_id;
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    const char **argv[DLOCK_REDLOCK_NODES_MAX];
    char *tok[DLOCK_REDLOCK_NODES_MAX];
    int only[DLOCK_REDLOCK_NODES_MAX] = {0}, oom = 0;
    for (unsigned i = 0; i < rl->n; i++) {
        argv[i] = malloc(sizeof *argv[i] * (2 * k + 2));
        tok[i] = malloc(24 * k);
        oom |= !argv[i] || !tok[i];
        for (size_t j = 0; j < k; j++)
            only[i] |= l[j].g->node_token[i] != 0;
        if (!only[i])
            peer_fail(&p[i], "%s", "granted nothing");
    }
    for (unsigned i = 0; i < rl->n && !oom; i++) {
        for (size_t j = 0; j < k; j++) {
            argv[i][j] = l[j].key;
            snprintf(tok[i] + 24 * j, 24, "%" PRIu64, l[j].g->node_token[i]);
            argv[i][k + 2 + j] = tok[i] + 24 * j;
        }
        argv[i][k] = client_id;
        argv[i][k + 1] = rl->lease_str;
    }
    for (size_t j = 0; j < k; j++) {
        l[j].verdict = -1, l[j].sent_boot = 0;
        memset(l[j].regrant, 0, sizeof l[j].regrant);
    }
    unsigned *acks = calloc(k, sizeof *acks);
    oom |= !acks;
    if (!oom) {
        peers_open(rl, p, deadline);
        int64_t first = dlock_boot_ns();
        int64_t valid = first + rl->lease_ns - rl->drift_ns;
        for (size_t j = 0; j < k; j++)
            l[j].sent_boot = first;
        peers_call_each(rl, p, only, 1, dlock_script_in(DLOCK_SCRIPT_RENEW, 2), (int)k,
                        (int)k + 2, (const char **const *)argv, 1,
                        step_deadline(rl, deadline));
        int counts[DLOCK_REDLOCK_NODES_MAX];
        for (unsigned i = 0; i < rl->n; i++) {
            const redisReply *r = p[i].rep;
            int fits = !p[i].failed && r && r->type == REDIS_REPLY_ARRAY && r->elements == k;
            for (size_t j = 0; fits && j < k; j++)
                fits = r->element[j]->type == REDIS_REPLY_INTEGER;
            if (!fits && !p[i].failed)
                peer_fail(&p[i], "%s", "answered no renewal");
            counts[i] = !p[i].failed && counts_now(rl, i, p[i].run, p[i].seed, first);
        }
        int skip[DLOCK_REDLOCK_NODES_MAX];
        for (unsigned i = 0; i < rl->n; i++)
            skip[i] = only[i] && p[i].failed; /* (asked, and failed: stopped or gone) */
        regrant_chunk(rl, args, client_name, l, k, first, deadline, skip, acks);
        int in_time = dlock_boot_ns() < valid;
        for (size_t j = 0; j < k; j++) {
            unsigned ok = acks[j], gone = 0;
            for (unsigned i = 0; i < rl->n; i++) {
                if (p[i].failed || !l[j].g->node_token[i])
                    continue;
                if (p[i].rep->element[j]->integer == 1)
                    ok += counts[i];
                else
                    gone++;
            }
            if (ok >= rl->m && in_time) {
                l[j].verdict = 1;
                l[j].valid_boot = valid;
            } else if (gone > rl->n - rl->m) {
                l[j].verdict = 0;
            }
        }
        char msg[600] = "";
        size_t len = 0;
        for (unsigned i = 0; i < rl->n; i++)
            if ((p[i].failed || !counts[i]) && only[i] && len < sizeof msg)
                len += (size_t)snprintf(msg + len, sizeof msg - len, "; %s %s",
                                        rl->node[i].addr,
                                        p[i].failed ? p[i].why : "does not count");
        for (size_t j = 0; j < k; j++)
            if (l[j].verdict != 1)
                dlock_err_set(l[j].verdict ? DLOCK_EREDIS : DLOCK_ELOST, "redlock renewal of "
                              "'%s': not confirmed by %u counting nodes%s%s", l[j].name, rl->m,
                              in_time ? "" : " within its validity", msg);
        peers_close(rl, p);
    } else {
        dlock_err_set(DLOCK_ENOMEM, "out of memory");
    }
    for (unsigned i = 0; i < rl->n; i++) {
        free(argv[i]);
        free(tok[i]);
    }
    free(acks);
}

int dlock_redlock_renew_many(dlock_redlock *rl, const dlock_script_args *args,
                             const char *client_name, dlock_redlock_lease *l, size_t n,
                             int64_t deadline)
{
    int rc = DLOCK_OK;
    char why[700] = "";
    for (size_t from = 0; from < n; from += DLOCK_REDLOCK_RENEW_BATCH) {
        size_t k = n - from < DLOCK_REDLOCK_RENEW_BATCH ? n - from : DLOCK_REDLOCK_RENEW_BATCH;
        renew_chunk(rl, args, client_name, l + from, k, deadline);
        for (size_t j = from; j < from + k; j++)
            if (l[j].verdict != 1 && rc == DLOCK_OK) {
                rc = l[j].verdict ? DLOCK_EREDIS : DLOCK_ELOST;
                snprintf(why, sizeof why, "%s", dlock_last_error());
            }
    }
    if (rc == DLOCK_OK)
        return rc;
    return dlock_err_set(rc, "%s", why);
}
