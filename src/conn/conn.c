/*
 * Redis connections and the caller threads' connection pool.
 *
 * Pool invariants (all under pool->mu; the only lock taken under it is the
 * Sentinel record's (sentinel.h: a leaf lock), to tell a stale connection;
 * no Redis I/O happens under it, only the close of a stale or broken
 * connection):
 *   - open counts the connections that exist: idle ones plus checked-out ones
 *     plus those being opened by a thread that reserved a slot; open <= size.
 *   - idle[0 .. nidle) are connected, without error, and owned by nobody.
 * A connection is used by one thread at a time: the one that checked it out.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/sds.h>

#include "conn/conn.h"
#include "common/error.h"

void dlock_block_signals(sigset_t *old)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, old);
}

void dlock_addrs_free(dlock_addr *a, unsigned n)
{
    if (!a)
        return;
    for (unsigned i = 0; i < n; i++)
        free(a[i].host);
    free(a);
}

int dlock_addrs_parse(const char *list, const char *what, dlock_addr **out, unsigned *n)
{
    *out = NULL;
    *n = 0;
    unsigned cap = 1;
    for (const char *p = list; *p; p++)
        cap += *p == ',';
    dlock_addr *a = calloc(cap, sizeof *a);
    if (!a)
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    unsigned k = 0;
    const char *p = list;
    for (;;) {
        const char *end = strchr(p, ',');
        if (!end)
            end = p + strlen(p);
        while (p < end && *p == ' ')
            p++;
        const char *e = end;
        while (e > p && e[-1] == ' ')
            e--;
        size_t len = (size_t)(e - p);
        const char *colon = NULL;
        for (const char *q = e; q > p; q--)
            if (q[-1] == ':') {
                colon = q - 1;
                break;
            }
        const char *h = p, *he = colon;
        int bracketed = colon && h < he && *h == '[' && he[-1] == ']';
        if (bracketed) {
            h++;
            he--;
        }
        /* a host holds no ':' unless bracketed (IPv6), no '[' ']' or space */
        for (const char *q = h; colon && q < he; q++)
            if ((*q == ':' && !bracketed) || *q == '[' || *q == ']' || *q == ' ')
                colon = NULL;
        char port[8];
        size_t plen = colon ? (size_t)(e - colon - 1) : 0;
        long v = 0;
        if (colon && plen > 0 && plen < sizeof port) {
            memcpy(port, colon + 1, plen);
            port[plen] = '\0';
            char *pe;
            v = port[0] >= '0' && port[0] <= '9' ? strtol(port, &pe, 10) : 0;
            if (v && *pe)
                v = 0;
        }
        if (!colon || he <= h || v <= 0 || v > 65535) {
            dlock_addrs_free(a, k);
            return dlock_err_set(DLOCK_EINVAL, "%s: '%.*s' is not host:port (in \"%s\")", what,
                                 (int)len, p, list);
        }
        a[k].host = malloc((size_t)(he - h) + 1);
        if (a[k].host) {
            memcpy(a[k].host, h, (size_t)(he - h));
            a[k].host[he - h] = '\0';
        }
        a[k].port = (int)v;
        if (!a[k].host) {
            dlock_addrs_free(a, k);
            return dlock_err_set(DLOCK_ENOMEM, "out of memory");
        }
        k++;
        if (!*end)
            break;
        p = end + 1;
    }
    *out = a;
    *n = k;
    return DLOCK_OK;
}

