/*
 * Redis Cluster: hash slots, the slot map, and the nodes a client talks to.
 *
 * Every key of a lock name is "<prefix>{<name>}..." and so shares the hash
 * tag <name> (or, for a name that holds '}', the part before it): all keys
 * of a name live in one slot, which a script may touch in a cluster.
 * dlock_cluster_slot computes that slot exactly as Redis does (keyHashSlot):
 * CRC16 (XMODEM: polynomial 0x1021, initial 0) of the hash tag if the key has
 * a non-empty one (the bytes between the first '{' and the first '}' after
 * it), else of the whole key, modulo 16384. A name starting with '}' has an
 * empty tag, and its keys would scatter: cluster mode refuses such names,
 * and prefixes holding a brace.
 *
 * The map (dlock_cluster) says which master serves each slot. It is built
 * from CLUSTER SHARDS (CLUSTER SLOTS before Redis 7) asked of any node the
 * client knows (the seeds first), and refreshed by the subscriber thread
 * every DLOCK_CLUSTER_CHECK_MS and soon after a call or a renewal met a
 * connection error (dlock_cluster_want_refresh; at most once per
 * DLOCK_CLUSTER_REFRESH_MIN_MS), and slot by slot on a MOVED reply. Every node the client has met has its own pool of
 * connections and its own batcher (batch.h), so script calls to different
 * masters never wait for each other.
 *
 * Shared state and its guards:
 *   cl->mu guards appending nodes and the refresh bookkeeping (last_ns,
 *   next_any); it is never held during I/O. cl->refresh_mu makes refreshes
 *   one at a time and is held during the refresh's I/O; lock order:
 *   refresh_mu, then mu; a pool's mutex (conn.c) is taken under neither.
 *   Nodes are only ever added, never freed before the map is destroyed, so
 *   a node pointer stays valid for the client's life. nodes[] entries are
 *   written before nnodes is raised (release) and read after nnodes is read
 *   (acquire); slots[] entries are single 16-bit words read and written
 *   atomically (release/acquire, for the node they name; a stale entry only
 *   costs a MOVED).
 */
#ifndef DLOCK_CLUSTER_H
#define DLOCK_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "conn/batch.h"
#include "conn/conn.h"
#include "common/slot.h"

#define DLOCK_CLUSTER_SLOTS 16384
/* The most nodes a client keeps (masters met over its life, failovers
 * included). */
#define DLOCK_CLUSTER_NODES_MAX 1024
/* A refresh after a connection error comes at most this often. */
#define DLOCK_CLUSTER_REFRESH_MIN_MS 100
/* The subscriber thread refreshes the map this often. */
#define DLOCK_CLUSTER_CHECK_MS 2000
/* Redirects (MOVED, ASK) one call follows before it fails. */
#define DLOCK_CLUSTER_REDIRECTS_MAX 5

/* dlock_crc16 and dlock_cluster_slot, the hash slot of a key: common/slot.h. */

/* One master the client talks to. */
typedef struct dlock_cluster_node {
    unsigned index;      /* in the map's node list, from 0 */
    dlock_conn_cfg cfg;  /* the client's settings, with this node's host and port */
    dlock_pool *pool;
    dlock_batch *batch;  /* the caller threads' script calls to this node */
} dlock_cluster_node;

typedef struct dlock_cluster dlock_cluster;

/* A map seeded with the nodes of `seeds` ("host:port,..."). Connections use
 * base's credentials and timeouts (base must outlive the map); each node
 * gets a pool of pool_size connections and a batcher with min_replicas as
 * in dlock_batch_create. Nothing is connected yet. DLOCK_OK, DLOCK_EINVAL
 * (a bad seed list, message set) or DLOCK_ENOMEM. */
int dlock_cluster_create(const dlock_conn_cfg *base, const char *seeds, unsigned pool_size,
                         uint32_t min_replicas, dlock_counters *ctr, dlock_cluster **out);

/* Frees the map and every node's pool and batcher; no call may be running. */
void dlock_cluster_destroy(dlock_cluster *cl);

/* Asks known nodes in turn for the slot map and applies the first answer.
 * Without force, does nothing if a refresh ended less than
 * DLOCK_CLUSTER_REFRESH_MIN_MS ago, or if another thread is refreshing
 * right now (unless the map is empty: then it waits for that refresh). No
 * node is asked once `deadline` (monotonic; DLOCK_NEVER: none) has passed;
 * each ask takes at most a connect and a command timeout. Clears a pending
 * dlock_cluster_want_refresh. DLOCK_OK, or DLOCK_EREDIS (no node answered;
 * message set). */
int dlock_cluster_refresh(dlock_cluster *cl, int force, int64_t deadline);

/* Asks for a refresh soon, without waiting for it: the subscriber thread
 * makes it (a caller or the renewal thread that met a connection error must
 * not spend its own time on other nodes). No lock needed. */
void dlock_cluster_want_refresh(dlock_cluster *cl);

/* 1 if a refresh was asked for and not made yet. */
int dlock_cluster_refresh_wanted(dlock_cluster *cl);

/* The master serving slot; when the map knows none, a refresh is made
 * first, bounded by deadline (as dlock_cluster_refresh). NULL (DLOCK_EREDIS,
 * message set) if still none. */
dlock_cluster_node *dlock_cluster_route(dlock_cluster *cl, unsigned slot, int64_t deadline);

/* The node at host:port, added if new; NULL when out of memory or full. */
dlock_cluster_node *dlock_cluster_node_at(dlock_cluster *cl, const char *host, int port);

/* Records that node serves slot (a MOVED reply). */
void dlock_cluster_set_slot(dlock_cluster *cl, unsigned slot, const dlock_cluster_node *node);

/* How many nodes the map holds now, and the i-th (i < that count). */
unsigned dlock_cluster_nnodes(dlock_cluster *cl);
dlock_cluster_node *dlock_cluster_node_get(dlock_cluster *cl, unsigned i);

/* The distinct masters the slot map names now, at most max of them, into
 * out[]; returns how many. */
unsigned dlock_cluster_masters(dlock_cluster *cl, dlock_cluster_node **out, unsigned max);

/* The next node in turn, for a connection that may go to any node (the
 * subscriber's: PUBLISH reaches every node of a cluster). Copies its host
 * into host[size] and sets *port. */
void dlock_cluster_any(dlock_cluster *cl, char *host, size_t size, int *port);

/* The route of a connection to any node of the cluster cfg->cluster names
 * (conn.h): the subscriber's. */
extern const dlock_conn_route dlock_cluster_any_route;

enum { DLOCK_REDIRECT_NONE = 0, DLOCK_REDIRECT_MOVED = 1, DLOCK_REDIRECT_ASK = 2 };

/* If reply is a MOVED or ASK error, parses its slot and address (an empty
 * host, as a node that does not know its own address sends, becomes
 * `asked`, the host the reply came from) and returns its kind; else
 * DLOCK_REDIRECT_NONE. */
int dlock_cluster_redirect(const redisReply *reply, const char *asked, unsigned *slot,
                           char *host, size_t size, int *port);

/* 1 if reply is TRYAGAIN (a multi-key call during a slot migration) or
 * CLUSTERDOWN: the same call may succeed a little later. */
int dlock_cluster_is_busy(const redisReply *reply);

#endif
