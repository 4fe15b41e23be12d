/*
 * dlock: a two-tier distributed lock on Redis for heavily threaded C servers.
 *
 * One client per process (dlock_client_open) is shared by all its threads.
 * Threads of one client that want the same name are coalesced by the local
 * tier: at most one of them talks to Redis for that name at a time, the
 * others sleep, each parked on its own futex. Reentrant acquires cost no Redis
 * command. Across processes and machines, exclusion comes from a lease in
 * Redis owned by the client, renewed in batches by one renewal thread.
 *
 * Thread safety: every function may be called concurrently from any number
 * of threads on the same client. dlock_client_close must be the last call
 * on a client: no call may start after it; calls still running when it
 * starts are woken (as by dlock_client_shutdown) and waited for. Do not
 * call dlock_client_close from the on_lost or on_log callbacks (a call
 * that runs them may still be inside), nor cancel (pthread_cancel) a thread
 * inside a dlock call. The library installs a thread-exit hook (see
 * dlock_unclean): a program that dlopen()s it must not dlclose() it while
 * threads that took locks may still exit.
 *
 * Errors: functions return DLOCK_OK (0) or a negative DLOCK_E* code;
 * dlock_strerror() names it and dlock_last_error() gives the calling thread's
 * detailed message for its last failed call (for example hiredis' reason when
 * Redis is unreachable).
 */
#ifndef DLOCK_H
#define DLOCK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the public API: the only symbols the shared library exports. */
#if defined(__GNUC__) && __GNUC__ >= 4
#define DLOCK_API __attribute__((visibility("default")))
#else
#define DLOCK_API
#endif

/* Error codes: XX(name, value, message). One list generates the enum,
 * dlock_strerror() and dlock_err_name(). */
#define DLOCK_ERRNO_MAP(XX)                                                      \
    XX(EINVAL, -1, "invalid argument")                                           \
    XX(EBUSY, -2, "lock is held elsewhere")                                      \
    XX(ETIMEDOUT, -3, "timed out waiting for the lock")                          \
    XX(ENOTHELD, -4, "lock is not held by this thread")                          \
    XX(ELOST, -5, "lease was lost while held")                                   \
    XX(EREDIS, -6, "redis unreachable or failed")                                \
    XX(ENOMEM, -7, "out of memory")                                              \
    XX(EFORK, -8, "client used in a forked child; open a new client there")     \
    XX(ECLOSED, -9, "client is shutting down (dlock_client_shutdown)")          \
    XX(ESERVER, -10, "redis server unsuitable for dlock (version, eviction policy, "    \
                     "permissions or protocol)")                                 \
    XX(ECANCELED, -11, "acquire cancelled (dlock_cancel_fire)")

enum {
#define DLOCK_XX_(name, val, msg) DLOCK_##name = (val),
    DLOCK_ERRNO_MAP(DLOCK_XX_)
#undef DLOCK_XX_
    DLOCK_OK = 0 /* last: C89 allows no comma after the last enumerator */
};

/* Levels of the on_log callback. */
#define DLOCK_LOG_ERROR 0
#define DLOCK_LOG_WARN 1
#define DLOCK_LOG_INFO 2

/* The version of this header; dlock_version() gives the library's. */
#define DLOCK_VERSION_MAJOR 0
#define DLOCK_VERSION_MINOR 4
#define DLOCK_VERSION_PATCH 0
#define DLOCK_VERSION_STRING "0.4.0"
/* MAJOR * 10000 + MINOR * 100 + PATCH, for #if comparisons */
#define DLOCK_VERSION_NUMBER                                                   \
    (DLOCK_VERSION_MAJOR * 10000 + DLOCK_VERSION_MINOR * 100 + DLOCK_VERSION_PATCH)

/* The protocol this release writes by default with Redis (the layout of
 * its keys and messages and what its scripts expect: docs/design.md,
 * "Protocol versions"), and the protocols it reads and writes: 1 and 2,
 * chosen per client by dlock_config.protocol (2 by default since 0.4.0; 1
 * in 0.3.0). Clients share one Redis and one key prefix, whatever their
 * versions, when each reads the protocol every other writes. Data of a
 * protocol a client does not speak (0.2.0 meeting protocol 2's; any
 * release meeting a later one's, marked in the name's hash) is refused
 * with DLOCK_ESERVER, naming both protocols, and left as it was: never
 * misread (docs/operations.md, "Upgrades"). */
#define DLOCK_PROTOCOL_VERSION 2
#define DLOCK_PROTOCOL_LOWEST 1
#define DLOCK_PROTOCOL_HIGHEST 2

/* Limits, checked by every call that takes such an argument. */
#define DLOCK_NAME_MAX 512            /* bytes in a lock name, without the NUL */
#define DLOCK_PREFIX_MAX 64           /* bytes in key_prefix */
#define DLOCK_LEASE_MIN_MS 100u       /* shortest lease_ms accepted */
#define DLOCK_LEASE_MAX_MS 86400000u  /* longest lease_ms accepted (one day) */
#define DLOCK_TIMEOUT_MAX_MS 600000u  /* longest connect/command timeout */
#define DLOCK_PASS_LIMIT_MAX 1000000u /* largest pass_limit accepted */
#define DLOCK_WAITER_TTL_MIN_MS 100u  /* shortest waiter_ttl_ms accepted */
#define DLOCK_CLIENT_NAME_MAX 64      /* bytes in client_name */
#define DLOCK_MIN_REPLICAS_MAX 64u    /* largest min_replicas accepted */

typedef struct dlock_client dlock_client;

