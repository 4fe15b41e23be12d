/*
 * The renewal manager.
 *
 * Shared state and its guards:
 *   r->mu guards the registry (items, count), r->stop and r->kick.
 *   Each item stands for one grant (entry, epoch, token) and holds one
 *   reference on its entry. e->renew points at e's item; it is written only
 *   with both e->mu and r->mu held, so either lock suffices to read it.
 * Lock order: e->mu, then r->mu. The manager thread never takes e->mu while
 * holding r->mu, and never calls dlock_table_put with any lock held.
 *
 * A round:
 *   1. under r->mu: snapshot every item (entry with an extra reference, epoch,
 *      token), append one renew script call per chunk to the connection and
 *      write them all out. Because removal also takes r->mu, a grant removed
 *      before the snapshot is never renewed, and one removed after it was
 *      already on the wire before its release command could be sent.
 *   2. without locks: read the replies (one round trip for all chunks).
 *   3. per entry, under e->mu: apply the verdict only if the entry still holds
 *      the same grant (state HELD, same epoch, same item): renewed -> validity
 *      extended from the time the round was sent; gone -> lost; no answer ->
 *      lost only once the validity deadline has passed.
 *   4. without locks: run the lost callbacks, then drop the references.
 * Between rounds the thread sleeps until the next period (lease/3), or sooner
 * when the earliest validity deadline of a lease that could not be renewed
 * comes first, or after a short retry pause when Redis failed.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "renew.h"

enum {
    CHUNK = 200,          /* keys per renew script call */
    RETRY_MS = 100,       /* pause after a failed round, at most */
};

struct dlock_renew_item {
    dlock_renew_item *prev, *next;
    dlock_entry *e;
    uint64_t epoch;
    char token[24]; /* decimal, as the scripts store it */
};

struct dlock_renew {
    dlock_renew_cfg cfg;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC: stop, or a new item to schedule */
    dlock_renew_item *items; /* list head, guarded by mu */
    size_t count;            /* guarded by mu */
    int stop;                /* guarded by mu */
    redisContext *conn;      /* the manager thread's own connection */
    int64_t period_ns, drift_ns;
};

typedef struct snap {
    dlock_entry *e;
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
    pthread_cond_broadcast(&e->cv);
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

/* Appends ceil(n / CHUNK) renew calls. Called with r->mu held (the snapshot's
 * entries are referenced, so their keys stay valid). 0 or -1. */
static int append_chunks(dlock_renew *r, const snap *s, size_t n)
{
    const char **argv = malloc(sizeof *argv * (2 * CHUNK + 2));
    if (!argv)
        return -1;
    char lease[16];
    snprintf(lease, sizeof lease, "%" PRIu32, r->cfg.lease_ms);
    int rc = 0;
    for (size_t at = 0; at < n && rc == 0; at += CHUNK) {
        size_t k = n - at < CHUNK ? n - at : CHUNK;
        for (size_t i = 0; i < k; i++) {
            argv[i] = s[at + i].e->key;
            argv[k + 2 + i] = s[at + i].token;
        }
        argv[k] = r->cfg.client_id;
        argv[k + 1] = lease;
        rc = dlock_conn_append_eval(r->conn, r->cfg.ctr, DLOCK_SCRIPT_RENEW, (int)k, (int)k + 2,
                                    argv, NULL);
    }
    free(argv);
    return rc;
}

/* Reads one chunk's reply into verdicts. 0, or -1 if the connection failed. */
static int read_chunk(dlock_renew *r, snap *s, size_t k, int retried)
{
    redisReply *rep = NULL;
    if (redisGetReply(r->conn, (void **)&rep) != REDIS_OK)
        return -1;
    if (dlock_conn_is_noscript(rep) && !retried) {
        freeReplyObject(rep);
        return 1; /* the caller runs this chunk again with EVAL */
    }
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == k) {
        for (size_t i = 0; i < k; i++)
            s[i].verdict = rep->element[i]->type == REDIS_REPLY_INTEGER &&
                           rep->element[i]->integer == 1;
    }
    /* Any other reply (an error) leaves the verdicts unknown. */
    freeReplyObject(rep);
    return 0;
}

