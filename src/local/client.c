/*
 * The client's life: dlock_client_open (its threads and connections),
 * dlock_client_shutdown and dlock_client_close; the subscriber's and the
 * renewal thread's callbacks into the entries; the helpers the lock calls
 * share (client.h); statistics. The rules of the entries are client.h's;
 * this file adds the process-wide state below (the open clients, the fork
 * generation, the calling thread's held slots), each with its rule.
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

#include "local/client.h"
#include "local/config.h"
#include "common/error.h"

/*
 * The open clients of this process, for the thread-exit hook (orphan.c),
 * which finds the client of a lock an exiting thread holds by its serial.
 * open_mu is a leaf, but for the hook's lookups (dlock_client_find_enter,
 * dlock_client_enter_all), which enter the clients they find under it:
 * close unlinks the client under open_mu before it waits for the threads
 * inside, so a client found here stays alive until the hook's leave().
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

/* The calling thread's held slots (client.h). */
__thread dlock_held_slot dlock_held_slots[DLOCK_HELD_SLOTS];
__thread unsigned dlock_held_uncached;

/* The calling thread became the owner of e (outermost acquire). */
void dlock_held_remember(const dlock_client *c, dlock_entry *e)
{
    for (int i = 0; i < DLOCK_HELD_SLOTS; i++)
        if (!dlock_held_slots[i].e) {
            dlock_held_slots[i].serial = c->serial;
            dlock_held_slots[i].e = e;
            dlock_held_slots[i].since_ns = dlock_now_ns();
            return;
        }
    dlock_held_uncached++;
}

/* The calling thread stops owning e (outermost release). The serial is
 * matched too: a slot left by a closed client may hold the address that e
 * now has. */
void dlock_held_forget(dlock_client *c, dlock_entry *e)
{
    for (int i = 0; i < DLOCK_HELD_SLOTS; i++)
        if (dlock_held_slots[i].e == e && dlock_held_slots[i].serial == c->serial) {
            dlock_held_slots[i].e = NULL;
            /* hold times are measured for the entries a thread caches (all
             * but its ninth and later names held at once); a hold moved to
             * a handle is measured by the handle */
            if (!e->x.by_handle)
                dlock_hist_add(&c->ctr.hold, dlock_now_ns() - dlock_held_slots[i].since_ns);
            return;
        }
    DLOCK_ASSERT(dlock_held_uncached > 0);
    dlock_held_uncached--;
}

/* The entry `name` of c with a new reference, if the calling thread may own
 * it: from its slots, else from the table while it owns uncached entries;
 * NULL when it owns no such name. The caller still checks ownership under
 * e->mu. */