typedef struct dlock_config {
    const char *redis_host;     /* default "127.0.0.1" */
    int redis_port;             /* default 6379 */
    const char *redis_password; /* default NULL (no AUTH); with redis_username, that
                                   user's password */
    int redis_db;               /* default 0 */
    const char *key_prefix;     /* default "dlock:"; at most DLOCK_PREFIX_MAX bytes */
    uint32_t lease_ms;          /* default 30000; renewed every lease_ms/3 while held */
    uint32_t connect_timeout_ms, command_timeout_ms; /* defaults 1000 */
    uint32_t pass_limit;        /* consecutive local handoffs of one lease between
                                   threads of this client before it goes back to
                                   Redis for other clients; 0: no handoff;
                                   below lease_ms * 1000 and at most
                                   DLOCK_PASS_LIMIT_MAX; default 128
                                   (docs/performance.md: the measured
                                   trade-off) */
    /* Called once for each held lease that is lost (found gone in Redis, or
     * its validity ran out while Redis was unreachable), with the holder's
     * token. It runs outside every library lock, on the renewal thread (then
     * it must not block for long: it delays renewals) or, when a release is
     * the first to find the lease gone, on the releasing thread. It may call
     * dlock_held(); the holder itself learns of the loss from dlock_held() and
     * from its dlock_release(), which returns DLOCK_ELOST. */
    void (*on_lost)(const char *name, uint64_t fence, void *arg);
    void *on_lost_arg;
    uint32_t pool_size;         /* Redis connections shared by caller threads, each
                                   carrying batches of their script calls; default 4 */
    uint32_t waiter_ttl_ms;     /* a client waiting for a lock keeps its place in
                                   the lock's wait queue in Redis this long
                                   without news (its poller retries every
                                   waiter_ttl_ms/4, or at once when woken); a
                                   dead waiter is skipped after at most this;
                                   DLOCK_WAITER_TTL_MIN_MS..DLOCK_LEASE_MAX_MS;
                                   default 2000 */
    /* Where the server is: exactly one of redis_host/redis_port (the
     * default), redis_unix_path, sentinels and cluster_nodes names it.
     * Setting one of the last three while redis_host or redis_port differs
     * from its default is DLOCK_EINVAL (set redis_host to NULL, or leave
     * both alone). */
    const char *redis_unix_path;   /* connect over this Unix socket; default NULL */
    const char *sentinels;         /* "host:port,host:port,...": Sentinel mode; the
                                      master named sentinel_master is asked of them
                                      on every connect (docs/deployments.md);
                                      default NULL */
    const char *sentinel_master;   /* the master's name known to the sentinels;
                                      required with sentinels */
    const char *sentinel_password; /* AUTH for the sentinels; default NULL: none */
    const char *redis_username;    /* ACL user: AUTH redis_username redis_password
                                      (needs redis_password); default NULL: the
                                      default user */
    uint32_t min_replicas;         /* after each grant and each renewal, WAIT until
                                      this many replicas have it (at most half the
                                      command timeout); fewer: the grant is given
                                      back and the acquire fails with DLOCK_EREDIS,
                                      a renewal counts as not made. A lease is then
                                      on that many replicas before its holder runs,
                                      and a failover that promotes one of them (or
                                      one further ahead) keeps it;
                                      docs/deployments.md says when that holds. A release
                                      in another client then gives the lease with
                                      a wake-up, not a direct grant (one acquire
                                      more per crossing). 0..DLOCK_MIN_REPLICAS_MAX;
                                      default 0: no WAIT */
    const char *cluster_nodes;     /* "host:port,host:port,...": Redis Cluster mode;
                                      these seed nodes are asked for the slot map,
                                      and each lock name goes to the master of its
                                      slot (docs/deployments.md). key_prefix must
                                      hold no brace, redis_db must be 0, and a
                                      name must not start with '}' (DLOCK_EINVAL);
                                      default NULL */
    /* Called for events worth a line in the application's log: a lease
     * lost (however it was found: by the renewal, by its release, or while
     * it was passed between threads), a lease released by an operator
     * (dlockctl release --force), a thread that exited holding locks,
     * renewals failing and working again, the subscriber reconnecting, the
     * server found unfit for dlock (DLOCK_LOG_ERROR) and fit again.
     * level is one of DLOCK_LOG_*; message is one line without a newline,
     * valid during the call. It runs outside every library lock, on a
     * library thread (keep it short: it delays that thread's work) or on
     * the thread of the call that found the event. Default NULL: none. */
    void (*on_log)(int level, const char *message, void *arg);
    void *on_log_arg;
    const char *client_name;       /* who this client is, for operators: set with
                                      CLIENT SETNAME on each of its connections and
                                      stored with each lease it is granted, next to
                                      the grant's time (dlockctl shows both). At most
                                      DLOCK_CLIENT_NAME_MAX bytes, printable ASCII
                                      without spaces; default NULL: "<host>:<pid>" */
    uint32_t protocol;             /* the protocol this client writes to a name whose
                                      data is of no protocol or of this one: 1 or 2
                                      (DLOCK_PROTOCOL_LOWEST..DLOCK_PROTOCOL_HIGHEST;
                                      2 needs Redis 7.0: with an older server,
                                      calls that ask Redis fail with
                                      DLOCK_ESERVER saying so). An acquire that finds the
                                      name's data in the other protocol (an older or
                                      newer client holds it, or its data lives on)
                                      is sent again in that one, once, and the grant
                                      lives in it. Moving a fleet from 1 to 2 takes two
                                      steps (docs/operations.md, "Upgrades"): first
                                      every host runs a release that reads both
                                      (0.3.0, which writes 1 by default, or this one
                                      set to 1), then the hosts write 2. Default
                                      DLOCK_PROTOCOL_VERSION: 2 since 0.4.0 (1
                                      before); set 1 for a Redis older than 7.0 */
    uint32_t join_ms;                  /* the shared mode's join window
                                          (dlock_acquire_shared): other threads join
                                          this client's shared lease without Redis
                                          for this long after its grant; it bounds
                                          how long a writer of another client waits
                                          behind this client's readers; at most
                                          lease_ms; default 20 */
    /* Redlock mode (docs/guide.md, "Redlock"; docs/design.md, "Redlock"):
     * "host:port,host:port,...", an odd number (3 to 15) of independent
     * Redis masters (7.0 or later, each with maxmemory-policy
     * noeviction); one exclusive lease of a name is granted by a majority
     * m = N/2 + 1 of them. It names the servers instead of
     * redis_host/redis_port, redis_unix_path, sentinels and cluster_nodes
     * (setting two is DLOCK_EINVAL), and needs protocol 2 (DLOCK_EINVAL
     * otherwise; min_replicas too). A fresh deployment is seeded once by
     * an operator (`dlockctl --redlock-nodes LIST seed-fresh`, before any
     * client runs); until then acquires fail with DLOCK_EREDIS saying so.
     * What it guarantees:
     *   - fencing tokens of a name strictly increase from one acquire to
     *     any acquire whose first send comes after the first's grant
     *     (local handoffs included: a grant of token T reserves T ..
     *     T + pass_limit on a majority), whatever the servers' clocks do,
     *     as long as each node keeps what it wrote while its run lasts
     *     (no eviction, no rollback without a restart: any restart, with
     *     or without its data, is seen, and the node is re-seeded from a
     *     majority by the clients a lease + the drift allowance after they
     *     see it), at most N - m nodes are unseeded at once, and this
     *     host's CLOCK_BOOTTIME does not run slow by more than the drift
     *     allowance (1% of the lease + 2 ms);
     *   - mutual exclusion (no two clients hold a valid lease of a name at
     *     once) under the lease assumption besides: no node's lease runs
     *     out, in real time, before the validity its client computed
     *     (client and node clock rates and forward steps together within
     *     the drift allowance);
     *   - a held lease is renewed on the nodes that granted it, and
     *     granted by the renewals on a node that did not (down, cut off
     *     or refusing at the acquire) once it can (the name free there;
     *     at most 8 such leases per 256 held a round, one round trip
     *     each), so that a lease granted with one node of three down
     *     outlives the loss of another; it is lost (on_lost,
     *     dlock_held() 0, its release DLOCK_ELOST) once no majority of
     *     counting nodes confirmed a renewal before its validity ended,
     *     or when its release comes after that validity or finds more
     *     than N - m nodes without the grant (on_lost fires then, once);
     *     a lease found lost by the renewals is released on every node
     *     by the renewal thread (a minority that still holds it would
     *     keep it from the others for up to a lease), leaving the word
     *     that it expired for the next holder's dlock_unclean.
     * Each node is checked (Redis 7.0, noeviction) when a connection to
     * it opens, and while the client runs by the periodic server check,
     * one node per check in turn (every lease_ms / 3, 1 to 30 s apart: a
     * node changed under the clients is found within N such periods, a
     * check of a node that does not answer before the next renewal round
     * is due is given up and counts for nothing); while the last check of
     * any node found it unfit, acquires that ask the nodes fail with
     * DLOCK_ESERVER naming the node (an evicting node may lose a mark,
     * which the tokens' order relies on). An acquire needs m reachable
     * nodes that count: a node counts once seeded in its current run (a
     * fresh deployment by dlockctl seed-fresh; a restarted node by the
     * clients, a lease + the drift allowance after the first of them saw
     * it), for every client at once, a client that starts fresh too (the
     * run is read when a connection opens: each address must reach its
     * server directly, or through a proxy that closes the client's
     * connection when the server's closes, never one that keeps it
     * across a restart of the server behind it); a
     * try fails with DLOCK_EREDIS while too few count. A waiting acquire
     * that finds too few nodes counting tries again every lease_ms / 10
     * (5 ms to lease_ms / 3) while its wait leaves time for another try,
     * then fails with DLOCK_EREDIS (up to one such pause before wait_ms
     * ends; one that waits forever waits for the nodes). A renewal round renews
     * every held name in one pipelined exchange per node per 256 names
     * (each lease confirmed by its own majority): a stopped node delays
     * each such exchange by up to a connect and a command timeout, so
     * keep (held names / 256, rounded up) x (connect_timeout_ms +
     * command_timeout_ms) well below lease_ms / 3 (semaphores over the
     * nodes: twice that, their names' claims are a second exchange);
     * an acquire or release
     * meets it once, then skips a node whose last exchange did not
     * answer for up to a second (a third of the lease; an answer to a
     * renewal or a background job ends the skipping).
     * A close releases the held names by one such bound for all of them
     * (a node that failed one release is not asked for the others: what
     * it holds ends within a lease).
     * dlock_unclean after a grant of the nodes tells the end that at
     * least m of the nodes that granted it report alike (each tells its
     * own, as one server does, for a lease time after the end); else 0
     * (nothing a majority knows): a release that reached a majority is a
     * release, though a node it missed tells EXPIRED; a grant that
     * expired on fewer than m of the voters (the others did not hold it,
     * or their word is gone) is told as 0.
     * Waiting: a waiting acquire is queued on every node that refuses
     * it and woken by a release on any node (a subscriber per node;
     * without a message it tries again after the holder's lease time
     * left, 5 ms to the smaller of lease_ms / 3 and waiter_ttl_ms / 4,
     * jittered; that bound when only other waiters' turns refused it).
     * Its order: if client A is queued ahead of client B on a
     * majority of the nodes and stays live there, B is handed a token
     * only after one of those nodes granted A (not FIFO of hand-outs:
     * docs/design.md "Redlock", "The order guaranteed"); a wait whose
     * try got some votes but fewer than m keeps them unless a node that
     * refused it is held by a client whose wait began first, by the
     * clients' wall clocks (wait-die: no deadlock or starvation between
     * waits, within the spread of the clients' clocks; a waiter that
     * dies keeping a split vote holds those nodes for a lease). A wait
     * leaves every node's queue once granted or given up, in the
     * background; its places stay alive while connect_timeout_ms +
     * 2 x command_timeout_ms (a try with a node stopped) stays well
     * below waiter_ttl_ms / 2. A waiting holder's client name on the
     * nodes is "<client_name>@<ticket>.<id>". Each client subscribes
     * to every node (N connections and threads).
     * Shared mode works in this mode too: shared leases of several
     * clients side by side, none beside an exclusive lease; a shared
     * token is above every token handed out before its acquire began
     * and above the last exclusive token, the next exclusive token above
     * it; two shared leases whose acquires overlapped are in no order
     * (docs/design.md "Redlock", Shared mode). A waiting shared acquire
     * also gives its split vote back when a node refused it naming no
     * holder. Semaphores: a limit of at most 64, each permit a slot,
     * an exclusive quorum lock of its own (dlock_sem_acquire).
     * `dlockctl --redlock-nodes LIST` list, show and watch read every
     * node (docs/operations.md, "Redlock"). Default NULL: not Redlock
     * mode. */
    const char *redlock_nodes;
} dlock_config;

