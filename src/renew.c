/*
 * The renewal manager.
 *
 * Shared state and its guards:
 *   r->mu guards the registry (items, count), the orphan list, r->stop and
 *   r->writing. It is never held during Redis I/O.
 *   Each item stands for one grant (entry, epoch, token) and holds one
 *   reference on its entry. e->renew points at e's item; it is written only
 *   with both e->mu and r->mu held, so either lock suffices to read it. Items
 *   are freed only under r->mu, so an item seen in the registry under r->mu
 *   can be read then.
 * Lock order: e->mu, then r->mu. The manager thread never takes e->mu while
 * holding r->mu, and never calls dlock_table_put with any lock held.
 *
 * A round:
 *   1. under r->mu: snapshot every item (entry with an extra reference, epoch,
 *      token), append one renew script call per chunk to the connection's
 *      buffer, and set r->writing.
 *   2. without locks: write the buffer out; then, under r->mu, clear
 *      r->writing and wake releasers waiting in dlock_renew_quiesce. A
 *      releaser unregisters its grant (under r->mu) and then waits out any
 *      write in progress before it sends its release: so no renewal of a
 *      grant is ever sent after its release (a late renewal could otherwise
 *      extend a lease whose release failed).
 *   3. without locks: read the replies (one round trip for all chunks).
 *   4. per entry, under e->mu: apply the verdict only if the entry still holds
 *      the same grant (state HELD, same epoch, same item): renewed -> validity
 *      extended from the time the round was sent; gone -> lost; no answer ->
 *      lost only once the validity deadline has passed.
 *   5. without locks: run the lost callbacks, then drop the references.
 * Between rounds the thread sleeps until the next period (lease/3), or sooner
 * when the earliest validity deadline of a lease that could not be renewed
 * comes first, or a caller asked for a round by some time (dlock_renew_by,
 * for a direct grant valid for the waiter ttl only) or at once
 * (dlock_renew_kick), or after a short retry pause when Redis failed. A due
 * round goes before the orphan releases.
 *
 * Orphans: a caller whose acquire has an unknown outcome hands the attempt's
 * nonce here (dlock_renew_orphan) instead of waiting for another round trip;
 * the thread wakes, releases exactly that grant if it exists, and keeps
 * trying for one lease time while Redis fails (after that it expired).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "cluster.h"
#include "renew.h"
#include "sentinel.h"

enum {
    CHUNK = 200,          /* keys per renew script call */
    RETRY_MS = 100,       /* pause after a failed round, at most */
    OPEN_BACKOFF_MAX_MS = 500, /* longest pause between failed opens of a lane */
};

struct dlock_renew_item {
    dlock_renew_item *prev, *next;
    dlock_entry *e;
    uint64_t epoch;
    char token[24]; /* decimal, as the scripts store it */
};

typedef struct orphan {
    struct orphan *next;
    int leave;              /* 0: release the grant of attempt `nonce`; 1: leave
                               the wait queue, as call number `nonce` */
    int64_t until_ns;       /* give up then: the lease has expired */
    int64_t next_try_ns;    /* when the next release try is due */
    int64_t backoff_ns;     /* pause before the try after that */
    int result;             /* of the last try (release_orphans) */
    int lane, sent, redo;   /* release_orphans' bookkeeping for the try: where, */
    int eval, asking;       /* sent or not, to run again (as EVAL, after ASKING) */
    char nonce[24];         /* decimal */
    char *keys[DLOCK_KEYS]; /* copies of the entry's keys, in buf */
    char *name;             /* in buf */
    char buf[];
} orphan;

/* One connection of the manager: to the server, or in Cluster mode to one
 * master (lane i: node i of the slot map). */
typedef struct lane {
    redisContext *conn;
    int wrote;          /* appended to since the last flush */
    int acked;          /* a renewal ran here this round: WAIT here (min_replicas) */
    unsigned pass;      /* the pass (r->pass) that last decided on this lane's
                           connection: it is opened at most once per pass */
    int64_t retry_ns;   /* after a failed open: no new try before then */
    int64_t backoff_ns; /* the pause after the next failed open */
    int open_rc;        /* the last open's result (DLOCK_ESERVER: the server unfit) */
    char open_err[256]; /* and its message */
} lane;

struct dlock_renew {
    dlock_renew_cfg cfg;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* CLOCK_MONOTONIC: stop, a first item, or an orphan */
    pthread_cond_t wrote;    /* r->writing went back to 0 */
    dlock_renew_item *items; /* list head, guarded by mu */
    size_t count;            /* guarded by mu */
    orphan *orphans;         /* guarded by mu */
    int orphan_new;          /* guarded by mu: an orphan arrived, due at once */
    int kick;                /* guarded by mu: renew now, not at the period's end */
    int64_t due;             /* guarded by mu: start a round by then (monotonic), at
                                the latest; DLOCK_NEVER: at the period's end */
    int writing;             /* guarded by mu: a renewal write is in progress */
    int stop;                /* guarded by mu */
    lane *lanes;             /* the manager thread's connections (see lane_open); only */
    unsigned nlanes;         /* that thread touches them, and dlock_renew_stop after it */
    unsigned pass;           /* bumped at the start of each pipeline (same owner) */
                             /* (the manager thread also clears the lanes' backoff on
                                a kick, under mu: dlock_renew_stop runs after it) */
    int64_t period_ns, drift_ns;
    int failing;             /* the last round failed (manager thread only): log changes */
    int64_t check_ns;        /* the server check's period (dlock_renew_check_ns) */
};

int64_t dlock_renew_check_ns(uint32_t lease_ms)
{
    int64_t p = (int64_t)lease_ms * DLOCK_NS_PER_MS / 3;
    if (p < 1000 * DLOCK_NS_PER_MS)
        p = 1000 * DLOCK_NS_PER_MS;
    if (p > 30000 * DLOCK_NS_PER_MS)
        p = 30000 * DLOCK_NS_PER_MS;
    return p;
}


typedef struct snap {
    dlock_entry *e;
    int lane;      /* where its renewal goes: -1 nowhere (no node known) */
    unsigned slot; /* Cluster mode: its keys' slot */
    uint64_t epoch;
    dlock_renew_item *item; /* identity only: compared, never dereferenced */
    char token[24];
    int verdict; /* 1 renewed, 0 gone, -1 no answer */
    uint64_t lost_token; /* the holder's token when found lost */
} snap;

