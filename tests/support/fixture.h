/*
 * A private redis-server for tests and storms: started on a free loopback
 * port in a fresh temporary directory (no persistence), stopped after.
 * Also reads the server's own load figures (INFO commandstats and cpu).
 *
 * Not thread-safe per fx_redis; each test process owns its servers.
 */
#ifndef DLOCK_FIXTURE_H
#define DLOCK_FIXTURE_H

#include <sys/types.h>
#include <hiredis/hiredis.h>
#include "dlock.h"

/* How to start a server (fx_redis_start_opts); zero: a plain one. */
typedef struct fx_redis_opts {
    int unix_socket;          /* also listen on <dir>/redis.sock (fx_redis.unix_path) */
    int replica_of;           /* loopback port of a master to replicate; 0: none */
    int never_promote;        /* replica-priority 0: Sentinel never promotes it */
    int cluster;              /* a Redis Cluster node (cluster-enabled, its
                                 nodes.conf in dir, node timeout 2000 ms) */
    const char *requirepass;  /* the default user's password; NULL: none */
    const char *sentinel_master; /* non-NULL: run as a sentinel (redis-server
                                    --sentinel) monitoring this master name */
    int sentinel_master_port; /* ... at 127.0.0.1:this port, quorum 2, down after
                                 sentinel_down_ms (0: 1000 ms), failover timeout
                                 the larger of 5000 ms and sentinel_down_ms */
    int sentinel_down_ms;
    const char *const *args;  /* more redis-server arguments, NULL-terminated,
                                 after all others (so they override them;
                                 at most 62 arguments in all); NULL: none */
    const char *const *env;   /* "NAME=value" strings, NULL-terminated, added
                                 to the inherited environment (an inherited
                                 entry of the same name is left out; at
                                 most 128 given, 255 in all); NULL: none */
} fx_redis_opts;

typedef struct fx_redis {
    pid_t pid;          /* redis-server's pid, 0 when not running */
    int port;           /* loopback port, kept across fx_redis_restart */
    char dir[256];      /* temporary working directory (removed by stop) */
    char unix_path[300]; /* with opts.unix_socket: <dir>/redis.sock, else "" */
    fx_redis_opts opts; /* as started (pointers are the caller's: keep them alive) */
} fx_redis;

/* Starts redis-server on a free port of 127.0.0.1 and waits (at most 10 s)
 * until it answers PING. Returns 0, or -1 with a message on stderr. */
int fx_redis_start(fx_redis *r);

/* fx_redis_start with options (NULL: none). Returns 0, or -1 with a message
 * on stderr. fx_redis_restart starts it again with the same options. */
int fx_redis_start_opts(fx_redis *r, const fx_redis_opts *opts);

/* Stops it (SIGTERM, then SIGKILL after 5 s), reaps it, removes its dir. */
void fx_redis_stop(fx_redis *r);

/* Sends `sig` to the server (SIGKILL, SIGSTOP, SIGCONT...). After SIGKILL
 * the process is reaped and pid is 0. Returns 0 or -1. */
int fx_redis_signal(fx_redis *r, int sig);

/* Starts the server again on the same port after a kill (empty data set).
 * Returns 0 or -1. */
int fx_redis_restart(fx_redis *r);

/* Independent servers, as Redlock's nodes: fx_redis_start of srv[0 .. n),
 * their "127.0.0.1:port,..." list into nodes (size bytes) unless nodes is
 * NULL. Returns 0, or -1 with a message on stderr. */
int fx_redis_start_set(fx_redis *srv, int n, char *nodes, size_t size);

/* Seeds a fresh Redlock deployment of nodes ("host:port,...") on key
 * prefix `prefix`, as `dlockctl --redlock-nodes LIST seed-fresh` does: it
 * refuses nodes that hold keys of the prefix (route/redlock.h,
 * dlock_redlock_seed_fresh). lease_ms is the node set's; each connection
 * and command waits timeout_ms, all of it wait_ms at most. Returns 0, or
 * -1 with a message on stderr (tests/support/fixture_redlock.c). */
int fx_redlock_seed_fresh(const char *nodes, const char *prefix, uint32_t lease_ms,
                          uint32_t timeout_ms, long wait_ms);

/* Every server of srv[0 .. n) running again after a test: SIGCONT to
 * those running (a stopped one goes on), fx_redis_restart of those
 * killed. Returns 0 or -1. */
int fx_redis_restore_set(fx_redis *srv, int n);

/* fx_redis_stop of srv[0 .. n). */
void fx_redis_stop_set(fx_redis *srv, int n);

/* A Sentinel topology on loopback: a master, one replica of it and three
 * sentinels monitoring it under `name` (quorum 2). Roles swap on failover:
 * ask fx_sentinel_master_port. */