static struct timeval ms_tv(uint32_t ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

int64_t dlock_conn_deadline(uint32_t timeout_ms)
{
    return dlock_now_ns() + (int64_t)timeout_ms * DLOCK_NS_PER_MS;
}

/* Marks c failed: REDIS_ERR_IO with the message, or with errno's. */
static void set_err(redisContext *c, int err, const char *what)
{
    c->err = err;
    if (what)
        snprintf(c->errstr, sizeof c->errstr, "%s", what);
    else
        snprintf(c->errstr, sizeof c->errstr, "%s", strerror(errno));
}

/* Waits until fd is ready for events or the deadline passes. A signal only
 * shortens one poll: the wait goes on for the time that is left. 1 ready
 * (or an error condition, which the next read or write reports), 0 the
 * deadline passed, -1 poll failed (errno). */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - dlock_now_ns();
        if (left <= 0)
            return 0;
        struct pollfd pfd = {.fd = fd, .events = events};
        /* Round up: a wait never ends before the deadline. */
        int64_t ms = (left + DLOCK_NS_PER_MS - 1) / DLOCK_NS_PER_MS;
        int n = poll(&pfd, 1, ms > INT32_MAX ? INT32_MAX : (int)ms);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

int dlock_conn_flush(redisContext *c, int64_t deadline)
{
    if (c->err)
        return -1;
    size_t len;
    while ((len = sdslen(c->obuf)) > 0) {
        ssize_t n = send(c->fd, c->obuf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            sdsrange(c->obuf, n, -1);
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            set_err(c, REDIS_ERR_IO, NULL);
            return -1;
        }
        int w = wait_fd(c->fd, POLLOUT, deadline);
        if (w <= 0) {
            set_err(c, REDIS_ERR_IO, w == 0 ? "timed out writing the request" : NULL);
            return -1;
        }
    }
    return 0;
}

int dlock_conn_read(redisContext *c, int64_t deadline, redisReply **out)
{
    *out = NULL;
    if (c->err)
        return -1;
    for (;;) {
        void *r = NULL;
        if (redisGetReplyFromReader(c, &r) != REDIS_OK)
            return -1; /* a protocol error: hiredis set c->err */
        if (r) {
            *out = r;
            return 0;
        }
        char buf[16384];
        ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0) {
            set_err(c, REDIS_ERR_EOF, "Server closed the connection");
            return -1;
        }
        if (n > 0) {
            if (redisReaderFeed(c->reader, buf, (size_t)n) != REDIS_OK) {
                set_err(c, REDIS_ERR_PROTOCOL, c->reader->errstr);
                return -1;
            }
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            set_err(c, REDIS_ERR_IO, NULL);
            return -1;
        }
        int w = wait_fd(c->fd, POLLIN, deadline);
        if (w <= 0) {
            set_err(c, REDIS_ERR_IO, w == 0 ? "timed out waiting for the reply" : NULL);
            return -1;
        }
    }
}

static int fail_ctx(redisContext *c, const char *what)
{
    if (c && c->err == REDIS_ERR_PROTOCOL) /* an HTTP server on the port, say */
        return dlock_err_set(DLOCK_EREDIS, "not a Redis server: it answered %s in another "
                             "protocol (%s)", what, c->errstr);
    int rc = dlock_err_set(DLOCK_EREDIS, "redis %s: %s", what,
                           c ? (c->err ? c->errstr : "unexpected reply") : "out of memory");
    return rc;
}

/* Sends one command and reads its reply by deadline, counted in ctr. The
 * reply, or NULL when the connection failed (c->err says why). */
static redisReply *command_by(redisContext *c, dlock_counters *ctr, int64_t deadline, int argc,
                              const char **argv)
{
    if (redisAppendCommandArgv(c, argc, argv, NULL) != REDIS_OK)
        return NULL;
    dlock_count(&ctr->redis_commands, 1);
    dlock_count(&ctr->redis_round_trips, 1);
    redisReply *r;
    if (dlock_conn_flush(c, deadline) != 0 || dlock_conn_read(c, deadline, &r) != 0)
        return NULL;
    return r;
}

redisReply *dlock_conn_command(redisContext *c, dlock_counters *ctr, uint32_t timeout_ms,
                               int argc, const char **argv)
{
    return command_by(c, ctr, dlock_conn_deadline(timeout_ms), argc, argv);
}

static int is_config_error(const char *msg);

int dlock_conn_is_not_master(const redisReply *r)
{
    /* Redis 5 and 6 wrap a script's READONLY: "ERR Error running script
     * (...): ... -READONLY You can't write against a read only replica." */
    return r && r->type == REDIS_REPLY_ERROR &&
           (strncmp(r->str, "READONLY", 8) == 0 || strncmp(r->str, "LOADING", 7) == 0 ||
            strncmp(r->str, "MASTERDOWN", 10) == 0 ||
            strstr(r->str, "READONLY You can't write") != NULL);
}

int dlock_conn_reply_code(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && is_config_error(r->str) ? DLOCK_ESERVER
                                                                         : DLOCK_EREDIS;
}

int dlock_conn_is_other_protocol(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "DLOCKPROTOCOL", 13) == 0;
}

int dlock_conn_refusal_protocol(const redisReply *r)
{
    static const char lead[] = "DLOCKPROTOCOL the data of this name is dlock protocol ";
    if (!dlock_conn_is_other_protocol(r) || strncmp(r->str, lead, sizeof lead - 1) != 0)
        return 0;
    const char *p = r->str + sizeof lead - 1;
    int v = 0;
    for (; *p >= '0' && *p <= '9' && v < 1000000; p++)
        v = v * 10 + (*p - '0');
    return *p == ';' ? v : 0;
}

