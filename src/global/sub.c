/*
 * The subscriber: one thread, one connection, one SUBSCRIBE.
 *
 * Shared state and its guards:
 *   s->mu guards s->stop for the backoff sleep (written only under s->mu and
 *   signalled on s->cv, so a sleeping thread cannot miss it). The thread also
 *   reads s->stop without s->mu between reads (a relaxed atomic load): stop
 *   carries no data, the thread only has to see it within one poll interval,
 *   and dlock_sub_stop's pthread_join orders everything before the free.
 *   s->mu is a leaf lock: nothing else is taken under it, no Redis I/O and no
 *   callback runs under it.
 *   s->ready is written only by the thread and read by anyone, as a relaxed
 *   atomic: a statistic and test probe, no other memory is published through
 *   it. (A test that sees ready == 1 and then publishes is ordered by the
 *   Redis server, which confirmed the subscription before the thread set
 *   ready.) s->reconnects, also written by the thread only, is incremented
 *   with release after on_resubscribed returns and read with acquire, so a
 *   reader that sees a count also sees the effects of the calls it counts.
 *   Everything else (the connection, the backoff, the RNG) belongs to the
 *   thread alone; the cfg copy and the channel are immutable after start.
 *
 * How the thread waits, with hiredis 0.14's synchronous API:
 *   It never blocks in a hiredis read. It poll()s the socket for at most
 *   POLL_MS, checks stop, and reads only when the socket is readable, with
 *   redisBufferRead (one read() of what is there, fed to the reply parser),
 *   then takes every complete reply out of the parser with
 *   redisGetReplyFromReader. A partial reply simply stays in the parser until
 *   the next readable event. So an idle subscription causes no timeout errors
 *   at all. (The alternative, a short SO_RCVTIMEO and redisGetReply, does not
 *   work as is in 0.14: a timeout sets c->err = REDIS_ERR_IO with errno
 *   EAGAIN and every later call on the context fails at once until c->err is
 *   cleared by hand.) A read() after POLLIN returns at once; the writes
 *   (SUBSCRIBE and PING) go through dlock_conn_flush, which never blocks past
 *   the command timeout.
 *
 * Liveness: a SUBSCRIBE must be confirmed within the command timeout. Once
 *   subscribed, after PING_IDLE_MS without receiving anything the thread sends
 *   a PING (in RESP2 subscribed mode the answer is ["pong", ""]); if nothing
 *   at all arrives for a command timeout while the PING is unanswered, the
 *   peer is taken for dead (a frozen server, a lost network). Any data
 *   received pushes that deadline back: a connection delivering a flood of
 *   messages is alive even if the pong is queued behind them.
 *
 * Sentinel mode: every DLOCK_SENTINEL_CHECK_MS the thread asks the
 *   sentinels where the master is (sentinel.h); when they name another
 *   server than the one it is connected to, it ends the session as if the
 *   connection were lost, and the pool and renewal thread drop theirs.
 *
 * Cluster mode: the connection goes to any node, the next one in turn on
 *   each reconnect (PUBLISH reaches every node of a cluster, so one
 *   subscription hears the releases of every master); every
 *   DLOCK_CLUSTER_CHECK_MS the thread refreshes the slot map (cluster.h).
 *
 * On a lost connection: close it, clear ready, sleep a backoff (BACKOFF_MIN_MS
 *   doubling to BACKOFF_MAX_MS, each sleep drawn uniformly from [b/2, b];
 *   reset after a confirmed subscription), reconnect with dlock_conn_open,
 *   SUBSCRIBE again; on the confirmation, set ready and, if a subscription
 *   had been confirmed before, call on_resubscribed and then count a
 *   reconnect.
 *
 * Signals: the thread is created with every signal blocked, so that the
 *   application's handlers run on its own threads. A write to a socket the
 *   server closed fails with EPIPE (MSG_NOSIGNAL, conn.h) and the connection
 *   is treated as lost.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"
#include "route/cluster.h"
#include "route/sentinel.h"
#include "global/sub.h"

enum {
    POLL_MS = 100,         /* longest poll: how long stop may go unseen */
    PING_IDLE_MS = 2000,   /* PING after this long without receiving anything */
    BACKOFF_MIN_MS = 50,   /* first pause before a reconnect */
    BACKOFF_MAX_MS = 1000, /* longest pause between two connection attempts */
};

