/*
 * The client and the public lock API: the local tier's rules around the
 * entry table, and the Redis calls of acquire and release.
 *
 * Invariants, per entry (all under e->mu; see table.h for the fields):
 *   I1. has_owner implies depth >= 1 and state is HELD or LOST.
 *   I2. At most one thread per entry talks to Redis for it (design rule 1):
 *       the poller (poller == 1, state ACQUIRING during its call) or the
 *       releaser (state RELEASING). A thread may become the poller only when
 *       !has_owner, state == NONE and poller == 0.
 *   I3. state HELD implies the grant is registered with the renewal manager
 *       (e->renew != NULL), which holds a reference on e.
 *   I4. A LOST lease is never given to another thread: the owner must
 *       release it, which returns DLOCK_ELOST and resets state to NONE.
 *   I5. handoff == 1 (an open handoff, I10) implies !has_owner and state
 *       HELD (or LOST, if the renewal found it gone meanwhile: then it is
 *       reset, not taken). Every waiter checks handoff first when it wakes,
 *       so a pending handoff is taken by the first waiter to run; a release
 *       sets it only while waiters > 0 and wakes the head, and no poller
 *       exists while a lease is held locally.
 *   I6. woken is cleared by the poller before each try and set by the
 *       subscriber thread (wake_one, wake_all), which signals e->pcv, on
 *       which only the poller sleeps: a wake-up arriving during a try makes
 *       the poller try again at once instead of sleeping, and wakes no
 *       waiter.
 *   I7. queued: this client may be in the name's wait queue in Redis; the
 *       last thread to give up (waiters == 1), whatever its error, takes it
 *       out: itself (redis_leave) after a timeout, through the renewal
 *       thread (dlock_renew_leave) when Redis failed. The leave is numbered
 *       from the attempt sequence under e->mu, so a later attempt of this
 *       client outranks it in Redis however late it arrives.
 *   I8. A thread that waited behind a poller whose call failed with an error
 *       of Redis (fail_seq changed) fails with it; no thread becomes the
 *       poller, or starts any Redis call, after its deadline.
 *   I9. When the lease goes back to Redis and threads still wait, the head
 *       of the local queue (e->wq) is woken to become the poller (not all: a
 *       herd); so is it when a poll ends without a grant. A woken waiter
 *       either polls or, if its deadline passed, wakes the next head before
 *       it leaves, so a wake-up is never lost with the thread that received
 *       it (kick_head on every way out of acquire).
 *  I10. The local succession policy. Threads that wait for a lease held or
 *       being acquired by this client queue in e->wq in arrival order (the
 *       poller excepted), each parked on its own node. A release that keeps
 *       the lease here (rule 3) either
 *         - hands it directly to the head, if the head has been the head
 *           for DLOCK_FAIR_NS or more: the releaser makes it the owner (has_owner,
 *           owner, depth, token, waiters--) under e->mu and sets its node's
 *           `granted`; no other thread can take it; or
 *         - opens it (handoff = 1) and wakes the head: whichever thread of
 *           this client runs first takes it, a newcomer that has not queued
 *           (barging) or the head.
 *       Queued threads are served in arrival order; a newcomer passes them
 *       only while the head has led for less than DLOCK_FAIR_NS, so the head
 *       waits at most that plus one hold while the lease stays here, and no
 *       thread starves. A granted thread returns without touching the queue
 *       or e->waiters again. Wake-ups of the hot path (release) are issued
 *       after e->mu is dropped (park.h).
 *  I11. Direct grants (lua/release.lua). A release in another client may
 *       grant this client the lease while it waits in Redis, under its
 *       newest attempt, for its waiter ttl, and tell it on its channel.
 *       Only e's poller takes such a grant (take_direct_grant), between its
 *       tries, and only if the message names its last refused try of the
 *       current wait (try_nonce, reset when a poll starts): messages of an
 *       earlier wait or an earlier try, or late ones, are dropped. The
 *       validity counts min(waiter ttl, lease) from the send of the named
 *       try, which Redis saw before the release ran; the lease is HELD and
 *       `provisional` until the renewal makes it a whole lease. A grant
 *       that is dropped is found again by the poller's next try (the lease
 *       is its own), or freed by the leave of a client that gave up
 *       (lua/leave.lua, only a grant older than the leave), or expires
 *       after the waiter ttl.
 * References: a thread inside a call holds one; the owner thread keeps the
 * one of its outermost acquire until its outermost release.
 *
 * Lock order: e->mu, then the renewal manager's mutex; the table, pool,
 * subscriber and unconfirmed-set (unconfirmed.h) mutexes are leaves. No Redis I/O happens with e->mu held;
 * on_lost and the subscriber's callbacks run with no lock held (the latter
 * take e->mu only).
 *
 * Which operations may run concurrently on one client: all of them, from
 * any threads, except dlock_client_close (last, alone).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/un.h>
#include <unistd.h>

#include "common.h"
#include "batch.h"
#include "cancel.h"
#include "cluster.h"
#include "conn.h"
#include "error.h"
#include "metrics.h"
#include "renew.h"
#include "sentinel.h"
#include "sub.h"
#include "table.h"
#include "unconfirmed.h"

/* The fairness bound of the local succession policy (I10; docs/guide.md, "Handoff"):
 * a waiter that has led the local queue this long is passed over by no one;
 * the next local release hands it the lease directly. Chosen by measurement
 * (docs/performance.md, "Many threads on one name"): 0.5 to 2 ms give the same throughput
 * as no bound at all, within the noise of this machine. */
#define DLOCK_FAIR_NS (1 * DLOCK_NS_PER_MS)

struct dlock_client {
    dlock_conn_cfg conn;
    char *prefix;
    char id[33];        /* 128 random bits, hex: the owner of our leases */
    char lease_str[16]; /* lease_ms in decimal, for the scripts */
    char pass_limit_str[16];
    char waiter_ttl_str[16];
    char keep_str[16];  /* how long Redis keeps the client's record of a name */
    char *wake_prefix;  /* "<prefix>wake:" */
    char *channel;      /* "<prefix>wake:<id>": this client's wake channel */
    dlock_script_args args;
    uint64_t attempts;  /* numbered calls so far (acquire attempts and leaves): the
                           next is attempts + 1; Redis refuses one older than the
                           newest it saw for a name (atomic fetch-and-add) */
    uint32_t lease_ms, pass_limit, waiter_ttl_ms, pool_size, keep_ms;
    uint32_t min_replicas; /* > 0: grants and renewals count only once WAIT confirms them */
    dlock_master master;   /* Sentinel mode: the newest master known (sentinel.h) */
    int64_t fallback_ns; /* a queued poller retries this often without a wake-up */
    int64_t drift_ns;
    int64_t handoff_margin_ns; /* no handoff this close to the validity deadline */
    uint32_t grant_ms;         /* a direct grant's validity: min(waiter ttl, lease) */
    int64_t grant_drift_ns;    /* its drift margin */
    int64_t grant_margin_ns;   /* the same as handoff_margin_ns, for a direct grant not
                                  renewed yet; and the least validity one is taken with */
    void (*on_lost)(const char *name, uint64_t fence, void *arg);
    void *on_lost_arg;
    void (*on_log)(int level, const char *message, void *arg);
    void *on_log_arg;
    unsigned fork_gen; /* fork generation at open: calls in a child fail */
    uint64_t serial;   /* unique among the clients of this process, ever: see held_find */
    dlock_counters ctr;
    dlock_counters sub_ctr; /* the subscriber's own: its keepalives are not lock traffic */
    dlock_table *table;
    dlock_pool *pool;   /* NULL in Cluster mode: each node has its own */
    dlock_batch *batch; /* the caller threads' script calls, pipelined over pool */
    dlock_cluster *cluster; /* Cluster mode: the slot map and the nodes */
    dlock_renew *renew;
    dlock_sub *sub;
    dlock_unconfirmed *unconfirmed; /* tokens of grants whose end Redis never confirmed */
    int closing;       /* atomic: dlock_client_shutdown began (never reset) */
    int server_bad;    /* atomic: the periodic check found the server unfit (server_check) */
    pthread_mutex_t server_mu; /* a leaf: guards server_msg */
    char server_msg[400];      /* why, for the acquires it refuses */
    unsigned inside;   /* atomic: threads inside a public call on this client */
    dlock_client *open_prev, *open_next; /* the open clients (open_mu) */
};

/*
 * The open clients of this process, for the thread-exit hook (on_thread_exit),
 * which finds the client of a lock an exiting thread holds by its serial.
 * open_mu is a leaf, but for the hook, which calls enter() under it: close
 * unlinks the client under open_mu before it waits for the threads inside,
 * so a client found here stays alive until the hook's leave().
 */
static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static dlock_client *open_clients;

/* fork(): the child gets a copy of the client without its threads or a
 * consistent view of its locks. pthread_atfork's child handler bumps this
 * generation (only one thread exists then, so a plain store would do; the
 * atomic keeps TSan informed). */
static unsigned fork_generation;

/* Serial numbers of clients, from 1 (atomic fetch-and-add). */
static uint64_t client_serials;

/*
 * The entries the calling thread owns, so that its release, dlock_held and
 * reentrant acquire find them without the table mutex (at 1024 threads on
 * one name that mutex, taken three times per acquisition, cost 186 us of
 * waiting per acquisition: a preempted holder stalls everyone).
 * Only the owning thread reads or writes its slots. A slot holds an entry
 * from the thread's acquire to its outermost release, during which the
 * owner's reference keeps the entry alive. A slot is matched on the client's
 * serial before its entry is touched: a slot left by a client closed while
 * the thread held a lock (which the API forbids using again) is never
 * dereferenced, even if a new client gets the same address. When every slot
 * is taken, the entry is not cached and `uncached` counts it: lookups then
 * fall back to the table.
 */
#define HELD_SLOTS 8
static __thread struct held_slot {
    uint64_t serial;
    dlock_entry *e;
    int64_t since_ns; /* the outermost acquire: the hold time's start */
} held[HELD_SLOTS];
static __thread unsigned held_uncached;

static void arm_exit_hook(void);

/* The calling thread became the owner of e (outermost acquire). */
static void held_remember(const dlock_client *c, dlock_entry *e)
{
    arm_exit_hook();
    for (int i = 0; i < HELD_SLOTS; i++)
        if (!held[i].e) {
            held[i].serial = c->serial;
            held[i].e = e;
            held[i].since_ns = dlock_now_ns();
            return;
        }
    held_uncached++;
}

/* The calling thread stops owning e (outermost release). The serial is
 * matched too: a slot left by a closed client may hold the address that e
 * now has. */
static void held_forget(dlock_client *c, dlock_entry *e)
{
    for (int i = 0; i < HELD_SLOTS; i++)
        if (held[i].e == e && held[i].serial == c->serial) {
            held[i].e = NULL;
            /* hold times are measured for the entries a thread caches (all
             * but its ninth and later names held at once); a hold moved to
             * a handle is measured by the handle */
            if (!e->by_handle)
                dlock_hist_add(&c->ctr.hold, dlock_now_ns() - held[i].since_ns);
            return;
        }
    DLOCK_ASSERT(held_uncached > 0);
    held_uncached--;
}

/* The entry `name` of c with a new reference, if the calling thread may own
 * it: from its slots, else from the table while it owns uncached entries;
 * NULL when it owns no such name. The caller still checks ownership under
 * e->mu. */
static dlock_entry *held_find(dlock_client *c, const char *name, size_t len)
{
    for (int i = 0; i < HELD_SLOTS; i++) {
        dlock_entry *e = held[i].e;
        if (e && held[i].serial == c->serial && e->name_len == len &&
            memcmp(e->name, name, len) == 0) {
            dlock_table_ref(e);
            return e;
        }
    }
    return held_uncached ? dlock_table_find(c->table, name, len) : NULL;
}

uint64_t dlock_boot_skew_ns; /* common.h: tests only */
uint64_t dlock_test_shutdown_delay_ns; /* common.h: tests only */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void)
{
    ck_pr_inc_uint(&fork_generation);
    /* another thread of the parent may have held it: the child has one thread */
    pthread_mutex_init(&open_mu, NULL);
}

static void install_atfork(void)
{
    pthread_atfork(NULL, NULL, on_fork_child);
}

void dlock_config_init(dlock_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->redis_host = "127.0.0.1";
    cfg->redis_port = 6379;
    cfg->redis_password = NULL;
    cfg->redis_db = 0;
    cfg->key_prefix = "dlock:";
    cfg->lease_ms = 30000;
    cfg->connect_timeout_ms = 1000;
    cfg->command_timeout_ms = 1000;
    cfg->pass_limit = 128;
    cfg->pool_size = 4;
    cfg->waiter_ttl_ms = 2000;
}

/* Which settings name the server: exactly one of host/port, the Unix
 * socket and the sentinels. */