/* Fills *cfg with the defaults above. Always call it before setting fields,
 * so that fields added later get their defaults. */
DLOCK_API void dlock_config_init(dlock_config *cfg);

/* Opens a client: one per process, shared by its threads. Copies everything
 * it needs from *cfg (strings included). Starts the renewal thread and tries
 * to connect; an unreachable Redis is not an error here (every later call
 * reports it as DLOCK_EREDIS and reconnects), so a server may start before
 * its Redis. Returns DLOCK_OK and sets *out, or DLOCK_EINVAL for a NULL or
 * out-of-range argument (the message says which), or DLOCK_ENOMEM. */
DLOCK_API int dlock_client_open(const dlock_config *cfg, dlock_client **out);

/* Begins an orderly stop of the client, from any thread, while others are
 * inside calls on it:
 *   - every acquire waiting for a lock (dlock_acquire, dlock_acquire_ex,
 *     dlock_acquire_handle...) returns DLOCK_ECLOSED: a waiting thread at
 *     once, a thread inside a Redis call once that call returns (within the
 *     command timeout); a grant that call brings back is given back to Redis
 *     in the background. An acquire that was granted the lock before the
 *     shutdown began returns DLOCK_OK;
 *   - every later acquire returns DLOCK_ECLOSED at once, reentrant ones too;
 *   - locks still held stay held and renewed until released; their releases
 *     give the leases back to Redis (never to another thread of this client),
 *     and dlock_held, the handles, stats and metrics work as before.
 * Returns DLOCK_OK (also when called again), DLOCK_EINVAL for NULL,
 * DLOCK_EFORK in a forked child. Then release what is held and call
 * dlock_client_close. */
DLOCK_API int dlock_client_shutdown(dlock_client *c);