#define FX_SENTINELS 3
typedef struct fx_sentinel_set {
    fx_redis srv[3];                  /* the first master and its replica(s) */
    int nsrv;                         /* 2, or 3 with two replicas */
    fx_redis sentinel[FX_SENTINELS];
    char name[32];
    char addrs[128];                  /* "127.0.0.1:p,127.0.0.1:p,127.0.0.1:p" */
} fx_sentinel_set;

/* Starts it and waits until it is ready (fx_sentinel_wait). 0, or -1 with
 * a message on stderr (whatever started is stopped). */
int fx_sentinel_start(fx_sentinel_set *t, const char *name);
/* The same with `replicas` (1 or 2) replicas (a second one is never
 * promoted: replica-priority 0), and the sentinels' down-after-milliseconds
 * (0: 1000). */
int fx_sentinel_start_n(fx_sentinel_set *t, const char *name, int replicas, int down_ms);
void fx_sentinel_stop(fx_sentinel_set *t);

/* Waits (about 30 s at most: sentinels find each other through hello
 * messages every 2 s) until every sentinel names master_port as the master,
 * knows a replica and the other sentinels, master_port says ROLE master,
 * the replica's link is up and a replica acknowledges a write on the
 * master (WAIT 1, within 500 ms). 0, or -1 with a message on stderr. */
int fx_sentinel_wait(fx_sentinel_set *t, int master_port, int replica_port);

/* The port of whichever of t->srv says ROLE master now (the first if more
 * do), and of the other one (with one replica). */
int fx_sentinel_master_port(fx_sentinel_set *t);
int fx_sentinel_replica_port(fx_sentinel_set *t);

/* The master's port that sentinel i reports, or -1. */
int fx_sentinel_reported(fx_sentinel_set *t, int i);

/* One command on a fresh connection to 127.0.0.1:port: the reply (free it)
 * or NULL. */
redisReply *fx_cmd_at(int port, const char *fmt, ...);

/* 1 if the server at port says ROLE master. */
int fx_is_master(int port);

/* A Redis Cluster on loopback: `masters` masters, each with `replicas`
 * replicas, all slots assigned (redis-cli --cluster create). */
#define FX_CLUSTER_MAX 12
typedef struct fx_cluster {
    fx_redis node[FX_CLUSTER_MAX];
    int n;                            /* nodes started */
    char addrs[FX_CLUSTER_MAX * 24];  /* "127.0.0.1:p,..." of every node */
} fx_cluster;

/* Starts the nodes, creates the cluster and waits (at most 30 s) until every
 * node says cluster_state:ok with all 16384 slots. 0, or -1 with a message
 * on stderr (whatever started is stopped). */
int fx_cluster_start(fx_cluster *c, int masters, int replicas);
void fx_cluster_stop(fx_cluster *c);

/* A server wall clock that a test steps: redis-server started with
 * fx_fake_clock.env in fx_redis_opts.env runs under libfaketime through
 * the project's clock shim (tests/support/clockshim.c says why it is needed and
 * what each setting does), reading its offset from real time from a file
 * on every wall-clock read; its monotonic clock stays real. Several servers
 * may share one. */
typedef struct fx_fake_clock {
    char path[300];        /* the offset file */
    char preload[700];     /* storage of env's entries */
    char file_env[340];
    const char *env[8];    /* for fx_redis_opts.env */
} fx_fake_clock;

/* Creates the offset file (offset 0) in TMPDIR, fills k->env with the shim
 * and libfaketimeMT at these paths, and clears this process's FAKETIME*
 * settings (an inherited FAKETIME would override the file). 0, or -1 with a
 * message on stderr (a path missing). */
int fx_fake_clock_init(fx_fake_clock *k, const char *shim, const char *faketime);

/* Sets the offset: the servers read real time + offset_ms from their next
 * clock read on (the file is replaced whole). 0 or -1. */
int fx_fake_clock_set(fx_fake_clock *k, long offset_ms);

/* Removes the offset file. */
void fx_fake_clock_remove(fx_fake_clock *k);

/* The one server of a test process, and cmocka-shaped fixtures for it (they
 * take cmocka's state argument and ignore it). */
extern fx_redis fx_server;
int fx_group_setup(void **state);    /* starts fx_server: 0, or -1 */
int fx_group_teardown(void **state); /* stops it: 0 */
/* Per-test teardown: a test that stopped (SIGSTOP) or killed the server and
 * then failed an assertion must not break the tests after it: resumes it,
 * or starts it again. 0, or -1. */
int fx_ensure_server(void **state);

/* A new connection to host:port (1 s timeouts), or NULL. */
redisContext *fx_connect(const char *host, int port);

/* Calls of `cmd` (lower case, e.g. "evalsha") in INFO commandstats of
 * host:port; cmd NULL sums every command except INFO itself. -1 on error. */
