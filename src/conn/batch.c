/*
 * Automatic pipelining of the caller threads' script calls (see batch.h).
 *
 * Invariants (b->mu guards `active`, the FIFO and every call's move out of
 * PENDING; b->mu is a leaf lock: nothing is locked under it, and no Redis
 * I/O happens under it):
 *   B1 active counts the leaders: threads running a batch plus threads
 *      promoted to lead that have not taken their batch yet; active <= lanes.
 *      A leader holds at most one pooled connection, and only leaders take
 *      connections from the pool, so a leader never waits for one.
 *   B2 the FIFO holds exactly the calls in state PENDING or LEAD. LEAD
 *      means "its thread holds a lane and has not taken its batch yet": a
 *      call that finds a free lane on arrival is LEAD at once, a waiting
 *      call becomes LEAD when promoted; either stays at its place in the
 *      FIFO until its own thread takes it, and other leaders skip it.
 *   B3 when a leader finishes and the FIFO holds a PENDING call, it promotes
 *      the oldest one, keeping its lane: so a call waits only while every
 *      lane is in use, and a waiting call is taken by one of the next
 *      ceil(position / DLOCK_BATCH_MAX) batches.
 *   B4 a call's state moves PENDING -> INFLIGHT (taken into a batch),
 *      PENDING -> LEAD (promoted), LEAD -> INFLIGHT (taken by its own
 *      thread), PENDING -> out of the FIFO (its deadline passed) or
 *      PENDING -> DONE (failed with a batch that found the server stuck:
 *      B5), all under b->mu; INFLIGHT -> DONE by its leader without b->mu (a leader's own
 *      call needs no DONE: its thread reads its outputs itself),
 *      after every output field is written (release store). After DONE the
 *      leader touches the call no more but for the futex wake-up, which
 *      may reach reused memory (dlock_futex_wake says why that is harmless).
 *   B5 a batch that found the server stuck (its exchange or the connection's
 *      setup timed out or failed, other than a connection closed while idle)
 *      fails every call still PENDING, unsent, with it: they would only wait
 *      for the same stuck server in turn, each another command timeout.
 *      Calls that arrive after that go to the server afresh.
 */
#include <pthread.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "conn/batch.h"
#include "common/error.h"

enum { CALL_PENDING = 0, CALL_INFLIGHT, CALL_LEAD, CALL_DONE };

struct dlock_batch {
    pthread_mutex_t mu;
    dlock_pool *pool;
    dlock_counters *ctr;
    uint32_t command_timeout_ms;
    uint32_t min_replicas;    /* > 0: every exchange ends with a WAIT */
    int resolve_on_shortfall; /* drop a connection whose WAIT fell short */
    unsigned lanes;
    unsigned active;          /* B1; mu */
    dlock_call *head, *tail;  /* the FIFO (B2); mu */
};

dlock_batch *dlock_batch_create(dlock_pool *pool, unsigned lanes, uint32_t command_timeout_ms,
                                uint32_t min_replicas, int resolve_on_shortfall,
                                dlock_counters *ctr)
{
    dlock_batch *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    pthread_mutex_init(&b->mu, NULL);
    DLOCK_LOCKSTAT_NAME(&b->mu, "batch");
    b->pool = pool;
    b->ctr = ctr;
    b->command_timeout_ms = command_timeout_ms;
    b->min_replicas = min_replicas;
    b->resolve_on_shortfall = resolve_on_shortfall;
    b->lanes = lanes ? lanes : 1;
    return b;
}

