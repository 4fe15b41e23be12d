/*
 * Redis connections: opening one (timeouts, AUTH, SELECT, SCRIPT LOAD),
 * running a script with EVALSHA and its EVAL fallback, and a small pool of
 * connections that caller threads check out for one call at a time.
 */
#ifndef DLOCK_CONN_H
#define DLOCK_CONN_H

#include <signal.h>

#include <hiredis/hiredis.h>

#include "common.h"
#include "script.h"

typedef struct dlock_conn_cfg {
    char *host;
    int port;
    char *password; /* NULL: no AUTH */
    int db;
    uint32_t connect_timeout_ms;
    uint32_t command_timeout_ms;
} dlock_conn_cfg;

/* dlock_conn_open and dlock_conn_eval may be called from any thread: they
 * keep SIGPIPE from a closed connection away from the process (see conn.c). */

/* Opens a ready connection: connected within the connect timeout, command
 * timeout set, authenticated, database selected, scripts loaded if their
 * digests are not known yet. DLOCK_OK, or DLOCK_EREDIS with the message set. */
int dlock_conn_open(const dlock_conn_cfg *cfg, dlock_counters *ctr, redisContext **out);

/* Runs one script and waits for its reply: EVALSHA, or EVAL if the digest is
 * unknown or the server answers NOSCRIPT (then the digest is relearned).
 * argv holds nkeys keys followed by nargs arguments. Returns the reply (free
 * it with freeReplyObject; a Redis error comes back as REDIS_REPLY_ERROR), or
 * NULL when the connection failed (c->err says why; do not reuse c). */
redisReply *dlock_conn_eval(redisContext *c, dlock_counters *ctr, dlock_script_id id,
                            int nkeys, int nargs, const char **argv, const size_t *lens);

/* Appends one script call to c's output buffer without waiting: EVALSHA
 * when use_sha and the digest is known, else EVAL (after a NOSCRIPT answer).
 * 0 or -1 (out of memory). */
int dlock_conn_append_eval(redisContext *c, dlock_counters *ctr, dlock_script_id id, int use_sha,
                           int nkeys, int nargs, const char **argv, const size_t *lens);

/* Writes c's output buffer out (blocking, within the command timeout).
 * 0, or -1 if the connection failed. */
int dlock_conn_flush(redisContext *c);

/* 1 if reply is the NOSCRIPT error of an EVALSHA. */
int dlock_conn_is_noscript(const redisReply *reply);

/* Keeps a SIGPIPE raised by writes in between away from the process: enter
 * blocks SIGPIPE in the calling thread, leave consumes one raised meanwhile
 * and restores the mask. For raw hiredis I/O on an application thread. */
typedef struct dlock_pipe_guard {
    sigset_t old;
    int was_pending;
} dlock_pipe_guard;
void dlock_pipe_guard_enter(dlock_pipe_guard *g);
void dlock_pipe_guard_leave(dlock_pipe_guard *g);

/* Blocks every signal in the calling thread, saving the old mask in *old:
 * a library thread is started with this mask (the new thread inherits it),
 * so application signal handlers never run on it and a write to a closed
 * connection cannot raise SIGPIPE. Restore with pthread_sigmask. */
void dlock_block_signals(sigset_t *old);

typedef struct dlock_pool dlock_pool;

/* A pool of at most size connections to cfg (copied by reference: cfg must
 * outlive the pool). Connections open lazily. NULL when out of memory. */
dlock_pool *dlock_pool_create(const dlock_conn_cfg *cfg, unsigned size, dlock_counters *ctr);

/* Closes every idle connection and frees the pool; none may be checked out. */
void dlock_pool_destroy(dlock_pool *p);

/* Checks out a connection: an idle one, or a new one while fewer than size
 * are open; otherwise waits for one to come back, as long as others do come
 * back at least once per command timeout, and at most 10 command timeouts.
 * DLOCK_OK, or DLOCK_EREDIS (cannot connect, or none came back in time). */
int dlock_pool_get(dlock_pool *p, redisContext **out);

/* Returns a checked-out connection; a failed one (c->err set) or broken != 0
 * is closed instead, so the next dlock_pool_get reconnects. */
void dlock_pool_put(dlock_pool *p, redisContext *c, int broken);

#endif
