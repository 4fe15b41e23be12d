/*
 * Sentinel: which server is the master of a name the sentinels watch, and
 * the client's record of it.
 *
 * The record (dlock_master) holds the newest master address the client has
 * seen, with the sentinels' config-epoch of that address: a failover raises
 * the epoch, so an answer with a lower epoch (a sentinel that has not heard
 * of the failover yet) never replaces a newer one. Every connection of the
 * client goes to the recorded address; connections to any other server are
 * stale and dropped (pool, renewal and subscriber check them). The
 * subscriber thread asks the sentinels again every DLOCK_SENTINEL_CHECK_MS,
 * so that a failover moves the client within about that long even while
 * the deposed master still answers.
 *
 * Concurrency: m->mu guards the record's fields; it is a leaf lock, held
 * only to copy or update them (no I/O under it). Everything else here is
 * stateless: every query opens its own short-lived connection.
 */
#ifndef DLOCK_SENTINEL_H
#define DLOCK_SENTINEL_H

#include <pthread.h>

#include "conn/conn.h"

/* Each sentinel gets at most this long to connect and answer, so a dead one
 * costs little before the next is tried. */
#define DLOCK_SENTINEL_TIMEOUT_MS 500u

/* How often the subscriber thread asks the sentinels where the master is. */
#define DLOCK_SENTINEL_CHECK_MS 1000

struct dlock_master {
    pthread_mutex_t mu;
    char host[256];
    int port;
    long long epoch; /* the address's config-epoch; -1: nothing recorded yet */
    int suspect;     /* the recorded master said it is none: ask every sentinel */
};

void dlock_master_init(dlock_master *m);
void dlock_master_destroy(dlock_master *m);

/* Asks cfg's sentinels in turn (AUTH sentinel_password first if set) with
 * SENTINEL MASTER and get-master-addr-by-name (see ask() in sentinel.c),
 * records an answer whose config-epoch is not below the recorded one (a lower one is stale: the next sentinel is
 * asked), and returns the recorded address in host (at most hostlen - 1
 * bytes) and *port. The master is not checked here: dlock_conn_open runs
 * ROLE on it. Safe on any thread. DLOCK_OK; DLOCK_EREDIS when no sentinel
 * answered and nothing is recorded (the message gives each one's reason);
 * DLOCK_ESERVER when every sentinel refused the credentials (one that could
 * not be reached makes it DLOCK_EREDIS: it may know the master later). */
int dlock_sentinel_master(const dlock_conn_cfg *cfg, dlock_counters *ctr, char *host,
                          size_t hostlen, int *port);

/* The recorded master host:port says (ROLE) it is no master: puts the
 * record in doubt (if it still names host:port). The next
 * dlock_sentinel_master then asks every sentinel and takes the newest
 * answer, and one behind the record too if most sentinels answered and all
 * are behind it (sentinels that lost their state count epochs from 0
 * again). A master that cannot be reached proves nothing: the record stays. */
void dlock_sentinel_doubt(const dlock_conn_cfg *cfg, const char *host, int port);

/* 1 if cfg is in Sentinel mode and c is connected to another server than
 * the recorded master: a failover moved the master, drop c. */
int dlock_sentinel_stale(const dlock_conn_cfg *cfg, const redisContext *c);

/* The route of a client in Sentinel mode (conn.h): connections go to the
 * master the sentinels name (dlock_sentinel_master), check it with ROLE,
 * put it in doubt when it is none, and are dropped when the master moved. */
extern const dlock_conn_route dlock_sentinel_route;

#endif