static int check_server_config(const dlock_config *cfg)
{
    int by_unix = cfg->redis_unix_path != NULL, by_sentinel = cfg->sentinels != NULL;
    int by_cluster = cfg->cluster_nodes != NULL;
    int host_set = (cfg->redis_host && strcmp(cfg->redis_host, "127.0.0.1") != 0) ||
                   cfg->redis_port != 6379;
    const char *set[3];
    int nset = 0;
    if (by_unix)
        set[nset++] = "redis_unix_path";
    if (by_sentinel)
        set[nset++] = "sentinels";
    if (by_cluster)
        set[nset++] = "cluster_nodes";
    if (nset > 1)
        return dlock_err_set(DLOCK_EINVAL, "%s and %s both name the server: set one of them",
                             set[0], set[1]);
    if (nset && host_set)
        return dlock_err_set(DLOCK_EINVAL, "%s and redis_host/redis_port (%s:%d) both name the "
                             "server: set redis_host to NULL, or leave host and port at their "
                             "defaults", set[0],
                             cfg->redis_host ? cfg->redis_host : "NULL", cfg->redis_port);
    if (by_unix) {
        if (!cfg->redis_unix_path[0])
            return dlock_err_set(DLOCK_EINVAL, "redis_unix_path is empty");
        if (strlen(cfg->redis_unix_path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
            return dlock_err_set(DLOCK_EINVAL, "redis_unix_path is longer than %zu bytes",
                                 sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
    } else if (!nset) {
        if (!cfg->redis_host || !cfg->redis_host[0])
            return dlock_err_set(DLOCK_EINVAL, "redis_host is NULL or empty");
        if (cfg->redis_port <= 0 || cfg->redis_port > 65535)
            return dlock_err_set(DLOCK_EINVAL, "redis_port %d is not in 1..65535",
                                 cfg->redis_port);
    }
    if (by_sentinel && (!cfg->sentinel_master || !cfg->sentinel_master[0]))
        return dlock_err_set(DLOCK_EINVAL, "sentinels is set but sentinel_master is NULL or "
                                           "empty: name the master the sentinels watch");
    if (!by_sentinel && (cfg->sentinel_master || cfg->sentinel_password))
        return dlock_err_set(DLOCK_EINVAL, "%s is set but sentinels is NULL",
                             cfg->sentinel_master ? "sentinel_master" : "sentinel_password");
    if (cfg->redis_username && (!cfg->redis_username[0] || !cfg->redis_password))
        return dlock_err_set(DLOCK_EINVAL, "%s", cfg->redis_username[0]
                             ? "redis_username needs redis_password (any string for a user "
                               "with nopass)"
                             : "redis_username is empty");
    if (by_cluster) {
        /* A cluster has database 0 only; a brace in the prefix would make
         * it, not the name, the keys' hash tag (or leave an empty one). */
        if (cfg->redis_db != 0)
            return dlock_err_set(DLOCK_EINVAL, "redis_db %d: a Redis Cluster has database 0 "
                                 "only", cfg->redis_db);
        if (cfg->key_prefix && strpbrk(cfg->key_prefix, "{}"))
            return dlock_err_set(DLOCK_EINVAL, "key_prefix \"%s\" holds a brace: in Cluster "
                                 "mode the name is each key's hash tag", cfg->key_prefix);
    }
    return DLOCK_OK;
}

static int check_config(const dlock_config *cfg)
{
    int rc = check_server_config(cfg);
    if (rc != DLOCK_OK)
        return rc;
    if (cfg->redis_db < 0)
        return dlock_err_set(DLOCK_EINVAL, "redis_db %d is negative", cfg->redis_db);
    if (!cfg->key_prefix)
        return dlock_err_set(DLOCK_EINVAL, "key_prefix is NULL");
    if (strnlen(cfg->key_prefix, DLOCK_PREFIX_MAX + 1) > DLOCK_PREFIX_MAX)
        return dlock_err_set(DLOCK_EINVAL, "key_prefix is longer than %d bytes", DLOCK_PREFIX_MAX);
    if (cfg->lease_ms < DLOCK_LEASE_MIN_MS || cfg->lease_ms > DLOCK_LEASE_MAX_MS)
        return dlock_err_set(DLOCK_EINVAL, "lease_ms %" PRIu32 " is not in %u..%u", cfg->lease_ms,
                             DLOCK_LEASE_MIN_MS, DLOCK_LEASE_MAX_MS);
    if (cfg->connect_timeout_ms == 0 || cfg->connect_timeout_ms > DLOCK_TIMEOUT_MAX_MS)
        return dlock_err_set(DLOCK_EINVAL, "connect_timeout_ms %" PRIu32 " is not in 1..%u",
                             cfg->connect_timeout_ms, DLOCK_TIMEOUT_MAX_MS);
    if (cfg->command_timeout_ms == 0 || cfg->command_timeout_ms > DLOCK_TIMEOUT_MAX_MS)
        return dlock_err_set(DLOCK_EINVAL, "command_timeout_ms %" PRIu32 " is not in 1..%u",
                             cfg->command_timeout_ms, DLOCK_TIMEOUT_MAX_MS);
    /* Tokens of local handoffs are reserved for one lease time; beyond it,
     * server time in us must be past them: pass_limit < lease_ms * 1000. */
    if (cfg->pass_limit > DLOCK_PASS_LIMIT_MAX || cfg->pass_limit >= (uint64_t)cfg->lease_ms * 1000)
        return dlock_err_set(DLOCK_EINVAL, "pass_limit %" PRIu32 " is above %u or not below "
                             "lease_ms * 1000", cfg->pass_limit, DLOCK_PASS_LIMIT_MAX);
    if (cfg->pool_size == 0 || cfg->pool_size > 1024)
        return dlock_err_set(DLOCK_EINVAL, "pool_size %" PRIu32 " is not in 1..1024",
                             cfg->pool_size);
    if (cfg->min_replicas > DLOCK_MIN_REPLICAS_MAX)
        return dlock_err_set(DLOCK_EINVAL, "min_replicas %" PRIu32 " is above %u",
                             cfg->min_replicas, DLOCK_MIN_REPLICAS_MAX);
    if (cfg->client_name) {
        size_t n = strnlen(cfg->client_name, DLOCK_CLIENT_NAME_MAX + 1);
        if (n == 0 || n > DLOCK_CLIENT_NAME_MAX)
            return dlock_err_set(DLOCK_EINVAL, "client_name is empty or longer than %d bytes",
                                 DLOCK_CLIENT_NAME_MAX);
        for (size_t i = 0; i < n; i++)
            if (cfg->client_name[i] <= ' ' || cfg->client_name[i] > '~')
                return dlock_err_set(DLOCK_EINVAL, "client_name \"%s\": only printable ASCII "
                                     "without spaces (Redis' CLIENT SETNAME rule)",
                                     cfg->client_name);
    }
    if (cfg->waiter_ttl_ms < DLOCK_WAITER_TTL_MIN_MS || cfg->waiter_ttl_ms > DLOCK_LEASE_MAX_MS)
        return dlock_err_set(DLOCK_EINVAL, "waiter_ttl_ms %" PRIu32 " is not in %u..%u",
                             cfg->waiter_ttl_ms, DLOCK_WAITER_TTL_MIN_MS, DLOCK_LEASE_MAX_MS);
    return DLOCK_OK;
}

/* strdup, or NULL with *oom set. */
static char *dup_or_flag(const char *s, int *oom)
{
    char *d = strdup(s);
    if (!d)
        *oom = 1;
    return d;
}

/* "<host>:<pid>", the default client_name, with anything CLIENT SETNAME
 * refuses replaced by '_'. */
static char *default_name(int *oom)
{
    char host[DLOCK_CLIENT_NAME_MAX], name[DLOCK_CLIENT_NAME_MAX + 1];
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = '\0';
    snprintf(name, sizeof name, "%.40s:%ld", host, (long)getpid());
    for (char *p = name; *p; p++)
        if (*p <= ' ' || *p > '~')
            *p = '_';
    return dup_or_flag(name, oom);
}

static int random_id(char out[33])
{
    unsigned char b[16];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t n = getrandom(b + got, sizeof b - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
    return 0;
}

static void client_free(dlock_client *c)
{
    dlock_sub_stop(c->sub);
    dlock_renew_stop(c->renew);
    dlock_batch_destroy(c->batch);
    dlock_pool_destroy(c->pool);
    dlock_cluster_destroy(c->cluster);
    dlock_table_destroy(c->table);
    dlock_unconfirmed_destroy(c->unconfirmed);
    free(c->conn.host);
    free(c->conn.password);
    free(c->conn.client_name);
    free(c->conn.username);
    free(c->conn.unix_path);
    dlock_addrs_free(c->conn.sentinels, c->conn.nsentinels);
    free(c->conn.sentinel_master);
    free(c->conn.sentinel_password);
    dlock_master_destroy(&c->master);
    pthread_mutex_destroy(&c->server_mu);
    free(c->prefix);
    free(c->wake_prefix);
    free(c->channel);
    free(c);
}

/* Parses a decimal uint64 at *p up to a space; advances *p past the space.
 * 0 if there is none (or it is 0: attempts and tokens start at 1). */
static uint64_t parse_u64(const char **p, const char *end)
{
    uint64_t v = 0;
    const char *q = *p;
    while (q < end && *q >= '0' && *q <= '9' && v < UINT64_MAX / 10)
        v = v * 10 + (uint64_t)(*q++ - '0');
    if (q == *p || q >= end || *q != ' ')
        return 0;
    *p = q + 1;
    return v;
}

/* A message on this client's channel (release.lua, leave.lua, dlockctl):
 * "f <token> <name>", an operator released the lease by force; "w <name>",
 * the turn for name is this client's; or "g <attempt> <token> <name>", a
 * release granted this client the lease of name directly under that
 * attempt ("u <end> <attempt> <token> <name>" when the grant before ended
 * uncleanly). Either way the poller of name, if this client still waits for
 * it, looks at once: it takes the grant if it still waits in that attempt
 * (poll_redis), else tries again. A payload of another form is ignored
 * (the poller's periodic retry covers it). On the subscriber thread. */
/* Formats one line for the application's log callback, if it has one.
 * Called with no library lock held. */
static void client_log(dlock_client *c, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void client_log(dlock_client *c, int level, const char *fmt, ...)
{
    if (!c->on_log)
        return;
    char line[DLOCK_NAME_MAX + 200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    c->on_log(level, line, c->on_log_arg);
}

static void wake_one(void *arg, const char *payload, size_t len)
{
    dlock_client *c = arg;
    const char *p = payload, *end = payload + len;
    uint64_t nonce = 0, token = 0;
    if (len > 2 && p[0] == 'f' && p[1] == ' ') {
        /* "f <token> <name>": an operator released our lease of name by
         * force (dlockctl release --force). The message is not trusted on
         * its own: a renewal round now asks Redis, and marks the lease lost
         * (dlock_held 0, on_lost) only if Redis no longer has it as ours. */
        const char *q = p + 2;
        token = parse_u64(&q, end);
        size_t nlen = (size_t)(end - q);
        if (!token || nlen == 0 || nlen > DLOCK_NAME_MAX)
            return;
        dlock_entry *e = dlock_table_find(c->table, q, nlen);
        if (!e)
            return; /* not ours any more */
        /* only for the grant we hold: not a stale message about an earlier
         * grant, nor one for a name we only wait for */
        pthread_mutex_lock(&e->mu);
        int ours = e->state == DLOCK_LEASE_HELD && e->grant_token == token;
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
        if (!ours)
            return;
        dlock_count(&c->ctr.forced_releases, 1);
        client_log(c, DLOCK_LOG_WARN, "the lease of '%.*s' (token %" PRIu64 ") was released by "
                   "an operator (dlockctl release --force); checking with Redis now",
                   (int)nlen, q, token);
        dlock_renew_kick(c->renew);
        return;
    }
    int unclean = 0;
    if (len > 2 && p[0] == 'w' && p[1] == ' ') {
        p += 2;
    } else if (len > 2 && (p[0] == 'g' || p[0] == 'u') && p[1] == ' ') {
        /* "u <end> <attempt> <token> <name>": a direct grant after an
         * unclean end (release.lua, ARGV[10]) */
        const char *q = p + 2;
        if (p[0] == 'u') {
            uint64_t u = parse_u64(&q, end);
            if (u == 0 || u > DLOCK_UNCLEAN_FORCED)
                return; /* malformed */
            unclean = (int)u;
        }
        nonce = parse_u64(&q, end);
        token = nonce ? parse_u64(&q, end) : 0;
        if (!token)
            return; /* malformed */
        p = q;
    } else {
        return; /* not a message of this version: the poller's retry covers it */
    }
    size_t nlen = (size_t)(end - p);
    if (nlen == 0 || nlen > DLOCK_NAME_MAX)
        return;
    dlock_entry *e = dlock_table_find(c->table, p, nlen);
    if (!e)
        return; /* nobody here waits for it any more */
    pthread_mutex_lock(&e->mu);
    /* With min_replicas a grant counts only once WAIT confirmed it: the
     * releaser's WAIT is not the taker's, so the poller's next try (which
     * finds the lease its own and confirms it) takes it instead. */
    if (nonce && e->poller && !c->min_replicas) {
        e->msg_grant = 1;
        e->msg_nonce = nonce;
        e->msg_token = token;
        e->msg_unclean = unclean;
    }
    e->woken = 1;
    pthread_cond_signal(&e->pcv); /* the poller only: the waiters have nothing to do */
    pthread_mutex_unlock(&e->mu);
    dlock_table_put(c->table, e);
}

static void wake_entry(dlock_entry *e, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&e->mu);
    e->woken = 1;
    pthread_cond_signal(&e->pcv);
    pthread_mutex_unlock(&e->mu);
}

/* The subscriber (re)subscribed: wake-ups sent before may have been missed
 * (pollers may have queued before the first subscription, or while the
 * connection was down), so every poller of this client tries again. On the
 * subscriber thread. */
static void wake_all(void *arg)
{
    dlock_client *c = arg;
    dlock_table_each_ref(c->table, wake_entry, NULL);
}

/* The subscriber reconnected: Redis may have restarted and lost every lease
 * (without persistence); a renewal round now marks them lost at once rather
 * than up to lease_ms/3 later. On the subscriber thread. */
static void renew_now(void *arg)
{
    dlock_client *c = arg;
    client_log(c, DLOCK_LOG_INFO, "the subscriber reconnected to Redis: wake-ups resume, and a "
               "renewal round checks every held lease now");
    dlock_renew_kick(c->renew);
}

static void log_from_renewal(void *arg, int level, const char *message)
{
    client_log(arg, level, "%s", message);
}

/* The renewal thread's periodic check of the server's settings (renew.h):
 * an unfit server (an eviction policy set, a downgrade) turns acquires into
 * DLOCK_ESERVER until a check finds it fit again; each change is logged. On
 * the renewal thread, no lock held. */
static void server_check(void *arg, int rc, const char *message)
{
    dlock_client *c = arg;
    int bad = rc != DLOCK_OK, was = dlock_load_int(&c->server_bad);
    if (bad) {
        pthread_mutex_lock(&c->server_mu);
        snprintf(c->server_msg, sizeof c->server_msg, "%s", message);
        pthread_mutex_unlock(&c->server_mu);
    }
    dlock_store_int_release(&c->server_bad, bad); /* the message before the flag */
    if (bad && !was)
        client_log(c, DLOCK_LOG_ERROR, "the server is no longer fit for dlock: %s; acquires "
                   "fail with DLOCK_ESERVER until it is mended", message);
    else if (!bad && was)
        client_log(c, DLOCK_LOG_INFO, "the server is fit for dlock again: acquires resume");
}

static void lost_from_renewal(void *arg, const char *name, uint64_t token)
{
    dlock_client *c = arg;
    client_log(c, DLOCK_LOG_WARN, "the lease of '%s' (token %" PRIu64 ") is lost: Redis no "
               "longer has it as this client's, or it could not be renewed in time", name, token);
    if (c->on_lost)
        c->on_lost(name, token, c->on_lost_arg);
}

int dlock_client_open(const dlock_config *cfg, dlock_client **out)
{
    dlock_err_clear();
    if (!out)
        return dlock_err_set(DLOCK_EINVAL, "out is NULL");
    *out = NULL;
    if (!cfg)
        return dlock_err_set(DLOCK_EINVAL, "config is NULL");
    int rc = check_config(cfg);
    if (rc != DLOCK_OK)
        return rc;
    pthread_once(&atfork_once, install_atfork);

    dlock_client *c = calloc(1, sizeof *c);
    if (!c)
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    dlock_master_init(&c->master);
    c->conn.master = &c->master;
    pthread_mutex_init(&c->server_mu, NULL);
    /* NULL copies as NULL; *oom is set when a non-NULL one could not be. */
    int oom = 0;
    c->conn.host = cfg->redis_host ? dup_or_flag(cfg->redis_host, &oom) : NULL;
    c->conn.password = cfg->redis_password ? dup_or_flag(cfg->redis_password, &oom) : NULL;
    c->conn.username = cfg->redis_username ? dup_or_flag(cfg->redis_username, &oom) : NULL;
    c->conn.unix_path = cfg->redis_unix_path ? dup_or_flag(cfg->redis_unix_path, &oom) : NULL;
    c->conn.sentinel_master =
        cfg->sentinel_master ? dup_or_flag(cfg->sentinel_master, &oom) : NULL;
    c->conn.sentinel_password =
        cfg->sentinel_password ? dup_or_flag(cfg->sentinel_password, &oom) : NULL;
    c->prefix = strdup(cfg->key_prefix);
    c->conn.client_name = cfg->client_name ? dup_or_flag(cfg->client_name, &oom)
                                           : default_name(&oom);
    c->conn.port = cfg->redis_port;
    c->conn.db = cfg->redis_db;
    c->conn.connect_timeout_ms = cfg->connect_timeout_ms;
    c->conn.command_timeout_ms = cfg->command_timeout_ms;
    c->lease_ms = cfg->lease_ms;
    snprintf(c->lease_str, sizeof c->lease_str, "%" PRIu32, cfg->lease_ms);
    c->pass_limit = cfg->pass_limit;
    snprintf(c->pass_limit_str, sizeof c->pass_limit_str, "%" PRIu32, cfg->pass_limit);
    c->waiter_ttl_ms = cfg->waiter_ttl_ms;
    c->min_replicas = cfg->min_replicas;
    c->conn.min_replicas = cfg->min_replicas;
    snprintf(c->waiter_ttl_str, sizeof c->waiter_ttl_str, "%" PRIu32, cfg->waiter_ttl_ms);
    /* Redis remembers a client's newest attempt per name this long after its
     * last call on the name: longer than a lease and than a queue entry. */
    c->keep_ms = 2 * (cfg->lease_ms > cfg->waiter_ttl_ms ? cfg->lease_ms : cfg->waiter_ttl_ms);
    snprintf(c->keep_str, sizeof c->keep_str, "%" PRIu32, c->keep_ms);
    c->fallback_ns = (int64_t)cfg->waiter_ttl_ms * DLOCK_NS_PER_MS / 4;
    c->pool_size = cfg->pool_size;
    c->drift_ns = dlock_renew_drift_ns(cfg->lease_ms);
    /* A lease renewed on time keeps at least 2/3 of its time: one with less
     * than 1/3 left has missed a renewal and is not passed on. */
    c->handoff_margin_ns = (int64_t)cfg->lease_ms * DLOCK_NS_PER_MS / 3;
    /* A direct grant lasts the waiter ttl in Redis, but a renewal (or the
     * same attempt seen again) resets it to the lease time, which may be
     * shorter: its validity counts the smaller of the two. */
    c->grant_ms = cfg->waiter_ttl_ms < cfg->lease_ms ? cfg->waiter_ttl_ms : cfg->lease_ms;
    c->grant_drift_ns = dlock_renew_drift_ns(c->grant_ms);
    c->grant_margin_ns = (int64_t)c->grant_ms * DLOCK_NS_PER_MS / 4;
    c->on_lost = cfg->on_lost;
    c->on_lost_arg = cfg->on_lost_arg;
    c->on_log = cfg->on_log;
    c->on_log_arg = cfg->on_log_arg;
    c->fork_gen = dlock_load_uint(&fork_generation);
    c->serial = ck_pr_faa_64(&client_serials, 1) + 1;
    if (oom || !c->prefix) {
        client_free(c);
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    }
    if (cfg->sentinels) {
        rc = dlock_addrs_parse(cfg->sentinels, "sentinels", &c->conn.sentinels,
                               &c->conn.nsentinels);
        if (rc != DLOCK_OK) {
            client_free(c);
            return rc;
        }
        c->conn.route = &dlock_sentinel_route; /* connections go to the master they name */
    }
    if (random_id(c->id) != 0) {
        client_free(c);
        return dlock_err_set(DLOCK_ENOMEM, "no random bytes for the client id");
    }
    size_t plen = strlen(c->prefix);
    c->wake_prefix = malloc(plen + 6);
    c->channel = malloc(plen + 6 + sizeof c->id);
    if (!c->wake_prefix || !c->channel) {
        client_free(c);
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    }
    snprintf(c->wake_prefix, plen + 6, "%swake:", c->prefix);
    snprintf(c->channel, plen + 6 + sizeof c->id, "%s%s", c->wake_prefix, c->id);
    c->args = (dlock_script_args){c->id, c->lease_str, c->pass_limit_str, c->waiter_ttl_str,
                                  c->wake_prefix, c->keep_str};
    c->table = dlock_table_create(c->prefix, c->id, &c->ctr);
    c->unconfirmed = dlock_unconfirmed_create(c->keep_ms);
    if (cfg->cluster_nodes) {
        rc = dlock_cluster_create(&c->conn, cfg->cluster_nodes, cfg->pool_size,
                                  cfg->min_replicas, &c->ctr, &c->cluster);
        if (rc != DLOCK_OK) {
            client_free(c);
            return rc;
        }
        c->conn.cluster = c->cluster; /* the subscriber connects to any node */
        c->conn.route = &dlock_cluster_any_route;
    } else {
        c->pool = dlock_pool_create(&c->conn, cfg->pool_size, &c->ctr);
        if (c->pool)
            c->batch = dlock_batch_create(c->pool, cfg->pool_size, cfg->command_timeout_ms,
                                          cfg->min_replicas, cfg->sentinels != NULL, &c->ctr);
    }
    if (!c->table || !c->unconfirmed || (!c->cluster && (!c->pool || !c->batch))) {
        client_free(c);
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    }
    dlock_renew_cfg rc_cfg = {
        .conn = &c->conn,
        .ctr = &c->ctr,
        .table = c->table,
        .args = &c->args,
        .lease_ms = c->lease_ms,
        .keep_ms = c->keep_ms,
        .waiter_ttl_ms = c->waiter_ttl_ms,
        .min_replicas = cfg->min_replicas,
        .lost = lost_from_renewal,
        .lost_arg = c,
        .log = log_from_renewal,
        .server = server_check,
    };
    rc = dlock_renew_start(&rc_cfg, &c->renew);
    if (rc != DLOCK_OK) {
        client_free(c);
        return rc;
    }
    dlock_sub_cfg sub_cfg = {
        .conn = &c->conn,
        .ctr = &c->sub_ctr,
        .channel = c->channel,
        .on_message = wake_one,
        .on_subscribed = wake_all, /* the first subscription too: see wake_all */
        .on_resubscribed = renew_now,
        .arg = c,
    };
    rc = dlock_sub_start(&sub_cfg, &c->sub);
    if (rc != DLOCK_OK) {
        client_free(c);
        return rc;
    }
    /* Connect once now so that the first acquire is fast; an unreachable
     * Redis is reported by later calls, not here. */
    redisContext *rc_conn;
    if (c->cluster)
        dlock_cluster_refresh(c->cluster, 1, DLOCK_NEVER);
    else if (dlock_pool_get(c->pool, DLOCK_NEVER, &rc_conn) == DLOCK_OK)
        dlock_pool_put(c->pool, rc_conn, 0);
    dlock_err_clear();
    pthread_mutex_lock(&open_mu);
    c->open_next = open_clients;
    if (open_clients)
        open_clients->open_prev = c;
    open_clients = c;
    pthread_mutex_unlock(&open_mu);
    *out = c;
    return DLOCK_OK;
}

static void shutdown_now(dlock_client *c);

void dlock_client_close(dlock_client *c)
{
    if (!c)
        return;
    if (dlock_load_uint(&fork_generation) != c->fork_gen)
        return; /* a child: the parent's client is not ours to touch */
    /* Out of the open clients first: no thread-exit hook enters it after. */
    pthread_mutex_lock(&open_mu);
    if (c->open_prev)
        c->open_prev->open_next = c->open_next;
    else
        open_clients = c->open_next;
    if (c->open_next)
        c->open_next->open_prev = c->open_prev;
    pthread_mutex_unlock(&open_mu);
    /* Threads still inside calls: wake them (waiting acquires return
     * DLOCK_ECLOSED) and wait until they have left. */
    shutdown_now(c);
    while (dlock_load_uint_acquire(&c->inside) != 0) { /* see leave */
        struct timespec ts = {0, 1000000}; /* 1 ms */
        nanosleep(&ts, NULL);
    }
    client_free(c);
}

/* Checks the arguments common to the lock calls; sets *len. */
static int check_call(dlock_client *c, const char *name, size_t *len)
{
    if (!c)
        return dlock_err_set(DLOCK_EINVAL, "client is NULL");
    if (dlock_load_uint(&fork_generation) != c->fork_gen)
        return dlock_err_set(DLOCK_EFORK, "this client was opened before fork(); open a new "
                                          "client in the child");
    if (!name)
        return dlock_err_set(DLOCK_EINVAL, "name is NULL");
    *len = strnlen(name, DLOCK_NAME_MAX + 1);
    if (*len == 0)
        return dlock_err_set(DLOCK_EINVAL, "name is empty");
    if (*len > DLOCK_NAME_MAX)
        return dlock_err_set(DLOCK_EINVAL, "name is longer than %d bytes", DLOCK_NAME_MAX);
    if (c->cluster && name[0] == '}')
        return dlock_err_set(DLOCK_EINVAL, "name \"%s\" starts with '}': in Cluster mode its "
                             "keys would have no hash tag and land in different slots", name);
    return DLOCK_OK;
}

/*
 * Shutdown and cancellation. A thread inside a public call counts itself in
 * c->inside (enter ... leave), so that dlock_client_close can wait for it;
 * leave is its last access to c. dlock_client_shutdown sets c->closing, then
 * wakes every entry (shutdown_wake); a cancel token, when fired, wakes the
 * entry of each acquire registered on it (cancel_wake). A waiter looks at
 * both flags (stop_rc) under e->mu before it sleeps, and the wake-ups take
 * e->mu, so none is missed (the poller on e->pcv, a parked waiter on its
 * node). Order: closing is stored before the entries are visited; an entry
 * made after the visit is made under the table mutex, which the visit took
 * after the store, so its first waiter sees the flag.
 */
static void enter(dlock_client *c)
{
    ck_pr_inc_uint(&c->inside);
}

static void leave(dlock_client *c)
{
    /* Every access of the call to c comes before the decrement: close
     * frees c once it reads 0 (release here, acquire there). */
    dlock_dec_uint_release(&c->inside);
}

/* DLOCK_ECLOSED if c is shutting down, DLOCK_ECANCELED if k is fired, else
 * DLOCK_OK. Any lock or none. */
static int stop_rc(dlock_client *c, dlock_cancel *k)
{
    if (dlock_load_int(&c->closing))
        return DLOCK_ECLOSED;
    if (dlock_cancel_is_fired(k))
        return DLOCK_ECANCELED;
    return DLOCK_OK;
}

/* stop_rc's code with its message. */
static int stop_err(int rc, const char *name)
{
    if (rc == DLOCK_ECLOSED)
        return dlock_err_set(rc, "the client is shutting down (dlock_client_shutdown): no "
                             "acquire of '%s'", name);
    return dlock_err_set(rc, "the acquire of '%s' was cancelled (dlock_cancel_fire)", name);
}

/* Wakes whatever waits in e: the poller, and every parked waiter, which
 * look at the stop flags again. Called with no lock held. */
static void wake_waiters(dlock_entry *e, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&e->mu);
    pthread_cond_signal(&e->pcv); /* the poller only sleeps on it */
    dlock_waitq_wake_all(&e->wq);
    pthread_mutex_unlock(&e->mu);
}

/* An acquire registered on a cancel token (cancel.h). */
typedef struct cancel_reg {
    dlock_cancel_reg base; /* first: cancel_wake casts back */
    dlock_client *c;
    const char *name;
    size_t len;
    dlock_waiter *w; /* the acquiring thread's node */
} cancel_reg;

/* The token of r's acquire was fired: wakes that thread, if it waits in
 * r's entry. Called under the token's mutex (cancel.h: before the table and
 * entry mutexes); the acquire is still inside its call, so c is alive. */
static void cancel_wake(dlock_cancel_reg *base)
{
    cancel_reg *r = (cancel_reg *)base;
    dlock_entry *e = dlock_table_find(r->c->table, r->name, r->len);
    if (!e)
        return; /* not in the entry yet: it looks at the flag when it is */
    pthread_mutex_lock(&e->mu);
    if (e->poller)
        pthread_cond_signal(&e->pcv); /* the poller may be r's thread */
    if (r->w->queued)
        dlock_waitq_wake(r->w); /* a thread waits for one name at a time: in e */
    pthread_mutex_unlock(&e->mu);
    dlock_table_put(r->c->table, e);
}

/* Sets the closing flag and wakes every entry's waiters (see above).
 * Called inside a call (enter), or by close. */
static void shutdown_now(dlock_client *c)
{
    dlock_store_int(&c->closing, 1);
    ck_pr_fence_memory(); /* the flag before the visit (the visit's table mutex orders it
                             for entries made later) */
    dlock_table_each_ref(c->table, wake_waiters, NULL);
}

int dlock_client_shutdown(dlock_client *c)
{
    dlock_err_clear();
    if (!c)
        return dlock_err_set(DLOCK_EINVAL, "client is NULL");
    if (dlock_load_uint(&fork_generation) != c->fork_gen)
        return dlock_err_set(DLOCK_EFORK, "this client was opened before fork()");
    enter(c); /* a close from another thread waits for the visit */
    uint64_t hold = dlock_load_64(&dlock_test_shutdown_delay_ns);
    if (hold) {
        struct timespec ts = {(time_t)(hold / 1000000000u), (long)(hold % 1000000000u)};
        nanosleep(&ts, NULL); /* tests only: a shutdown caught inside its call */
    }
    shutdown_now(c);
    leave(c);
    return DLOCK_OK;
}

/* A small per-thread generator for retry jitter (xorshift64*). */
static uint64_t jitter_rand(void)
{
    static __thread uint64_t s;
    if (!s)
        s = (uint64_t)dlock_now_ns() ^ ((uint64_t)(uintptr_t)&s << 17) ^ 0x9e3779b97f4a7c15ULL;
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ULL;
}

/*
 * Runs a script through the batcher (pipelined with other threads' calls
 * when every pooled connection is busy) and returns its reply in *out.
 * A pooled connection that the server closed while it sat idle fails at once
 * with EOF or a reset; the call is then made again, at most pool_size + 1
 * times. That is safe even if the first try did run, because every script is
 * idempotent for its caller: a release matches its grant, and an acquire
 * retried with the same nonce is granted again in place. The wait for a
 * connection or a batch ends at the caller's deadline (DLOCK_NEVER: none but
 * the exchanges' own); the exchange itself has one command timeout. Returns
 * DLOCK_OK, or an error (DLOCK_EREDIS, DLOCK_ETIMEDOUT, DLOCK_ESERVER) with
 * the message set and *sent telling whether the command may have reached
 * Redis. Called without any lock held (the caller may lead a batch).
 */
/* The kind of a failed exchange, for the start of a DLOCK_EREDIS message
 * (unreachable, timed out, or refused by the server, which the callers of
 * replies say themselves), from the connection's error text. */
static const char *redis_failure(const char *err)
{
    if (strstr(err, "refused by the server"))
        return ""; /* it says so itself (conn.c: a setup step the server refused) */
    if (strstr(err, "timed out") || strstr(err, "came free"))
        return "timed out: ";
    return "unreachable: ";
}

/* Cluster mode: the node serving slot now, or `node` if none is known (no
 * refresh is waited for: the deadline is now). */
static dlock_cluster_node *route_or(dlock_client *c, unsigned slot, dlock_cluster_node *node)
{
    dlock_cluster_node *n = dlock_cluster_route(c->cluster, slot, dlock_now_ns());
    return n ? n : node;
}

/* The stop flags a waiting acquire's call looks at between TRYAGAIN
 * retries (stop_rc): none for releases and leaves. */
typedef struct stop_on {
    int acquire;        /* a waiting acquire: a shutdown stops it */
    dlock_cancel *k;    /* its cancel token, or NULL */
} stop_on;

static int call_script(dlock_client *c, dlock_script_id id, int nargs, const char **argv,
                       const char *what, const char *name, int64_t deadline, redisReply **out,
                       int *sent, int *acked, stop_on stop)
{
    *sent = 0;
    if (acked)
        *acked = -1;
    dlock_batch *b = c->batch;
    dlock_cluster_node *node = NULL;
    unsigned slot = 0, redirects = 0, busy = 0;
    int asking = 0;
    /* TRYAGAIN and CLUSTERDOWN are retried until the caller's deadline; a
     * call without one (a release, a wait forever) for 10 command timeouts. */
    int64_t busy_until = deadline != DLOCK_NEVER
                             ? deadline
                             : dlock_now_ns() + 10 * (int64_t)c->conn.command_timeout_ms *
                                                    DLOCK_NS_PER_MS;
    if (c->cluster) {
        slot = dlock_cluster_slot(argv[0], strlen(argv[0]));
        if (!(node = dlock_cluster_route(c->cluster, slot, deadline)))
            return dlock_err_set(DLOCK_EREDIS, "redis %s of '%s': %s", what, name,
                                 dlock_last_error());
    }
    for (uint32_t attempt = 0;;) {
        if (node)
            b = node->batch;
        dlock_call call = {.id = id, .nkeys = DLOCK_SCRIPT_KEYS, .nargs = nargs, .argv = argv,
                           .deadline = deadline, .asking = asking};
        int rc = dlock_batch_run(b, &call);
        if (rc == DLOCK_OK && node) {
            /* Cluster: a redirect or a busy slot did not run the script */
            char host[256];
            int port;
            unsigned to;
            int kind = dlock_cluster_redirect(call.reply, node->cfg.host, &to, host, sizeof host,
                                              &port);
            if (kind != DLOCK_REDIRECT_NONE && redirects < DLOCK_CLUSTER_REDIRECTS_MAX) {
                dlock_cluster_node *next = dlock_cluster_node_at(c->cluster, host, port);
                if (next) {
                    redirects++;
                    freeReplyObject(call.reply);
                    if (kind == DLOCK_REDIRECT_MOVED)
                        dlock_cluster_set_slot(c->cluster, to, next);
                    asking = kind == DLOCK_REDIRECT_ASK; /* this once, no map change */
                    node = next;
                    continue;
                }
            }
            if (dlock_cluster_is_busy(call.reply)) {
                /* TRYAGAIN (a migration under way) or CLUSTERDOWN (a
                 * failover): 10, 20, 40 .. 100 ms pauses until busy_until
                 * (a call does not give up before its deadline while the
                 * cluster says to retry) */
                int64_t pause = (int64_t)(10 << (busy < 4 ? busy : 4)) * DLOCK_NS_PER_MS;
                if (pause > 100 * DLOCK_NS_PER_MS)
                    pause = 100 * DLOCK_NS_PER_MS;
                /* (a waiting acquire stops on a shutdown or its cancel
                 * token: the caller returns ECLOSED or ECANCELED) */
                if (dlock_now_ns() + pause < busy_until &&
                    !(stop.acquire && stop_rc(c, stop.k) != DLOCK_OK)) {
                    busy++;
                    freeReplyObject(call.reply);
                    struct timespec ts = {0, (long)pause};
                    nanosleep(&ts, NULL);
                    if (!asking)
                        node = route_or(c, slot, node);
                    continue;
                }
            }
        }
        if (rc == DLOCK_OK) {
            *sent = 1;
            *out = call.reply;
            if (acked)
                *acked = call.acked;
            return DLOCK_OK;
        }
        if (node && rc == DLOCK_EREDIS)
            dlock_cluster_want_refresh(c->cluster); /* a failover? the subscriber asks */
        if (!call.sent)
            return dlock_err_set(rc, "%s%s", rc == DLOCK_EREDIS ? redis_failure(call.err) : "",
                                 call.err);
        *sent = 1;
        rc = dlock_err_set(rc, "%sredis %s of '%s': %s", redis_failure(call.err), what, name,
                           call.err);
        if (!call.closed || ++attempt > c->pool_size)
            return rc;
        if (node && !asking)
            node = route_or(c, slot, node);
    }
}

/* The acquire script, as attempt `nonce`. Called by e's poller without e->mu,
 * waiting for a connection until `deadline`. Returns DLOCK_OK with *token and
 * *sent_boot (when it was sent, on the boot clock), DLOCK_EBUSY with
 * *pttl_ms, or an error of call_script. */
/* What a refusal said of the holder (acquire.lua): see dlock_entry.busy_*. */
typedef struct busy_info {
    char holder[DLOCK_CLIENT_NAME_MAX + 1];
    long long held_ms, queue;
} busy_info;

static int redis_acquire(dlock_client *c, dlock_entry *e, const char *nonce, int queue,
                         uint64_t unconfirmed_last, int unconfirmed_end, int64_t deadline,
                         dlock_cancel *k, uint64_t *token, int *unclean, int64_t *pttl_ms,
                         busy_info *busy, int64_t *sent_boot)
{
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_ACQUIRE_ARGS];
    for (int k = 0; k < DLOCK_SCRIPT_KEYS; k++)
        argv[k] = e->keys[k];
    const char **a = argv + DLOCK_SCRIPT_KEYS;
    a[0] = c->id;
    a[1] = c->lease_str;
    a[2] = nonce;
    a[3] = c->pass_limit_str;
    a[4] = c->waiter_ttl_str;
    a[5] = queue ? "1" : "0";
    a[6] = c->keep_str;
    a[7] = c->conn.client_name;
    char unconfirmed[24];
    snprintf(unconfirmed, sizeof unconfirmed, "%" PRIu64, unconfirmed_last);
    a[8] = unconfirmed;
    char how[4];
    snprintf(how, sizeof how, "%d", unconfirmed_last ? unconfirmed_end : 0);
    a[9] = how;
    redisReply *rep;
    int sent, acked;
    *sent_boot = dlock_boot_ns();
    int rc = call_script(c, DLOCK_SCRIPT_ACQUIRE, DLOCK_ACQUIRE_ARGS, argv, "acquire", e->name,
                         deadline, &rep, &sent, &acked, (stop_on){1, k});
    if (rc != DLOCK_OK) {
        /* If it reached Redis the outcome is unknown: the renewal thread
         * releases exactly this attempt's grant, if there is one, without
         * delaying the caller. */
        if (sent)
            dlock_renew_orphan(c->renew, e, nonce);
        return rc;
    }
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 2 &&
        rep->element[0]->type == REDIS_REPLY_INTEGER &&
        rep->element[1]->type == REDIS_REPLY_INTEGER) {
        if (rep->element[0]->integer == 1 && c->min_replicas &&
            (acked < 0 || (uint32_t)acked < c->min_replicas)) {
            /* A failover now could lose the grant and give the name to
             * another client: it is given back (in the background, like a
             * grant of unknown outcome) and the acquire fails. */
            dlock_renew_orphan(c->renew, e, nonce);
            rc = dlock_err_set(DLOCK_EREDIS, "the grant of '%s' reached %d of the %" PRIu32
                               " replicas min_replicas asks for (WAIT); given back", e->name,
                               acked < 0 ? 0 : acked, c->min_replicas);
        } else if (rep->element[0]->integer == 1) {
            *token = (uint64_t)rep->element[1]->integer;
            /* how the grant before ended (acquire.lua, "End") */
            *unclean = rep->elements >= 3 && rep->element[2]->type == REDIS_REPLY_INTEGER &&
                               rep->element[2]->integer > 0 &&
                               rep->element[2]->integer <= DLOCK_UNCLEAN_FORCED
                           ? (int)rep->element[2]->integer
                           : 0;
            rc = DLOCK_OK;
        } else if (rep->element[0]->integer == 0) {
            *pttl_ms = rep->element[1]->integer;
            busy->holder[0] = '\0';
            busy->held_ms = busy->queue = -1;
            if (rep->elements >= 5 && rep->element[2]->type == REDIS_REPLY_STRING &&
                rep->element[3]->type == REDIS_REPLY_INTEGER &&
                rep->element[4]->type == REDIS_REPLY_INTEGER) {
                snprintf(busy->holder, sizeof busy->holder, "%s", rep->element[2]->str);
                busy->held_ms = rep->element[3]->integer;
                busy->queue = rep->element[4]->integer;
            }
            rc = DLOCK_EBUSY;
        } else {
            /* Redis saw a newer attempt of ours for this name: impossible for
             * the one attempt a poller awaits, unless attempts were reordered
             * on the way. Nothing changed in Redis. */
            rc = dlock_err_set(DLOCK_EREDIS, "redis refused a stale acquire attempt of '%s'",
                               e->name);
        }
    } else {
        rc = dlock_err_set(dlock_conn_reply_code(rep), "refused by the server: redis acquire of "
                           "'%s': %s", e->name,
                           rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
        /* This try did not run, but an earlier one on a connection that
         * closed under it (call_script retried) may have: its grant, if
         * any, is given back in the background. */
        dlock_renew_orphan(c->renew, e, nonce);
    }
    freeReplyObject(rep);
    return rc;
}

/* The release script for the grant with Redis token `grant`, whose last
 * token handed out was `last`; `ending` DLOCK_UNCLEAN_ABANDONED for a holder
 * thread that exited, else 0. Without e->mu, as e's releaser.
 * DLOCK_OK, DLOCK_ELOST (the grant was gone), or DLOCK_EREDIS. */
static int redis_release(dlock_client *c, dlock_entry *e, uint64_t grant, uint64_t last,
                         int ending)
{
    char tok[24], last_tok[24];
    snprintf(tok, sizeof tok, "%" PRIu64, grant);
    snprintf(last_tok, sizeof last_tok, "%" PRIu64, last);
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS];
    dlock_script_release_argv(&c->args, e->keys, e->name, "token", tok, last_tok,
                              ending ? "1" : "0", argv);
    redisReply *rep;
    int sent;
    int rc = call_script(c, DLOCK_SCRIPT_RELEASE, DLOCK_RELEASE_ARGS, argv, "release", e->name,
                         DLOCK_NEVER, &rep, &sent, NULL, (stop_on){0, NULL});
    if (rc != DLOCK_OK) {
        char why[200];
        snprintf(why, sizeof why, "%s", dlock_last_error());
        return dlock_err_set(rc, "%s (the lease expires after %" PRIu32 " ms)", why,
                             c->lease_ms);
    }
    if (rep->type == REDIS_REPLY_INTEGER)
        rc = rep->integer >= 1 ? DLOCK_OK /* 2: it also woke the next waiter; 1 also when a
                                             retry finds its first try ran */
                               : dlock_err_set(DLOCK_ELOST, "the lease of '%s' was gone from "
                                                            "redis at release", e->name);
    else
        rc = dlock_err_set(dlock_conn_reply_code(rep), "refused by the server: redis release of "
                           "'%s': %s", e->name,
                           rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    freeReplyObject(rep);
    return rc;
}

/* The next number of the client's attempt sequence, in decimal. */
static void next_number(dlock_client *c, char out[24])
{
    snprintf(out, 24, "%" PRIu64, ck_pr_faa_64(&c->attempts, 1) + 1);
}

/* Takes this client out of e's wait queue in Redis (its last waiter gave
 * up), passing the turn on if it had it, as call `number`. If Redis cannot
 * be told now, the renewal thread retries in the background; a queue entry
 * left behind all the same is skipped once its waiter ttl runs out. Without
 * e->mu, as e's poller. */
static void redis_leave(dlock_client *c, dlock_entry *e, const char *number)
{
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_LEAVE_ARGS];
    dlock_script_leave_argv(&c->args, e->keys, e->name, number, argv);
    redisReply *rep;
    int sent;
    char keep[256]; /* the caller's own error message stays the one reported */
    snprintf(keep, sizeof keep, "%s", dlock_last_error());
    if (call_script(c, DLOCK_SCRIPT_LEAVE, DLOCK_LEAVE_ARGS, argv, "leave", e->name, DLOCK_NEVER,
                    &rep, &sent, NULL, (stop_on){0, NULL}) == DLOCK_OK) {
        if (rep->type != REDIS_REPLY_INTEGER)
            dlock_renew_leave(c->renew, e, number);
        freeReplyObject(rep);
    } else {
        dlock_renew_leave(c->renew, e, number);
    }
    dlock_err_set(0, "%s", keep);
}

/* Makes the calling thread e's owner for a new grant, valid until
 * valid_until (boot clock). Called with e->mu held. */
static int take_grant(dlock_client *c, dlock_entry *e, uint64_t token, int unclean,
                      int64_t valid_until)
{
    e->state = DLOCK_LEASE_HELD;
    e->unclean = unclean;
    e->ending = 0;
    if (unclean)
        dlock_count(&c->ctr.unclean, 1);
    e->grant_token = token;
    e->token = token;
    e->handoff = 0;
    e->epoch++;
    e->valid_until_ns = valid_until;
    e->grant_boot_ns = dlock_boot_ns(); /* after the reply or message: Redis granted before */
    if (e->unconfirmed) {
        e->unconfirmed = 0; /* the grant's token is above it (acquire.lua) */
        e->unconfirmed_end = 0;
        dlock_unconfirmed_clear(c->unconfirmed, e->name);
    }
    e->provisional = 0;
    e->msg_grant = 0;
    e->passes = 0;
    e->lost_notified = 0;
    e->queued = 0; /* the acquire script took this client out of the queue */
    int rc = dlock_renew_add(c->renew, e);
    if (rc != DLOCK_OK) {
        e->state = DLOCK_LEASE_NONE;
        return dlock_err_set(rc, "out of memory registering the lease of '%s'", e->name);
    }
    e->has_owner = 1;
    e->owner = pthread_self();
    e->depth = 1;
    dlock_count(&c->ctr.leases_held, 1);
    dlock_count(&c->ctr.grants, 1);
    return DLOCK_OK;
}

/* The grant of e ended without a release Redis confirmed (a failed release,
 * a lost lease), after `last` was handed out under it, as `end` (0 a
 * release, DLOCK_UNCLEAN_ABANDONED, DLOCK_UNCLEAN_EXPIRED): the next acquire
 * of the name tells Redis (acquire.lua, ARGV[9] and ARGV[10]), also if e is
 * freed meanwhile. Called with e->mu held (the set's mutex is a leaf). */
static void unconfirmed_end(dlock_client *c, dlock_entry *e, uint64_t last, int end)
{
    if (last >= e->unconfirmed) {
        e->unconfirmed = last;
        e->unconfirmed_end = end;
    }
    dlock_unconfirmed_put(c->unconfirmed, e->name, e->unconfirmed, e->unconfirmed_end);
}

/* Takes a lease that its holder passed on (cohort handoff): no Redis command.
 * Called with e->mu held, e->handoff set. If the lease's validity ran out
 * while it was passed, it is lost and not taken (rule 4): the caller polls,
 * and drops the registry's reference after unlocking if *drop was set.
 * DLOCK_OK or DLOCK_ELOST. */
static int take_handoff(dlock_client *c, dlock_entry *e, int *drop)
{
    DLOCK_ASSERT(!e->has_owner && e->state == DLOCK_LEASE_HELD);
    e->handoff = 0;
    if (dlock_boot_ns() >= e->valid_until_ns) {
        /* Lost by its validity alone: Redis may still have it as ours. */
        unconfirmed_end(c, e, e->token, DLOCK_UNCLEAN_EXPIRED);
        *drop += dlock_renew_mark_lost(c->renew, e);
        e->lost_notified = 1; /* no thread held it: nobody to tell */
        e->state = DLOCK_LEASE_NONE;
        return DLOCK_ELOST;
    }
    e->has_owner = 1;
    e->owner = pthread_self();
    e->depth = 1;
    return DLOCK_OK;
}

/* The direct grant message of e (wake_one), looked at by e's poller between
 * tries, with e->mu held. It is taken if it names the poller's last refused
 * try and enough of its validity is left, counted from when that try was
 * sent: the release that made the grant ran after Redis had seen the try,
 * and granted the lease for the waiter ttl from then (a renewal or a late
 * copy of the try resets that to the lease time: the validity counts the
 * smaller). A grant under an earlier try is never taken: that try's
 * successor was refused, so when it ran the lease was not this client's,
 * and the earlier grant was gone. A message dropped here (stale, or late)
 * costs time only: the next try finds the lease this client's own, if it
 * still is. DLOCK_OK (e is HELD by the calling
 * thread, provisionally: the renewal makes it a whole lease, at once if
 * other threads wait for it, else by half its validity), DLOCK_EBUSY
 * (dropped), or DLOCK_ENOMEM. */
static int take_direct_grant(dlock_client *c, dlock_entry *e)
{
    e->msg_grant = 0;
    if (e->msg_nonce == 0 || e->msg_nonce != e->try_nonce)
        return DLOCK_EBUSY;
    int64_t valid = e->try_sent_boot + (int64_t)c->grant_ms * DLOCK_NS_PER_MS - c->grant_drift_ns;
    int64_t now = dlock_boot_ns();
    if (now + c->grant_margin_ns >= valid)
        return DLOCK_EBUSY;
    char nonce[24];
    snprintf(nonce, sizeof nonce, "%" PRIu64, e->msg_nonce);
    int rc = take_grant(c, e, e->msg_token, e->msg_unclean, valid);
    if (rc != DLOCK_OK) {
        dlock_renew_orphan(c->renew, e, nonce);
        return rc;
    }
    e->provisional = 1;
    dlock_count(&c->ctr.direct_grants, 1);
    if (e->waiters > 1)
        dlock_renew_kick(c->renew); /* so that local handoffs can follow */
    else
        dlock_renew_by(c->renew, dlock_now_ns() + (valid - now) / 2);
    return DLOCK_OK;
}

/* The message of a timeout or a busy try on e: what the last refused try
 * said of the holder (at 3 a.m., who holds it, since when, how many wait).
 * Called with e->mu held. Returns rc. */
static int busy_err(const dlock_entry *e, int rc)
{
    char holder[DLOCK_CLIENT_NAME_MAX + 64] = "", queue[128] = "";
    double since = e->busy_known ? (dlock_now_ns() - e->busy_at_ns) / 1e9 : 0; /* the try's age */
    double left = e->busy_left_ms / 1e3 - since;
    if (e->has_owner || e->state == DLOCK_LEASE_HELD)
        snprintf(holder, sizeof holder, ": held by another thread of this client");
    else if (!e->busy_known)
        ; /* no try of this wait was answered */
    else if (e->busy_holder[0] && e->busy_held_ms >= 0)
        snprintf(holder, sizeof holder, ": held by %s for %.1f s, its lease ends in %.1f s",
                 e->busy_holder, e->busy_held_ms / 1e3 + since, left > 0 ? left : 0.0);
    else if (e->busy_holder[0])
        snprintf(holder, sizeof holder, ": held by %s", e->busy_holder);
    else if (e->busy_left_ms < 0)
        snprintf(holder, sizeof holder, ": free, but it is another waiting client's turn");
    if (e->busy_known && e->busy_queue >= 0)
        snprintf(queue, sizeof queue, "; %lld client%s in its wait queue in Redis, this one "
                 "included", e->busy_queue, e->busy_queue == 1 ? "" : "s");
    if (rc == DLOCK_ETIMEDOUT)
        return dlock_err_set(rc, "timed out waiting for '%s'%s%s", e->name, holder, queue);
    return dlock_err_set(rc, "'%s' is not free%s%s", e->name, holder, queue);
}

/* Someone changed e's state: wakes the head of the local queue if there is
 * something for it to do: an open handoff to take, or no poller while the
 * lease is not here (it polls: I9). Called with e->mu held. */
static void kick_head(dlock_entry *e)
{
    if (e->wq.head &&
        (e->handoff || (!e->has_owner && e->state == DLOCK_LEASE_NONE && !e->poller)))
        dlock_waitq_wake(e->wq.head);
}

/*
 * The poller's loop. Called with e->mu held, as e's designated poller
 * (e->poller == 1, !has_owner, state NONE); returns with e->mu held. Talks
 * to Redis without e->mu. A refused try leaves the client in the lock's wait
 * queue in Redis (unless `once`); the poller then sleeps on e->cv until a
 * wake-up (e->woken, set by the subscriber when a release gives this client
 * the turn), the fallback retry time (waiter_ttl/4, which also keeps its
 * place in the queue alive; sooner if the lease's remaining time is
 * shorter, for a holder that died), or its own deadline. A poller that gives
 * up while no other thread of this client waits takes the client out of the
 * queue. A shutdown or a fired cancel token (stop_rc) ends the poll: a
 * grant that its last try brought back is given back in the background.
 */
static int poll_redis(dlock_client *c, dlock_entry *e, int64_t deadline, int once,
                      dlock_cancel *k)
{
    e->try_nonce = 0; /* a new wait: no direct grant yet */
    e->msg_grant = 0;
    e->busy_known = 0;
    for (;;) {
        DLOCK_ASSERT(!e->has_owner && e->state == DLOCK_LEASE_NONE);
        e->state = DLOCK_LEASE_ACQUIRING;
        e->woken = 0; /* a wake-up from now on triggers another try */
        uint64_t unconfirmed = e->unconfirmed;
        int unconfirmed_how = e->unconfirmed_end;
        pthread_mutex_unlock(&e->mu);
        int kept_how;
        uint64_t kept = dlock_unconfirmed_get(c->unconfirmed, e->name, &kept_how);
        if (kept > unconfirmed) {
            unconfirmed = kept; /* the entry was freed and made anew since */
            unconfirmed_how = kept_how;
        }
        uint64_t token = 0;
        int unclean = 0;
        int64_t pttl = 0, sent_boot = 0;
        busy_info busy = {"", -1, -1};
        if (dlock_load_int_acquire(&c->server_bad)) {
            /* no new grant from a server the periodic check found unfit (a
             * held lease, reentrancy and local handoffs need no Redis call) */
            pthread_mutex_lock(&c->server_mu);
            int rc = dlock_err_set(DLOCK_ESERVER, "%s (found by the periodic check of the "
                                   "server; acquires that ask Redis fail until it is mended)",
                                   c->server_msg);
            pthread_mutex_unlock(&c->server_mu);
            pthread_mutex_lock(&e->mu);
            e->state = DLOCK_LEASE_NONE;
            return rc;
        }
        char nonce[24];
        next_number(c, nonce);
        /* A single try waits for a connection (or a place in a batch) at
         * most one command timeout: it has no deadline of its own. */
        int64_t by = once ? dlock_now_ns() + (int64_t)c->conn.command_timeout_ms * DLOCK_NS_PER_MS
                          : deadline;
        int rc = redis_acquire(c, e, nonce, !once, unconfirmed, unconfirmed_how, by, k, &token,
                               &unclean, &pttl, &busy, &sent_boot);
        if (once && rc == DLOCK_ETIMEDOUT)
            rc = dlock_err_set(DLOCK_EREDIS, "timed out: redis took no try of '%s' within the "
                               "command timeout (%" PRIu32 " ms): every connection was busy or "
                               "stuck", e->name, c->conn.command_timeout_ms);
        if (rc == DLOCK_OK && dlock_boot_ns() >= sent_boot + (int64_t)c->lease_ms * DLOCK_NS_PER_MS -
                                                             c->drift_ns) {
            /* The answer came back after the lease could have expired. */
            dlock_renew_orphan(c->renew, e, nonce);
            rc = dlock_err_set(DLOCK_EREDIS, "timed out: redis answered the acquire of '%s' "
                               "after the lease could have expired", e->name);
        }
        pthread_mutex_lock(&e->mu);
        e->state = DLOCK_LEASE_NONE;
        int stop = stop_rc(c, k);
        if (stop != DLOCK_OK) {
            if (rc == DLOCK_OK)
                dlock_renew_orphan(c->renew, e, nonce);
            else if (rc == DLOCK_EBUSY && !once)
                e->queued = 1; /* the last waiter to go takes the client out */
            return stop_err(stop, e->name);
        }
        if (rc == DLOCK_OK) {
            rc = take_grant(c, e, token, unclean,
                            sent_boot + (int64_t)c->lease_ms * DLOCK_NS_PER_MS - c->drift_ns);
            if (rc != DLOCK_OK)
                dlock_renew_orphan(c->renew, e, nonce);
            return rc;
        }
        if (rc != DLOCK_EBUSY)
            return rc;
        snprintf(e->busy_holder, sizeof e->busy_holder, "%s", busy.holder);
        e->busy_held_ms = busy.held_ms;
        e->busy_left_ms = pttl;
        e->busy_queue = busy.queue;
        e->busy_known = 1;
        e->busy_at_ns = dlock_now_ns() - (dlock_boot_ns() - sent_boot); /* the send */
        if (once)
            return busy_err(e, DLOCK_EBUSY);
        e->queued = 1;
        e->try_nonce = strtoull(nonce, NULL, 10);
        e->try_sent_boot = sent_boot;
        if (e->msg_grant && (rc = take_direct_grant(c, e)) != DLOCK_EBUSY)
            return rc; /* it came before the refusal's answer */
        int64_t now = dlock_now_ns();
        if (now >= deadline)
            return busy_err(e, DLOCK_ETIMEDOUT);
        int64_t delay_ns = c->fallback_ns;
        if (pttl > 0 && pttl * DLOCK_NS_PER_MS < delay_ns)
            delay_ns = pttl * DLOCK_NS_PER_MS + DLOCK_NS_PER_MS / 2;
        /* Jitter: a uniform time in [3/4, 1] of the delay, so that pollers of
         * many clients do not retry in step. */
        delay_ns -= (int64_t)(jitter_rand() % (uint64_t)(delay_ns / 4 + 1));
        int64_t wake = now + delay_ns < deadline ? now + delay_ns : deadline;
        while (!e->woken && (stop = stop_rc(c, k)) == DLOCK_OK && dlock_now_ns() < wake) {
            struct timespec ts = dlock_ts(wake);
            pthread_cond_timedwait(&e->pcv, &e->mu, &ts);
        }
        if ((stop = stop_rc(c, k)) != DLOCK_OK)
            return stop_err(stop, e->name); /* a direct grant is freed by the leave */
        if (e->msg_grant && (rc = take_direct_grant(c, e)) != DLOCK_EBUSY)
            return rc; /* granted by a release: no call needed */
        if (dlock_now_ns() >= deadline) /* no try after the deadline, woken or not */
            return busy_err(e, DLOCK_ETIMEDOUT);
    }
}

static int release_outermost(dlock_client *c, dlock_entry *e, const char *name);

/* A lease whose validity ran out while it was passed between threads:
 * nobody held it, so on_lost has no holder to tell, but the log says so.
 * Called with no lock held. */
static void log_lost_in_passing(dlock_client *c, const char *name, uint64_t token)
{
    client_log(c, DLOCK_LOG_WARN, "the lease of '%s' (token %" PRIu64 ") ran out while it was "
               "passed between threads (not renewed in time): it goes back to Redis", name,
               token);
}

/* acquire's work, once the arguments are checked and the cancel token, if
 * any, has this call registered. */
static int acquire_checked(dlock_client *c, const char *name, size_t len, int64_t wait_ms,
                           uint64_t *fence, dlock_cancel *k)
{
    int rc = DLOCK_OK;
    int64_t now = dlock_now_ns();
    /* Waits beyond ~292 years are "forever". */
    int64_t deadline = wait_ms < 0 || wait_ms > (DLOCK_NEVER - now) / DLOCK_NS_PER_MS
                           ? DLOCK_NEVER
                           : now + wait_ms * DLOCK_NS_PER_MS;
    dlock_entry *e = held_find(c, name, len); /* a reentrant acquire, without the table */
    if (!e)
        e = dlock_table_get(c->table, name, len);
    if (!e)
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");

    pthread_mutex_lock(&e->mu);
    if (e->has_owner && !e->by_handle && pthread_equal(e->owner, pthread_self())) {
        /* Reentrant acquire: depth only, no Redis command. */
        if (e->state != DLOCK_LEASE_HELD || dlock_boot_ns() >= e->valid_until_ns) {
            rc = dlock_err_set(DLOCK_ELOST, "the lease of '%s' is lost; release it", name);
        } else {
            e->depth++;
            if (fence)
                *fence = e->token;
        }
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e); /* the owner keeps its outermost reference */
        if (rc == DLOCK_OK)
            dlock_count(&c->ctr.acquisitions, 1);
        return rc;
    }

    e->waiters++;
    uint64_t fail_seq = e->fail_seq;
    int drop_registry = 0, give_back = 0;
    uint64_t passed_lost = 0; /* a lease lost while being passed here: logged on the way out */
    dlock_waiter *w = dlock_waiter_self();
    for (;;) {
        if (dlock_waiter_granted(w)) {
            /* Passed to this thread alone while it was parked (I10). */
            rc = DLOCK_OK;
            break;
        }
        if (!e->has_owner && e->state == DLOCK_LEASE_LOST) {
            /* Lost while being passed between threads: nobody holds it. */
            if (e->unconfirmed)
                unconfirmed_end(c, e, e->unconfirmed, e->unconfirmed_end);
            e->state = DLOCK_LEASE_NONE;
            e->handoff = 0;
        }
        if ((rc = stop_rc(c, k)) != DLOCK_OK) {
            /* Shutdown or cancelled: stop waiting. A lease being passed to
             * the waiters (an open handoff, I5) must not be left without
             * anyone to take it: the last waiter takes it to give it back
             * (below); otherwise the next one is woken on the way out. */
            if (e->handoff && e->waiters == 1) {
                uint64_t t = e->token;
                if (take_handoff(c, e, &drop_registry) == DLOCK_OK)
                    give_back = 1;
                else
                    passed_lost = t;
            }
            rc = stop_err(rc, name);
            break;
        }
        if (e->handoff) {
            uint64_t t = e->token;
            rc = take_handoff(c, e, &drop_registry);
            if (rc == DLOCK_OK)
                break;
            passed_lost = t;
            continue; /* it expired in passing: poll Redis again */
        }
        if (e->fail_seq != fail_seq) {
            /* The poll this thread waited behind failed: so does this call,
             * rather than poll again and wait another timeout (rule: waiters
             * fail with their poller). */
            rc = dlock_err_set(e->fail_rc, "%s", e->fail_msg);
            break;
        }
        if (!e->has_owner && e->state == DLOCK_LEASE_NONE && !e->poller) {
            if (wait_ms != 0 && dlock_now_ns() >= deadline) {
                /* No Redis call starts past the caller's deadline; the
                 * wake-up that may have been meant to make this thread the
                 * poller goes to the next waiter on the way out (I9). */
                rc = busy_err(e, DLOCK_ETIMEDOUT);
                break;
            }
            /* The poller sleeps on e->pcv between tries, out of the queue. */
            dlock_waitq_remove(&e->wq, w);
            e->poller = 1;
            rc = poll_redis(c, e, deadline, wait_ms == 0, k);
            e->poller = 0;
            if (rc != DLOCK_OK && rc != DLOCK_EBUSY && rc != DLOCK_ETIMEDOUT &&
                rc != DLOCK_ECLOSED && rc != DLOCK_ECANCELED) {
                /* Tell the threads that waited behind this poll: they fail
                 * too rather than each wait a timeout in turn. */
                e->fail_seq++;
                e->fail_rc = rc;
                snprintf(e->fail_msg, sizeof e->fail_msg, "%s", dlock_last_error());
                dlock_waitq_wake_all(&e->wq);
            }
            break;
        }
        if (wait_ms == 0) {
            rc = dlock_err_set(DLOCK_EBUSY, "'%s' is held or being acquired by another thread",
                               name);
            break;
        }
        int64_t now = dlock_now_ns();
        if (now >= deadline) {
            rc = busy_err(e, DLOCK_ETIMEDOUT);
            break;
        }
        if (!w->queued)
            dlock_waitq_push(&e->wq, w, now);
        dlock_waiter_park(w, &e->mu, deadline);
    }
    if (give_back) {
        /* A stopped waiter that took an open handoff nobody else waits for:
         * it releases it as the releasing thread would have, with word of
         * how the hold before ended (it used the lease for nothing). */
        dlock_waitq_remove(&e->wq, w);
        e->waiters--;
        e->ending = e->unclean;
        char keep[256];
        snprintf(keep, sizeof keep, "%s", dlock_last_error());
        dlock_table_ref(e); /* the owner's, which release_outermost drops with ours */
        (void)release_outermost(c, e, name);
        dlock_err_set(rc, "%s", keep);
        return rc;
    }
    if (dlock_waiter_granted(w)) {
        /* A direct handoff: the releaser made this thread the owner, took
         * it out of the queue and out of e->waiters (I10). */
        pthread_mutex_unlock(&e->mu);
        if (passed_lost)
            log_lost_in_passing(c, name, passed_lost);
        held_remember(c, e);
        dlock_count(&c->ctr.acquisitions, 1);
        if (fence)
            *fence = w->token;
        return DLOCK_OK;
    }
    dlock_waitq_remove(&e->wq, w);
    if (rc != DLOCK_OK && e->queued && e->waiters == 1 && !e->poller && !e->has_owner &&
        e->state == DLOCK_LEASE_NONE && !e->handoff) {
        /* The last thread here that wanted the name gives up: take the
         * client out of the queue (passing its turn on, if it had it). The
         * call is numbered now, before any later attempt of this client, so
         * Redis ignores it if it arrives after one. */
        char number[24];
        next_number(c, number);
        e->queued = 0;
        if (rc != DLOCK_ETIMEDOUT && rc != DLOCK_EBUSY) {
            /* Redis is failing, or the acquire was cancelled or the client
             * shuts down (the thread returns at once, without a Redis
             * call): the renewal thread tells it when it can
             * (dlock_client_close makes it try once more). */
            dlock_renew_leave(c->renew, e, number);
        } else {
            /* As e's poller, so that nobody else talks to Redis for e
             * meanwhile. */
            e->poller = 1;
            pthread_mutex_unlock(&e->mu);
            redis_leave(c, e, number);
            pthread_mutex_lock(&e->mu);
            e->poller = 0;
        }
    }
    /* A thread that came meanwhile may poll; a wake-up this thread received
     * and did not use goes on (I9). */
    kick_head(e);
    e->waiters--;
    uint64_t token = e->token;
    pthread_mutex_unlock(&e->mu);
    if (passed_lost)
        log_lost_in_passing(c, name, passed_lost);
    while (drop_registry-- > 0)
        dlock_table_put(c->table, e); /* our own reference keeps e alive */
    if (rc != DLOCK_OK) {
        dlock_table_put(c->table, e);
        return rc;
    }
    /* Our reference becomes the owner's, dropped by the outermost release. */
    held_remember(c, e);
    dlock_count(&c->ctr.acquisitions, 1);
    if (fence)
        *fence = token;
    return DLOCK_OK;
}

/* The common path of the acquire calls: the arguments, the stop flags, and
 * the call's registration on its cancel token k (NULL: none) around it. */
static int acquire(dlock_client *c, const char *name, int64_t wait_ms, uint64_t *fence,
                   dlock_cancel *k)
{
    size_t len;
    int rc = check_call(c, name, &len);
    if (rc != DLOCK_OK)
        return rc;
    if ((rc = stop_rc(c, k)) != DLOCK_OK)
        return stop_err(rc, name);
    if (!k)
        return acquire_checked(c, name, len, wait_ms, fence, NULL);
    cancel_reg reg = {.base.wake = cancel_wake, .c = c, .name = name, .len = len,
                      .w = dlock_waiter_self()};
    if (dlock_cancel_register(k, &reg.base) != 0)
        return stop_err(DLOCK_ECANCELED, name);
    rc = acquire_checked(c, name, len, wait_ms, fence, k);
    dlock_cancel_unregister(k, &reg.base);
    return rc;
}

static int release(dlock_client *c, const char *name)
{
    size_t len;
    int rc = check_call(c, name, &len);
    if (rc != DLOCK_OK)
        return rc;
    dlock_entry *e = held_find(c, name, len);
    if (!e)
        return dlock_err_set(DLOCK_ENOTHELD, "'%s' is not held by this thread", name);

    pthread_mutex_lock(&e->mu);
    if (!e->has_owner || e->by_handle || !pthread_equal(e->owner, pthread_self())) {
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
        return dlock_err_set(DLOCK_ENOTHELD, "'%s' is not held by this thread", name);
    }
    if (e->depth > 1) {
        e->depth--;
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
        return DLOCK_OK;
    }
    held_forget(c, e);
    return release_outermost(c, e, name);
}

/* The k-th local handoff of a grant takes token grant_token + k: only once
 * k us have passed since the grant on the server's clock, so that no token
 * is ever ahead of it (docs/guide.md, "Fencing tokens": a restart or failover that
 * loses the fence cannot undercut a token in use). Redis made the grant at
 * server time grant_token (a grant is never ahead of server time but after a
 * clock step back), before this client learned it at grant_boot_ns; this
 * host's clock may run up to 1% fast (the drift margin's assumption), so the
 * elapsed time counts 99%. A handoff this fast (more than one per
 * microsecond) goes back to Redis instead. Called with e->mu held. */
static int handoff_in_time(const dlock_entry *e, int64_t now)
{
    int64_t us = (now - e->grant_boot_ns) / 1000;
    return (int64_t)e->passes + 1 <= us - (us + 99) / 100;
}

/* The outermost release of e by the calling thread, which holds e->mu and
 * two references (its lookup's and the owner's, both dropped here). */
static int release_outermost(dlock_client *c, dlock_entry *e, const char *name)
{
    int rc;
    e->has_owner = 0;
    e->depth = 0;
    if (e->state == DLOCK_LEASE_LOST) {
        e->ending = 0; /* Redis took it back: the next grant learns that itself */
        if (e->unconfirmed) /* found lost by validity */
            unconfirmed_end(c, e, e->unconfirmed, e->unconfirmed_end);
        e->state = DLOCK_LEASE_NONE;
        kick_head(e); /* it polls */
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
        dlock_table_put(c->table, e); /* the owner's reference */
        return dlock_err_set(DLOCK_ELOST, "the lease of '%s' was lost while held", name);
    }
    DLOCK_ASSERT(e->state == DLOCK_LEASE_HELD);
    int64_t now = dlock_boot_ns();
    if (e->waiters > 0 && e->passes < c->pass_limit && !dlock_load_int(&c->closing) &&
        now + (e->provisional ? c->grant_margin_ns : c->handoff_margin_ns) < e->valid_until_ns &&
        handoff_in_time(e, now)) {
        /* Cohort handoff (rule 3): the lease stays with this client and
         * passes to a waiting thread, with the next token, and with word of
         * how this hold ended (a thread that exited: dlock_unclean). */
        e->passes++;
        e->token++;
        e->unclean = e->ending;
        e->ending = 0;
        if (e->unclean)
            dlock_count(&c->ctr.unclean, 1);
        dlock_count(&c->ctr.handoffs, 1);
        dlock_waiter *h = e->wq.head, *wk = NULL;
        if (h && dlock_now_ns() - e->wq.head_since_ns >= DLOCK_FAIR_NS) {
            /* Direct handoff (I10) to the longest waiter: it has waited
             * long enough that nobody may pass it. */
            e->has_owner = 1;
            e->owner = h->self;
            e->depth = 1;
            e->waiters--;
            wk = dlock_waitq_grant(&e->wq, h, e->token);
        } else {
            /* Open handoff: the first thread of this client to run takes
             * it, a newcomer or the head, which is woken (one waiter, not
             * all: the others would only burn CPU). */
            e->handoff = 1;
            if (h)
                wk = dlock_waitq_wake_later(h);
        }
        pthread_mutex_unlock(&e->mu);
        /* Woken after the unlock, so that it does not wake up only to wait
         * for e->mu (its node outlives the wait: park.h). */
        dlock_waiter_unpark(wk);
        dlock_table_put(c->table, e);
        dlock_table_put(c->table, e); /* the owner's: the taker has its own */
        return DLOCK_OK;
    }
    int drop = dlock_renew_remove(c->renew, e); /* no renewal after this point */
    e->state = DLOCK_LEASE_RELEASING;
    uint64_t grant = e->grant_token, token = e->token;
    int ending = e->ending;
    e->ending = 0;
    pthread_mutex_unlock(&e->mu);
    if (drop)
        dlock_table_put(c->table, e); /* we still hold two references */
    dlock_renew_quiesce(c->renew); /* no renewal of this grant after the release */

    rc = redis_release(c, e, grant, token, ending);

    int notify = 0;
    pthread_mutex_lock(&e->mu);
    dlock_count(&c->ctr.leases_held, (uint64_t)-1);
    if (rc != DLOCK_OK) {
        /* The lease may still be ours in Redis, until it expires (the
         * release did not arrive), or be ours again (a step back of the
         * server's clock brings an expired grant back): a later acquire
         * that finds it so is granted above every token handed out under
         * it. */
        unconfirmed_end(c, e, token, rc == DLOCK_ELOST ? DLOCK_UNCLEAN_EXPIRED : ending);
    }
    if (rc == DLOCK_ELOST) {
        dlock_count(&c->ctr.leases_lost, 1);
        notify = !e->lost_notified;
        e->lost_notified = 1;
    }
    e->state = DLOCK_LEASE_NONE;
    /* One waiter becomes the poller; waking all of them (a thousand threads
     * every pass_limit acquisitions) cost 40% of the throughput of one
     * process x 1024 threads on one name. A woken waiter that gives up
     * instead passes the wake-up on (I9). */
    kick_head(e);
    pthread_mutex_unlock(&e->mu);
    if (notify) {
        /* found at the release, before the renewal did: said here */
        client_log(c, DLOCK_LOG_WARN, "the lease of '%s' (token %" PRIu64 ") was gone from Redis "
                   "at its release: it was lost while held (it expired, or was taken or "
                   "released by an operator)", e->name, token);
        if (c->on_lost)
            c->on_lost(e->name, token, c->on_lost_arg);
    }
    dlock_table_put(c->table, e);
    dlock_table_put(c->table, e); /* the owner's reference */
    return rc;
}

/*
 * The thread-exit hook. A thread's first outermost acquire arms it (a
 * pthread key whose destructor runs when the thread exits); at exit it
 * releases every lock the thread still holds as owner, as its release
 * would, but as DLOCK_UNCLEAN_ABANDONED (the next holder is told: dlock_unclean),
 * logs each (on_log) and counts it. The locks are found in the thread's
 * cache of held entries, and, if it held more than it caches, in the
 * tables of the open clients. A slot of a client closed since is skipped:
 * its leases were released by the close.
 */
static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static __thread int exit_armed;

static void on_thread_exit(void *unused);

static void exit_key_create(void)
{
    /* Without a key (none left) nothing is released at exit: the leases
     * stay held and renewed until the client closes, as before. */
    (void)pthread_key_create(&exit_key, on_thread_exit);
}

static void arm_exit_hook(void)
{
    if (exit_armed)
        return;
    exit_armed = 1;
    pthread_once(&exit_once, exit_key_create);
    (void)pthread_setspecific(exit_key, &exit_armed); /* non-NULL: the destructor runs */
}

/* The open client with this serial, entered (enter), or NULL. */
static dlock_client *open_client_enter(uint64_t serial)
{
    pthread_mutex_lock(&open_mu);
    dlock_client *c = open_clients;
    while (c && c->serial != serial)
        c = c->open_next;
    if (c)
        enter(c);
    pthread_mutex_unlock(&open_mu);
    return c;
}

/* Releases e, which the exiting calling thread owns in the entered client
 * c, as an abandoned hold. Takes the lookup's reference itself. */
static void abandon(dlock_client *c, dlock_entry *e)
{
    char name[DLOCK_NAME_MAX + 1];
    memcpy(name, e->name, e->name_len + 1); /* e may be freed by the release */
    dlock_table_ref(e); /* the lookup's: the owner's keeps e alive meanwhile */
    pthread_mutex_lock(&e->mu);
    DLOCK_ASSERT(e->has_owner && !e->by_handle && pthread_equal(e->owner, pthread_self()));
    uint64_t token = e->token;
    unsigned depth = e->depth;
    e->depth = 1;
    e->ending = DLOCK_UNCLEAN_ABANDONED;
    held_forget(c, e);
    int rc = release_outermost(c, e, name);
    dlock_count(&c->ctr.abandoned, 1);
    dlock_count_rc(c->ctr.release_rc, rc);
    client_log(c, DLOCK_LOG_WARN, "thread %ld exited holding '%s' (token %" PRIu64 ", depth %u): "
               "released for it (%s); the next holder is told (DLOCK_UNCLEAN_ABANDONED)",
               (long)syscall(SYS_gettid), name, token, depth,
               rc == DLOCK_OK ? "ok" : dlock_strerror(rc));
}

/* Adds e to the list in arg if the calling thread owns it (not through a
 * handle) and its cache does not hold it; with a reference for the list.
 * For dlock_table_each_ref. */
typedef struct owned_list {
    dlock_entry **v;
    size_t n, cap;
} owned_list;

static void collect_owned(dlock_entry *e, void *arg)
{
    owned_list *l = arg;
    for (int i = 0; i < HELD_SLOTS; i++)
        if (held[i].e == e)
            return;
    pthread_mutex_lock(&e->mu);
    int mine = e->has_owner && !e->by_handle && pthread_equal(e->owner, pthread_self());
    pthread_mutex_unlock(&e->mu);
    if (!mine)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        dlock_entry **v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return; /* out of memory: that lease stays until the client closes */
        l->v = v;
        l->cap = cap;
    }
    dlock_table_ref(e);
    l->v[l->n++] = e;
}