int64_t dlock_renew_drift_ns(uint32_t lease_ms)
{
    /* Clock drift between this host and Redis: 1% of the lease plus 2 ms. */
    return (int64_t)lease_ms * DLOCK_NS_PER_MS / 100 + 2 * DLOCK_NS_PER_MS;
}

int dlock_renew_add(dlock_renew *r, dlock_entry *e)
{
    DLOCK_ASSERT(e->state == DLOCK_LEASE_HELD && e->renew == NULL);
    dlock_renew_item *it = calloc(1, sizeof *it);
    if (!it)
        return DLOCK_ENOMEM;
    it->e = e;
    it->epoch = e->epoch;
    snprintf(it->token, sizeof it->token, "%" PRIu64, e->grant_token);
    dlock_table_ref(e);
    pthread_mutex_lock(&r->mu);
    it->next = r->items;
    if (r->items)
        r->items->prev = it;
    r->items = it;
    r->count++;
    e->renew = it;
    if (r->count == 1)
        pthread_cond_signal(&r->cv); /* the thread may sleep without a period */
    pthread_mutex_unlock(&r->mu);
    return DLOCK_OK;
}

/* Called with r->mu held. */
static void unlink_item(dlock_renew *r, dlock_renew_item *it)
{
    if (it->prev)
        it->prev->next = it->next;
    else
        r->items = it->next;
    if (it->next)
        it->next->prev = it->prev;
    r->count--;
    it->e->renew = NULL;
    free(it);
}

int dlock_renew_remove(dlock_renew *r, dlock_entry *e)
{
    if (!e->renew)
        return 0;
    pthread_mutex_lock(&r->mu);
    unlink_item(r, e->renew);
    pthread_mutex_unlock(&r->mu);
    return 1;
}

int dlock_renew_mark_lost(dlock_renew *r, dlock_entry *e)
{
    DLOCK_ASSERT(e->state == DLOCK_LEASE_HELD);
    e->state = DLOCK_LEASE_LOST;
    dlock_count(&r->cfg.ctr->leases_held, (uint64_t)-1);
    dlock_count(&r->cfg.ctr->leases_lost, 1);
    dlock_waitq_wake_head(&e->wq); /* a passed lease lost: the head polls instead */
    return dlock_renew_remove(r, e);
}

/* Called with r->mu held: copies the registry, taking a reference on each
 * entry. Returns the number copied, or -1 when out of memory. */
static ssize_t snapshot(dlock_renew *r, snap **out)
{
    *out = NULL;
    if (!r->count)
        return 0;
    snap *s = malloc(sizeof *s * r->count);
    if (!s)
        return -1;
    size_t n = 0;
    r->pass++; /* each lane is opened at most once */
    for (dlock_renew_item *it = r->items; it; it = it->next, n++) {
        dlock_table_ref(it->e); /* the item's reference keeps refs > 0 */
        s[n].e = it->e;
        s[n].epoch = it->epoch;
        s[n].item = it;
        memcpy(s[n].token, it->token, sizeof s[n].token);
        s[n].verdict = -1;
    }
    *out = s;
    return (ssize_t)n;
}

/* The deadline of an exchange starting now. */
static int64_t cmd_deadline(const dlock_renew *r)
{
    return dlock_conn_deadline(r->cfg.conn->command_timeout_ms);
}

static dlock_cluster *cluster_of(const dlock_renew *r)
{
    return r->cfg.conn->cluster;
}

/* The lane of key: 0 outside Cluster mode, else the node index of the
 * master serving its slot (*slot set); -1 when no node is known. */
static int lane_of(dlock_renew *r, const char *key, unsigned *slot)
{
    *slot = 0;
    if (!cluster_of(r))
        return 0;
    *slot = dlock_cluster_slot(key, strlen(key));
    /* no refresh waited for here: the subscriber thread makes it */
    dlock_cluster_node *n = dlock_cluster_route(cluster_of(r), *slot, dlock_now_ns());
    if (!n)
        dlock_cluster_want_refresh(cluster_of(r));
    return n ? (int)n->index : -1;
}

/* Lane i's connection as it is (NULL: none). */
static redisContext *lane_get(const dlock_renew *r, int i)
{
    return i >= 0 && (unsigned)i < r->nlanes ? r->lanes[i].conn : NULL;
}

/* Lane i's connection for the current pass (r->pass): the first call of
 * the pass opens it if it has none (or a failed one, or one to a master the
 * sentinels no longer name), unless a failed open asked for a pause; later
 * calls of the pass return what the first decided, so a node that does not
 * answer costs one connect per pass and backoff, not one per chunk, and a
 * connection with appended requests is never replaced under them. NULL if
 * it has no usable connection. */
static redisContext *lane_open(dlock_renew *r, int i)
{
    if (i < 0)
        return NULL;
    if ((unsigned)i >= r->nlanes) {
        unsigned n = (unsigned)i + 1;
        lane *l = realloc(r->lanes, n * sizeof *l);
        if (!l)
            return NULL;
        memset(l + r->nlanes, 0, (n - r->nlanes) * sizeof *l);
        r->lanes = l;
        r->nlanes = n;
    }
    lane *l = &r->lanes[i];
    if (l->pass != r->pass) {
        l->pass = r->pass;
        if (l->conn && (l->conn->err || dlock_sentinel_stale(r->cfg.conn, l->conn))) {
            redisFree(l->conn); /* failed, or the master moved */
            l->conn = NULL;
        }
        int64_t now = dlock_now_ns();
        if (!l->conn && now >= l->retry_ns) {
            const dlock_conn_cfg *cfg =
                cluster_of(r) ? &dlock_cluster_node_get(cluster_of(r), (unsigned)i)->cfg
                              : r->cfg.conn;
            l->open_rc = dlock_conn_open(cfg, r->cfg.ctr, &l->conn);
            if (l->open_rc != DLOCK_OK) {
                snprintf(l->open_err, sizeof l->open_err, "%s", dlock_last_error());
                l->conn = NULL;
                /* 100 ms, doubling up to 500 ms, before the next try: short
                 * enough that a server back from a restart is found well
                 * within a lease */
                if (l->backoff_ns < RETRY_MS * DLOCK_NS_PER_MS)
                    l->backoff_ns = RETRY_MS * DLOCK_NS_PER_MS;
                l->retry_ns = dlock_now_ns() + l->backoff_ns;
                l->backoff_ns = l->backoff_ns * 2 < OPEN_BACKOFF_MAX_MS * DLOCK_NS_PER_MS
                                    ? l->backoff_ns * 2
                                    : OPEN_BACKOFF_MAX_MS * DLOCK_NS_PER_MS;
                if (cluster_of(r))
                    dlock_cluster_want_refresh(cluster_of(r)); /* a failover? */
            } else {
                l->wrote = 0;
                l->backoff_ns = 0;
            }
        }
    }
    return l->conn && !l->conn->err ? l->conn : NULL;
}

