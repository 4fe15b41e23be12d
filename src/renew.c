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
#include "renew.h"
#include "sentinel.h"

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

typedef struct orphan {
    struct orphan *next;
    int leave;              /* 0: release the grant of attempt `nonce`; 1: leave
                               the wait queue, as call number `nonce` */
    int64_t until_ns;       /* give up then: the lease has expired */
    int64_t next_try_ns;    /* when the next release try is due */
    int64_t backoff_ns;     /* pause before the try after that */
    int result;             /* of the last try (release_orphans) */
    char nonce[24];         /* decimal */
    char *keys[DLOCK_KEYS]; /* copies of the entry's keys, in buf */
    char *name;             /* in buf */
    char buf[];
} orphan;

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

/* Appends the renew call of s[0 .. k) (k <= CHUNK). The snapshot's entries
 * are referenced, so their keys stay valid. 0 or -1 (out of memory). */
static int append_chunk(dlock_renew *r, const snap *s, size_t k, int use_sha)
{
    const char *argv[2 * CHUNK + 2];
    for (size_t i = 0; i < k; i++) {
        argv[i] = s[i].e->keys[DLOCK_KEY_LEASE];
        argv[k + 2 + i] = s[i].token;
    }
    argv[k] = r->cfg.args->client_id;
    argv[k + 1] = r->cfg.args->lease_ms;
    return dlock_conn_append_eval(r->conn, r->cfg.ctr, DLOCK_SCRIPT_RENEW, use_sha, (int)k,
                                  (int)k + 2, argv, NULL);
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

/* Reads one chunk's reply into verdicts. 0, or -1 if the connection failed. */
static int read_chunk(dlock_renew *r, snap *s, size_t k, int retried)
{
    redisReply *rep = NULL;
    if (dlock_conn_read(r->conn, cmd_deadline(r), &rep) != 0)
        return -1;
    if (dlock_conn_is_noscript(rep) && !retried) {
        freeReplyObject(rep);
        return 1; /* the caller runs this chunk again with EVAL */
    }
    /* A replica (failover): verdicts unknown, and the round drops the
     * connection so that the next one finds the master. */
    dlock_conn_check_master(r->conn, rep);
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == k) {
        for (size_t i = 0; i < k; i++)
            s[i].verdict = rep->element[i]->type == REDIS_REPLY_INTEGER &&
                           rep->element[i]->integer == 1;
    }
    /* Any other reply (an error) leaves the verdicts unknown. */
    freeReplyObject(rep);
    return 0;
}

/* Runs one chunk again after NOSCRIPT (a restarted server), with EVAL, for
 * the grants still registered: a grant released since the snapshot is not
 * renewed. 0, or -1 if the connection failed. */
static int rerun_chunk(dlock_renew *r, snap *s, size_t k)
{
    snap keep[CHUNK];
    size_t idx[CHUNK], m = 0;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < k; i++) {
        dlock_renew_item *it = s[i].e->renew; /* readable under r->mu */
        if (it == s[i].item && it->epoch == s[i].epoch) {
            keep[m] = s[i];
            idx[m++] = i;
        }
    }
    r->writing = m > 0;
    pthread_mutex_unlock(&r->mu);
    if (!m)
        return 0;
    int rc = append_chunk(r, keep, m, 0) == 0 && dlock_conn_flush(r->conn, cmd_deadline(r)) == 0
                 ? 0
                 : -1;
    if (rc == 0)
        dlock_count(&r->cfg.ctr->redis_round_trips, 1);
    end_write(r);
    if (rc == 0 && (rc = read_chunk(r, keep, m, 1)) == 0)
        for (size_t i = 0; i < m; i++)
            s[idx[i]].verdict = keep[i].verdict;
    return rc;
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

static void drop_conn(dlock_renew *r)
{
    if (r->conn) {
        redisFree(r->conn); /* reconnect next time */
        r->conn = NULL;
    }
}

/* Opens the manager's connection if it has none (or only one to a master
 * the sentinels no longer name). 0 or -1. */
static int ensure_conn(dlock_renew *r)
{
    if (r->conn && dlock_sentinel_stale(r->cfg.conn, r->conn))
        drop_conn(r); /* the master moved */
    if (!r->conn && dlock_conn_open(r->cfg.conn, r->cfg.ctr, &r->conn) != DLOCK_OK)
        r->conn = NULL;
    return r->conn ? 0 : -1;
}

/* WAIT min_replicas on the renewal connection, within half a command
 * timeout: 1 if that many replicas have every write made on it so far,
 * 0 if not (or the connection failed: then r->conn->err is set). */
static int replicas_acked(dlock_renew *r)
{
    char want[16], ms[16];
    snprintf(want, sizeof want, "%" PRIu32, r->cfg.min_replicas);
    uint32_t t = r->cfg.conn->command_timeout_ms / 2;
    snprintf(ms, sizeof ms, "%" PRIu32, t ? t : 1);
    const char *argv[3] = {"WAIT", want, ms};
    redisReply *rep = dlock_conn_command(r->conn, r->cfg.ctr, r->cfg.conn->command_timeout_ms,
                                         3, argv);
    int ok = rep && rep->type == REDIS_REPLY_INTEGER &&
             rep->integer >= (long long)r->cfg.min_replicas;
    if (rep)
        freeReplyObject(rep);
    return ok;
}

