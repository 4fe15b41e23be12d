/*
 * Redis connections: opening one (timeouts, AUTH, SELECT, SCRIPT LOAD),
 * running a script with EVALSHA and its EVAL fallback, and a small pool of
 * connections that caller threads check out for one call at a time.
 */
#ifndef DLOCK_CONN_H
#define DLOCK_CONN_H

#include <signal.h>

#include <hiredis/hiredis.h>

#include "common/common.h"
#include "conn/script.h"

/* One "host:port" of a list of servers. */
typedef struct dlock_addr {
    char *host;
    int port;
} dlock_addr;

typedef struct dlock_master dlock_master; /* sentinel.h */
typedef struct dlock_cluster dlock_cluster; /* cluster.h */
typedef struct dlock_conn_cfg dlock_conn_cfg;

/* Where a connection goes when the configuration does not name one server:
 * the routing layer above (sentinel.c: the master the sentinels name;
 * cluster.c: any node of a cluster, for the subscriber) gives it, so that
 * connections never call up into it. */
typedef struct dlock_conn_route {
    /* The address to connect to now, into host (size n) and *port.
     * DLOCK_OK, or an error with the message set. */
    int (*where)(const dlock_conn_cfg *cfg, dlock_counters *ctr, char *host, size_t n, int *port);
    /* The server at host:port said it is not the master: ask anew next
     * time. NULL: nothing to do. */
    void (*doubt)(const dlock_conn_cfg *cfg, const char *host, int port);
    /* 1 if c goes to a server that is no longer the one to use (the master
     * moved), else 0. NULL: never. */
    int (*stale)(const dlock_conn_cfg *cfg, const redisContext *c);
    int check_role; /* a new connection checks with ROLE that it reached a master */
    int any_node;   /* a connection to any node, which writes nothing: no WAIT check */
} dlock_conn_route;

/* Where and how to connect: exactly one of host/port, unix_path,
 * sentinels and cluster names the server (dlock_client_open checks it). */
struct dlock_conn_cfg {
    char *host;
    int port;
    char *unix_path;       /* non-NULL: connect over this Unix socket */
    char *username;        /* non-NULL: AUTH username password (an ACL user) */
    char *password;        /* NULL: no AUTH */
    char *client_name;     /* non-NULL: CLIENT SETNAME on each connection */
    int db;
    dlock_addr *sentinels; /* nsentinels > 0: Sentinel mode, the master is */
    unsigned nsentinels;   /* resolved on every connect (sentinel.h) */
    char *sentinel_master;
    char *sentinel_password; /* NULL: sentinels need no AUTH */
    dlock_master *master;  /* Sentinel mode: the client's record of the master */
    dlock_cluster *cluster; /* Cluster mode: a connection to any node, in turn
                               (each node's own settings have their address) */
    uint32_t min_replicas; /* > 0: a new connection checks that WAIT is allowed */
    int protocol;          /* the client's setting: 2 needs Redis 7.0 (its check) */
    uint32_t connect_timeout_ms;
    uint32_t command_timeout_ms;
    const dlock_conn_route *route; /* NULL: host/port or unix_path is the server */
    /* Non-NULL: called with saw_info_arg, each new connection and its
     * setup's INFO text once INFO passed its check (route/redlock.c keeps
     * the run id of the server each connection reached: a connection
     * reaches one server for its life). Copies of the settings call it
     * too. */
    void (*saw_info)(void *arg, const redisContext *c, const char *info);
    void *saw_info_arg;
};

/* Parses "host:port,host:port,..." (an IPv6 host in brackets: "[::1]:6379";
 * spaces around items are ignored) into a new array *out of *n entries
 * (free with dlock_addrs_free). DLOCK_OK, DLOCK_EINVAL with the message
 * naming `what` and the bad item, or DLOCK_ENOMEM. */
int dlock_addrs_parse(const char *list, const char *what, dlock_addr **out, unsigned *n);
void dlock_addrs_free(dlock_addr *a, unsigned n);

/* Connects to host:port, or to unix_path when it is not NULL, within
 * timeout_ms (a signal does not stretch it). Returns a context whose err is
 * set on failure (or NULL when out of memory); the socket is blocking with
 * SO_RCVTIMEO/SO_SNDTIMEO set to command_timeout_ms for plain hiredis calls,
 * though the library's own I/O does not rely on them. */
redisContext *dlock_conn_connect(const char *host, int port, const char *unix_path,
                                 uint32_t timeout_ms, uint32_t command_timeout_ms);

/* Sends one command and reads its reply within timeout_ms, counted in ctr.
 * The reply (an error reply included), or NULL when the connection failed
 * (c->err says why). */
redisReply *dlock_conn_command(redisContext *c, dlock_counters *ctr, uint32_t timeout_ms,
                               int argc, const char **argv);

/* 1 if reply is an error that means this server cannot serve writes now and
 * the connection should be dropped so that the next one finds the master
 * again: READONLY (a replica: the master failed over), LOADING, MASTERDOWN. */
int dlock_conn_is_not_master(const redisReply *reply);

/* The error code for an error reply: DLOCK_ESERVER for a refusal that no
 * retry cures (WRONGPASS, NOPERM, NOAUTH: credentials or an ACL user's
 * permissions; DLOCKPROTOCOL: data of another protocol), else DLOCK_EREDIS. */
int dlock_conn_reply_code(const redisReply *reply);

/* Whether reply is a script's refusal of another protocol's data
 * (DLOCKPROTOCOL: lua/acquire.lua, "Protocol"): nothing was written, and a
 * try again is refused again while that data lives. */