static void on_thread_exit(void *unused)
{
    (void)unused;
    for (int i = 0; i < HELD_SLOTS; i++) {
        if (!held[i].e)
            continue;
        dlock_client *c = open_client_enter(held[i].serial);
        if (!c || dlock_load_uint(&fork_generation) != c->fork_gen) {
            held[i].e = NULL; /* its client closed (or is the parent's): nothing to do */
            if (c)
                leave(c);
            continue;
        }
        abandon(c, held[i].e);
        leave(c);
    }
    while (held_uncached > 0) {
        /* More names than the cache holds: look in every open client's table. */
        pthread_mutex_lock(&open_mu);
        size_t n = 0;
        for (dlock_client *c = open_clients; c; c = c->open_next)
            n++;
        dlock_client **cs = calloc(n ? n : 1, sizeof *cs);
        n = 0;
        for (dlock_client *c = open_clients; cs && c; c = c->open_next)
            if (dlock_load_uint(&fork_generation) == c->fork_gen) {
                enter(c);
                cs[n++] = c;
            }
        pthread_mutex_unlock(&open_mu);
        size_t found = 0;
        for (size_t k = 0; k < n; k++) {
            owned_list l = {NULL, 0, 0};
            dlock_table_each_ref(cs[k]->table, collect_owned, &l);
            for (size_t j = 0; j < l.n; j++) {
                abandon(cs[k], l.v[j]);
                dlock_table_put(cs[k]->table, l.v[j]); /* the list's */
            }
            found += l.n;
            free(l.v);
            leave(cs[k]);
        }
        free(cs);
        if (found == 0)
            break; /* held by clients closed since: nothing left to release */
    }
}