void dlock_batch_destroy(dlock_batch *b)
{
    if (!b)
        return;
    DLOCK_ASSERT(b->active == 0 && !b->head);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

/* Appends call to the FIFO. b->mu held. */
static void fifo_push(dlock_batch *b, dlock_call *call)
{
    call->next = NULL;
    if (b->tail)
        b->tail->next = call;
    else
        b->head = call;
    b->tail = call;
}

/* Takes x, whose predecessor in the FIFO is prev (NULL: x is the head), out
 * of the FIFO while walking it. b->mu held. */
static void fifo_unlink(dlock_batch *b, dlock_call *prev, dlock_call *x)
{
    if (prev)
        prev->next = x->next;
    else
        b->head = x->next;
    if (b->tail == x)
        b->tail = prev;
    x->next = NULL;
}

/* Takes call out of the FIFO (it is in it). b->mu held. */
static void fifo_remove(dlock_batch *b, dlock_call *call)
{
    dlock_call *prev = NULL;
    for (dlock_call *x = b->head; x != call; x = x->next)
        prev = x;
    if (prev)
        prev->next = call->next;
    else
        b->head = call->next;
    if (b->tail == call)
        b->tail = prev;
    call->next = NULL;
}

/* 1 if c failed because it was closed or reset under the exchange (an idle
 * timeout, a restart): another connection may succeed. */
static int conn_was_closed(const redisContext *c)
{
    return c->err == REDIS_ERR_EOF ||
           (c->err == REDIS_ERR_IO &&
            (strstr(c->errstr, "reset") || strstr(c->errstr, "Broken pipe")));
}

static void call_fail(dlock_call *call, int rc, int sent, const char *why)
{
    call->rc = rc;
    call->sent = sent;
    snprintf(call->err, sizeof call->err, "%s", why);
}

/* Fails every call of batch[from..n) whose connection failed. */
static void fail_rest(dlock_call **batch, unsigned from, unsigned n, const redisContext *conn)
{
    int closed = conn_was_closed(conn);
    for (unsigned i = from; i < n; i++) {
        if (batch[i]->rc != DLOCK_OK || batch[i]->reply)
            continue; /* settled already */
        call_fail(batch[i], DLOCK_EREDIS, 1, conn->errstr);
        batch[i]->closed = closed;
    }
}

/* Out of memory while building the request: nothing is written; every
 * unsettled call of batch[0..n) fails unsent, and the connection is marked
 * failed so that it is dropped. */
static void fail_unsent_oom(dlock_call **batch, unsigned n, redisContext *conn)
{
    for (unsigned k = 0; k < n; k++)
        if (batch[k]->rc == DLOCK_OK && !batch[k]->reply)
            call_fail(batch[k], DLOCK_ENOMEM, 0, "out of memory");
    if (!conn->err)
        conn->err = REDIS_ERR_OOM;
}

/* Writes the calls of batch[0..n) that are still unsettled and have no
 * reply yet, as EVALSHA (use_sha) or EVAL, and reads their replies in
 * order, by deadline. 0, or -1 when the connection failed (those calls are
 * failed). */
static int exchange(dlock_batch *b, redisContext *conn, dlock_call **batch, unsigned n,
                    int use_sha, int64_t deadline)
{
    unsigned out = 0;
    for (unsigned i = 0; i < n; i++) {
        dlock_call *call = batch[i];
        if (call->rc != DLOCK_OK || call->reply)
            continue;
        const char *asking[1] = {"ASKING"};
        if (call->asking)
            dlock_count(&b->ctr->redis_commands, 1);
        if ((call->asking && redisAppendCommandArgv(conn, 1, asking, NULL) != REDIS_OK) ||
            dlock_conn_append_eval(conn, b->ctr, call->id, use_sha, call->nkeys, call->nargs,
                                   call->argv, NULL) != 0) {
            fail_unsent_oom(batch, n, conn);
            return -1;
        }
        out++;
    }
    if (!out)
        return 0;
    char want[16], wait_ms[16];
    if (b->min_replicas) {
        /* The scripts' writes reach this many replicas before the calls
         * learn their outcome; WAIT blocks this connection for at most half
         * the command timeout, well within the exchange's deadline. */
        snprintf(want, sizeof want, "%" PRIu32, b->min_replicas);
        snprintf(wait_ms, sizeof wait_ms, "%" PRIu32,
                 b->command_timeout_ms / 2 ? b->command_timeout_ms / 2 : 1);
        const char *argv[3] = {"WAIT", want, wait_ms};
        if (redisAppendCommandArgv(conn, 3, argv, NULL) != REDIS_OK) {
            fail_unsent_oom(batch, n, conn);
            return -1;
        }
        dlock_count(&b->ctr->redis_commands, 1);
    }
    dlock_count(&b->ctr->redis_round_trips, 1);
    if (dlock_conn_flush(conn, deadline) != 0) {
        fail_rest(batch, 0, n, conn);
        return -1;
    }
    int not_master = 0;
    unsigned char mine[DLOCK_BATCH_MAX] = {0}; /* replies read in this exchange */
    for (unsigned i = 0; i < n; i++) {
        dlock_call *call = batch[i];
        if (call->rc != DLOCK_OK || call->reply)
            continue;
        redisReply *r;
        if (call->asking) {
            /* ASKING's +OK; an error there shows in the script's reply */
            if (dlock_conn_read(conn, deadline, &r) != 0) {
                fail_rest(batch, i, n, conn);
                return -1;
            }
            freeReplyObject(r);
        }
        if (dlock_conn_read(conn, deadline, &r) != 0) {
            fail_rest(batch, i, n, conn);
            return -1;
        }
        mine[i] = 1;
        /* A replica's READONLY (a failover): the call gets the error, the
         * connection is dropped after the batch and the next one finds the
         * new master. The replies after it are still read. */
        if (dlock_conn_is_not_master(r))
            not_master = 1;
        call->reply = r;
    }
    if (b->min_replicas) {
        redisReply *r = NULL;
        int acked = -1; /* unknown: counts as too few */
        if (dlock_conn_read(conn, deadline, &r) == 0) {
            if (r->type == REDIS_REPLY_INTEGER)
                acked = (int)(r->integer < INT32_MAX ? r->integer : INT32_MAX);
            freeReplyObject(r);
        }
        for (unsigned i = 0; i < n; i++)
            if (mine[i])
                batch[i]->acked = acked;
        /* Too few replicas: in Sentinel mode most likely a failover that
         * promoted the replica while this master still runs; the next
         * connection asks the sentinels again. */
        if (b->resolve_on_shortfall && (acked < 0 || (uint32_t)acked < b->min_replicas) &&
            !conn->err) {
            conn->err = REDIS_ERR_OTHER;
            snprintf(conn->errstr, sizeof conn->errstr, "too few replicas acknowledged");
        }
    }
    if (not_master && !conn->err) {
        conn->err = REDIS_ERR_OTHER;
        snprintf(conn->errstr, sizeof conn->errstr, "the server is not a writable master");
    }
    /* Every call read here has its reply; a failed connection (the WAIT's
     * read, a replica, a shortfall) makes the caller fail the NOSCRIPT ones
     * as retryable instead of sending them again on it. */
    return conn->err ? -1 : 0;
}

/* Runs batch[0..n) on one pooled connection. Every call ends settled: a
 * reply, or rc and err set. Returns 1 if the server looks stuck (B5), with
 * why in stuck_why, else 0. Called without b->mu. */
static int run_batch(dlock_batch *b, dlock_call **batch, unsigned n, char *stuck_why,
                     size_t why_len)
{
    int64_t now = dlock_now_ns();
    unsigned live = 0;
    for (unsigned i = 0; i < n; i++) {
        if (batch[i]->deadline != DLOCK_NEVER && now >= batch[i]->deadline)
            call_fail(batch[i], DLOCK_ETIMEDOUT, 0,
                      "no redis connection came free before the caller's deadline");
        else
            live++;
    }
    if (!live)
        return 0;
    redisContext *conn;
    int rc = dlock_pool_get(b->pool, DLOCK_NEVER, &conn);
    if (rc != DLOCK_OK) {
        for (unsigned i = 0; i < n; i++)
            if (batch[i]->rc == DLOCK_OK)
                call_fail(batch[i], rc, 0, dlock_last_error());
        snprintf(stuck_why, why_len, "%s", dlock_last_error());
        return rc == DLOCK_EREDIS;
    }
    int64_t deadline = dlock_conn_deadline(b->command_timeout_ms);
    int ok = exchange(b, conn, batch, n, 1, deadline) == 0;
    int stuck = !ok && conn->err && !conn_was_closed(conn) && conn->err != REDIS_ERR_OOM &&
                conn->err != REDIS_ERR_OTHER; /* (OTHER: a replica or a WAIT shortfall) */
    if (stuck)
        snprintf(stuck_why, why_len, "%s", conn->errstr);
    /* A restarted or flushed server answers NOSCRIPT: those calls go again
     * as EVAL, which caches the scripts for the next EVALSHA; if the
     * connection failed meanwhile they fail as the calls after them did
     * (they did not run: a retry is safe). */
    unsigned again = 0;
    for (unsigned i = 0; i < n; i++) {
        if (batch[i]->reply && dlock_conn_is_noscript(batch[i]->reply)) {
            freeReplyObject(batch[i]->reply);
            batch[i]->reply = NULL;
            if (!ok) {
                call_fail(batch[i], DLOCK_EREDIS, 1, conn->errstr);
                batch[i]->closed = 1;
            }
            again++;
        }
    }
    if (ok && again)
        exchange(b, conn, batch, n, 0, deadline);
    dlock_pool_put(b->pool, conn, conn->err != 0);
    return stuck;
}

/* Waits until call is DONE (returns 0) or its thread is promoted to lead
 * (returns 1). A call still PENDING at its deadline leaves the FIFO and is
 * settled with DLOCK_ETIMEDOUT; once taken into a batch it is waited for
 * without a deadline, as the exchange has its own. */
static int await(dlock_batch *b, dlock_call *call)
{
    for (;;) {
        /* Acquire: DONE publishes the outputs the leader wrote (B4). */
        int s = dlock_load_int_acquire(&call->state);
        if (s == CALL_DONE)
            return 0;
        if (s == CALL_LEAD)
            return 1;
        int64_t deadline = s == CALL_PENDING ? call->deadline : DLOCK_NEVER;
        if (deadline != DLOCK_NEVER && dlock_now_ns() >= deadline) {
            pthread_mutex_lock(&b->mu);
            if (dlock_load_int(&call->state) == CALL_PENDING) {
                fifo_remove(b, call);
                pthread_mutex_unlock(&b->mu);
                call_fail(call, DLOCK_ETIMEDOUT, 0,
                          "no redis connection came free before the caller's deadline");
                return 0;
            }
            pthread_mutex_unlock(&b->mu);
            continue; /* taken or promoted meanwhile */
        }
        dlock_futex_wait(&call->state, s, deadline);
    }
}

/* The server is stuck (B5): every call still PENDING fails now, unsent.
 * Called without b->mu. */
static void fail_pending(dlock_batch *b, const char *why)
{
    dlock_call *failed = NULL;
    pthread_mutex_lock(&b->mu);
    dlock_call *prev = NULL, *next;
    for (dlock_call *x = b->head; x; x = next) {
        next = x->next;
        if (dlock_load_int(&x->state) != CALL_PENDING) {
            prev = x;
            continue;
        }
        fifo_unlink(b, prev, x);
        x->next = failed; /* (a private list from here on) */
        failed = x;
        call_fail(x, DLOCK_EREDIS, 0, "");
        snprintf(x->err, sizeof x->err, "the call ahead of it on this server failed: %.150s", why);
        dlock_store_int(&x->state, CALL_INFLIGHT); /* out of the FIFO, not yet DONE */
    }
    pthread_mutex_unlock(&b->mu);
    while (failed) {
        dlock_call *x = failed;
        failed = x->next;
        x->next = NULL;
        /* Release: the outputs before DONE (B4); then only the wake. */
        dlock_store_int_release(&x->state, CALL_DONE);
        dlock_futex_wake(&x->state, 1);
    }
}

/* Leads until self is settled: takes the oldest waiting calls, runs them,
 * hands each its result, then promotes the next leader or gives the lane
 * back. The caller holds a lane (B1) and self is in state LEAD. */
static void lead(dlock_batch *b, dlock_call *self)
{
    dlock_call *batch[DLOCK_BATCH_MAX];
    int self_done = 0;
    if (self->deadline != DLOCK_NEVER && dlock_now_ns() >= self->deadline) {
        /* Promoted (or arrived) past its deadline: it sends nothing, not
         * even the others' calls, and passes the lane on at once. */
        pthread_mutex_lock(&b->mu);
        fifo_remove(b, self);
        pthread_mutex_unlock(&b->mu);
        call_fail(self, DLOCK_ETIMEDOUT, 0,
                  "no redis connection came free before the caller's deadline");
        self_done = 1;
    }
    while (!self_done) {
        unsigned n = 0;
        pthread_mutex_lock(&b->mu);
        dlock_call *prev = NULL, *next;
        for (dlock_call *x = b->head; x && n < DLOCK_BATCH_MAX; x = next) {
            next = x->next;
            if (x != self && dlock_load_int(&x->state) == CALL_LEAD) {
                prev = x; /* its own thread takes it, with the calls behind it */
                continue;
            }
            fifo_unlink(b, prev, x);
            dlock_store_int(&x->state, CALL_INFLIGHT);
            batch[n++] = x;
        }
        pthread_mutex_unlock(&b->mu);
        char why[160];
        if (run_batch(b, batch, n, why, sizeof why)) /* n >= 1: self is in the FIFO until taken */
            fail_pending(b, why);
        for (unsigned i = 0; i < n; i++) {
            dlock_call *call = batch[i];
            if (call == self) {
                self_done = 1;
                continue;
            }
            /* Release: the outputs before DONE (B4); then only the wake. */
            dlock_store_int_release(&call->state, CALL_DONE);
            dlock_futex_wake(&call->state, 1);
        }
    }
    dlock_call *promote = NULL;
    pthread_mutex_lock(&b->mu);
    for (dlock_call *x = b->head; x; x = x->next) {
        if (dlock_load_int(&x->state) == CALL_PENDING) {
            promote = x;
            break;
        }
    }
    if (promote)
        dlock_store_int(&promote->state, CALL_LEAD); /* the lane passes on (B3) */
    else
        b->active--;
    pthread_mutex_unlock(&b->mu);
    if (promote)
        dlock_futex_wake(&promote->state, 1);
}

int dlock_batch_run(dlock_batch *b, dlock_call *call)
{
    call->reply = NULL;
    call->rc = DLOCK_OK;
    call->sent = 0;
    call->closed = 0;
    call->acked = b->min_replicas ? -1 : 0;
    call->err[0] = '\0';
    pthread_mutex_lock(&b->mu);
    int leads = b->active < b->lanes;
    if (leads)
        b->active++;
    dlock_store_int(&call->state, leads ? CALL_LEAD : CALL_PENDING);
    fifo_push(b, call);
    pthread_mutex_unlock(&b->mu);
    if (leads || await(b, call))
        lead(b, call);
    return call->rc;
}

unsigned dlock_batch_waiting(dlock_batch *b)
{
    unsigned n = 0;
    pthread_mutex_lock(&b->mu);
    for (dlock_call *x = b->head; x; x = x->next)
        n += dlock_load_int(&x->state) == CALL_PENDING;
    pthread_mutex_unlock(&b->mu);
    return n;
}