/* Stops the client and frees it. If threads are still inside calls on it,
 * it first does what dlock_client_shutdown does and waits until they have
 * returned (a waiting acquire returns DLOCK_ECLOSED within the command
 * timeout; a release under way finishes). Then it stops the renewal thread,
 * releases in Redis every lease the client still holds, and frees the
 * client. No call on c may start after close has started, and threads that
 * still held locks must not use them afterwards (their leases are released
 * here). NULL is ignored. In a forked child the parent's client is only
 * forgotten: nothing is released or freed there. */
DLOCK_API void dlock_client_close(dlock_client *c);

/* Acquires the lock `name` for the calling thread.
 *   wait_ms == 0: try once; DLOCK_EBUSY if the lock is held elsewhere (by
 *                 another process, or by or for another thread of this client).
 *   wait_ms  > 0: wait at most that long; DLOCK_ETIMEDOUT when it runs out.
 *   wait_ms  < 0: wait until acquired.
 * On DLOCK_OK the thread holds the lock and, if fence is not NULL, *fence is
 * the fencing token of this grant: strictly greater than every token given
 * before for this name, across all clients, whatever steps the Redis
 * server's clock makes, but for a loss of Redis' data while its clock is
 * behind a token and one narrow window after a step back (docs/guide.md,
 * "Fencing tokens"). Reentrant: a thread that holds
 * the lock acquires it again at once, with no Redis command, and gets the
 * same token; each acquire needs its own release.
 * Bounds. The deadline (now + wait_ms; for a try, now + the command
 * timeout, spent waiting for a connection at most) is kept while waiting,
 * for a connection too: no Redis exchange starts after it. An exchange takes
 * at most one command timeout, and a call that must first open a connection
 * the connect timeout plus one command timeout more (its whole setup, AUTH
 * to SCRIPT LOAD, is one pipelined exchange). So an acquire returns within
 * wait_ms + the connect timeout + two command timeouts, a try within the
 * connect timeout + three command timeouts, whatever the server does; a
 * wait forever ends with the lock or an error. A server that leaves an
 * exchange unanswered for a command timeout is taken for stuck: the calls
 * waiting for a connection to it fail with that exchange (DLOCK_EREDIS),
 * whatever their own deadlines, instead of each waiting another timeout.
 * Measured (test_deadline, timeouts 1000 ms): 256 tries on a frozen server
 * all fail within 1.0 s; an acquire with 100 ms to wait that must open a
 * connection to a server answering 900 ms late gets the lock after 1.8 s.
 * In Cluster mode TRYAGAIN and CLUSTERDOWN are retried until the deadline
 * (a wait forever: for 10 command timeouts); a shutdown or a fired cancel
 * token ends the retries. Signals delivered to the calling thread (interval
 * timers, profilers) do not stretch any of these bounds.
 * Errors: DLOCK_EINVAL (NULL client or name, empty name, name longer than
 * DLOCK_NAME_MAX), DLOCK_ETIMEDOUT and DLOCK_EBUSY (dlock_last_error() names
 * the holder's client_name, how long it has held the lease, when the lease
 * ends and how many clients wait for it), DLOCK_EREDIS (Redis unreachable
 * or failed, within the bounds above; when Redis could not be reached, did
 * not answer in time or answered with an error, dlock_last_error() starts
 * with "unreachable:", "timed out:" or "refused by the server:" ("not a
 * Redis server:" when something else answered on the port) and names the
 * step and, for a connection's setup, the server's address; if the outcome
 * of the acquire is unknown, the renewal
 * thread releases that grant in the background, or it expires after
 * lease_ms; threads of this client that waited behind the failed call fail
 * with it), DLOCK_ESERVER (the server is older than Redis 5, or than
 * Redis 7.0 with protocol 2, or may evict keys: maxmemory set with a policy
 * other than noeviction; or it refused the credentials or an ACL user's
 * permission: WRONGPASS, NOPERM; or the name holds data of a protocol this
 * release does not speak (DLOCK_PROTOCOL_LOWEST..DLOCK_PROTOCOL_HIGHEST),
 * which is left as it was; dlock_last_error() says which; no retry cures
 * it, but for one case: the name's data moved from one protocol to the
 * other and back between the three sends of one try, seldom, and a retry
 * finds it where it is); the renewal
 * thread checks the server's version and eviction policy again every
 * lease_ms/3, at least 1 s and at most 30 s apart (in Cluster mode, the
 * masters it renews leases on), and while that check finds the server
 * unfit every acquire that asks Redis fails so; a held lock stays held and
 * reentrant), DLOCK_ELOST (a nested acquire while the
 * held lease is lost), DLOCK_ECLOSED (dlock_client_shutdown was called), DLOCK_EFORK,
 * DLOCK_ENOMEM. */
DLOCK_API int dlock_acquire(dlock_client *c, const char *name, int64_t wait_ms, uint64_t *fence);

/*
 * Cancelling a waiting acquire from another thread (for request deadlines
 * and event loops). A cancel token is fired once, from any thread; every
 * acquire that uses it and has not returned yet returns DLOCK_ECANCELED:
 * a waiting thread at once, a thread inside a Redis call once that call
 * returns (within the command timeout; a grant it brings back is given back
 * in the background). An acquire that was granted the lock before it saw the
 * token fired returns DLOCK_OK (release it as usual). An acquire that
 * starts with a fired token returns DLOCK_ECANCELED at once. One token may
 * serve any number of acquires, at once or one after the other, on any
 * clients.
 */
typedef struct dlock_cancel dlock_cancel;

/* A new token, not fired. DLOCK_OK, DLOCK_EINVAL (NULL out), DLOCK_ENOMEM. */
DLOCK_API int dlock_cancel_create(dlock_cancel **out);

/* Fires the token: the acquires using it return DLOCK_ECANCELED (above).
 * Any thread, any number of times; NULL is ignored. */
DLOCK_API void dlock_cancel_fire(dlock_cancel *k);

/* 1 if the token is fired, else 0 (also for NULL). */
DLOCK_API int dlock_cancel_fired(dlock_cancel *k);

/* Makes a fired token usable again (not fired). Call it only while no
 * acquire uses it. NULL is ignored. */
DLOCK_API void dlock_cancel_reset(dlock_cancel *k);

/* Frees the token. No acquire may be using it. NULL is ignored. */
DLOCK_API void dlock_cancel_destroy(dlock_cancel *k);

/* Options of dlock_acquire_ex and dlock_acquire_handle_ex. */
typedef struct dlock_acquire_opts {
    dlock_cancel *cancel; /* fired: the acquire returns DLOCK_ECANCELED; NULL: none */
} dlock_acquire_opts;

/* Fills *o with the defaults (no cancel token). Always call it before
 * setting fields, so that fields added later get their defaults. */
DLOCK_API void dlock_acquire_opts_init(dlock_acquire_opts *o);

/* dlock_acquire with options (NULL: the defaults, which is dlock_acquire).
 * Errors: those of dlock_acquire, and DLOCK_ECANCELED. */