int dlock_conn_check_master(redisContext *c, const redisReply *r)
{
    if (!dlock_conn_is_not_master(r))
        return 0;
    c->err = REDIS_ERR_OTHER;
    snprintf(c->errstr, sizeof c->errstr, "%s", r->str);
    return 1;
}

/* A refusal that no retry cures: wrong credentials, a user without the
 * permission, AUTH that the server does not expect, or a script's refusal
 * of data of another protocol (lua/acquire.lua, "Protocol"). */
static int is_config_error(const char *msg)
{
    return strncmp(msg, "WRONGPASS", 9) == 0 || strncmp(msg, "NOPERM", 6) == 0 ||
           strncmp(msg, "DLOCKPROTOCOL", 13) == 0 || /* dlock_conn_is_other_protocol */
           strncmp(msg, "DLOCKKIND", 9) == 0 || /* a lock's name used by a semaphore, or
                                                   the other way (lua/p2/SEM.txt) */
           strncmp(msg, "NOAUTH", 6) == 0 || strstr(msg, "AUTH <password> called without") ||
           strstr(msg, "invalid password") || strstr(msg, "invalid username");
}

/* The value of "field:" in INFO's text, copied into out (empty if absent). */
static void info_field(const char *info, const char *field, char *out, size_t n)
{
    out[0] = '\0';
    size_t flen = strlen(field);
    for (const char *p = info; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, field, flen) == 0 && p[flen] == ':') {
            p += flen + 1;
            size_t k = strcspn(p, "\r\n");
            if (k >= n)
                k = n - 1;
            memcpy(out, p, k);
            out[k] = '\0';
            return;
        }
    }
}

int dlock_conn_check_info(const char *info, int protocol)
{
    char version[64], maxmemory[32], policy[64];
    info_field(info, "redis_version", version, sizeof version);
    info_field(info, "maxmemory", maxmemory, sizeof maxmemory);
    info_field(info, "maxmemory_policy", policy, sizeof policy);
    if (!version[0])
        return dlock_err_set(DLOCK_ESERVER, "redis INFO shows no redis_version: not a Redis "
                                            "server dlock can check");
    if (atoi(version) < 5)
        return dlock_err_set(DLOCK_ESERVER, "redis %s is too old: dlock needs Redis 5 or later "
                                            "(its scripts read TIME before writing), 7.0 or "
                                            "later for protocol 2, the default", version);
    if (protocol == 2 && atoi(version) < 7)
        return dlock_err_set(DLOCK_ESERVER, "redis %s is too old for protocol 2 "
                             "(dlock_config.protocol): it needs Redis 7.0 or later (PEXPIRE "
                             "... GT); write protocol 1, or upgrade Redis", version);
    if (maxmemory[0] && strtoull(maxmemory, NULL, 10) != 0 && strcmp(policy, "noeviction") != 0)
        return dlock_err_set(DLOCK_ESERVER, "redis maxmemory-policy is %s with maxmemory %s: it "
                             "may evict a live lease and grant it again; dlock needs noeviction "
                             "or maxmemory 0", policy[0] ? policy : "(unknown)", maxmemory);
    return DLOCK_OK;
}

/* Waits for the connection with wait_fd (hiredis' own wait fails on the
 * first signal). */