int dlock_conn_is_other_protocol(const redisReply *reply);

/* The protocol such a refusal names as the data's ("DLOCKPROTOCOL the data
 * of this name is dlock protocol P; ..."), or 0 if reply is none or names
 * none. */
int dlock_conn_refusal_protocol(const redisReply *reply);

/* If reply is such an error, marks c failed (err set, the error as its
 * message) so that whoever holds it drops it and reconnects. Returns 1 if
 * it did. */
int dlock_conn_check_master(redisContext *c, const redisReply *reply);

/*
 * I/O and deadlines. Every exchange here has an absolute deadline on the
 * monotonic clock and waits with poll() for the time that is left; a signal
 * that interrupts a wait only makes it wait for the rest (SO_RCVTIMEO, which
 * hiredis' blocking calls rely on, starts over after every interrupted read,
 * so an application's interval timer or profiler could stretch a call
 * without bound). Reads and writes never block in the kernel (MSG_DONTWAIT),
 * and writes use MSG_NOSIGNAL: a connection the server closed fails with
 * EPIPE instead of raising SIGPIPE in the process. A connection whose
 * deadline passed has c->err set (REDIS_ERR_IO, "timed out") and must not be
 * reused. All of this may run on any thread, the application's included.
 */

/* Opens a ready connection: in Sentinel mode the master's address asked of
 * the sentinels first (dlock_sentinel_master), in Cluster mode the next
 * node in turn (dlock_cluster_any); connected within the connect
 * timeout, then authenticated, in Sentinel mode checked with ROLE to be a
 * master, database selected, the server checked (dlock_conn_check_info)
 * and scripts loaded if their digests are not known yet, all of that in
 * one pipelined exchange within one command timeout. DLOCK_OK, DLOCK_ESERVER (a server dlock must not use:
 * the message says why), or DLOCK_EREDIS with the message set (naming the
 * step that failed and the server's address). */
int dlock_conn_open(const dlock_conn_cfg *cfg, dlock_counters *ctr, redisContext **out);


/* Checks INFO's text: Redis >= 5 (scripts call TIME before writing, which
 * needs script effects replication), >= 7.0 for a client that writes
 * protocol 2 (`protocol`: its scripts use PEXPIRE ... GT), and no eviction
 * policy that could evict a live lease (maxmemory 0, or maxmemory-policy
 * noeviction). DLOCK_OK or DLOCK_ESERVER with the message set. */
int dlock_conn_check_info(const char *info, int protocol);

/* The monotonic deadline that is timeout_ms from now. */
int64_t dlock_conn_deadline(uint32_t timeout_ms);

/* Writes c's output buffer out by deadline. 0, or -1 with c->err set. */
int dlock_conn_flush(redisContext *c, int64_t deadline);

/* Reads one reply by deadline into *out (free it with freeReplyObject).
 * 0, or -1 with c->err set (the connection is then unusable). */
int dlock_conn_read(redisContext *c, int64_t deadline, redisReply **out);

/* Runs one script and waits for its reply, by deadline: EVALSHA, or EVAL if
 * the digest is unknown or the server answers NOSCRIPT (then the digest is
 * relearned). argv holds nkeys keys followed by nargs arguments. Returns the
 * reply (free it with freeReplyObject; a Redis error comes back as
 * REDIS_REPLY_ERROR), or NULL when the connection failed (c->err says why;
 * do not reuse c). */
redisReply *dlock_conn_eval(redisContext *c, dlock_counters *ctr, int64_t deadline,
                            dlock_script_id id, int nkeys, int nargs, const char **argv,
                            const size_t *lens);

/* Appends one script call to c's output buffer without waiting: EVALSHA
 * when use_sha and the digest is known, else EVAL (after a NOSCRIPT answer).
 * 0 or -1 (out of memory). */
int dlock_conn_append_eval(redisContext *c, dlock_counters *ctr, dlock_script_id id, int use_sha,
                           int nkeys, int nargs, const char **argv, const size_t *lens);

/* 1 if reply is the NOSCRIPT error of an EVALSHA. */
int dlock_conn_is_noscript(const redisReply *reply);

/* Blocks every signal in the calling thread, saving the old mask in *old:
 * a library thread is started with this mask (the new thread inherits it),
 * so application signal handlers never run on it. Restore with
 * pthread_sigmask. */
void dlock_block_signals(sigset_t *old);

typedef struct dlock_pool dlock_pool;

/* A pool of at most size connections to cfg (copied by reference: cfg must
 * outlive the pool). Connections open lazily. NULL when out of memory. */
dlock_pool *dlock_pool_create(const dlock_conn_cfg *cfg, unsigned size, dlock_counters *ctr);

/* Closes every idle connection and frees the pool; none may be checked out. */
void dlock_pool_destroy(dlock_pool *p);

/* Checks out a connection: an idle one, or a new one while fewer than size
 * are open; otherwise waits for one to come back, as long as others do come
 * back at least once per command timeout, at most 10 command timeouts, and
 * never past the caller's deadline (DLOCK_NEVER: none). DLOCK_OK,
 * DLOCK_ETIMEDOUT (the caller's deadline came first), DLOCK_EREDIS (cannot
 * connect, or none came back in time) or DLOCK_ESERVER (dlock_conn_open). */
int dlock_pool_get(dlock_pool *p, int64_t deadline, redisContext **out);


/* Returns a checked-out connection; a failed one (c->err set) or broken != 0
 * is closed instead, so the next dlock_pool_get reconnects. */
void dlock_pool_put(dlock_pool *p, redisContext *c, int broken);

#endif