DLOCK_API int dlock_acquire_ex(dlock_client *c, const char *name, int64_t wait_ms,
                               uint64_t *fence, const dlock_acquire_opts *opts);

/* Releases one level of the calling thread's hold on `name`; the outermost
 * release gives the lease back to Redis (or, with a local handoff, to a waiting
 * thread of this client). Returns DLOCK_OK (also when the release had to be
 * sent again on a new connection after the first try ran: a release is
 * idempotent); DLOCK_ENOTHELD if the calling thread does not hold `name`
 * (nothing changes); DLOCK_ELOST if the lease had been lost while held (the
 * lock is released locally all the same); DLOCK_EREDIS or DLOCK_ESERVER if
 * Redis could not be told (the lock is released locally and the lease
 * expires in Redis after at most lease_ms); DLOCK_EINVAL, DLOCK_EFORK. */
DLOCK_API int dlock_release(dlock_client *c, const char *name);

/*
 * Shared (read) mode of the same name that dlock_acquire takes exclusively
 * (docs/guide.md, "Shared mode"): any number of shared holders across
 * threads and clients, or one exclusive holder, never both, as long as
 * every lease stays valid (the assumptions of dlock_acquire: the server's
 * clock does not step back by more than a lease, no failover or restart
 * loses the writes, this host's clock runs at most 1% fast).
 *
 * A client holds one shared lease of a name in Redis (protocol 2, whatever
 * the protocol setting: protocol 1 has no shared mode), renewed like an
 * exclusive one; its threads share it. While the client holds it, another
 * thread's shared acquire costs no Redis command if no thread of the client
 * waits for the name exclusively and the lease was granted less than
 * dlock_config.join_ms ago (the join window, 20 ms by default); otherwise the thread waits for the lease to go
 * back and asks Redis. Writers do not starve: once an exclusive request
 * waits in Redis no client gets a new shared grant, so a writer waits at
 * most for the shared holders granted before it, each client's for its
 * join window plus the longest shared hold begun in it.
 *
 * Reentrancy: a shared holder may take the name shared again (one more
 * level); a thread holding it exclusively may take it shared (one more
 * level of its exclusive hold, released by dlock_release_shared); a thread
 * holding it shared may not take it exclusively (DLOCK_EINVAL: two
 * upgraders would wait for each other forever); release it first.
 *
 * Fencing: *fence (if fence) is the shared grant's token, the same for
 * every holder of the grant: it is above every token handed out before it
 * and below every exclusive token handed out after it (exclusive tokens
 * stay strictly increasing); two shared holders may share a token.
 * dlock_unclean tells a shared holder how the last exclusive hold before
 * its grant ended; a shared hold's own end is told to nobody.
 *
 * wait_ms as for dlock_acquire. Errors: those of dlock_acquire, and
 * DLOCK_EINVAL for an upgrade (above). A thread that exits holding the name
 * shared has its holds released for it, as for dlock_acquire.
 */
DLOCK_API int dlock_acquire_shared(dlock_client *c, const char *name, int64_t wait_ms,
                                   uint64_t *fence);

/* dlock_acquire_shared with options (NULL: the defaults). Errors: those of
 * dlock_acquire_shared, and DLOCK_ECANCELED. */
DLOCK_API int dlock_acquire_shared_ex(dlock_client *c, const char *name, int64_t wait_ms,
                                      uint64_t *fence, const dlock_acquire_opts *opts);

/* Releases one level of the calling thread's shared hold on `name`; the
 * last holder of the client's shared lease gives it back to Redis.
 * DLOCK_OK; DLOCK_ENOTHELD if the calling thread does not hold `name`
 * shared (nothing changes); DLOCK_ELOST if the lease was lost, or ran out,
 * while held (released locally all the same); DLOCK_EREDIS or
 * DLOCK_ESERVER if Redis could not be told (the lease expires after at most
 * lease_ms); DLOCK_EINVAL, DLOCK_EFORK. */
DLOCK_API int dlock_release_shared(dlock_client *c, const char *name);

/*
 * Counting semaphore (docs/guide.md, "Semaphores"): at most `limit` permits
 * of `name` are held at once across all clients and threads; each
 * dlock_sem_acquire takes one permit for the calling thread, each
 * dlock_sem_release gives one back (a thread may hold several). A name is
 * a lock or a semaphore, never both: a name that holds a lock's data in
 * Redis is refused with DLOCK_ESERVER, one this client uses as a lock with
 * DLOCK_EINVAL (and the other way round).
 *
 * Permits belong to this client's lease of the name in Redis (protocol 2,
 * whatever the protocol setting), renewed with the others; a client that
 * dies frees its permits a lease time after its last renewal, never later.
 * The limit holds as long as every lease stays valid, under dlock_acquire's
 * assumptions (no failover or restart loses the writes, this host's clock
 * runs at most 1% fast; the server's clock may step back by any amount:
 * lua/p2/SEM.txt, "Clock"). Waiting clients are served first come, first
 * served, in Redis; a client's threads queue locally behind one thread
 * that asks Redis. A permit one thread gives back goes to another waiting
 * thread of the same client without a Redis command, at most pass_limit
 * times in a row, then back to Redis. Permits have no fencing token.
 *
 * `limit` (1 or more) must be the one every current holder and waiter of
 * the name uses: otherwise DLOCK_EINVAL, with a message naming both; once
 * nobody holds or waits, a new limit takes over (in Redlock mode, about
 * two leases later: the name's claim, below). wait_ms as for
 * dlock_acquire. Errors: those of dlock_acquire (DLOCK_EBUSY, DLOCK_ETIMEDOUT,
 * DLOCK_EREDIS, DLOCK_ESERVER, DLOCK_ECLOSED, DLOCK_ENOMEM, DLOCK_EINVAL,
 * DLOCK_EFORK). A thread that exits holding permits has them given back for
 * it. on_lost runs with fence 0 when the renewal finds this client's
 * permits of a name gone; each thread holding one then gets DLOCK_ELOST
 * from its release.
 *
 * In Redlock mode (redlock_nodes; docs/guide.md, "Redlock") the limit is
 * at most 64: a permit is one of the name's `limit` slots, each an
 * exclusive quorum lock of its own (its keys "<prefix>{<name>}:s<k>..."),
 * so the limit holds wherever the mode's exclusion holds, under its
 * assumptions (dlock_acquire, Redlock mode). One slot of this client lost
 * loses all its permits of the name (on_lost once). A try asks each slot
 * this client does not hold in turn, one quorum exchange each; a wait
 * queues on every slot it asks (a release of any of them grants it to
 * the first waiter of that slot's queue, and wakes it), and leaves the
 * others' queues once it has a permit (or gives up).
 * A try first claims the name on the nodes for its
 * limit (one more quorum exchange) unless this client's own claim holds
 * two thirds of a lease more, and the renewals claim it again while permits are
 * held: while a claim lives on a majority, a second limit (DLOCK_EINVAL)
 * and a lock of the name (DLOCK_ESERVER from dlock_acquire; the name
 * holding a lock's data: DLOCK_ESERVER from this call) are refused across
 * clients, under the same assumptions as the exclusion (a refusal by
 * fewer nodes is no refusal: a wait goes on). A claim ends about two
 * leases after this client's last permit or try of the name. Not yet in
 * this mode: the waiting clients are served in order per slot, not
 * across a name's slots.
 */