int dlock_unclean(dlock_client *c, const char *name)
{
    dlock_err_clear();
    if (!c)
        return dlock_err_set(DLOCK_EINVAL, "client is NULL");
    enter(c);
    size_t len;
    int rc = check_call(c, name, &len);
    dlock_entry *e = rc == DLOCK_OK ? held_find(c, name, len) : NULL;
    if (rc == DLOCK_OK && !e)
        rc = dlock_err_set(DLOCK_ENOTHELD, "'%s' is not held by this thread", name);
    if (e) {
        pthread_mutex_lock(&e->mu);
        if (e->has_owner && !e->by_handle && pthread_equal(e->owner, pthread_self()))
            rc = e->unclean;
        else
            rc = dlock_err_set(DLOCK_ENOTHELD, "'%s' is not held by this thread", name);
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
    }
    leave(c);
    return rc;
}

void dlock_acquire_opts_init(dlock_acquire_opts *o)
{
    if (o)
        memset(o, 0, sizeof *o);
}

int dlock_acquire_ex(dlock_client *c, const char *name, int64_t wait_ms, uint64_t *fence,
                     const dlock_acquire_opts *opts)
{
    dlock_err_clear();
    if (!c)
        return dlock_err_set(DLOCK_EINVAL, "client is NULL");
    enter(c);
    int64_t t0 = dlock_now_ns();
    int rc = acquire(c, name, wait_ms, fence, opts ? opts->cancel : NULL);
    if (rc != DLOCK_EFORK) { /* a forked client's counters are not ours */
        dlock_count_rc(c->ctr.acquire_rc, rc);
        if (rc == DLOCK_OK)
            dlock_hist_add(&c->ctr.wait, dlock_now_ns() - t0);
    }
    leave(c);
    return rc;
}

