/*
 * Redis connections and the caller threads' connection pool.
 *
 * Pool invariants (all under pool->mu, a leaf lock: nothing else is locked
 * while it is held, and no Redis I/O happens under it):
 *   - open counts the connections that exist: idle ones plus checked-out ones
 *     plus those being opened by a thread that reserved a slot; open <= size.
 *   - idle[0 .. nidle) are connected, without error, and owned by nobody.
 * A connection is used by one thread at a time: the one that checked it out.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "error.h"

/*
 * SIGPIPE: hiredis writes with write(2), so a write to a connection the
 * server closed raises SIGPIPE, which kills a process that did not ignore it.
 * Caller threads belong to the application, so their signal mask is only
 * borrowed: SIGPIPE is blocked around each exchange, a SIGPIPE raised by it
 * is consumed, and the mask is restored (the library's own threads block
 * every signal for their whole life instead).
 */
void dlock_pipe_guard_enter(dlock_pipe_guard *g)
{
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, &g->old);
    sigpending(&pending);
    g->was_pending = sigismember(&pending, SIGPIPE);
}

void dlock_pipe_guard_leave(dlock_pipe_guard *g)
{
    if (!g->was_pending) {
        sigset_t pipe, pending;
        sigemptyset(&pipe);
        sigaddset(&pipe, SIGPIPE);
        sigpending(&pending);
        if (sigismember(&pending, SIGPIPE)) {
            struct timespec zero = {0, 0};
            sigtimedwait(&pipe, NULL, &zero); /* ours: consume it */
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

void dlock_block_signals(sigset_t *old)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, old);
}

static struct timeval ms_tv(uint32_t ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

static int fail_ctx(redisContext *c, const char *what)
{
    int rc = dlock_err_set(DLOCK_EREDIS, "redis %s: %s", what,
                           c ? (c->err ? c->errstr : "unexpected reply") : "out of memory");
    return rc;
}

/* Sends one simple command and checks that the reply is not an error. */
static int simple_command(redisContext *c, dlock_counters *ctr, const char *what, int argc,
                          const char **argv)
{
    redisReply *r = redisCommandArgv(c, argc, argv, NULL);
    dlock_count(&ctr->redis_commands, 1);
    dlock_count(&ctr->redis_round_trips, 1);
    if (!r)
        return fail_ctx(c, what);
    int rc = DLOCK_OK;
    if (r->type == REDIS_REPLY_ERROR)
        rc = dlock_err_set(DLOCK_EREDIS, "redis %s: %s", what, r->str);
    freeReplyObject(r);
    return rc;
}

/* Loads every script whose digest is not known yet, pipelined. */
static int load_scripts(redisContext *c, dlock_counters *ctr)
{
    int sent[DLOCK_SCRIPT_COUNT] = {0}, n = 0;
    for (int id = 0; id < DLOCK_SCRIPT_COUNT; id++) {
        if (dlock_script_sha(id))
            continue;
        const char *argv[3] = {"SCRIPT", "LOAD", dlock_script_body(id)};
        if (redisAppendCommandArgv(c, 3, argv, NULL) != REDIS_OK)
            return fail_ctx(c, "SCRIPT LOAD");
        sent[id] = 1;
        n++;
    }
    if (!n)
        return DLOCK_OK;
    dlock_count(&ctr->redis_commands, n);
    dlock_count(&ctr->redis_round_trips, 1);
    int rc = DLOCK_OK;
    for (int id = 0; id < DLOCK_SCRIPT_COUNT; id++) {
        if (!sent[id])
            continue;
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK)
            return fail_ctx(c, "SCRIPT LOAD");
        if (r->type == REDIS_REPLY_STRING)
            dlock_script_set_sha(id, r->str, r->len);
        else if (rc == DLOCK_OK)
            rc = dlock_err_set(DLOCK_EREDIS, "redis SCRIPT LOAD: %s",
                               r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
        freeReplyObject(r);
    }
    return rc;
}

static int conn_open(const dlock_conn_cfg *cfg, dlock_counters *ctr, redisContext **out);

int dlock_conn_open(const dlock_conn_cfg *cfg, dlock_counters *ctr, redisContext **out)
{
    dlock_pipe_guard g;
    dlock_pipe_guard_enter(&g);
    int rc = conn_open(cfg, ctr, out);
    dlock_pipe_guard_leave(&g);
    return rc;
}

static int conn_open(const dlock_conn_cfg *cfg, dlock_counters *ctr, redisContext **out)
{
    *out = NULL;
    redisContext *c = redisConnectWithTimeout(cfg->host, cfg->port, ms_tv(cfg->connect_timeout_ms));
    if (!c || c->err) {
        int rc = dlock_err_set(DLOCK_EREDIS, "redis connect to %s:%d: %s", cfg->host, cfg->port,
                               c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return rc;
    }
    int rc = DLOCK_OK;
    if (redisSetTimeout(c, ms_tv(cfg->command_timeout_ms)) != REDIS_OK)
        rc = fail_ctx(c, "set timeout");
    if (rc == DLOCK_OK)
        redisEnableKeepAlive(c); /* best effort: dead peers are found sooner */
    if (rc == DLOCK_OK && cfg->password) {
        const char *argv[2] = {"AUTH", cfg->password};
        rc = simple_command(c, ctr, "AUTH", 2, argv);
    }
    if (rc == DLOCK_OK && cfg->db != 0) {
        char db[16];
        snprintf(db, sizeof db, "%d", cfg->db);
        const char *argv[2] = {"SELECT", db};
        rc = simple_command(c, ctr, "SELECT", 2, argv);
    }
    if (rc == DLOCK_OK)
        rc = load_scripts(c, ctr);
    if (rc != DLOCK_OK) {
        redisFree(c);
        return rc;
    }
    *out = c;
    return DLOCK_OK;
}

int dlock_conn_flush(redisContext *c)
{
    int done = 0;
    while (!done)
        if (redisBufferWrite(c, &done) != REDIS_OK)
            return -1;
    return 0;
}

int dlock_conn_is_noscript(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0;
}

/* Builds ["EVALSHA"|"EVAL", sha|body, nkeys, argv...] and appends it. */
static int append_script(redisContext *c, dlock_script_id id, int use_sha, int nkeys, int nargs,
                         const char **argv, const size_t *lens)
{
    enum { INLINE = 16 };
    const char *vbuf[INLINE];
    size_t lbuf[INLINE];
    int n = 3 + nkeys + nargs;
    const char **v = n <= INLINE ? vbuf : malloc(sizeof *v * n);
    size_t *l = n <= INLINE ? lbuf : malloc(sizeof *l * n);
    if (!v || !l) {
        if (v != vbuf)
            free(v);
        if (l != lbuf)
            free(l);
        return -1;
    }
    char nk[16];
    snprintf(nk, sizeof nk, "%d", nkeys);
    const char *sha = use_sha ? dlock_script_sha(id) : NULL;
    v[0] = sha ? "EVALSHA" : "EVAL";
    v[1] = sha ? sha : dlock_script_body(id);
    v[2] = nk;
    for (int i = 0; i < 3; i++)
        l[i] = strlen(v[i]);
    for (int i = 0; i < nkeys + nargs; i++) {
        v[3 + i] = argv[i];
        l[3 + i] = lens ? lens[i] : strlen(argv[i]);
    }
    int rc = redisAppendCommandArgv(c, n, v, l) == REDIS_OK ? 0 : -1;
    if (v != vbuf)
        free(v);
    if (l != lbuf)
        free(l);
    return rc;
}

int dlock_conn_append_eval(redisContext *c, dlock_counters *ctr, dlock_script_id id, int use_sha,
                           int nkeys, int nargs, const char **argv, const size_t *lens)
{
    dlock_count(&ctr->redis_commands, 1);
    return append_script(c, id, use_sha, nkeys, nargs, argv, lens);
}

static redisReply *conn_eval(redisContext *c, dlock_counters *ctr, dlock_script_id id, int nkeys,
                             int nargs, const char **argv, const size_t *lens);

redisReply *dlock_conn_eval(redisContext *c, dlock_counters *ctr, dlock_script_id id, int nkeys,
                            int nargs, const char **argv, const size_t *lens)
{
    dlock_pipe_guard g;
    dlock_pipe_guard_enter(&g);
    redisReply *r = conn_eval(c, ctr, id, nkeys, nargs, argv, lens);
    dlock_pipe_guard_leave(&g);
    return r;
}

static redisReply *conn_eval(redisContext *c, dlock_counters *ctr, dlock_script_id id, int nkeys,
                             int nargs, const char **argv, const size_t *lens)
{
    for (int use_sha = 1;; use_sha = 0) {
        if (append_script(c, id, use_sha, nkeys, nargs, argv, lens) != 0)
            return NULL;
        dlock_count(&ctr->redis_commands, 1);
        dlock_count(&ctr->redis_round_trips, 1);
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK)
            return NULL;
        if (!use_sha || !dlock_conn_is_noscript(r))
            return r;
        /* A restarted or flushed server: EVAL caches the script again. */
        freeReplyObject(r);
    }
}

struct dlock_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled when a slot or an idle connection frees */
    const dlock_conn_cfg *cfg;
    dlock_counters *ctr;
    unsigned size, open, nidle;
    uint64_t returns; /* healthy connections given back: Redis is answering */
    redisContext *idle[];
};

dlock_pool *dlock_pool_create(const dlock_conn_cfg *cfg, unsigned size, dlock_counters *ctr)
{
    dlock_pool *p = calloc(1, sizeof *p + sizeof p->idle[0] * size);
    if (!p)
        return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&p->mu, NULL);
    p->cfg = cfg;
    p->ctr = ctr;
    p->size = size;
    return p;
}