/* One round. Returns when the next one is due. */
static int64_t round_once(dlock_renew *r)
{
    int64_t now = dlock_now_ns();
    ensure_conn(r);

    snap *s;
    pthread_mutex_lock(&r->mu);
    ssize_t n = snapshot(r, &s);
    int64_t sent_ns = dlock_now_ns(), sent_boot = dlock_boot_ns();
    int ok = r->conn != NULL && n > 0;
    for (ssize_t at = 0; ok && at < n; at += CHUNK)
        ok = append_chunk(r, s + at, n - at < CHUNK ? (size_t)(n - at) : CHUNK, 1) == 0;
    r->writing = ok;
    pthread_mutex_unlock(&r->mu);
    if (n <= 0)
        return now + r->period_ns; /* nothing held (or no memory): idle */

    if (ok) {
        ok = dlock_conn_flush(r->conn, cmd_deadline(r)) == 0;
        end_write(r);
    }
    if (ok) {
        dlock_count(&r->cfg.ctr->redis_round_trips, 1);
        dlock_count(&r->cfg.ctr->renew_round_trips, 1);
        int noscript = 0;
        for (size_t at = 0; at < (size_t)n && ok; at += CHUNK) {
            size_t k = (size_t)n - at < CHUNK ? (size_t)n - at : CHUNK;
            int rc = read_chunk(r, s + at, k, 0);
            noscript |= rc == 1;
            ok = rc >= 0;
        }
        /* NOSCRIPT (a restarted server): once the pipeline is read, run the
         * unanswered chunks again with EVAL. */
        for (size_t at = 0; noscript && at < (size_t)n && ok; at += CHUNK) {
            size_t k = (size_t)n - at < CHUNK ? (size_t)n - at : CHUNK;
            if (s[at].verdict == -1)
                ok = rerun_chunk(r, s + at, k) == 0;
        }
        if (r->cfg.min_replicas && !(ok && !r->conn->err && replicas_acked(r))) {
            /* Not known to be on enough replicas (WAIT fell short, or the
             * round failed before it could run: the chunks read so far may
             * say "renewed"): a failover could lose these renewals, so none
             * counts; the leases keep their old validity and the next round
             * comes soon. */
            for (ssize_t i = 0; i < n; i++)
                if (s[i].verdict == 1)
                    s[i].verdict = -1; /* a lease found gone stays gone */
            if (ok && r->cfg.conn->nsentinels)
                drop_conn(r); /* a failover? the next round asks the sentinels */
            ok = 0;
        }
        dlock_count(&r->cfg.ctr->renew_rounds, 1);
        dlock_count(&r->cfg.ctr->renew_keys, (uint64_t)n);
        if (r->conn && r->conn->err)
            ok = 0; /* a replica answered: retry soon, on a new connection */
    }
    if (!ok)
        drop_conn(r);
    int64_t earliest = apply(r, s, (size_t)n, sent_boot);
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

/* Appends o's script call. 0 or -1 (out of memory). */
static int append_job(dlock_renew *r, const orphan *o, int use_sha)
{
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS];
    if (o->leave) {
        dlock_script_leave_argv(r->cfg.args, o->keys, o->name, o->nonce, argv);
        return dlock_conn_append_eval(r->conn, r->cfg.ctr, DLOCK_SCRIPT_LEAVE, use_sha,
                                      DLOCK_SCRIPT_KEYS, DLOCK_LEAVE_ARGS, argv, NULL);
    }
    dlock_script_release_argv(r->cfg.args, o->keys, o->name, "nonce", o->nonce, "0", argv);
    return dlock_conn_append_eval(r->conn, r->cfg.ctr, DLOCK_SCRIPT_RELEASE, use_sha,
                                  DLOCK_SCRIPT_KEYS, DLOCK_RELEASE_ARGS, argv, NULL);
}

/* What a job's reply means: done, or to be tried again later. */
static int job_result(const orphan *o, const redisReply *rep)
{
    enum { UNKNOWN = -1, NOT_OWNED = 0, DONE = 1 };
    if (!rep || rep->type != REDIS_REPLY_INTEGER)
        return UNKNOWN;
    if (o->leave)
        return DONE; /* it ran: whatever it found, the queue entry is gone */
    /* 1, 2: released (now or before); 3: a newer attempt was seen, so no
     * grant of this one exists or can appear; 0: not (yet) granted. */
    return rep->integer >= 1 ? DONE : NOT_OWNED;
}