long long fx_info_calls(const char *host, int port, const char *cmd);

/* fx_info_calls(host, port, NULL) less the subscriber threads' own
 * SUBSCRIBE and keepalive PING: the commands that lock calls and renewals
 * cause. -1 on error. */
long long fx_info_lock_calls(const char *host, int port);

/* Top-level commands a dlock client sends (EVALSHA, EVAL, SCRIPT, AUTH,
 * SELECT, PING) in INFO commandstats of host:port: what the server counts
 * as round trips, without the commands run inside scripts. -1 on error. */
long long fx_info_top_calls(const char *host, int port);

/* used_cpu_sys + used_cpu_user of host:port in seconds, or -1 on error. */
double fx_info_cpu(const char *host, int port);

/* A lock name's data as the server holds it, in the layout of whichever
 * protocol wrote it: `key` is the name's key, "<prefix>{<name>}" (protocol
 * 1: the lease hash, with fence, turn and record keys beside it; protocol
 * 2: one hash with the grant in field g, lua/p2/LAYOUT.txt). A test that
 * asserts what a call did to a name asks these, so that it holds whatever
 * protocol its clients write (DLOCK_TEST_PROTOCOL). */

/* The protocol of the name's data: 1, 2, or 0 when there is none (no key;
 * or a key of neither layout). */
int fx_key_protocol(redisContext *c, const char *key);

/* The time left of the grant of the name, in ms, by the server's clock:
 * its end (server ms) less the server's TIME; -2 when there is no grant (no
 * data, a grant released, or one that expired: protocol 1's key outlives
 * its grant by a lease time, as a fence; protocol 2's hash keeps its
 * fields). */
long long fx_lease_ms(redisContext *c, const char *key);

/* A field of the name's grant, malloc'd (free it), or NULL when there is
 * no grant (released, or no data; an expired grant still answers while its
 * data lives): what "token" (decimal) or "owner" (the client id). */
char *fx_grant_get(redisContext *c, const char *key, const char *what);

/* 1 if the name has data of any protocol, live or kept (protocol 1's lease
 * key, protocol 2's hash), else 0. */
int fx_key_has_data(redisContext *c, const char *key);

/* 1 if the server holds a turn of the name that has not run out (protocol
 * 1's turn key; protocol 2's field t, until its end), else 0. */
int fx_turn_live(redisContext *c, const char *key);

/* What the server remembers of client `id` for the name (protocol 1's
 * record key, protocol 2's field c:<id>), malloc'd, or NULL when none or
 * its time ran out. The first word is the client's newest attempt in both
 * layouts. */
char *fx_record_get(redisContext *c, const char *key, const char *id);

/* fx_lease_ms on fx_server, over a connection of its own. */
long long fx_server_lease_ms(const char *key);

/* The client name of the holder of the name's grant (dlock_config
 * client_name: protocol 1's field name, protocol 2's n), malloc'd, or NULL
 * when there is no grant (as fx_grant_get). */
char *fx_grant_client_name(redisContext *c, const char *key);

/* The server ms at which the name's grant was made (renewals keep it:
 * protocol 1's field since, protocol 2's exp less dur in g), or -1 when
 * there is no grant (as fx_grant_get). */
long long fx_grant_since_ms(redisContext *c, const char *key);

/* dlock_config_init, then points it at r with test-friendly timeouts
 * (connect 500 ms, command 1000 ms), and the protocol DLOCK_TEST_PROTOCOL
 * names, if set. */
void fx_config(dlock_config *cfg, const fx_redis *r);

/* Waits (at most 10 s) until c's subscriber thread has connected and sent
 * its SUBSCRIBE, so that its start-up traffic stays out of a measured
 * window. 0, or -1 if it did not within the bound. */
int fx_wait_subscriber(dlock_client *c);

/* Waits (at most 10 s) until some connection of r subscribes to channel
 * (PUBSUB NUMSUB): a client's subscriber thread subscribes after
 * dlock_client_open returns, so a message published before it would reach
 * nobody. 0, or -1 if none did within the bound. */
int fx_wait_channel(const fx_redis *r, const char *channel);

/* c's local entries (dlock_stats.entries) once they are down to 0, or the
 * count seen last after 10 s. A library thread still handling a wake-up
 * message for a name, or a renewal round in flight, keeps the entry it
 * looks at a moment after the last caller is done with it: under load,
 * milliseconds. Polling keeps a check that no entry leaks from failing on
 * that; 10 s is far above any such moment (a round is bounded by the
 * command timeout). */
uint64_t fx_entries_settled(dlock_client *c);

/* Monotonic time in ns, and a sleep in ms. */
long long fx_now_ns(void);
void fx_sleep_ms(long ms);

#endif
