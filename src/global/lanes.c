/*
 * The renewal thread's connections (lanes.h). No locks: one thread at a
 * time owns a dlock_lanes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "route/cluster.h"
#include "common/error.h"
#include "global/lanes.h"
#include "route/sentinel.h"

enum {
    BACKOFF_MIN_MS = 100, /* the first pause after a failed open */
    OPEN_BACKOFF_MAX_MS = 500, /* longest pause between failed opens of a lane */
};

void dlock_lanes_pass(dlock_lanes *lanes)
{
    lanes->pass++;
}

int64_t dlock_lanes_deadline(const dlock_lanes *lanes)
{
    return dlock_conn_deadline(lanes->conn->command_timeout_ms);
}

static dlock_cluster *cluster_of(const dlock_lanes *lanes)
{
    return lanes->conn->cluster;
}

int dlock_lanes_route(dlock_lanes *lanes, const char *key, unsigned *slot)
{
    *slot = 0;
    if (!cluster_of(lanes))
        return 0;
    *slot = dlock_cluster_slot(key, strlen(key));
    /* no refresh waited for here: the subscriber thread makes it */
    dlock_cluster_node *n = dlock_cluster_route(cluster_of(lanes), *slot, dlock_now_ns());
    if (!n)
        dlock_cluster_want_refresh(cluster_of(lanes));
    return n ? (int)n->index : -1;
}

redisContext *dlock_lanes_get(const dlock_lanes *lanes, int i)
{
    return i >= 0 && (unsigned)i < lanes->n ? lanes->v[i].conn : NULL;
}

/* Lane i's connection for the current pass (lanes->pass): the first call of
 * the pass opens it if it has none (or a failed one, or one to a master the
 * sentinels no longer name), unless a failed open asked for a pause; later
 * calls of the pass return what the first decided, so a node that does not
 * answer costs one connect per pass and backoff, not one per chunk, and a
 * connection with appended requests is never replaced under them. NULL if
 * it has no usable connection. */
redisContext *dlock_lanes_open(dlock_lanes *lanes, int i)
{
    if (i < 0)
        return NULL;
    if ((unsigned)i >= lanes->n) {
        unsigned n = (unsigned)i + 1;
        dlock_lane *l = realloc(lanes->v, n * sizeof *l);
        if (!l)
            return NULL;
        memset(l + lanes->n, 0, (n - lanes->n) * sizeof *l);
        lanes->v = l;
        lanes->n = n;
    }
    dlock_lane *l = &lanes->v[i];
    if (l->pass != lanes->pass) {
        l->pass = lanes->pass;
        if (l->conn && (l->conn->err || dlock_sentinel_stale(lanes->conn, l->conn))) {
            redisFree(l->conn); /* failed, or the master moved */
            l->conn = NULL;
        }
        int64_t now = dlock_now_ns();
        if (!l->conn && now >= l->retry_ns) {
            const dlock_conn_cfg *cfg =
                cluster_of(lanes) ? &dlock_cluster_node_get(cluster_of(lanes), (unsigned)i)->cfg
                              : lanes->conn;
            l->open_rc = dlock_conn_open(cfg, lanes->ctr, &l->conn);
            if (l->open_rc != DLOCK_OK) {
                snprintf(l->open_err, sizeof l->open_err, "%s", dlock_last_error());
                l->conn = NULL;
                /* 100 ms, doubling up to 500 ms, before the next try: short
                 * enough that a server back from a restart is found well
                 * within a lease */
                if (l->backoff_ns < BACKOFF_MIN_MS * DLOCK_NS_PER_MS)
                    l->backoff_ns = BACKOFF_MIN_MS * DLOCK_NS_PER_MS;
                l->retry_ns = dlock_now_ns() + l->backoff_ns;
                l->backoff_ns = l->backoff_ns * 2 < OPEN_BACKOFF_MAX_MS * DLOCK_NS_PER_MS
                                    ? l->backoff_ns * 2
                                    : OPEN_BACKOFF_MAX_MS * DLOCK_NS_PER_MS;
                if (cluster_of(lanes))
                    dlock_cluster_want_refresh(cluster_of(lanes)); /* a failover? */
            } else {
                l->wrote = 0;
                l->backoff_ns = 0;
            }
        }
    }
    return l->conn && !l->conn->err ? l->conn : NULL;
}