DLOCK_API int dlock_sem_acquire(dlock_client *c, const char *name, uint32_t limit,
                                int64_t wait_ms);

/* dlock_sem_acquire with options (NULL: the defaults). Errors: those of
 * dlock_sem_acquire, and DLOCK_ECANCELED. */
DLOCK_API int dlock_sem_acquire_ex(dlock_client *c, const char *name, uint32_t limit,
                                   int64_t wait_ms, const dlock_acquire_opts *opts);

/* Gives back one permit of `name` that the calling thread holds: to a
 * thread of this client that waits for one, or to Redis. DLOCK_OK;
 * DLOCK_ENOTHELD if the calling thread holds no permit of `name` (nothing
 * changes); DLOCK_ELOST if the permit was lost, or ran out, while held
 * (released locally all the same); DLOCK_EREDIS or DLOCK_ESERVER if Redis
 * could not be told (the permit ends in Redis within the longer of lease_ms
 * and waiter_ttl_ms after this client stops holding permits of the name: a
 * permit granted directly lasts at least the waiter ttl); DLOCK_EINVAL,
 * DLOCK_EFORK. */
DLOCK_API int dlock_sem_release(dlock_client *c, const char *name);

/*
 * Unclean ends. Like a robust mutex's EOWNERDEAD, a holder learns whether
 * the hold before its own ended other than by its holder's release, so
 * that it can check the data the lock protects:
 *   DLOCK_UNCLEAN_ABANDONED  the holder's thread exited holding it (the
 *                            library released it: see below), or its
 *                            client was closed while a thread held it;
 *   DLOCK_UNCLEAN_EXPIRED    the grant expired unreleased: its process died
 *                            or stalled past the lease, its lease was lost,
 *                            or its release never reached Redis (also a
 *                            direct grant to a waiter that died unused);
 *   DLOCK_UNCLEAN_FORCED     an operator released it (dlockctl release
 *                            --force).
 * Redis keeps the word for a lease time after such an end (an operator's
 * release: an hour): a grant made later reports 0, as does any grant after
 * Redis lost its data (a restart without persistence, a failover that lost
 * the writes). In Redlock mode each node keeps its own word, and a grant
 * reports the word a majority of the nodes tell alike, else 0
 * (dlock_config.redlock_nodes). A grant nobody used (an attempt of unknown outcome, a direct
 * grant to a waiter that gave up) passes on the word it got.
 *
 * A thread that exits while it holds locks taken with dlock_acquire (a
 * thread-exit hook, installed at its first acquire) has each of them
 * released for it, through on_log (DLOCK_LOG_WARN, with the name and the
 * thread's id) and dlock_stats.abandoned; the next holder is told
 * DLOCK_UNCLEAN_ABANDONED. (A process that ends never runs the hook: its
 * leases expire, DLOCK_UNCLEAN_EXPIRED.) Handles belong to no thread.
 */
#define DLOCK_UNCLEAN_ABANDONED 1
#define DLOCK_UNCLEAN_EXPIRED 2
#define DLOCK_UNCLEAN_FORCED 3

/* For the calling thread's hold of `name`: 0 if the hold before it ended by
 * its holder's release (or nothing is known of it), else one of
 * DLOCK_UNCLEAN_*. The same for every reentrant acquire of one hold; a
 * thread that gets the lock by a local handoff is told how the releasing
 * thread's hold ended. No Redis command. Errors: DLOCK_ENOTHELD (the
 * calling thread does not hold `name`), DLOCK_EINVAL, DLOCK_EFORK. */
DLOCK_API int dlock_unclean(dlock_client *c, const char *name);

/* 1 if the calling thread holds `name` (exclusively, shared, or a permit
 * of semaphore `name` not lost) and its lease is still valid (known
 * renewed in time, by the local clock with a drift margin), else 0. The local
 * clock is CLOCK_BOOTTIME, which keeps counting through a system suspend.
 * Costs no Redis command. Returns 0 for invalid arguments and in a forked
 * child. */
DLOCK_API int dlock_held(dlock_client *c, const char *name);

/*
 * Locks that move between threads. A lock taken with dlock_acquire belongs
 * to the calling thread: only it may release it, and it may take it again
 * (reentrancy). A lock taken with dlock_acquire_handle belongs to the
 * returned handle instead: any thread may release it, once, with
 * dlock_handle_release (for a job that hops between threads of a pool).
 * It is not reentrant: an acquire of the same name by any thread of the
 * client, the acquiring one included, waits for the handle's release like
 * any other waiter. Renewal, fencing, loss and handoff to waiting threads
 * work as for a thread-owned lock. A shared hold (dlock_acquire_shared_handle)
 * and a semaphore's permit (dlock_sem_acquire_handle) can belong to a handle
 * too, released the same way; they are holds like a thread's of their mode
 * (the client's other shared acquires join it within the join window and
 * wait for its release after; other permits are taken beside it). A handle must be released before
 * dlock_client_close; one never released leaks its memory and holds the lease
 * until the client closes. A thread that exits leaves its handles held.
 */
typedef struct dlock_handle dlock_handle;

/* As dlock_acquire, but the lock belongs to *out. Errors: those of
 * dlock_acquire, and DLOCK_EINVAL also for a NULL out or when the calling
 * thread holds `name` already (take the handle instead of, not on top of, a
 * thread's hold). */
DLOCK_API int dlock_acquire_handle(dlock_client *c, const char *name, int64_t wait_ms,
                                   uint64_t *fence, dlock_handle **out);

/* dlock_acquire_handle with options (dlock_acquire_ex; NULL: the defaults).
 * Errors: those of dlock_acquire_handle, and DLOCK_ECANCELED. */
DLOCK_API int dlock_acquire_handle_ex(dlock_client *c, const char *name, int64_t wait_ms,
                                      uint64_t *fence, dlock_handle **out,
                                      const dlock_acquire_opts *opts);

/* As dlock_acquire_handle, but the handle holds `name` shared (as
 * dlock_acquire_shared): one more holder of the client's shared lease,
 * beside its threads' shared holds and other handles; a thread asking
 * `name` exclusively waits for its release like any other writer, and so
 * does a shared acquire of this client once the join window of the lease
 * has closed (dlock_config.join_ms: as beside a thread's long shared hold),
 * so a thread must not wait without a bound for a shared hold of a name
 * while it keeps a shared handle of it. Errors:
 * those of dlock_acquire_shared, and DLOCK_EINVAL also for a NULL out or
 * when the calling thread holds `name` already, exclusively or shared. */