struct dlock_sub {
    dlock_sub_cfg cfg;      /* cfg.channel points at channel; cfg.ctr never NULL */
    char *channel;          /* owned copy */
    size_t channel_len;
    pthread_t thread;
    pthread_mutex_t mu;     /* leaf lock: guards stop for writers and the sleep */
    pthread_cond_t cv;      /* CLOCK_MONOTONIC; signalled when stop is set */
    int stop;               /* written under mu; read under mu or relaxed */
    int ready;              /* relaxed atomic, written by the thread only */
    uint64_t reconnects;    /* release/acquire atomic, written by the thread only */
    dlock_counters own_ctr; /* used when cfg->ctr is NULL */

    /* Thread-private. */
    redisContext *c;
    int ever_subscribed;
    uint64_t rng;
};

static int stopping(dlock_sub *s)
{
    return dlock_load_int(&s->stop);
}

/* xorshift64: jitter only, no quality needed. */
static uint64_t next_rand(dlock_sub *s)
{
    uint64_t x = s->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s->rng = x;
    return x;
}

/* Sleeps until deadline unless stop is set first. Returns 1 if stopping.
 * Called without locks. */
static int sleep_until(dlock_sub *s, int64_t deadline)
{
    struct timespec ts = dlock_ts(deadline);
    pthread_mutex_lock(&s->mu);
    while (!s->stop && dlock_now_ns() < deadline)
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    int stop = s->stop;
    pthread_mutex_unlock(&s->mu);
    return stop;
}

static int is_str(const redisReply *r)
{
    return r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS;
}

static int is_kind(const redisReply *r, const char *kind)
{
    return r->type == REDIS_REPLY_ARRAY && r->elements >= 1 && is_str(r->element[0]) &&
           strcasecmp(r->element[0]->str, kind) == 0;
}

static int is_our_channel(const dlock_sub *s, const redisReply *r)
{
    return is_str(r) && r->len == s->channel_len && memcmp(r->str, s->channel, r->len) == 0;
}

/* The state of one connection's session, thread-private. */
typedef struct session {
    int subscribed;     /* the server confirmed our SUBSCRIBE */
    int ping_out;       /* a PING is unanswered */
    int64_t last_rx;    /* when data last arrived (or the session began) */
    int64_t deadline;   /* lost if nothing arrives by then; DLOCK_NEVER if none */
} session;

/* Handles one reply. 0, or -1 if it shows the connection is not what we
 * expect (an error reply, a confirmation of another channel): drop it. */
static int handle(dlock_sub *s, session *ss, redisReply *r)
{
    if (is_kind(r, "message")) {
        if (r->elements != 3 || !is_our_channel(s, r->element[1]) ||
            r->element[2]->type != REDIS_REPLY_STRING)
            return -1;
        s->cfg.on_message(s->cfg.arg, r->element[2]->str, r->element[2]->len);
        return 0;
    }
    if (is_kind(r, "subscribe")) {
        if (r->elements != 3 || !is_our_channel(s, r->element[1]) || ss->subscribed)
            return -1;
        ss->subscribed = 1;
        ss->deadline = DLOCK_NEVER;
        dlock_store_int(&s->ready, 1);
        if (s->cfg.on_subscribed)
            s->cfg.on_subscribed(s->cfg.arg);
        if (s->ever_subscribed) {
            if (s->cfg.on_resubscribed)
                s->cfg.on_resubscribed(s->cfg.arg);
            /* Release, after the call: whoever reads the new count with
             * dlock_sub_reconnects (acquire) also sees what the callback
             * did (the tests count calls and compare). */
            __atomic_fetch_add(&s->reconnects, 1, __ATOMIC_RELEASE);
        }
        s->ever_subscribed = 1;
        return 0;
    }
    if (is_kind(r, "pong") && ss->ping_out) {
        ss->ping_out = 0;
        ss->deadline = DLOCK_NEVER;
        return 0;
    }
    return -1; /* an error reply (NOAUTH, OOM...) or a protocol surprise */
}

/* Subscribes on s->c and delivers messages until the connection is lost or
 * stop is seen. Returns 1 if a subscription was confirmed on it. Called
 * without locks. */