/* One release try for each orphan due now, in one pipeline. An orphan is
 * done when Redis released its grant. One that Redis says it does not own
 * stays a while: its acquire may still be on its way to Redis (another
 * connection, served later), so it is tried again with a doubling pause
 * until its lease time is over; so is one Redis did not answer. Called
 * without locks. Returns when the next try is due (DLOCK_NEVER: none left). */
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
    size_t sent = 0;
    if (due && ensure_conn(r) == 0) {
        for (orphan *o = due; o; o = o->next, sent++)
            if (append_job(r, o, 1) != 0)
                break;
        if (sent)
            dlock_count(&r->cfg.ctr->redis_round_trips, 1);
    }
    /* Read every reply of the pipeline before running anything again. */
    enum { UNKNOWN = -1, RELEASED = 1, NOSCRIPT = 2 };
    size_t i = 0;
    int failed = sent && dlock_conn_flush(r->conn, cmd_deadline(r)) != 0;
    int64_t deadline = cmd_deadline(r);
    for (orphan *o = due; o; o = o->next, i++) {
        o->result = UNKNOWN;
        redisReply *rep = NULL;
        if (i >= sent || failed)
            continue;
        if (dlock_conn_read(r->conn, deadline, &rep) != 0) {
            failed = 1;
            continue;
        }
        o->result = dlock_conn_is_noscript(rep) ? NOSCRIPT : job_result(o, rep);
        dlock_conn_check_master(r->conn, rep); /* then dropped below */
        freeReplyObject(rep);
    }
    /* A restarted server answered NOSCRIPT: those again, with EVAL. */
    for (orphan *o = due; o && !failed; o = o->next) {
        if (o->result != NOSCRIPT)
            continue;
        redisReply *rep = NULL;
        o->result = UNKNOWN;
        deadline = cmd_deadline(r);
        if (append_job(r, o, 0) != 0 || dlock_conn_flush(r->conn, deadline) != 0 ||
            dlock_conn_read(r->conn, deadline, &rep) != 0) {
            failed = 1;
        } else {
            dlock_count(&r->cfg.ctr->redis_round_trips, 1);
            o->result = job_result(o, rep);
            freeReplyObject(rep);
        }
    }
    if (failed || (r->conn && r->conn->err))
        drop_conn(r);
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

static void *manager_main(void *arg)
{
    dlock_renew *r = arg;
    int64_t next = dlock_now_ns() + r->period_ns;
    int64_t orphan_retry = 0;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        int64_t now = dlock_now_ns();
        if (r->kick) {
            r->kick = 0;
            next = now;
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
            /* With nothing registered, sleep until a lease or an orphan
             * arrives; a first lease's renewal is due one period later. */
            if (r->count == 0 && !r->orphans) {
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

/* After the thread stopped: gives every registered lease back, pipelined.
 * Best effort within the timeouts: a lease not released expires after
 * lease_ms. */
static void release_all(dlock_renew *r)
{
    if (!r->items || ensure_conn(r) != 0)
        return;
    typedef struct rel {
        dlock_renew_item *it;
        char last[24];
        int done;
    } rel;
    rel *v = malloc(sizeof *v * r->count);
    if (!v)
        return;
    size_t sent = 0;
    for (dlock_renew_item *it = r->items; it; it = it->next) {
        rel *x = &v[sent];
        x->it = it;
        x->done = 0;
        pthread_mutex_lock(&it->e->mu);
        snprintf(x->last, sizeof x->last, "%" PRIu64, it->e->token);
        pthread_mutex_unlock(&it->e->mu);
        const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS];
        dlock_script_release_argv(r->cfg.args, it->e->keys, it->e->name, "token", it->token,
                                  x->last, argv);
        if (dlock_conn_append_eval(r->conn, r->cfg.ctr, DLOCK_SCRIPT_RELEASE, 1,
                                   DLOCK_SCRIPT_KEYS, DLOCK_RELEASE_ARGS, argv, NULL) != 0)
            break;
        sent++;
    }
    if (sent)
        dlock_count(&r->cfg.ctr->redis_round_trips, 1);
    int64_t deadline = cmd_deadline(r);
    size_t got = 0;
    if (sent && dlock_conn_flush(r->conn, deadline) != 0)
        sent = 0;
    for (; got < sent; got++) {
        redisReply *rep = NULL;
        if (dlock_conn_read(r->conn, deadline, &rep) != 0)
            break;
        v[got].done = !dlock_conn_is_noscript(rep);
        freeReplyObject(rep);
    }
    /* A restarted server answered NOSCRIPT: run those again with EVAL. */
    for (size_t i = 0; i < got && r->conn->err == 0; i++) {
        if (v[i].done)
            continue;
        const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS];
        dlock_script_release_argv(r->cfg.args, v[i].it->e->keys, v[i].it->e->name, "token",
                                  v[i].it->token, v[i].last, argv);
        redisReply *rep = dlock_conn_eval(r->conn, r->cfg.ctr, cmd_deadline(r),
                                          DLOCK_SCRIPT_RELEASE, DLOCK_SCRIPT_KEYS,
                                          DLOCK_RELEASE_ARGS, argv, NULL);
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
    if (r->conn)
        redisFree(r->conn);
    pthread_cond_destroy(&r->wrote);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