DLOCK_API int dlock_acquire_shared_handle(dlock_client *c, const char *name, int64_t wait_ms,
                                          uint64_t *fence, dlock_handle **out);

/* dlock_acquire_shared_handle with options (NULL: the defaults). Errors:
 * those of dlock_acquire_shared_handle, and DLOCK_ECANCELED. */
DLOCK_API int dlock_acquire_shared_handle_ex(dlock_client *c, const char *name,
                                             int64_t wait_ms, uint64_t *fence,
                                             dlock_handle **out,
                                             const dlock_acquire_opts *opts);

/* As dlock_sem_acquire, but the permit belongs to *out: any thread gives
 * it back, with dlock_handle_release (which passes it to a waiting thread
 * or to Redis, as dlock_sem_release does). The calling thread may hold
 * permits of `name` besides. Errors: those of dlock_sem_acquire, and
 * DLOCK_EINVAL also for a NULL out. */
DLOCK_API int dlock_sem_acquire_handle(dlock_client *c, const char *name, uint32_t limit,
                                       int64_t wait_ms, dlock_handle **out);

/* dlock_sem_acquire_handle with options (NULL: the defaults). Errors:
 * those of dlock_sem_acquire_handle, and DLOCK_ECANCELED. */
DLOCK_API int dlock_sem_acquire_handle_ex(dlock_client *c, const char *name, uint32_t limit,
                                          int64_t wait_ms, dlock_handle **out,
                                          const dlock_acquire_opts *opts);

/* Releases the handle's hold (exclusive, shared or a permit), from any
 * thread, and frees the handle (it must not be used again). Returns as
 * dlock_release (dlock_release_shared, dlock_sem_release): DLOCK_OK,
 * DLOCK_ELOST (lost while held; released locally all the same),
 * DLOCK_EREDIS or DLOCK_ESERVER (Redis could not be told; the lease
 * expires), DLOCK_EINVAL (NULL handle: nothing freed), DLOCK_EFORK (in a
 * forked child: nothing freed). */
DLOCK_API int dlock_handle_release(dlock_handle *h);

/* 1 if the handle's hold is still valid (as dlock_held; a permit: not lost
 * and its lease valid), else 0; 0 for a NULL handle and in a forked child
 * (which holds nothing). Any thread; no Redis command. */
DLOCK_API int dlock_handle_held(dlock_handle *h);

/* dlock_unclean for a handle's hold (0 for a permit: a semaphore keeps no
 * word of how permits ended). Returns 0, DLOCK_UNCLEAN_*, DLOCK_EINVAL for
 * a NULL handle, or DLOCK_EFORK in a forked child. Any thread. */
DLOCK_API int dlock_handle_unclean(dlock_handle *h);

/* Acquires `name` (as dlock_acquire with wait_ms), runs fn(arg, fence)
 * holding it, and releases it. Returns dlock_acquire's error if it was not
 * acquired (fn did not run), else dlock_release's result: DLOCK_OK, or
 * DLOCK_ELOST when the lease was lost while fn ran (its writes may have been
 * rejected by storage that checks fence). DLOCK_EINVAL for a NULL fn. */
DLOCK_API int dlock_with(dlock_client *c, const char *name, int64_t wait_ms,
                         void (*fn)(void *arg, uint64_t fence), void *arg);

/* dlock_with in shared mode: dlock_acquire_shared, fn(arg, fence),
 * dlock_release_shared. Returns as dlock_with. */
DLOCK_API int dlock_with_shared(dlock_client *c, const char *name, int64_t wait_ms,
                                void (*fn)(void *arg, uint64_t fence), void *arg);

/* dlock_with for one permit of a semaphore: takes one (as
 * dlock_sem_acquire), runs fn(arg), gives that permit back (not another the
 * thread holds). Returns dlock_sem_acquire's error if no permit was taken
 * (fn did not run), else the give-back's result (DLOCK_ELOST: the permit
 * was lost while fn ran). DLOCK_EINVAL for a NULL fn. */
DLOCK_API int dlock_sem_with(dlock_client *c, const char *name, uint32_t limit,
                             int64_t wait_ms, void (*fn)(void *arg), void *arg);

#if defined(__GNUC__) || defined(__clang__)
/*
 * A scope guard (GCC and Clang): the lock is released when the guard's
 * scope ends, however it ends (return, break, goto).
 *
 *     {
 *         DLOCK_GUARD(g);
 *         uint64_t fence;
 *         if (dlock_guard_acquire(&g, c, "order:42", 5000, &fence) != DLOCK_OK)
 *             return;
 *         ...                           (released at the closing brace)
 *     }
 *
 * dlock_guard_acquire_shared takes the name shared instead, and
 * dlock_guard_sem_acquire one permit of a semaphore (its scope's end gives
 * back one permit of the name as dlock_sem_release does: a lost one the
 * thread holds first). The release's result is not reported (the guard
 * ends with the scope): where a lost lease matters, check dlock_held(c,
 * name) before leaving the scope. name must outlive the scope.
 */
typedef struct dlock_guard {
    dlock_client *c;
    const char *name;
    int held; /* 0: nothing; 1: exclusive; 2: shared; 3: a permit */
} dlock_guard;

static __inline__ void dlock_guard_release_(dlock_guard *g)
{
    if (g->held == 1)
        (void)dlock_release(g->c, g->name);
    else if (g->held == 2)
        (void)dlock_release_shared(g->c, g->name);
    else if (g->held == 3)
        (void)dlock_sem_release(g->c, g->name);
    g->held = 0;
}

#define DLOCK_GUARD(var)                                                          \
    __attribute__((cleanup(dlock_guard_release_))) dlock_guard var = {0, 0, 0}

/* The guard takes the hold that rc says was taken (held: its mode). */
static __inline__ int dlock_guard_took_(dlock_guard *g, dlock_client *c, const char *name,
                                        int rc, int held)
{
    if (rc == DLOCK_OK) {
        g->c = c;
        g->name = name;
        g->held = held;
    }
    return rc;
}

/* Acquires into the guard (as dlock_acquire); on DLOCK_OK the scope's end
 * releases it. A guard holds one lock at a time: DLOCK_EINVAL if it holds
 * one already. */
static __inline__ int dlock_guard_acquire(dlock_guard *g, dlock_client *c, const char *name,
                                          int64_t wait_ms, uint64_t *fence)
{
    if (g->held)
        return DLOCK_EINVAL;
    return dlock_guard_took_(g, c, name, dlock_acquire(c, name, wait_ms, fence), 1);
}