/* Closes lane i's connection (reconnect next time). */
static void lane_drop(dlock_renew *r, int i)
{
    if (i >= 0 && (unsigned)i < r->nlanes && r->lanes[i].conn) {
        redisFree(r->lanes[i].conn);
        r->lanes[i].conn = NULL;
    }
}

/* Closes every failed connection (and in Cluster mode asks for a refresh of
 * the map: a failover?). */
static void lanes_drop_failed(dlock_renew *r)
{
    int failed = 0;
    for (unsigned i = 0; i < r->nlanes; i++)
        if (r->lanes[i].conn && r->lanes[i].conn->err) {
            lane_drop(r, (int)i);
            failed = 1;
        }
    if (failed && cluster_of(r))
        dlock_cluster_want_refresh(cluster_of(r));
}

/* Marks c failed after an append ran out of memory: what it holds (an
 * ASKING without its call, say) is never flushed, and it is dropped. */
static void conn_oom(redisContext *c)
{
    if (!c->err) {
        c->err = REDIS_ERR_OOM;
        snprintf(c->errstr, sizeof c->errstr, "out of memory");
    }
}

/* Flushes every lane marked `wrote`, clearing the marks. Returns how many
 * were written; a lane that failed keeps its error (its replies are not
 * read). */
static unsigned lanes_flush(dlock_renew *r, int64_t deadline)
{
    unsigned n = 0;
    for (unsigned i = 0; i < r->nlanes; i++) {
        if (!r->lanes[i].wrote)
            continue;
        r->lanes[i].wrote = 0;
        if (r->lanes[i].conn && !r->lanes[i].conn->err &&
            dlock_conn_flush(r->lanes[i].conn, deadline) == 0)
            n++;
    }
    return n;
}

/* Appends ASKING (after an ASK redirect) to c. 0 or -1. */
static int append_asking(dlock_renew *r, redisContext *c)
{
    const char *argv[1] = {"ASKING"};
    dlock_count(&r->cfg.ctr->redis_commands, 1);
    return redisAppendCommandArgv(c, 1, argv, NULL) == REDIS_OK ? 0 : -1;
}

/* Reads the reply to an ASKING (when `asking`) and then one call's reply.
 * 0 with *out set, or -1 if the connection failed. */
static int read_reply(redisContext *c, int asking, int64_t deadline, redisReply **out)
{
    if (asking) {
        redisReply *ok = NULL;
        if (dlock_conn_read(c, deadline, &ok) != 0)
            return -1;
        freeReplyObject(ok);
    }
    return dlock_conn_read(c, deadline, out);
}

/* What a reply asks for: nothing, or to run the call again: as EVAL
 * (NOSCRIPT: kept for later tries), on the slot's new master (MOVED), or on
 * the importing node after ASKING (ASK: for the next try only). */
enum { REDO_NONE = 0, REDO_EVAL, REDO_MOVED, REDO_ASK };

/* Sorts out a MOVED or ASK reply from lane `from`: records a move in the
 * slot map, and sets *lane to the node to ask. REDO_NONE if it is none of
 * them (or the node cannot be added). */
static int redirect(dlock_renew *r, const redisReply *rep, int from, int *lane)
{
    dlock_cluster *cl = cluster_of(r);
    if (!cl || from < 0)
        return REDO_NONE;
    char host[256];
    int port;
    unsigned slot;
    int kind = dlock_cluster_redirect(rep, dlock_cluster_node_get(cl, (unsigned)from)->cfg.host,
                                      &slot, host, sizeof host, &port);
    dlock_cluster_node *n = kind ? dlock_cluster_node_at(cl, host, port) : NULL;
    if (!n)
        return REDO_NONE;
    if (kind == DLOCK_REDIRECT_MOVED)
        dlock_cluster_set_slot(cl, slot, n);
    *lane = (int)n->index;
    return kind == DLOCK_REDIRECT_MOVED ? REDO_MOVED : REDO_ASK;
}

/* Ends a write begun under r->mu (r->writing set): releasers may go on. */
static void end_write(dlock_renew *r)
{
    pthread_mutex_lock(&r->mu);
    r->writing = 0;
    pthread_cond_broadcast(&r->wrote);
    pthread_mutex_unlock(&r->mu);
}