/* Runs one chunk again synchronously, after NOSCRIPT (a restarted server). */
static int rerun_chunk(dlock_renew *r, snap *s, size_t k)
{
    const char **argv = malloc(sizeof *argv * (2 * k + 2));
    if (!argv)
        return 0;
    char lease[16];
    snprintf(lease, sizeof lease, "%" PRIu32, r->cfg.lease_ms);
    for (size_t i = 0; i < k; i++) {
        argv[i] = s[i].e->key;
        argv[k + 2 + i] = s[i].token;
    }
    argv[k] = r->cfg.client_id;
    argv[k + 1] = lease;
    redisReply *rep = dlock_conn_eval(r->conn, r->cfg.ctr, DLOCK_SCRIPT_RENEW, (int)k,
                                      (int)k + 2, argv, NULL);
    free(argv);
    if (!rep)
        return -1;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == k)
        for (size_t i = 0; i < k; i++)
            s[i].verdict = rep->element[i]->type == REDIS_REPLY_INTEGER &&
                           rep->element[i]->integer == 1;
    freeReplyObject(rep);
    return 0;
}

/* Step 3 and 4 of a round. Returns the earliest validity deadline among the
 * leases that stay registered but were not renewed (DLOCK_NEVER if none). */
static int64_t apply(dlock_renew *r, snap *s, size_t n, int64_t sent_ns)
{
    int64_t earliest = DLOCK_NEVER;
    int64_t valid = sent_ns + (int64_t)r->cfg.lease_ms * DLOCK_NS_PER_MS - r->drift_ns;
    int64_t now = dlock_now_ns();
    size_t nlost = 0;
    for (size_t i = 0; i < n; i++) {
        dlock_entry *e = s[i].e;
        int drop_registry_ref = 0, lost = 0;
        pthread_mutex_lock(&e->mu);
        if (e->state == DLOCK_LEASE_HELD && e->epoch == s[i].epoch && e->renew == s[i].item) {
            if (s[i].verdict == 1) {
                if (valid > e->valid_until_ns)
                    e->valid_until_ns = valid;
            } else if (s[i].verdict == 0 || now >= e->valid_until_ns) {
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
    return earliest;
}

/* One round. Returns when the next one is due. */
static int64_t round_once(dlock_renew *r)
{
    int64_t now = dlock_now_ns();
    if (!r->conn && dlock_conn_open(r->cfg.conn, r->cfg.ctr, &r->conn) != DLOCK_OK)
        r->conn = NULL;

    snap *s;
    pthread_mutex_lock(&r->mu);
    ssize_t n = snapshot(r, &s);
    int64_t sent_ns = dlock_now_ns();
    int ok = r->conn && n > 0 && append_chunks(r, s, (size_t)n) == 0;
    if (ok) {
        int done = 0;
        while (!done && ok)
            ok = redisBufferWrite(r->conn, &done) == REDIS_OK;
    }
    pthread_mutex_unlock(&r->mu);
    if (n <= 0)
        return now + r->period_ns; /* nothing held (or no memory): idle */

    if (ok) {
        dlock_count(&r->cfg.ctr->redis_round_trips, 1);
        dlock_count(&r->cfg.ctr->renew_round_trips, 1);
        for (size_t at = 0; at < (size_t)n && ok; at += CHUNK) {
            size_t k = (size_t)n - at < CHUNK ? (size_t)n - at : CHUNK;
            int rc = read_chunk(r, s + at, k, 0);
            if (rc == 1) {
                /* NOSCRIPT: the rest of the pipeline is read first, then the
                 * chunk is run again (its keys are still ours to renew: the
                 * script checks each grant's token). */
                size_t rest_at = at + k;
                for (size_t a2 = rest_at; a2 < (size_t)n && ok; a2 += CHUNK) {
                    size_t k2 = (size_t)n - a2 < CHUNK ? (size_t)n - a2 : CHUNK;
                    ok = read_chunk(r, s + a2, k2, 1) == 0;
                }
                for (size_t a2 = at; a2 < (size_t)n && ok; a2 += CHUNK) {
                    size_t k2 = (size_t)n - a2 < CHUNK ? (size_t)n - a2 : CHUNK;
                    if (s[a2].verdict == -1)
                        ok = rerun_chunk(r, s + a2, k2) == 0;
                }
                break;
            }
            ok = rc == 0;
        }
        dlock_count(&r->cfg.ctr->renew_rounds, 1);
        dlock_count(&r->cfg.ctr->renew_keys, (uint64_t)n);
    }
    if (!ok && r->conn) {
        redisFree(r->conn); /* reconnect next round */
        r->conn = NULL;
    }
    int64_t earliest = apply(r, s, (size_t)n, sent_ns);
    free(s);
    int64_t next = ok ? sent_ns + r->period_ns : dlock_now_ns() + RETRY_MS * DLOCK_NS_PER_MS;
    if (!ok && next > sent_ns + r->period_ns)
        next = sent_ns + r->period_ns;
    return earliest < next ? earliest : next;
}

static void *manager_main(void *arg)
{
    dlock_renew *r = arg;
    int64_t next = dlock_now_ns() + r->period_ns;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        int64_t now = dlock_now_ns();
        if (now < next) {
            /* With nothing registered, sleep until a lease arrives; its first
             * renewal is then due one period later. */
            if (r->count == 0) {
                pthread_cond_wait(&r->cv, &r->mu);
                next = dlock_now_ns() + r->period_ns;
            } else {
                struct timespec ts = dlock_ts(next);
                pthread_cond_timedwait(&r->cv, &r->mu, &ts);
            }
            continue;
        }
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
    r->drift_ns = dlock_renew_drift_ns(cfg->lease_ms);
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&r->thread, NULL, manager_main, r) != 0) {
        pthread_cond_destroy(&r->cv);
        pthread_mutex_destroy(&r->mu);
        free(r);
        return dlock_err_set(DLOCK_ENOMEM, "cannot start the renewal thread");
    }
    *out = r;
    return DLOCK_OK;
}

/* After the thread stopped: gives every registered lease back, pipelined.
 * Best effort within the timeouts: a lease not released expires after
 * lease_ms. */
static void release_all(dlock_renew *r)
{
    if (!r->items)
        return;
    if (!r->conn && dlock_conn_open(r->cfg.conn, r->cfg.ctr, &r->conn) != DLOCK_OK)
        r->conn = NULL;
    if (!r->conn)
        return;
    dlock_renew_item **v = malloc(sizeof *v * r->count);
    if (!v)
        return;
    char fence_ms[16];
    snprintf(fence_ms, sizeof fence_ms, "%" PRIu32, r->cfg.lease_ms);
    size_t sent = 0;
    for (dlock_renew_item *it = r->items; it; it = it->next) {
        char last[24];
        pthread_mutex_lock(&it->e->mu);
        snprintf(last, sizeof last, "%" PRIu64, it->e->token);
        pthread_mutex_unlock(&it->e->mu);
        const char *argv[6] = {it->e->key, it->e->fence_key, r->cfg.client_id, it->token,
                               fence_ms, last};
        if (dlock_conn_append_eval(r->conn, r->cfg.ctr, DLOCK_SCRIPT_RELEASE, 2, 4, argv,
                                   NULL) != 0)
            break;
        v[sent++] = it;
    }
    if (sent)
        dlock_count(&r->cfg.ctr->redis_round_trips, 1);
    size_t got = 0;
    for (; got < sent; got++) {
        redisReply *rep = NULL;
        if (redisGetReply(r->conn, (void **)&rep) != REDIS_OK)
            break;
        if (!dlock_conn_is_noscript(rep))
            v[got] = NULL; /* done */
        freeReplyObject(rep);
    }
    /* A restarted server answered NOSCRIPT: run those again with EVAL. */
    for (size_t i = 0; i < got && r->conn->err == 0; i++) {
        if (!v[i])
            continue;
        const char *argv[5] = {v[i]->e->key, v[i]->e->fence_key, r->cfg.client_id, v[i]->token,
                               fence_ms};
        /* Without the last local token: the fence keeps the grant's token. */
        redisReply *rep = dlock_conn_eval(r->conn, r->cfg.ctr, DLOCK_SCRIPT_RELEASE, 2, 3, argv,
                                          NULL);
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

    release_all(r);
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
    if (r->conn)
        redisFree(r->conn);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