int dlock_acquire(dlock_client *c, const char *name, int64_t wait_ms, uint64_t *fence)
{
    return dlock_acquire_ex(c, name, wait_ms, fence, NULL);
}

int dlock_release(dlock_client *c, const char *name)
{
    dlock_err_clear();
    if (!c)
        return dlock_err_set(DLOCK_EINVAL, "client is NULL");
    enter(c);
    int rc = release(c, name);
    if (rc != DLOCK_EFORK)
        dlock_count_rc(c->ctr.release_rc, rc);
    leave(c);
    return rc;
}

struct dlock_handle {
    dlock_client *c;
    dlock_entry *e;   /* the owner's reference, held by the handle */
    int64_t since_ns; /* the acquire: the hold time's start */
};

/* dlock_acquire_handle_ex's work, inside the call (enter). */
static int acquire_handle(dlock_client *c, const char *name, int64_t wait_ms, uint64_t *fence,
                          dlock_handle **out, const dlock_acquire_opts *opts)
{
    size_t len;
    int rc = check_call(c, name, &len);
    if (rc != DLOCK_OK)
        return rc;
    dlock_entry *e = held_find(c, name, len);
    if (e) {
        /* (held_find may return an entry another thread holds or waits for,
         * when this one holds more names than it caches) */
        pthread_mutex_lock(&e->mu);
        int mine = e->has_owner && !e->by_handle && pthread_equal(e->owner, pthread_self());
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
        if (mine)
            return dlock_err_set(DLOCK_EINVAL, "'%s' is held by the calling thread already: a "
                                 "handle takes a hold of its own", name);
    }
    dlock_handle *h = malloc(sizeof *h);
    if (!h)
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    rc = dlock_acquire_ex(c, name, wait_ms, fence, opts);
    if (rc != DLOCK_OK) {
        free(h);
        return rc;
    }
    int64_t t0 = dlock_now_ns(); /* the hold starts now, not with the wait */
    /* The thread's hold becomes the handle's: out of the thread's cache,
     * flagged on the entry so that no thread takes it for its own. */
    e = held_find(c, name, len);
    DLOCK_ASSERT(e);
    pthread_mutex_lock(&e->mu);
    e->by_handle = 1;
    held_forget(c, e);
    pthread_mutex_unlock(&e->mu);
    dlock_table_put(c->table, e); /* the lookup's; the owner's stays, the handle's now */
    h->c = c;
    h->e = e;
    h->since_ns = t0;
    *out = h;
    return DLOCK_OK;
}