dlock_entry *dlock_held_find(dlock_client *c, const char *name, size_t len)
{
    for (int i = 0; i < DLOCK_HELD_SLOTS; i++) {
        dlock_entry *e = dlock_held_slots[i].e;
        if (e && dlock_held_slots[i].serial == c->serial && e->name_len == len &&
            memcmp(e->name, name, len) == 0) {
            dlock_table_ref(e);
            return e;
        }
    }
    return dlock_held_uncached ? dlock_table_find(c->table, name, len) : NULL;
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

int dlock_client_forked(const dlock_client *c)
{
    return dlock_load_uint(&fork_generation) != c->fork_gen;
}

dlock_client *dlock_client_find_enter(uint64_t serial)
{
    pthread_mutex_lock(&open_mu);
    dlock_client *c = open_clients;
    while (c && c->serial != serial)
        c = c->open_next;
    if (c)
        dlock_client_enter(c);
    pthread_mutex_unlock(&open_mu);
    return c;
}

dlock_client **dlock_client_enter_all(size_t *n)
{
    pthread_mutex_lock(&open_mu);
    size_t k = 0;
    for (dlock_client *c = open_clients; c; c = c->open_next)
        k++;
    dlock_client **cs = calloc(k ? k : 1, sizeof *cs);
    *n = 0;
    for (dlock_client *c = open_clients; cs && c; c = c->open_next)
        if (!dlock_client_forked(c)) {
            dlock_client_enter(c);
            cs[(*n)++] = c;
        }
    pthread_mutex_unlock(&open_mu);
    return cs;
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
    for (unsigned i = 0; i < DLOCK_REDLOCK_NODES_MAX; i++)
        dlock_sub_stop_ask(c->rl_sub[i]); /* (all at once, then each joined) */
    dlock_sub_stop(c->sub);
    for (unsigned i = 0; i < DLOCK_REDLOCK_NODES_MAX; i++)
        dlock_sub_stop(c->rl_sub[i]);
    dlock_renew_stop(c->renew);
    dlock_redlock_destroy(c->redlock); /* (after the renewals that use it) */
    dlock_trace_close(c->trace); /* after the threads that write it */
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
void dlock_client_log(dlock_client *c, int level, const char *fmt, ...)
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
        int ours = e->lease.state == DLOCK_LEASE_HELD && e->lease.grant_token == token;
        pthread_mutex_unlock(&e->mu);
        dlock_table_put(c->table, e);
        if (!ours)
            return;
        dlock_count(&c->ctr.forced_releases, 1);
        dlock_client_log(c, DLOCK_LOG_WARN, "the lease of '%.*s' (token %" PRIu64 ") was released "
                         "by an operator (dlockctl release --force); checking with Redis now",
                         (int)nlen, q, token);
        dlock_renew_kick(c->renew);
        return;
    }
    int unclean = 0, protocol = 1, shared = 0;
    uint64_t sem_attempt = 0; /* a "P" message's attempt (for the trace) */
    if (len > 2 && p[0] == 'w' && p[1] == ' ') {
        p += 2;
    } else if (len > 2 && p[0] == 'P' && p[1] == ' ') {
        /* "P <attempt> <count> <name>": a semaphore's direct grant
         * (lua/p2/SEM.txt): a wake-up for its poller, whose next try names
         * the attempt it was queued with and so takes the grant over
         * (local/sem.h) */
        const char *q = p + 2;
        sem_attempt = parse_u64(&q, end);
        if (!sem_attempt || !parse_u64(&q, end))
            return; /* malformed */
        p = q;
    } else if (len > 2 && strchr("guGUS", p[0]) && p[1] == ' ') {
        /* "u <end> <attempt> <token> <name>": a direct grant after an
         * unclean end (release.lua, ARGV[10]); "G" and "U" the same of
         * protocol 2's release (lua/p2/release.lua): the grant is in it;
         * "S <end> <attempt> <token> <name>" a direct shared grant, its
         * end always said, 0 for none (lua/p2/LAYOUT.txt, Shared mode) */
        const char *q = p + 2;
        protocol = p[0] == 'G' || p[0] == 'U' || p[0] == 'S' ? 2 : 1;
        shared = p[0] == 'S';
        if (p[0] == 'S' && q < end && *q == '0' && q + 1 < end && q[1] == ' ') {
            q += 2; /* end 0: a clean one */
        } else if (p[0] == 'u' || p[0] == 'U' || p[0] == 'S') {
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
     * finds the lease its own and confirms it) takes it instead. In
     * Redlock mode one node's grant is no vote: a wake-up only, and the
     * poller's next try, at once, is granted there anew (docs/design.md,
     * "Redlock", Waiting). */
    int stored = nonce && e->poll.poller && !c->min_replicas && !c->redlock;
    /* A grant no poller takes while threads wait in the other mode (its
     * last waiter gave up and no leave was sent, or its waiters queue
     * behind one of the other mode, which polls first): their tries would
     * be refused while it lives (DLOCKMODE), so it goes back at once, as a
     * grant of unknown outcome does; a thread of its own mode that waits
     * asks Redis anew. (With one kind only, the last waiter's leave frees
     * it, or the next poller finds it its own.) Never in Redlock mode: a
     * node's direct grant there may be under the attempt of the lease this
     * client holds, or of the try in flight (its queue entry on that node
     * outlived the grant the others made), and a give-back by that attempt
     * would release the lease on every node; the wait's leave gives up a
     * grant of an older attempt never taken, and a try of the other mode
     * meanwhile finds that node refusing it (DLOCKMODE: a refusal, no vote)
     * until then. */
    int unwanted = nonce && !stored && !c->redlock &&
                   e->kind_waiters[shared ? DLOCK_KIND_EXCL : DLOCK_KIND_SHARED] > 0;
    if (unwanted) {
        char number[24];
        snprintf(number, sizeof number, "%" PRIu64, nonce);
        dlock_renew_give_back(c->renew, e, number, protocol, shared);
    }
    if (stored) {
        e->poll.msg_grant = 1;
        e->poll.msg_nonce = nonce;
        e->poll.msg_token = token;
        e->poll.msg_unclean = unclean;
        e->poll.msg_protocol = protocol;
        e->poll.msg_shared = shared;
    }
    if (sem_attempt)
        dlock_trace_event(c->trace, "sem.msg", e->name, "%" PRIu64 " %" PRIu64, sem_attempt,
                          e->m.doubt);
    else
        dlock_trace_event(c->trace, "msg", e->name, "%" PRIu64 " %" PRIu64 " %d %d %d %d", nonce,
                          token, unclean, stored, protocol, shared);
    e->poll.woken = 1;
    pthread_cond_signal(&e->pcv); /* the poller only: the waiters have nothing to do */
    pthread_mutex_unlock(&e->mu);
    dlock_table_put(c->table, e);
}