void dlock_lanes_drop(dlock_lanes *lanes, int i)
{
    if (i >= 0 && (unsigned)i < lanes->n && lanes->v[i].conn) {
        redisFree(lanes->v[i].conn);
        lanes->v[i].conn = NULL;
    }
}

void dlock_lanes_drop_failed(dlock_lanes *lanes)
{
    int failed = 0;
    for (unsigned i = 0; i < lanes->n; i++)
        if (lanes->v[i].conn && lanes->v[i].conn->err) {
            dlock_lanes_drop(lanes, (int)i);
            failed = 1;
        }
    if (failed && cluster_of(lanes))
        dlock_cluster_want_refresh(cluster_of(lanes));
}

void dlock_lanes_oom(redisContext *c)
{
    if (!c->err) {
        c->err = REDIS_ERR_OOM;
        snprintf(c->errstr, sizeof c->errstr, "out of memory");
    }
}

unsigned dlock_lanes_flush(dlock_lanes *lanes, int64_t deadline)
{
    unsigned n = 0;
    for (unsigned i = 0; i < lanes->n; i++) {
        if (!lanes->v[i].wrote)
            continue;
        lanes->v[i].wrote = 0;
        if (lanes->v[i].conn && !lanes->v[i].conn->err &&
            dlock_conn_flush(lanes->v[i].conn, deadline) == 0)
            n++;
    }
    return n;
}

int dlock_lanes_append_asking(dlock_lanes *lanes, redisContext *c)
{
    const char *argv[1] = {"ASKING"};
    dlock_count(&lanes->ctr->redis_commands, 1);
    return redisAppendCommandArgv(c, 1, argv, NULL) == REDIS_OK ? 0 : -1;
}

int dlock_lanes_read_reply(redisContext *c, int asking, int64_t deadline, redisReply **out)
{
    if (asking) {
        redisReply *ok = NULL;
        if (dlock_conn_read(c, deadline, &ok) != 0)
            return -1;
        freeReplyObject(ok);
    }
    return dlock_conn_read(c, deadline, out);
}

int dlock_lanes_redirect(dlock_lanes *lanes, const redisReply *rep, int from, int *lane)
{
    dlock_cluster *cl = cluster_of(lanes);
    if (!cl || from < 0)
        return DLOCK_REDO_NONE;
    char host[256];
    int port;
    unsigned slot;
    int kind = dlock_cluster_redirect(rep, dlock_cluster_node_get(cl, (unsigned)from)->cfg.host,
                                      &slot, host, sizeof host, &port);
    dlock_cluster_node *n = kind ? dlock_cluster_node_at(cl, host, port) : NULL;
    if (!n)
        return DLOCK_REDO_NONE;
    if (kind == DLOCK_REDIRECT_MOVED)
        dlock_cluster_set_slot(cl, slot, n);
    *lane = (int)n->index;
    return kind == DLOCK_REDIRECT_MOVED ? DLOCK_REDO_MOVED : DLOCK_REDO_ASK;
}

void dlock_lanes_reset_backoff(dlock_lanes *lanes)
{
    for (unsigned i = 0; i < lanes->n; i++)
        lanes->v[i].retry_ns = lanes->v[i].backoff_ns = 0;
}

void dlock_lanes_close(dlock_lanes *lanes)
{
    for (unsigned i = 0; i < lanes->n; i++)
        dlock_lanes_drop(lanes, (int)i);
    free(lanes->v);
    lanes->v = NULL;
    lanes->n = 0;
}