int dlock_acquire_handle_ex(dlock_client *c, const char *name, int64_t wait_ms, uint64_t *fence,
                            dlock_handle **out, const dlock_acquire_opts *opts)
{
    dlock_err_clear();
    if (!out)
        return dlock_err_set(DLOCK_EINVAL, "out is NULL");
    *out = NULL;
    if (!c)
        return dlock_err_set(DLOCK_EINVAL, "client is NULL");
    enter(c);
    int rc = acquire_handle(c, name, wait_ms, fence, out, opts);
    leave(c);
    return rc;
}

int dlock_acquire_handle(dlock_client *c, const char *name, int64_t wait_ms, uint64_t *fence,
                         dlock_handle **out)
{
    return dlock_acquire_handle_ex(c, name, wait_ms, fence, out, NULL);
}

int dlock_handle_release(dlock_handle *h)
{
    dlock_err_clear();
    if (!h)
        return dlock_err_set(DLOCK_EINVAL, "handle is NULL");
    dlock_client *c = h->c;
    if (dlock_load_uint(&fork_generation) != c->fork_gen)
        return dlock_err_set(DLOCK_EFORK, "this handle's client was opened before fork()");
    enter(c);
    dlock_entry *e = h->e;
    char name[DLOCK_NAME_MAX + 1]; /* for messages: e may be freed before they are made */
    memcpy(name, e->name, e->name_len + 1);
    dlock_table_ref(e); /* the lookup's, as release_outermost expects */
    pthread_mutex_lock(&e->mu);
    DLOCK_ASSERT(e->has_owner && e->by_handle && e->depth == 1);
    e->by_handle = 0;
    e->owner = pthread_self(); /* the calling thread releases it */
    dlock_hist_add(&c->ctr.hold, dlock_now_ns() - h->since_ns);
    int rc = release_outermost(c, e, name);
    dlock_count_rc(c->ctr.release_rc, rc);
    free(h);
    leave(c);
    return rc;
}