static int session_run(dlock_sub *s)
{
    redisContext *c = s->c;
    const int64_t tmo = (int64_t)s->cfg.conn->command_timeout_ms * DLOCK_NS_PER_MS;
    const int64_t ping_idle = (int64_t)PING_IDLE_MS * DLOCK_NS_PER_MS;
    session ss = {0, 0, dlock_now_ns(), DLOCK_NEVER};

    const char *argv[2] = {"SUBSCRIBE", s->channel};
    size_t lens[2] = {9, s->channel_len};
    if (redisAppendCommandArgv(c, 2, argv, lens) != REDIS_OK ||
        dlock_conn_flush(c, dlock_now_ns() + tmo) != 0)
        return 0;
    dlock_count(&s->cfg.ctr->redis_commands, 1);
    dlock_count(&s->cfg.ctr->redis_round_trips, 1);
    ss.deadline = dlock_now_ns() + tmo;

    int sentinel = s->cfg.conn->nsentinels > 0;
    int64_t next_check = dlock_now_ns() + (int64_t)DLOCK_SENTINEL_CHECK_MS * DLOCK_NS_PER_MS;
    int64_t next_cluster = dlock_now_ns() + (int64_t)DLOCK_CLUSTER_CHECK_MS * DLOCK_NS_PER_MS;
    while (!stopping(s)) {
        int64_t now = dlock_now_ns();
        if (now >= ss.deadline)
            break; /* no confirmation, or no sign of life after a PING */
        if (sentinel && now >= next_check) {
            /* Where is the master now? After a failover the deposed master
             * may answer for seconds until the sentinels demote it: every
             * connection of the client leaves it once this records the new
             * one (sentinel.h), this one first. */
            char host[256];
            int port;
            dlock_sentinel_master(s->cfg.conn, s->cfg.ctr, host, sizeof host, &port);
            if (dlock_sentinel_stale(s->cfg.conn, c))
                break;
            now = dlock_now_ns();
            next_check = now + (int64_t)DLOCK_SENTINEL_CHECK_MS * DLOCK_NS_PER_MS;
        }
        if (s->cfg.conn->cluster &&
            (now >= next_cluster || dlock_cluster_refresh_wanted(s->cfg.conn->cluster))) {
            /* Cluster mode: the slot map is asked for now and then, so a
             * failover or a resharding is learnt before calls meet it, and
             * soon (within POLL_MS) after a call or a renewal met a
             * connection error. */
            dlock_cluster_refresh(s->cfg.conn->cluster, 0,
                                  dlock_conn_deadline(s->cfg.conn->connect_timeout_ms +
                                                      s->cfg.conn->command_timeout_ms));
            now = dlock_now_ns();
            next_cluster = now + (int64_t)DLOCK_CLUSTER_CHECK_MS * DLOCK_NS_PER_MS;
        }
        if (ss.subscribed && !ss.ping_out && now >= ss.last_rx + ping_idle) {
            const char *ping[1] = {"PING"};
            if (redisAppendCommandArgv(c, 1, ping, NULL) != REDIS_OK ||
                dlock_conn_flush(c, dlock_now_ns() + tmo) != 0)
                break;
            dlock_count(&s->cfg.ctr->redis_commands, 1);
            dlock_count(&s->cfg.ctr->redis_round_trips, 1);
            ss.ping_out = 1;
            ss.deadline = now + tmo;
        }
        int64_t wake = now + (int64_t)POLL_MS * DLOCK_NS_PER_MS;
        if (ss.deadline < wake)
            wake = ss.deadline;
        if (ss.subscribed && !ss.ping_out && ss.last_rx + ping_idle < wake)
            wake = ss.last_rx + ping_idle;
        if (sentinel && next_check < wake)
            wake = next_check;
        int wait_ms = wake > now ? (int)((wake - now + DLOCK_NS_PER_MS - 1) / DLOCK_NS_PER_MS) : 0;

        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        int n = poll(&pfd, 1, wait_ms);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            break;
        if (n == 0)
            continue;
        /* Readable, or POLLHUP/POLLERR: the read reports EOF or the error. */
        if (redisBufferRead(c) != REDIS_OK)
            break;
        now = dlock_now_ns();
        ss.last_rx = now;
        if (ss.ping_out)
            ss.deadline = now + tmo; /* alive: give the pong its time again */
        int bad = 0;
        for (;;) {
            redisReply *r = NULL;
            if (redisGetReplyFromReader(c, (void **)&r) != REDIS_OK) {
                bad = 1; /* a protocol error: the context is unusable */
                break;
            }
            if (!r)
                break; /* no complete reply left; a partial one waits */
            bad = handle(s, &ss, r) != 0;
            freeReplyObject(r);
            if (bad)
                break;
        }
        if (bad)
            break;
    }
    return ss.subscribed;
}