redisContext *dlock_conn_connect(const char *host, int port, const char *unix_path,
                                 uint32_t timeout_ms, uint32_t command_timeout_ms)
{
    int64_t deadline = dlock_conn_deadline(timeout_ms);
    redisContext *c = unix_path ? redisConnectUnixNonBlock(unix_path)
                                : redisConnectNonBlock(host, port);
    if (!c || c->err)
        return c;
    int w = wait_fd(c->fd, POLLOUT, deadline);
    int soerr = 0;
    socklen_t len = sizeof soerr;
    if (w <= 0) {
        set_err(c, REDIS_ERR_IO, w == 0 ? "Connection timed out" : NULL);
    } else if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0 || soerr) {
        errno = soerr ? soerr : errno;
        set_err(c, REDIS_ERR_IO, NULL);
    } else {
        int fl = fcntl(c->fd, F_GETFL);
        if (fl < 0 || fcntl(c->fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
            set_err(c, REDIS_ERR_IO, NULL);
        else
            c->flags |= REDIS_BLOCK;
    }
    if (!c->err && redisSetTimeout(c, ms_tv(command_timeout_ms)) != REDIS_OK && !c->err)
        set_err(c, REDIS_ERR_IO, NULL);
    if (!c->err && !unix_path)
        redisEnableKeepAlive(c); /* best effort: dead peers are found sooner */
    return c;
}

/* The steps of a connection's setup, sent as one pipeline (setup). */
enum { ST_AUTH, ST_NAME, ST_ROLE, ST_SELECT, ST_INFO, ST_WAIT, ST_SCRIPT };

/* One setup reply: DLOCK_OK, or the step's failure with the message set. */
static int setup_reply(int kind, const char *what, const redisReply *r, const dlock_conn_cfg *cfg,
                       const char *where, int *not_master)
{
    if (r->type == REDIS_REPLY_ERROR && kind != ST_NAME)
        /* an ACL user without a command, wrong credentials, LOADING, a bad
         * database index...: the server refused it */
        return dlock_err_set(is_config_error(r->str) ? DLOCK_ESERVER : DLOCK_EREDIS,
                             "refused by the server: redis %s: %s%s", what, r->str,
                             kind == ST_INFO ? " (dlock reads INFO to check the server's version "
                                               "and eviction policy; an ACL user needs +info)"
                                             : "");
    switch (kind) {
    case ST_NAME: /* best effort: a user without +client|setname still works, unnamed */
        return DLOCK_OK;
    case ST_ROLE:
        if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
            r->element[0]->type != REDIS_REPLY_STRING)
            return dlock_err_set(DLOCK_EREDIS, "redis ROLE: unexpected reply");
        if ((*not_master = strcmp(r->element[0]->str, "master") != 0))
            return dlock_err_set(DLOCK_EREDIS, "%s, the master '%s' last named by the sentinels, "
                                 "is a %s (a failover under way?)", where, cfg->sentinel_master,
                                 r->element[0]->str);
        return DLOCK_OK;
    case ST_INFO:
        if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
            return dlock_conn_check_info(r->str, cfg->protocol);
        return dlock_err_set(DLOCK_EREDIS, "redis INFO: unexpected reply");
    default:
        return DLOCK_OK;
    }
}

/* Sets a new connection up in one round trip: AUTH, CLIENT SETNAME, ROLE
 * (Sentinel mode), SELECT, INFO (dlock_conn_check_info), WAIT 0 0 (with
 * min_replicas: a user without +wait learns it here, not as grants that
 * seem to reach no replica; not on a Cluster connection to any node, the
 * subscriber's, which writes nothing), and SCRIPT LOAD of every script whose
 * digest is not known yet, all pipelined and read within one command
 * timeout. The first failing step (in that order) is reported. */
static int setup(redisContext *c, const dlock_conn_cfg *cfg, dlock_counters *ctr,
                 const char *where, int *not_master)
{
    struct {
        int kind, id;
        const char *what;
    } st[8 + DLOCK_SCRIPT_COUNT];
    int n = 0, ok = 1;
#define STEP(k, w, argc, ...)                                                                  \
    do {                                                                                       \
        const char *argv_[] = {__VA_ARGS__};                                                   \
        ok = ok && redisAppendCommandArgv(c, (argc), argv_, NULL) == REDIS_OK;                 \
        st[n].kind = (k);                                                                      \
        st[n].id = -1;                                                                         \
        st[n++].what = (w);                                                                    \
    } while (0)
    if (cfg->password) {
        if (cfg->username)
            STEP(ST_AUTH, "AUTH", 3, "AUTH", cfg->username, cfg->password);
        else
            STEP(ST_AUTH, "AUTH", 2, "AUTH", cfg->password);
    }
    if (cfg->client_name)
        STEP(ST_NAME, "CLIENT SETNAME", 3, "CLIENT", "SETNAME", cfg->client_name);
    if (cfg->route && cfg->route->check_role)
        STEP(ST_ROLE, "ROLE", 1, "ROLE");
    char db[16];
    snprintf(db, sizeof db, "%d", cfg->db);
    if (cfg->db != 0)
        STEP(ST_SELECT, "SELECT", 2, "SELECT", db);
    STEP(ST_INFO, "INFO", 1, "INFO");
    if (cfg->min_replicas && !(cfg->route && cfg->route->any_node))
        STEP(ST_WAIT, "WAIT (min_replicas needs it)", 3, "WAIT", "0", "0");
    for (int id = 0; id < DLOCK_SCRIPT_COUNT; id++)
        if (!dlock_script_sha(id)) {
            STEP(ST_SCRIPT, "SCRIPT LOAD", 3, "SCRIPT", "LOAD", dlock_script_body(id));
            st[n - 1].id = id;
        }
#undef STEP
    if (!ok)
        return fail_ctx(c, "setup");
    dlock_count(&ctr->redis_commands, (uint64_t)n);
    dlock_count(&ctr->redis_round_trips, 1);
    int64_t deadline = dlock_conn_deadline(cfg->command_timeout_ms);
    if (dlock_conn_flush(c, deadline) != 0)
        return fail_ctx(c, st[0].what);
    for (int i = 0; i < n; i++) {
        redisReply *r = NULL;
        if (dlock_conn_read(c, deadline, &r) != 0)
            return fail_ctx(c, st[i].what);
        int rc = setup_reply(st[i].kind, st[i].what, r, cfg, where, not_master);
        if (rc == DLOCK_OK && st[i].kind == ST_SCRIPT && r->type == REDIS_REPLY_STRING)
            dlock_script_set_sha(st[i].id, r->str, r->len);
        if (rc == DLOCK_OK && st[i].kind == ST_INFO && cfg->saw_info)
            cfg->saw_info(cfg->saw_info_arg, c, r->str);
        freeReplyObject(r);
        if (rc != DLOCK_OK)
            return rc; /* (the connection is dropped: the replies after it do not matter) */
    }
    return DLOCK_OK;
}