int dlock_handle_held(dlock_handle *h)
{
    if (!h)
        return 0;
    enter(h->c);
    dlock_entry *e = h->e;
    pthread_mutex_lock(&e->mu);
    int yes = e->has_owner && e->by_handle && e->state == DLOCK_LEASE_HELD &&
              dlock_boot_ns() < e->valid_until_ns;
    pthread_mutex_unlock(&e->mu);
    leave(h->c);
    return yes;
}

int dlock_handle_unclean(dlock_handle *h)
{
    if (!h)
        return dlock_err_set(DLOCK_EINVAL, "handle is NULL");
    enter(h->c);
    dlock_entry *e = h->e;
    pthread_mutex_lock(&e->mu);
    int rc = e->unclean;
    pthread_mutex_unlock(&e->mu);
    leave(h->c);
    return rc;
}

int dlock_with(dlock_client *c, const char *name, int64_t wait_ms,
               void (*fn)(void *arg, uint64_t fence), void *arg)
{
    if (!fn) {
        dlock_err_clear();
        return dlock_err_set(DLOCK_EINVAL, "fn is NULL");
    }
    uint64_t fence;
    int rc = dlock_acquire(c, name, wait_ms, &fence);
    if (rc != DLOCK_OK)
        return rc;
    fn(arg, fence);
    return dlock_release(c, name);
}