void dlock_pool_destroy(dlock_pool *p)
{
    if (!p)
        return;
    for (unsigned i = 0; i < p->nidle; i++)
        redisFree(p->idle[i]);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int dlock_pool_get(dlock_pool *p, redisContext **out)
{
    /* While other callers keep giving connections back, Redis is answering
     * and waiting is worth it; a command timeout without any coming back
     * means Redis is stuck. The hard limit keeps an unlucky waiter from
     * waiting forever behind a busy crowd. */
    int64_t tmo = (int64_t)p->cfg->command_timeout_ms * DLOCK_NS_PER_MS;
    int64_t now = dlock_now_ns();
    int64_t idle_deadline = now + tmo, hard_deadline = now + 10 * tmo;
    pthread_mutex_lock(&p->mu);
    uint64_t seen = p->returns;
    for (;;) {
        if (p->nidle) {
            *out = p->idle[--p->nidle];
            pthread_mutex_unlock(&p->mu);
            return DLOCK_OK;
        }
        if (p->open < p->size) {
            p->open++; /* reserve the slot, connect without the lock */
            pthread_mutex_unlock(&p->mu);
            int rc = dlock_conn_open(p->cfg, p->ctr, out);
            if (rc != DLOCK_OK) {
                pthread_mutex_lock(&p->mu);
                p->open--;
                pthread_cond_signal(&p->cv);
                pthread_mutex_unlock(&p->mu);
            }
            return rc;
        }
        int64_t deadline = idle_deadline < hard_deadline ? idle_deadline : hard_deadline;
        struct timespec ts = dlock_ts(deadline);
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        now = dlock_now_ns();
        if (p->returns != seen) {
            seen = p->returns;
            idle_deadline = now + tmo;
        }
        if (now >= idle_deadline || now >= hard_deadline) {
            pthread_mutex_unlock(&p->mu);
            return dlock_err_set(DLOCK_EREDIS, "no redis connection came free in time (all %u "
                                 "busy; redis slow or stuck)", p->size);
        }
    }
}

void dlock_pool_put(dlock_pool *p, redisContext *c, int broken)
{
    if (!c)
        return;
    if (broken || c->err) {
        redisFree(c);
        c = NULL;
    }
    pthread_mutex_lock(&p->mu);
    if (c) {
        p->idle[p->nidle++] = c;
        p->returns++; /* only a healthy connection shows Redis answering */
    } else {
        p->open--;
    }
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}