/* As dlock_guard_acquire, shared (as dlock_acquire_shared). */
static __inline__ int dlock_guard_acquire_shared(dlock_guard *g, dlock_client *c,
                                                 const char *name, int64_t wait_ms,
                                                 uint64_t *fence)
{
    if (g->held)
        return DLOCK_EINVAL;
    return dlock_guard_took_(g, c, name, dlock_acquire_shared(c, name, wait_ms, fence), 2);
}

/* As dlock_guard_acquire, one permit of a semaphore (as dlock_sem_acquire). */
static __inline__ int dlock_guard_sem_acquire(dlock_guard *g, dlock_client *c, const char *name,
                                              uint32_t limit, int64_t wait_ms)
{
    if (g->held)
        return DLOCK_EINVAL;
    return dlock_guard_took_(g, c, name, dlock_sem_acquire(c, name, limit, wait_ms), 3);
}
#endif

/* Counters of one client since it was opened, read without stopping it. */
typedef struct dlock_stats {
    uint64_t acquisitions;       /* successful dlock_acquire calls, nested ones included */
    uint64_t grants;             /* leases granted by Redis */
    uint64_t handoffs;           /* leases passed from thread to thread with no Redis command */
    uint64_t redis_commands;     /* commands sent to Redis by lock calls and renewals */
    uint64_t redis_round_trips;  /* round trips to Redis (a pipeline counts once) */
    uint64_t renew_rounds;       /* renewal periods in which leases were renewed */
    uint64_t renew_round_trips;  /* round trips spent renewing */
    uint64_t renew_keys;         /* leases renewed, summed over rounds */
    uint64_t leases_held;        /* leases held right now */
    uint64_t leases_lost;        /* leases found lost while held */
    uint64_t entries;            /* local entries (names some thread holds or waits for;
                                    a library thread handling a wake-up message or a
                                    renewal round keeps the entry it looks at a moment
                                    longer) */
    uint64_t subscriber_commands; /* sent by the subscriber thread: SUBSCRIBE, keepalive
                                     PINGs, connection setup (not in redis_commands) */
    uint64_t direct_grants;      /* of grants, those a release in another client made
                                    to this one while it waited, taken from the message
                                    that told it, with no acquire call */
    uint64_t timeouts;           /* dlock_acquire calls that returned DLOCK_ETIMEDOUT */
    uint64_t busy;               /* ... DLOCK_EBUSY (a single try found it held) */
    uint64_t errors;             /* dlock_acquire and dlock_release calls that failed
                                    otherwise (by code: dlock_client_metrics_prometheus) */
    uint64_t renewed;            /* leases Redis confirmed renewed, summed over rounds */
    uint64_t renew_failures;     /* renewal rounds that left a lease unconfirmed (Redis
                                    failed or did not answer in time) */
    uint64_t forced_releases;    /* held leases an operator released (dlockctl
                                    release --force) */
    uint64_t cancelled;          /* acquires that returned DLOCK_ECANCELED or DLOCK_ECLOSED
                                    (not in errors) */
    uint64_t unclean;            /* holds (grants and local handoffs) that followed an
                                    unclean end of the hold before (dlock_unclean) */
    uint64_t abandoned;          /* locks a thread held when it exited, released for it */
    uint64_t protocol_resends;   /* acquire attempts sent again in the other protocol,
                                    the name's data being in it (dlock_config.protocol):
                                    while a fleet moves from one protocol to the other */
    uint64_t shared_acquisitions; /* of acquisitions, those in shared mode
                                     (dlock_acquire_shared), nested ones included */
    uint64_t shared_joins;       /* shared acquires that joined the client's held shared
                                    lease, with no Redis command (its grants count in
                                    grants, nested acquires in neither) */
    uint64_t sem_acquisitions;   /* of acquisitions, semaphore permits taken
                                    (dlock_sem_acquire) */
    uint64_t sem_passes;         /* of those, permits passed from another thread of this
                                    client with no Redis command */
} dlock_stats;

/* The client's id: 32 hex digits (128 random bits, new at every open), the
 * owner recorded in Redis for its leases and in its wait-queue entries.
 * Valid until dlock_client_close; NULL for a NULL client. */
DLOCK_API const char *dlock_client_id(dlock_client *c);

/* The client's metrics in the Prometheus text exposition format (version
 * 0.0.4), labelled client="<client_name>": counters of acquisitions,
 * timeouts, busy tries, errors by code (acquire and release), grants,
 * direct grants, handoffs, Redis commands and round trips, renewal rounds,
 * renewed leases and failed rounds, lost and force-released leases; gauges
 * of leases held and entries; histograms (seconds, buckets from 16 us
 * doubling to about 67 s) of acquire waits, hold times (outermost acquire
 * to outermost release) and renewal round trips. A new string the caller
 * frees with free(); NULL with DLOCK_EINVAL (NULL client) or DLOCK_ENOMEM in
 * dlock_last_error(). Any thread, any time before dlock_client_close. */
DLOCK_API char *dlock_client_metrics_prometheus(dlock_client *c);

/* Fills *out with the client's counters. Returns DLOCK_OK, or DLOCK_EINVAL
 * for NULL arguments. */
DLOCK_API int dlock_client_stats(dlock_client *c, dlock_stats *out);

/*
 * Fencing (docs/guide.md, "Fencing"). A token only protects data whose store
 * checks it on every read and write: the store keeps the highest token that
 * has touched each record and refuses any operation with a lower one (equal
 * passes: one holder reads and writes many times). This is the text of a
 * Lua script that does that for a record kept as a Redis hash (in the
 * application's own Redis, or any): load it with SCRIPT LOAD, call it with
 *   EVALSHA <sha> 1 <record key> <token> get <field> ...
 *   EVALSHA <sha> 1 <record key> <token> set <field> <value> ...
 * It returns an array: the integer 1 then, for get, a bulk string per field
 * (nil when missing); or, when refused, the integer 0 and the highest token
 * as a bulk string of decimal digits (a later holder has touched the
 * record: the caller's lease is gone, and nothing was read or written). A
 * wrong call is an error reply "ERR fenced: ...". lua/fenced.lua says more;
 * the user guide gives the same rule for SQL. Returns the script's text, a
 * static string, never NULL.
 */
DLOCK_API const char *dlock_fenced_script(void);

/* The library's version, "MAJOR.MINOR.PATCH": the library linked in, which
 * may differ from the header's DLOCK_VERSION_STRING. */
DLOCK_API const char *dlock_version(void);

/* The message of error `code` ("unknown error" for codes not in the list). */
DLOCK_API const char *dlock_strerror(int code);

/* The symbolic name of error `code`, such as "DLOCK_EBUSY". */
DLOCK_API const char *dlock_err_name(int code);

/* The calling thread's detailed message for its last failed dlock call, or ""
 * if it has none. Valid until the thread's next dlock call. */
DLOCK_API const char *dlock_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* DLOCK_H */