static int held_check(dlock_client *c, const char *name)
{
    size_t len;
    if (check_call(c, name, &len) != DLOCK_OK)
        return 0;
    dlock_entry *e = held_find(c, name, len);
    if (!e)
        return 0;
    pthread_mutex_lock(&e->mu);
    int yes = e->has_owner && !e->by_handle && pthread_equal(e->owner, pthread_self()) &&
              e->state == DLOCK_LEASE_HELD && dlock_boot_ns() < e->valid_until_ns;
    pthread_mutex_unlock(&e->mu);
    dlock_table_put(c->table, e);
    return yes;
}

int dlock_held(dlock_client *c, const char *name)
{
    if (!c)
        return 0;
    enter(c);
    int yes = held_check(c, name);
    leave(c);
    return yes;
}

const char *dlock_client_id(dlock_client *c)
{
    return c ? c->id : NULL;
}

char *dlock_client_metrics_prometheus(dlock_client *c)
{
    if (!c) {
        dlock_err_set(DLOCK_EINVAL, "client is NULL");
        return NULL;
    }
    enter(c);
    char *text = dlock_metrics_prometheus(&c->ctr, &c->sub_ctr, c->conn.client_name);
    leave(c);
    if (!text)
        dlock_err_set(DLOCK_ENOMEM, "out of memory");
    return text;
}

int dlock_client_stats(dlock_client *c, dlock_stats *out)
{
    if (!c || !out)
        return dlock_err_set(DLOCK_EINVAL, "client or out is NULL");
    enter(c);
    out->acquisitions = dlock_load_64(&c->ctr.acquisitions);
    out->grants = dlock_load_64(&c->ctr.grants);
    out->handoffs = dlock_load_64(&c->ctr.handoffs);
    out->redis_commands = dlock_load_64(&c->ctr.redis_commands);
    out->redis_round_trips = dlock_load_64(&c->ctr.redis_round_trips);
    out->renew_rounds = dlock_load_64(&c->ctr.renew_rounds);
    out->renew_round_trips = dlock_load_64(&c->ctr.renew_round_trips);
    out->renew_keys = dlock_load_64(&c->ctr.renew_keys);
    out->leases_held = dlock_load_64(&c->ctr.leases_held);
    out->leases_lost = dlock_load_64(&c->ctr.leases_lost);
    out->entries = dlock_load_64(&c->ctr.entries);
    out->subscriber_commands = dlock_load_64(&c->sub_ctr.redis_commands);
    out->direct_grants = dlock_load_64(&c->ctr.direct_grants);
    out->timeouts = dlock_load_64(&c->ctr.acquire_rc[-DLOCK_ETIMEDOUT]);
    out->busy = dlock_load_64(&c->ctr.acquire_rc[-DLOCK_EBUSY]);
    out->errors = 0;
    for (int i = 1; i < DLOCK_NCODES; i++)
        if (i != -DLOCK_ETIMEDOUT && i != -DLOCK_EBUSY && i != -DLOCK_ECANCELED &&
            i != -DLOCK_ECLOSED)
            out->errors += dlock_load_64(&c->ctr.acquire_rc[i]) +
                           dlock_load_64(&c->ctr.release_rc[i]);
    out->cancelled = dlock_load_64(&c->ctr.acquire_rc[-DLOCK_ECANCELED]) +
                     dlock_load_64(&c->ctr.acquire_rc[-DLOCK_ECLOSED]);
    out->renewed = dlock_load_64(&c->ctr.renewed);
    out->renew_failures = dlock_load_64(&c->ctr.renew_failures);
    out->forced_releases = dlock_load_64(&c->ctr.forced_releases);
    out->unclean = dlock_load_64(&c->ctr.unclean);
    out->abandoned = dlock_load_64(&c->ctr.abandoned);
    leave(c);
    return DLOCK_OK;
}