static void *sub_main(void *arg)
{
    dlock_sub *s = arg;
    int64_t backoff_ms = 0; /* the first attempt is immediate */
    while (!stopping(s)) {
        if (backoff_ms) {
            /* Uniform in [b/2, b]: clients that lost the server together do
             * not all come back in the same millisecond. */
            int64_t half = backoff_ms * DLOCK_NS_PER_MS / 2;
            int64_t pause = half + (int64_t)(next_rand(s) % (uint64_t)(half + 1));
            if (sleep_until(s, dlock_now_ns() + pause))
                break;
        }
        if (dlock_conn_open(s->cfg.conn, s->cfg.ctr, &s->c) != DLOCK_OK) {
            s->c = NULL;
            backoff_ms = backoff_ms ? backoff_ms * 2 : BACKOFF_MIN_MS;
            if (backoff_ms > BACKOFF_MAX_MS)
                backoff_ms = BACKOFF_MAX_MS;
            continue;
        }
        int subscribed = session_run(s);
        dlock_store_int(&s->ready, 0);
        redisFree(s->c);
        s->c = NULL;
        if (subscribed || !backoff_ms)
            backoff_ms = BACKOFF_MIN_MS;
        else if ((backoff_ms *= 2) > BACKOFF_MAX_MS)
            backoff_ms = BACKOFF_MAX_MS;
    }
    return NULL;
}

int dlock_sub_start(const dlock_sub_cfg *cfg, dlock_sub **out)
{
    if (!out)
        return dlock_err_set(DLOCK_EINVAL, "dlock_sub_start: out is NULL");
    *out = NULL;
    if (!cfg || !cfg->conn || !cfg->channel || !cfg->channel[0] || !cfg->on_message)
        return dlock_err_set(DLOCK_EINVAL, "dlock_sub_start: conn, channel (not empty) and "
                                           "on_message are required");
    dlock_sub *s = calloc(1, sizeof *s);
    if (!s)
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    s->channel_len = strlen(cfg->channel);
    s->channel = malloc(s->channel_len + 1);
    if (!s->channel) {
        free(s);
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    }
    memcpy(s->channel, cfg->channel, s->channel_len + 1);
    s->cfg = *cfg;
    s->cfg.channel = s->channel;
    if (!s->cfg.ctr)
        s->cfg.ctr = &s->own_ctr;
    s->rng = (uint64_t)dlock_now_ns() ^ ((uint64_t)(uintptr_t)s << 16) ^ 0x9e3779b97f4a7c15ull;
    if (!s->rng)
        s->rng = 1;
    pthread_mutex_init(&s->mu, NULL);
    DLOCK_LOCKSTAT_NAME(&s->mu, "sub");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);

    /* The thread inherits a mask with every signal blocked (see the top). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&s->thread, NULL, sub_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s->channel);
        free(s);
        return dlock_err_set(DLOCK_ENOMEM, "cannot start the subscriber thread");
    }
    *out = s;
    return DLOCK_OK;
}

void dlock_sub_stop_ask(dlock_sub *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    dlock_store_int(&s->stop, 1);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void dlock_sub_stop(dlock_sub *s)
{
    if (!s)
        return;
    dlock_sub_stop_ask(s);
    pthread_join(s->thread, NULL);
    DLOCK_ASSERT(s->c == NULL); /* the thread closes its connection on the way out */
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s->channel);
    free(s);
}

int dlock_sub_ready(dlock_sub *s)
{
    return s ? dlock_load_int(&s->ready) : 0;
}

uint64_t dlock_sub_reconnects(dlock_sub *s)
{
    /* Acquire: pairs with the release increment after on_resubscribed. */
    return s ? __atomic_load_n(&s->reconnects, __ATOMIC_ACQUIRE) : 0;
}