static void wake_entry(dlock_entry *e, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&e->mu);
    e->poll.woken = 1;
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
    dlock_client_log(c, DLOCK_LOG_INFO, "the subscriber reconnected to Redis: wake-ups resume, "
                     "and a renewal round checks every held lease now");
    dlock_renew_kick(c->renew);
}

static void log_from_renewal(void *arg, int level, const char *message)
{
    dlock_client_log(arg, level, "%s", message);
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
        dlock_client_log(c, DLOCK_LOG_ERROR, "the server is no longer fit for dlock: %s; acquires "
                         "fail with DLOCK_ESERVER until it is mended", message);
    else if (!bad && was)
        dlock_client_log(c, DLOCK_LOG_INFO, "the server is fit for dlock again: acquires resume");
}

static void lost_from_renewal(void *arg, const char *name, uint64_t token)
{
    dlock_client *c = arg;
    dlock_client_log(c, DLOCK_LOG_WARN, "the lease of '%s' (token %" PRIu64 ") is lost: Redis "
                     "no longer has it as this client's, or it could not be renewed in time",
                     name, token);
    if (c->on_lost)
        c->on_lost(name, token, c->on_lost_arg);
}

/* Redlock mode (local/rlmode.h), before c's pool, batcher and threads
 * exist: the node set (c->redlock), and c->conn aimed at the first node
 * (the client's own pool, subscriber and periodic server check use it; no
 * lock goes through them). DLOCK_OK, DLOCK_EINVAL (a bad list: the
 * message says why) or DLOCK_ENOMEM. */
static int redlock_setup(dlock_client *c, const dlock_config *cfg)
{
    dlock_addr *a;
    unsigned n;
    int rc = dlock_addrs_parse(cfg->redlock_nodes, "redlock_nodes", &a, &n);
    if (rc != DLOCK_OK)
        return rc;
    char *host = strdup(a[0].host);
    c->conn.port = a[0].port;
    dlock_addrs_free(a, n);
    if (!host)
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    free(c->conn.host);
    c->conn.host = host;
    /* a refused waiter retries by the holder's lease time left, at most
     * this (acquire.c) when no wake-up comes: a third of a lease, and
     * within the waiter ttl (a quarter of it, as with one server), so
     * that its places in the nodes' queues stay alive */
    c->fallback_ns = (int64_t)c->lease_ms * DLOCK_NS_PER_MS / 3;
    if (c->fallback_ns > (int64_t)c->waiter_ttl_ms * DLOCK_NS_PER_MS / 4)
        c->fallback_ns = (int64_t)c->waiter_ttl_ms * DLOCK_NS_PER_MS / 4;
    return dlock_redlock_create(&c->conn, cfg->redlock_nodes, c->prefix, c->lease_ms,
                                c->pool_size, &c->ctr, &c->redlock);
}

