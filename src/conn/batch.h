/*
 * Automatic pipelining of the caller threads' script calls.
 *
 * A caller thread that needs a script run (an acquire, a release, a leave)
 * hands a dlock_call to dlock_batch_run. While a pooled connection is free,
 * the caller runs its call itself on one, alone: no other thread is
 * involved and the latency is one round trip, as without batching. When
 * every connection is in use, the call waits in a FIFO instead of waiting
 * for a connection; the next thread to lead takes every waiting call (at
 * most DLOCK_BATCH_MAX), writes them all with one write, reads the replies
 * with as few reads as they arrive in, and hands each caller its reply.
 * Redis then sees pipelined batches (one read and one write event for many
 * scripts), and no thread sits idle behind another's round trip: this is
 * flat combining, with at most one leader per connection.
 *
 * Leading passes on: a leader runs one batch, then, if calls wait, promotes
 * the oldest waiting call's thread to lead the next batch on the same
 * connection and returns to its own caller. A leader's caller thus waits for
 * one batch, never for other callers' later calls.
 */
#ifndef DLOCK_BATCH_H
#define DLOCK_BATCH_H

#include <hiredis/hiredis.h>

#include "common/common.h"
#include "conn/conn.h"
#include "conn/script.h"

/* The most calls one batch carries: about 10 KB of requests, which Redis
 * reads in one go (it reads 16 KB per read event). */
#define DLOCK_BATCH_MAX 32

/* One script call. The caller fills the inputs; dlock_batch_run fills the
 * outputs. It lives on the caller's stack for the duration of the call. */
typedef struct dlock_call {
    /* inputs */
    dlock_script_id id;
    int nkeys, nargs;
    const char **argv; /* nkeys keys, then nargs arguments; NUL-terminated */
    int64_t deadline;  /* monotonic: stop waiting for a connection (DLOCK_NEVER: none) */
    int asking;        /* Cluster mode, after an ASK redirect: ASKING goes just before
                          the script, on the same connection */
    /* outputs */
    redisReply *reply; /* DLOCK_OK: the reply (a Redis error is a REDIS_REPLY_ERROR
                          reply); the caller frees it with freeReplyObject */
    int rc;            /* DLOCK_OK, DLOCK_ETIMEDOUT, DLOCK_EREDIS, DLOCK_ESERVER or
                          DLOCK_ENOMEM */
    int sent;          /* the request was written, or may have been: it may have run */
    int closed;        /* it failed because the connection was closed or reset under
                          it (an idle timeout, a restart, a network reset): a retry on
                          a new connection may succeed (this one may have run: the
                          caller's scripts are idempotent, so that is safe) */
    int acked;         /* with min_replicas: how many replicas acknowledged the writes
                          of the exchange that carried the call (WAIT), -1 unknown;
                          0 without */
    char err[200];     /* rc != DLOCK_OK: why */
    /* private to batch.c */
    int state;         /* futex word; see batch.c */
    struct dlock_call *next;
} dlock_call;

typedef struct dlock_batch dlock_batch;

/* A batcher over pool, with at most `lanes` leaders at once (the pool's
 * size: each leader holds one connection). With min_replicas > 0 every
 * exchange ends with WAIT min_replicas (command_timeout_ms / 2) in the same
 * write, and each call's `acked` gets its answer; with resolve_on_shortfall
 * (Sentinel mode) a connection whose WAIT fell short is then dropped, so the
 * next one asks the sentinels where the master is. NULL when out of memory. */
dlock_batch *dlock_batch_create(dlock_pool *pool, unsigned lanes, uint32_t command_timeout_ms,
                                uint32_t min_replicas, int resolve_on_shortfall,
                                dlock_counters *ctr);

/* Frees it; no call may be running. */
void dlock_batch_destroy(dlock_batch *b);

/* Runs call and returns call->rc. Waits for a connection, or for a place in
 * a batch, at most until call->deadline (then DLOCK_ETIMEDOUT, not sent);
 * once sent, the exchange is bounded by the command timeout. Errors: those
 * of dlock_pool_get (not sent), or DLOCK_EREDIS when the connection failed
 * during the exchange (sent; `closed` says whether a retry is safe). The
 * message is in call->err, not in the thread's last error: the caller
 * formats it. Never called with a lock held that another caller of this
 * function could need: the caller may lead other threads' calls. */
int dlock_batch_run(dlock_batch *b, dlock_call *call);

/* How many calls wait for a batch now (not yet taken by a leader). For
 * tests and diagnostics: the figure is stale as soon as it is returned. */
unsigned dlock_batch_waiting(dlock_batch *b);

#endif