int dlock_conn_open(const dlock_conn_cfg *cfg, dlock_counters *ctr, redisContext **out)
{
    *out = NULL;
    char where[300];
    const char *host = cfg->host;
    int port = cfg->port;
    char master[256];
    if (cfg->route) {
        int rc = cfg->route->where(cfg, ctr, master, sizeof master, &port);
        if (rc != DLOCK_OK)
            return rc;
        host = master;
    }
    if (cfg->unix_path)
        snprintf(where, sizeof where, "unix:%s", cfg->unix_path);
    else
        snprintf(where, sizeof where, "%s:%d", host, port);
    redisContext *c = dlock_conn_connect(host, port, cfg->unix_path, cfg->connect_timeout_ms,
                                         cfg->command_timeout_ms);
    if (!c || c->err) {
        int rc = dlock_err_set(DLOCK_EREDIS, "redis connect to %s: %s", where,
                               c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return rc;
    }
    int not_master = 0;
    int rc = setup(c, cfg, ctr, where, &not_master);
    if (not_master)
        if (cfg->route && cfg->route->doubt)
            cfg->route->doubt(cfg, host, port); /* ask every sentinel next time */
    if (rc != DLOCK_OK) {
        char why[200];
        snprintf(why, sizeof why, "%s", dlock_last_error());
        dlock_err_set(rc, "%s (setting up a connection to %s)", why, where);
        redisFree(c);
        return rc;
    }
    *out = c;
    return DLOCK_OK;
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

redisReply *dlock_conn_eval(redisContext *c, dlock_counters *ctr, int64_t deadline,
                            dlock_script_id id, int nkeys, int nargs, const char **argv,
                            const size_t *lens)
{
    for (int use_sha = 1;; use_sha = 0) {
        if (append_script(c, id, use_sha, nkeys, nargs, argv, lens) != 0)
            return NULL;
        dlock_count(&ctr->redis_commands, 1);
        dlock_count(&ctr->redis_round_trips, 1);
        redisReply *r = NULL;
        if (dlock_conn_flush(c, deadline) != 0 || dlock_conn_read(c, deadline, &r) != 0)
            return NULL;
        if (!use_sha || !dlock_conn_is_noscript(r))
            return r;
        /* A restarted or flushed server: EVAL caches the script again. */
        freeReplyObject(r);
    }
}

/* 1 if the route says c goes to a server no longer to use. */
static int conn_stale(const dlock_conn_cfg *cfg, const redisContext *c)
{
    return cfg->route && cfg->route->stale && cfg->route->stale(cfg, c);
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
    DLOCK_LOCKSTAT_NAME(&p->mu, "pool");
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

int dlock_pool_get(dlock_pool *p, int64_t caller_deadline, redisContext **out)
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
            redisContext *c = p->idle[--p->nidle];
            if (conn_stale(p->cfg, c)) {
                /* the master moved: this one goes to the old one */
                redisFree(c);
                p->open--;
                continue;
            }
            *out = c;
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
        if (caller_deadline < deadline)
            deadline = caller_deadline;
        struct timespec ts = dlock_ts(deadline);
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        now = dlock_now_ns();
        if (p->returns != seen) {
            seen = p->returns;
            idle_deadline = now + tmo;
        }
        if (p->nidle || p->open < p->size)
            continue; /* one came free: take it, even at a deadline */
        if (now >= caller_deadline) {
            pthread_mutex_unlock(&p->mu);
            return dlock_err_set(DLOCK_ETIMEDOUT, "no redis connection came free before the "
                                 "caller's deadline (all %u busy)", p->size);
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
    if (broken || c->err || conn_stale(p->cfg, c)) {
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