void dlock_renew_quiesce(dlock_renew *r)
{
    pthread_mutex_lock(&r->mu);
    while (r->writing)
        pthread_cond_wait(&r->wrote, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

/* A round's unit of writing: one renew call for s[at .. at + k), all on
 * one lane (and in Cluster mode one slot: a script's keys share a slot). */
typedef struct chunk {
    size_t at, k;
    size_t m;   /* of those, the grants still registered when appended: p[at .. at + m) */
    int lane;   /* -1: no node known, or no connection: not sent */
    int redo;   /* run again in the next pass */
    int eval;   /* send as EVAL (a NOSCRIPT was seen) */
    int asking; /* send after ASKING (an ASK was seen; cleared by a MOVED) */
    int sent;   /* appended in the current pass (then sent_asking: with ASKING) */
    int sent_asking;
    int failed; /* answered with an error (TRYAGAIN, CLUSTERDOWN, ...): unknown */
} chunk;

/* Under r->mu: appends ch's call for its grants that are still registered
 * (a grant released since the snapshot is not renewed: its releaser did not
 * wait for this write) to c, as EVALSHA or (after NOSCRIPT) EVAL, after
 * ASKING after an ASK redirect. 1 if appended, 0 if none is left, -1 when
 * out of memory. */
static int append_chunk(dlock_renew *r, snap *s, snap **p, chunk *ch, redisContext *c)
{
    size_t m = 0;
    for (size_t i = ch->at; i < ch->at + ch->k; i++) {
        dlock_renew_item *it = s[i].e->renew; /* readable under r->mu */
        if (it == s[i].item && it->epoch == s[i].epoch)
            p[ch->at + m++] = &s[i];
    }
    ch->m = m;
    if (!m)
        return 0;
    const char *argv[2 * CHUNK + 2];
    for (size_t i = 0; i < m; i++) {
        argv[i] = p[ch->at + i]->e->keys[DLOCK_KEY_LEASE];
        argv[m + 2 + i] = p[ch->at + i]->token;
    }
    argv[m] = r->cfg.args->client_id;
    argv[m + 1] = r->cfg.args->lease_ms;
    ch->sent_asking = ch->asking;
    if ((ch->asking && append_asking(r, c) != 0) ||
        dlock_conn_append_eval(c, r->cfg.ctr, DLOCK_SCRIPT_RENEW, !ch->eval, (int)m, (int)m + 2,
                               argv, NULL) != 0) {
        conn_oom(c);
        return -1;
    }
    return 1;
}

/* Reads ch's reply into its grants' verdicts, or sets ch->redo (and
 * ch->lane for a redirect). 0, or -1 if the connection failed. */
static int read_chunk(dlock_renew *r, snap **p, chunk *ch, redisContext *c)
{
    redisReply *rep = NULL;
    ch->redo = 0;
    if (read_reply(c, ch->sent_asking, cmd_deadline(r), &rep) != 0)
        return -1;
    if (dlock_conn_is_noscript(rep) && !ch->eval) {
        /* a restarted server, or a node the client never loaded the
         * scripts on: again with EVAL (after ASKING still, if asked) */
        freeReplyObject(rep);
        ch->redo = ch->eval = 1;
        return 0;
    }
    int lane = ch->lane, redo = redirect(r, rep, ch->lane, &lane);
    if (redo != REDO_NONE) {
        freeReplyObject(rep);
        ch->redo = 1;
        ch->asking = redo == REDO_ASK;
        ch->lane = lane;
        return 0;
    }
    /* A replica (failover): verdicts unknown, and the lane is dropped so
     * that the next round finds the master. */
    dlock_conn_check_master(c, rep);
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == ch->m) {
        for (size_t i = 0; i < ch->m; i++)
            p[ch->at + i]->verdict = rep->element[i]->type == REDIS_REPLY_INTEGER &&
                                     rep->element[i]->integer == 1;
    } else {
        /* Any other reply (an error, TRYAGAIN, CLUSTERDOWN) leaves them
         * unknown, and the next round comes soon. */
        ch->failed = 1;
    }
    freeReplyObject(rep);
    return 0;
}

/* Step 3 and 4 of a round. Returns the earliest validity deadline among the
 * leases that stay registered but were not renewed, on the monotonic clock
 * (DLOCK_NEVER if none). */
static int64_t apply(dlock_renew *r, snap *s, size_t n, int64_t sent_boot)
{
    int64_t earliest = DLOCK_NEVER; /* on the boot clock, like validity */
    int64_t valid = sent_boot + (int64_t)r->cfg.lease_ms * DLOCK_NS_PER_MS - r->drift_ns;
    int64_t now = dlock_boot_ns();
    size_t nlost = 0;
    for (size_t i = 0; i < n; i++) {
        dlock_entry *e = s[i].e;
        int drop_registry_ref = 0, lost = 0;
        pthread_mutex_lock(&e->mu);
        if (e->state == DLOCK_LEASE_HELD && e->epoch == s[i].epoch && e->renew == s[i].item) {
            if (s[i].verdict == 1) {
                /* Set, not raised: the renewal reset the expiry in Redis to
                 * the lease time from this round, which may be sooner than a
                 * direct grant's waiter ttl. */
                e->valid_until_ns = valid;
                e->provisional = 0; /* a whole lease now */
            } else if (s[i].verdict == 0 || now >= e->valid_until_ns) {
                /* Redis may still have the grant as ours (the renewal went
                 * unanswered but may have run; or a step back of the
                 * server's clock brings an expired grant back), and the
                 * next acquire must go above its tokens (unconfirmed.h; the
                 * client records it when the holder or a waiter finds the
                 * loss). */
                if (e->token >= e->unconfirmed) {
                    e->unconfirmed = e->token;
                    e->unconfirmed_end = DLOCK_UNCLEAN_EXPIRED; /* a lost lease */
                }
                drop_registry_ref = dlock_renew_mark_lost(r, e);
                s[i].lost_token = e->token;
                if (!e->lost_notified) {
                    e->lost_notified = 1;
                    lost = 1;
                }
            } else if (e->valid_until_ns < earliest) {
                earliest = e->valid_until_ns;
            }
        }
        pthread_mutex_unlock(&e->mu);
        if (drop_registry_ref)
            dlock_table_put(r->cfg.table, e);
        /* Keep lost entries (and their names) referenced until the callback. */
        if (lost)
            s[nlost++] = s[i];
        else
            dlock_table_put(r->cfg.table, e);
    }
    for (size_t i = 0; i < nlost; i++) {
        if (r->cfg.lost)
            r->cfg.lost(r->cfg.lost_arg, s[i].e->name, s[i].lost_token);
        dlock_table_put(r->cfg.table, s[i].e);
    }
    if (earliest == DLOCK_NEVER)
        return DLOCK_NEVER;
    return dlock_now_ns() + (earliest - dlock_boot_ns()); /* on the monotonic clock */
}

/* WAIT min_replicas on c, within half a command timeout: 1 if that many
 * replicas have every write made on it so far, 0 if not (or the connection
 * failed: then c->err is set). */
static int replicas_acked(dlock_renew *r, redisContext *c)
{
    char want[16], ms[16];
    snprintf(want, sizeof want, "%" PRIu32, r->cfg.min_replicas);
    uint32_t t = r->cfg.conn->command_timeout_ms / 2;
    snprintf(ms, sizeof ms, "%" PRIu32, t ? t : 1);
    const char *argv[3] = {"WAIT", want, ms};
    redisReply *rep = dlock_conn_command(c, r->cfg.ctr, r->cfg.conn->command_timeout_ms, 3, argv);
    int ok = rep && rep->type == REDIS_REPLY_INTEGER &&
             rep->integer >= (long long)r->cfg.min_replicas;
    if (rep)
        freeReplyObject(rep);
    return ok;
}

/* Snapshot order in Cluster mode: by lane, then slot. */
static int by_lane_slot(const void *a, const void *b)
{
    const snap *x = a, *y = b;
    if (x->lane != y->lane)
        return x->lane < y->lane ? -1 : 1;
    return x->slot < y->slot ? -1 : x->slot > y->slot;
}

/* Cuts s[0..n) into chunks (at most CHUNK grants, one lane, one slot). */
static size_t make_chunks(const snap *s, size_t n, chunk *ch)
{
    size_t nc = 0;
    for (size_t i = 0; i < n; i++) {
        chunk *last = nc ? &ch[nc - 1] : NULL;
        if (last && last->k < CHUNK && last->lane == s[i].lane &&
            s[last->at].slot == s[i].slot) {
            last->k++;
            continue;
        }
        ch[nc++] = (chunk){.at = i, .k = 1, .lane = s[i].lane};
    }
    return nc;
}

/* One round. Returns when the next one is due. */
static int64_t round_once(dlock_renew *r)
{
    int64_t now = dlock_now_ns();
    snap *s;
    pthread_mutex_lock(&r->mu);
    ssize_t sn = snapshot(r, &s);
    pthread_mutex_unlock(&r->mu);
    if (sn <= 0)
        return now + r->period_ns; /* nothing held (or no memory): idle */
    size_t n = (size_t)sn;
    snap **p = malloc(sizeof *p * n);
    chunk *ch = malloc(sizeof *ch * n);
    int ok = p && ch;
    /* Route every grant (Cluster mode: its master, by its slot) and open
     * the lanes, before anything is written. */
    for (size_t i = 0; i < n; i++)
        s[i].lane = lane_of(r, s[i].e->keys[DLOCK_KEY_LEASE], &s[i].slot);
    if (cluster_of(r))
        qsort(s, n, sizeof *s, by_lane_slot);
    size_t nc = ok ? make_chunks(s, n, ch) : 0;
    int64_t sent_ns = dlock_now_ns(), sent_boot = dlock_boot_ns();
    /* Pass 0 sends every chunk; a later pass those a NOSCRIPT or a redirect
     * sent back (a redirect at most DLOCK_CLUSTER_REDIRECTS_MAX times). */
    for (int pass = 0; ok && pass <= DLOCK_CLUSTER_REDIRECTS_MAX; pass++) {
        r->pass++; /* each lane is opened at most once in this pass */
        for (size_t c = 0; c < nc; c++) {
            ch[c].sent = 0;
            if ((pass == 0 || ch[c].redo) && !lane_open(r, ch[c].lane))
                ch[c].lane = -1; /* no connection: unknown this round */
        }
        int any = 0;
        pthread_mutex_lock(&r->mu);
        for (size_t c = 0; c < nc && ok; c++) {
            if ((pass > 0 && !ch[c].redo) || ch[c].lane < 0)
                continue;
            redisContext *conn = lane_get(r, ch[c].lane);
            if (!conn || conn->err)
                continue;
            int rc = append_chunk(r, s, p, &ch[c], conn);
            if (rc < 0)
                ok = 0; /* out of memory: nothing more is appended */
            ch[c].sent = rc > 0;
            any |= rc > 0;
            if (rc > 0)
                r->lanes[ch[c].lane].wrote = 1;
        }
        r->writing = any;
        pthread_mutex_unlock(&r->mu);
        if (!any)
            break;
        int64_t flushed_ns = dlock_now_ns();
        unsigned trips = lanes_flush(r, cmd_deadline(r));
        end_write(r);
        if (pass == 0) {
            /* counted together, so that a reader sees whole rounds */
            dlock_count(&r->cfg.ctr->renew_rounds, 1);
            dlock_count(&r->cfg.ctr->renew_keys, (uint64_t)n);
        }
        dlock_count(&r->cfg.ctr->redis_round_trips, trips);
        dlock_count(&r->cfg.ctr->renew_round_trips, trips);
        int again = 0;
        for (size_t c = 0; c < nc; c++) {
            if (!ch[c].sent)
                continue;
            redisContext *conn = lane_get(r, ch[c].lane);
            if (conn->err || read_chunk(r, p, &ch[c], conn) != 0) {
                ch[c].redo = 0;
                ok = 0; /* this lane's verdicts stay unknown */
                continue;
            }
            again |= ch[c].redo;
            if (!ch[c].redo)
                r->lanes[ch[c].lane].acked = 1; /* ran here: WAIT here */
        }
        if (pass == 0)
            dlock_hist_add(&r->cfg.ctr->renew, dlock_now_ns() - flushed_ns);
        if (!again)
            break;
    }
    for (size_t c = 0; c < nc; c++)
        if (ch[c].lane < 0 || ch[c].redo || ch[c].failed)
            ok = 0; /* not answered, or an error: the next round comes soon */
    if (r->cfg.min_replicas) {
        /* A lane's renewals count once WAIT says enough replicas have them;
         * one that fell short (or failed before it could run: the chunks
         * read so far may say "renewed") leaves its leases their old
         * validity, and the next round comes soon. */
        for (unsigned l = 0; l < r->nlanes; l++) {
            if (!r->lanes[l].acked)
                continue;
            r->lanes[l].acked = 0;
            redisContext *conn = r->lanes[l].conn;
            if (conn && !conn->err && replicas_acked(r, conn))
                continue;
            for (size_t c = 0; c < nc; c++)
                for (size_t i = 0; ch[c].lane == (int)l && i < ch[c].m; i++)
                    if (p[ch[c].at + i]->verdict == 1)
                        p[ch[c].at + i]->verdict = -1; /* a lease found gone stays gone */
            if (conn && !conn->err && r->cfg.conn->nsentinels)
                lane_drop(r, (int)l); /* a failover? the next round asks the sentinels */
            ok = 0;
        }
    } else {
        for (unsigned l = 0; l < r->nlanes; l++)
            r->lanes[l].acked = 0;
    }
    char why[160] = "";
    for (unsigned l = 0; l < r->nlanes; l++)
        if (r->lanes[l].conn && r->lanes[l].conn->err) {
            ok = 0; /* a replica answered, or it failed: retry soon, reconnected */
            if (!why[0])
                snprintf(why, sizeof why, ": %s", r->lanes[l].conn->errstr);
        }
    lanes_drop_failed(r);
    size_t renewed = 0;
    for (size_t i = 0; i < n; i++)
        renewed += s[i].verdict == 1;
    dlock_count(&r->cfg.ctr->renewed, renewed);
    if (!ok)
        dlock_count(&r->cfg.ctr->renew_failures, 1);
    if (r->cfg.log && ok != !r->failing) {
        char line[300];
        if (!ok)
            snprintf(line, sizeof line, "renewal failing: %zu of %zu leases not confirmed%s; "
                     "retrying every 100 ms, each lease is lost when its validity runs out",
                     n - renewed, n, why);
        else
            snprintf(line, sizeof line, "renewal works again: %zu leases renewed", renewed);
        r->cfg.log(r->cfg.lost_arg, ok ? DLOCK_LOG_INFO : DLOCK_LOG_WARN, line);
    }
    r->failing = !ok;
    free(p);
    free(ch);
    int64_t earliest = apply(r, s, n, sent_boot);
    free(s);
    int64_t next = ok ? sent_ns + r->period_ns : dlock_now_ns() + RETRY_MS * DLOCK_NS_PER_MS;
    if (!ok && next > sent_ns + r->period_ns)
        next = sent_ns + r->period_ns;
    return earliest < next ? earliest : next;
}

void dlock_renew_by(dlock_renew *r, int64_t when_ns)
{
    pthread_mutex_lock(&r->mu);
    if (when_ns < r->due) {
        r->due = when_ns;
        pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

void dlock_renew_kick(dlock_renew *r)
{
    pthread_mutex_lock(&r->mu);
    r->kick = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Queues a background job for e (see dlock_renew_orphan and
 * dlock_renew_leave), given up after for_ms. */
static void add_job(dlock_renew *r, const dlock_entry *e, int leave, const char *number,
                    uint32_t for_ms)
{
    size_t len[DLOCK_KEYS], total = e->name_len + 1;
    for (int k = 0; k < DLOCK_KEYS; k++)
        total += (len[k] = strlen(e->keys[k]) + 1);
    orphan *o = malloc(sizeof *o + total);
    if (!o)
        return; /* the lease, if granted, expires after lease_ms; a queue
                   entry after the waiter ttl */
    char *p = o->buf;
    for (int k = 0; k < DLOCK_KEYS; k++) {
        o->keys[k] = memcpy(p, e->keys[k], len[k]);
        p += len[k];
    }
    o->name = memcpy(p, e->name, e->name_len + 1);
    o->leave = leave;
    snprintf(o->nonce, sizeof o->nonce, "%s", number);
    o->until_ns = dlock_now_ns() + (int64_t)for_ms * DLOCK_NS_PER_MS;
    o->next_try_ns = 0; /* at once */
    o->backoff_ns = RETRY_MS * DLOCK_NS_PER_MS;
    pthread_mutex_lock(&r->mu);
    o->next = r->orphans;
    r->orphans = o;
    r->orphan_new = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void dlock_renew_orphan(dlock_renew *r, const dlock_entry *e, const char *nonce)
{
    /* As long as Redis remembers the client's attempts for this name: a
     * later copy of the attempt is refused by Redis itself. */
    add_job(r, e, 0, nonce, r->cfg.keep_ms);
}

void dlock_renew_leave(dlock_renew *r, const dlock_entry *e, const char *number)
{
    /* After twice the waiter ttl the client's queue entry is dead anyway. */
    add_job(r, e, 1, number, 2 * r->cfg.waiter_ttl_ms);
}

/* Appends o's script call to c (after ASKING after an ASK redirect). 0 or
 * -1 (out of memory). */
static int append_job(dlock_renew *r, redisContext *c, const orphan *o, int use_sha, int asking)
{
    if (asking && append_asking(r, c) != 0)
        return -1;
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS];
    if (o->leave) {
        dlock_script_leave_argv(r->cfg.args, o->keys, o->name, o->nonce, argv);
        return dlock_conn_append_eval(c, r->cfg.ctr, DLOCK_SCRIPT_LEAVE, use_sha,
                                      DLOCK_SCRIPT_KEYS, DLOCK_LEAVE_ARGS, argv, NULL);
    }
    dlock_script_release_argv(r->cfg.args, o->keys, o->name, "nonce", o->nonce, "0", "0", argv);
    return dlock_conn_append_eval(c, r->cfg.ctr, DLOCK_SCRIPT_RELEASE, use_sha,
                                  DLOCK_SCRIPT_KEYS, DLOCK_RELEASE_ARGS, argv, NULL);
}

/* What a job's reply means: done, or to be tried again later. */
static int job_result(const orphan *o, const redisReply *rep)
{
    enum { UNKNOWN = -1, NOT_OWNED = 0, DONE = 1 };
    if (dlock_conn_is_other_protocol(rep))
        return DONE; /* refused, and refused again while that data lives: a grant
                        of ours under it, if any, expires by itself */
    if (!rep || rep->type != REDIS_REPLY_INTEGER)
        return UNKNOWN;
    if (o->leave)
        return DONE; /* it ran: whatever it found, the queue entry is gone */
    /* 1, 2: released (now or before); 3: a newer attempt was seen, so no
     * grant of this one exists or can appear; 0: not (yet) granted. */
    return rep->integer >= 1 ? DONE : NOT_OWNED;
}

/* One release try for each orphan due now, in one pipeline per lane, all
 * lanes in flight at once. An orphan is done when Redis released its grant.
 * One that Redis says it does not own stays a while: its acquire may still
 * be on its way to Redis (another connection, served later), so it is
 * tried again with a doubling pause until its lease time is over; so is one
 * Redis did not answer. A NOSCRIPT or a redirect is run again at once, on
 * its own. Called without locks. Returns when the next try is due
 * (DLOCK_NEVER: none left). */
static int64_t release_orphans(dlock_renew *r)
{
    pthread_mutex_lock(&r->mu);
    orphan *list = r->orphans;
    r->orphans = NULL;
    pthread_mutex_unlock(&r->mu);
    int64_t now = dlock_now_ns();
    orphan *due = NULL, *later = NULL, *next;
    for (orphan *o = list; o; o = next) { /* split: due now, or later */
        next = o->next;
        orphan **to = o->next_try_ns <= now ? &due : &later;
        o->next = *to;
        *to = o;
    }
    enum { UNKNOWN = -1, RELEASED = 1 };
    r->pass++; /* each lane is opened at most once for these tries */
    for (orphan *o = due; o; o = o->next) {
        unsigned slot;
        o->result = UNKNOWN;
        o->redo = o->eval = o->asking = 0;
        o->lane = lane_of(r, o->keys[0], &slot);
        redisContext *c = lane_open(r, o->lane);
        o->sent = c && append_job(r, c, o, 1, 0) == 0;
        if (o->sent)
            r->lanes[o->lane].wrote = 1;
        else if (c)
            conn_oom(c);
    }
    int64_t deadline = cmd_deadline(r);
    unsigned trips = lanes_flush(r, deadline);
    dlock_count(&r->cfg.ctr->redis_round_trips, trips);
    /* Read every reply of the pipelines before running anything again. */
    for (orphan *o = due; o; o = o->next) {
        redisContext *c = o->sent ? lane_get(r, o->lane) : NULL;
        redisReply *rep = NULL;
        if (!c || c->err || dlock_conn_read(c, deadline, &rep) != 0)
            continue;
        int lane = o->lane, kind;
        if (dlock_conn_is_noscript(rep)) {
            o->redo = o->eval = 1;
        } else if ((kind = redirect(r, rep, o->lane, &lane)) != REDO_NONE) {
            o->redo = 1;
            o->asking = kind == REDO_ASK;
            o->lane = lane;
        } else {
            o->result = job_result(o, rep);
        }
        dlock_conn_check_master(c, rep); /* then dropped below */
        freeReplyObject(rep);
    }
    /* A restarted server answered NOSCRIPT (again with EVAL), or the slot
     * moved (again on its master; after ASKING for an ASK): one at a time. */
    for (orphan *o = due; o; o = o->next) {
        if (!o->redo)
            continue;
        redisContext *c = lane_open(r, o->lane);
        redisReply *rep = NULL;
        deadline = cmd_deadline(r);
        if (!c)
            continue;
        if (append_job(r, c, o, !o->eval, o->asking) != 0) {
            conn_oom(c);
            continue;
        }
        if (dlock_conn_flush(c, deadline) == 0 && read_reply(c, o->asking, deadline, &rep) == 0) {
            dlock_count(&r->cfg.ctr->redis_round_trips, 1);
            o->result = job_result(o, rep);
            dlock_conn_check_master(c, rep);
            freeReplyObject(rep);
        }
    }
    lanes_drop_failed(r);
    now = dlock_now_ns();
    for (orphan *o = due; o; o = next) {
        next = o->next;
        if (o->result == RELEASED || now >= o->until_ns) {
            free(o);
            continue;
        }
        o->next_try_ns = now + o->backoff_ns;
        o->backoff_ns *= 2;
        o->next = later;
        later = o;
    }
    int64_t next_due = DLOCK_NEVER;
    for (orphan *o = later; o; o = o->next)
        if (o->next_try_ns < next_due)
            next_due = o->next_try_ns;
    if (later) {
        pthread_mutex_lock(&r->mu);
        orphan **tail = &later;
        while (*tail)
            tail = &(*tail)->next;
        *tail = r->orphans;
        r->orphans = later;
        pthread_mutex_unlock(&r->mu);
    }
    return next_due;
}

/* The periodic check of the server's settings (version, eviction policy:
 * an operator may change them under running clients), with INFO on each
 * open lane (every master in Cluster mode), or lane 0 opened for it. On the
 * manager thread, without r->mu. */
static void check_server(dlock_renew *r)
{
    if (!r->cfg.server)
        return;
    r->pass++; /* a pass of its own: lane_open may reconnect a failed lane */
    unsigned n = r->nlanes ? r->nlanes : 1;
    int asked = 0, rc = DLOCK_OK;
    char why[256] = "";
    for (unsigned i = 0; i < n && rc == DLOCK_OK; i++) {
        /* the server's lane, reconnected if it failed (its setup checks the
         * server too); a cluster's masters whose lanes are open */
        redisContext *c = cluster_of(r) ? lane_get(r, (int)i) : i == 0 ? lane_open(r, 0) : NULL;
        if (!c && !cluster_of(r) && i == 0 && r->nlanes && r->lanes[0].open_rc == DLOCK_ESERVER) {
            asked = 1;
            rc = DLOCK_ESERVER;
            snprintf(why, sizeof why, "%s", r->lanes[0].open_err);
            break;
        }
        if (!c || c->err)
            continue; /* not answered: the renewals say so */
        const char *argv[1] = {"INFO"};
        redisReply *rep =
            dlock_conn_command(c, r->cfg.ctr, r->cfg.conn->command_timeout_ms, 1, argv);
        if (rep && (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS)) {
            asked = 1;
            rc = dlock_conn_check_info(rep->str);
            if (rc != DLOCK_OK)
                snprintf(why, sizeof why, "%s", dlock_last_error());
        }
        if (rep)
            freeReplyObject(rep);
    }
    if (asked)
        r->cfg.server(r->cfg.lost_arg, rc, why);
}

static void *manager_main(void *arg)
{
    dlock_renew *r = arg;
    int64_t next = dlock_now_ns() + r->period_ns;
    int64_t orphan_retry = 0, next_check = dlock_now_ns() + r->check_ns;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        int64_t now = dlock_now_ns();
        if (now >= next_check && now < next && r->cfg.server) { /* (a due round goes first) */
            next_check = now + r->check_ns;
            pthread_mutex_unlock(&r->mu);
            check_server(r);
            pthread_mutex_lock(&r->mu);
            continue;
        }
        if (r->kick) {
            r->kick = 0;
            next = now;
            /* Redis is back (the subscriber reconnected): the round goes at
             * once, without waiting out a failed lane's backoff, so that it
             * finds leases a restarted Redis forgot within a round trip */
            for (unsigned i = 0; i < r->nlanes; i++)
                r->lanes[i].retry_ns = r->lanes[i].backoff_ns = 0;
        }
        if (r->due < next)
            next = r->due;
        /* A due round goes first: it keeps held leases (a direct grant's
         * first renewal has the waiter ttl only) from running out while
         * orphan releases, each up to a command timeout, are worked off. */
        if (now < next && r->orphans && (now >= orphan_retry || r->orphan_new)) {
            r->orphan_new = 0;
            pthread_mutex_unlock(&r->mu);
            orphan_retry = release_orphans(r);
            pthread_mutex_lock(&r->mu);
            continue;
        }
        if (now < next) {
            int64_t wake = next;
            if (r->orphans && orphan_retry < wake)
                wake = orphan_retry;
            if (r->cfg.server && next_check < wake)
                wake = next_check;
            /* With nothing registered, sleep until a lease or an orphan
             * arrives (or the server's check is due); a first lease's
             * renewal is due one period later. */
            if (r->count == 0 && !r->orphans) {
                struct timespec ts = dlock_ts(r->cfg.server ? next_check : DLOCK_NEVER);
                if (r->cfg.server)
                    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
                else
                    pthread_cond_wait(&r->cv, &r->mu);
                if (r->count)
                    next = dlock_now_ns() + r->period_ns;
            } else {
                struct timespec ts = dlock_ts(wake);
                pthread_cond_timedwait(&r->cv, &r->mu, &ts);
            }
            continue;
        }
        r->due = DLOCK_NEVER; /* this round renews every lease registered now */
        pthread_mutex_unlock(&r->mu);
        next = round_once(r);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int dlock_renew_start(const dlock_renew_cfg *cfg, dlock_renew **out)
{
    dlock_renew *r = calloc(1, sizeof *r);
    if (!r)
        return DLOCK_ENOMEM;
    r->cfg = *cfg;
    r->period_ns = (int64_t)cfg->lease_ms * DLOCK_NS_PER_MS / 3;
    r->check_ns = dlock_renew_check_ns(cfg->lease_ms);
    r->due = DLOCK_NEVER;
    r->drift_ns = dlock_renew_drift_ns(cfg->lease_ms);
    pthread_mutex_init(&r->mu, NULL);
    DLOCK_LOCKSTAT_NAME(&r->mu, "renew");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&r->wrote, NULL);
    sigset_t old;
    dlock_block_signals(&old); /* the thread inherits a mask blocking all signals */
    int created = pthread_create(&r->thread, NULL, manager_main, r);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (created != 0) {
        pthread_cond_destroy(&r->wrote);
        pthread_cond_destroy(&r->cv);
        pthread_mutex_destroy(&r->mu);
        free(r);
        return dlock_err_set(DLOCK_ENOMEM, "cannot start the renewal thread");
    }
    *out = r;
    return DLOCK_OK;
}

/* After the thread stopped: gives every registered lease back, one
 * pipeline per lane. Best effort within the timeouts: a lease not released
 * (a redirect, a failure) expires after lease_ms. */
static void release_all(dlock_renew *r)
{
    if (!r->items)
        return;
    typedef struct rel {
        dlock_renew_item *it;
        char last[24];
        int lane, sent, done;
    } rel;
    rel *v = malloc(sizeof *v * r->count);
    if (!v)
        return;
    size_t n = 0;
    r->pass++; /* each lane is opened at most once */
    for (dlock_renew_item *it = r->items; it; it = it->next, n++) {
        rel *x = &v[n];
        unsigned slot;
        x->it = it;
        x->done = 0;
        pthread_mutex_lock(&it->e->mu);
        snprintf(x->last, sizeof x->last, "%" PRIu64, it->e->token);
        pthread_mutex_unlock(&it->e->mu);
        x->lane = lane_of(r, it->e->keys[DLOCK_KEY_LEASE], &slot);
        redisContext *c = lane_open(r, x->lane);
        const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS];
        /* "1": the client closes while a thread holds it (acquire.lua, End) */
        dlock_script_release_argv(r->cfg.args, it->e->keys, it->e->name, "token", it->token,
                                  x->last, "1", argv);
        x->sent = c && dlock_conn_append_eval(c, r->cfg.ctr, DLOCK_SCRIPT_RELEASE, 1,
                                              DLOCK_SCRIPT_KEYS, DLOCK_RELEASE_ARGS, argv,
                                              NULL) == 0;
        if (x->sent)
            r->lanes[x->lane].wrote = 1;
        else if (c)
            conn_oom(c);
    }
    int64_t deadline = cmd_deadline(r);
    dlock_count(&r->cfg.ctr->redis_round_trips, lanes_flush(r, deadline));
    for (size_t i = 0; i < n; i++) {
        redisContext *c = v[i].sent ? lane_get(r, v[i].lane) : NULL;
        redisReply *rep = NULL;
        if (!c || c->err || dlock_conn_read(c, deadline, &rep) != 0)
            continue;
        v[i].done = !dlock_conn_is_noscript(rep);
        freeReplyObject(rep);
    }
    /* A restarted server answered NOSCRIPT: run those again with EVAL. */
    for (size_t i = 0; i < n; i++) {
        redisContext *c = v[i].sent && !v[i].done ? lane_get(r, v[i].lane) : NULL;
        if (!c || c->err)
            continue;
        const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS];
        dlock_script_release_argv(r->cfg.args, v[i].it->e->keys, v[i].it->e->name, "token",
                                  v[i].it->token, v[i].last, "1", argv);
        redisReply *rep = dlock_conn_eval(c, r->cfg.ctr, cmd_deadline(r), DLOCK_SCRIPT_RELEASE,
                                          DLOCK_SCRIPT_KEYS, DLOCK_RELEASE_ARGS, argv, NULL);
        if (rep)
            freeReplyObject(rep);
    }
    free(v);
}

void dlock_renew_stop(dlock_renew *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);

    /* On the caller's thread from here; every exchange keeps its deadline
     * and raises no SIGPIPE (conn.h). */
    for (orphan *o = r->orphans; o; o = o->next)
        o->next_try_ns = 0; /* one last try for every orphan */
    release_orphans(r);
    release_all(r);
    while (r->orphans) {
        orphan *o = r->orphans;
        r->orphans = o->next;
        free(o);
    }
    while (r->items) {
        dlock_entry *e = r->items->e;
        pthread_mutex_lock(&e->mu);
        if (e->state == DLOCK_LEASE_HELD) {
            e->state = DLOCK_LEASE_NONE;
            dlock_count(&r->cfg.ctr->leases_held, (uint64_t)-1);
        }
        int drop = dlock_renew_remove(r, e);
        pthread_mutex_unlock(&e->mu);
        if (drop)
            dlock_table_put(r->cfg.table, e);
    }
    for (unsigned i = 0; i < r->nlanes; i++)
        lane_drop(r, (int)i);
    free(r->lanes);
    pthread_cond_destroy(&r->wrote);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