int dlock_client_open(const dlock_config *cfg, dlock_client **out)
{
    dlock_err_clear();
    if (!out)
        return dlock_err_set(DLOCK_EINVAL, "out is NULL");
    *out = NULL;
    if (!cfg)
        return dlock_err_set(DLOCK_EINVAL, "config is NULL");
    int rc = dlock_config_check(cfg);
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
    c->conn.protocol = (int)cfg->protocol;
    c->conn.db = cfg->redis_db;
    c->conn.connect_timeout_ms = cfg->connect_timeout_ms;
    c->conn.command_timeout_ms = cfg->command_timeout_ms;
    c->lease_ms = cfg->lease_ms;
    snprintf(c->lease_str, sizeof c->lease_str, "%" PRIu32, cfg->lease_ms);
    c->pass_limit = cfg->pass_limit;
    c->join_ns = (int64_t)cfg->join_ms * DLOCK_NS_PER_MS;
    c->protocol = (int)cfg->protocol;
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
    c->trace = dlock_trace_open(c->id);
    if (c->trace) {
        const char *names[3] = {c->prefix, c->conn.client_name, c->wake_prefix};
        dlock_trace_argv(c->trace, "names", c->id, NULL, 3, names, NULL);
    }
    dlock_trace_event(c->trace, "open", c->id,
                      "%" PRIu32 " %" PRIu32 " %" PRIu32 " %" PRIu32 " %" PRIu32 " %" PRId64
                      " %" PRId64 " %" PRIu32 " %" PRId64 " %" PRId64 " %" PRId64 " %d %" PRId64,
                      c->lease_ms, c->pass_limit, c->waiter_ttl_ms, c->keep_ms, cfg->min_replicas,
                      c->drift_ns, c->handoff_margin_ns, c->grant_ms, c->grant_drift_ns,
                      c->grant_margin_ns, c->fallback_ns, c->protocol, c->join_ns);
    if (cfg->redlock_nodes && (rc = redlock_setup(c, cfg)) != DLOCK_OK) {
        client_free(c);
        return rc;
    }
    if (c->redlock)
        dlock_trace_event(c->trace, "rl.open", c->id, "%u %u %" PRId64,
                          dlock_redlock_nodes(c->redlock), dlock_redlock_majority(c->redlock),
                          dlock_redlock_drift_ns(c->redlock));
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
        .attempts = &c->attempts,
        .lost_arg = c,
        .log = log_from_renewal,
        .server = server_check,
        .trace = c->trace,
        .redlock = c->redlock,
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
    /* Redlock mode: wake-ups come from any node's release, so a
     * subscriber listens on each (the first is c->sub: c->conn is the
     * first node's), each reconnection waking every poller as above. */
    for (unsigned i = 1; rc == DLOCK_OK && c->redlock && i < dlock_redlock_nodes(c->redlock);
         i++) {
        dlock_sub_cfg node_sub = sub_cfg;
        node_sub.conn = dlock_redlock_node_cfg(c->redlock, i);
        node_sub.on_resubscribed = NULL;
        rc = dlock_sub_start(&node_sub, &c->rl_sub[i]);
    }
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
    if (c->redlock) /* this client's count of each node's time starts now */
        (void)dlock_redlock_refresh(c->redlock, dlock_conn_deadline(c->conn.command_timeout_ms));
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
    if (dlock_client_forked(c))
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
int dlock_client_check(dlock_client *c, const char *name, size_t *len)
{
    if (!c)
        return dlock_err_set(DLOCK_EINVAL, "client is NULL");
    if (dlock_client_forked(c))
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
 * leave is its last access to c. dlock_client_shutdown sets c->closing,
 * then wakes every entry (shutdown_now, wake_waiters); a cancel token, when
 * fired, wakes the entry of each acquire registered on it (api.c,
 * cancel_wake). A waiter looks at both flags (dlock_client_stop_rc) under
 * e->mu before it sleeps, and the wake-ups take e->mu, so none is missed
 * (the poller on e->pcv, a parked waiter on its node). Order: closing is
 * stored before the entries are visited; an entry made after the visit is
 * made under the table mutex, which the visit took after the store, so its
 * first waiter sees the flag.
 */
void dlock_client_enter(dlock_client *c)
{
    ck_pr_inc_uint(&c->inside);
}

void dlock_client_leave(dlock_client *c)
{
    /* Every access of the call to c comes before the decrement: close
     * frees c once it reads 0 (release here, acquire there). */
    dlock_dec_uint_release(&c->inside);
}

/* DLOCK_ECLOSED if c is shutting down, DLOCK_ECANCELED if k is fired, else
 * DLOCK_OK. Any lock or none. */
int dlock_client_stop_rc(dlock_client *c, dlock_cancel *k)
{
    if (dlock_load_int(&c->closing))
        return DLOCK_ECLOSED;
    if (dlock_cancel_is_fired(k))
        return DLOCK_ECANCELED;
    return DLOCK_OK;
}

/* dlock_client_stop_rc's code with its message. */
int dlock_client_stop_err(int rc, const char *name)
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
    if (dlock_client_forked(c))
        return dlock_err_set(DLOCK_EFORK, "this client was opened before fork()");
    dlock_client_enter(c); /* a close from another thread waits for the visit */
    uint64_t hold = dlock_load_64(&dlock_test_shutdown_delay_ns);
    if (hold) {
        struct timespec ts = {(time_t)(hold / 1000000000u), (long)(hold % 1000000000u)};
        nanosleep(&ts, NULL); /* tests only: a shutdown caught inside its call */
    }
    shutdown_now(c);
    dlock_client_leave(c);
    return DLOCK_OK;
}

/* The grant of e ended without a release Redis confirmed (a failed release,
 * a lost lease), after `last` was handed out under it, as `end` (0 a
 * release, DLOCK_UNCLEAN_ABANDONED, DLOCK_UNCLEAN_EXPIRED): the next acquire
 * of the name tells Redis (acquire.lua, ARGV[9] and ARGV[10]), also if e is
 * freed meanwhile. Called with e->mu held (the set's mutex is a leaf). */
void dlock_client_unconfirmed_end(dlock_client *c, dlock_entry *e, uint64_t last, int end)
{
    if (last >= e->lease.unconfirmed) {
        e->lease.unconfirmed = last;
        e->lease.unconfirmed_end = end;
    }
    dlock_trace_event(c->trace, "unconf", e->name, "%" PRIu64 " %d", last, end);
    dlock_unconfirmed_put(c->unconfirmed, e->name, e->lease.unconfirmed, e->lease.unconfirmed_end);
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
    dlock_client_enter(c);
    char *text = dlock_metrics_prometheus(&c->ctr, &c->sub_ctr, c->conn.client_name);
    dlock_client_leave(c);
    if (!text)
        dlock_err_set(DLOCK_ENOMEM, "out of memory");
    return text;
}

int dlock_client_stats(dlock_client *c, dlock_stats *out)
{
    if (!c || !out)
        return dlock_err_set(DLOCK_EINVAL, "client or out is NULL");
    dlock_client_enter(c);
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
    out->protocol_resends = dlock_load_64(&c->ctr.protocol_resends);
    out->shared_acquisitions = dlock_load_64(&c->ctr.shared_acquisitions);
    out->shared_joins = dlock_load_64(&c->ctr.shared_joins);
    out->sem_acquisitions = dlock_load_64(&c->ctr.sem_acquisitions);
    out->sem_passes = dlock_load_64(&c->ctr.sem_passes);
    dlock_client_leave(c);
    return DLOCK_OK;
}
