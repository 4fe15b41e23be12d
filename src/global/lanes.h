/*
 * The renewal thread's connections ("lanes"): one to the server, or in
 * Cluster mode one per master (lane i: node i of the slot map), each opened
 * at most once per pass and paused after a failed open; the routing of a
 * key to its lane, and the replies that send a call elsewhere (MOVED, ASK).
 *
 * Owner: one thread at a time, without locks: the renewal manager's thread
 * while it runs, then dlock_renew_stop after joining it (renew.h).
 */
#ifndef DLOCK_LANES_H
#define DLOCK_LANES_H

#include "conn/conn.h"

typedef struct dlock_lane {
    redisContext *conn;
    int wrote;          /* appended to since the last flush (set by the caller) */
    int acked;          /* a renewal ran here this round: WAIT here (min_replicas;
                           set and cleared by the caller) */
    unsigned pass;      /* the pass that last decided on this lane's connection:
                           it is opened at most once per pass */
    int64_t retry_ns;   /* after a failed open: no new try before then */
    int64_t backoff_ns; /* the pause after the next failed open */
    int open_rc;        /* the last open's result (DLOCK_ESERVER: the server unfit) */
    char open_err[256]; /* and its message */
} dlock_lane;

typedef struct dlock_lanes {
    const dlock_conn_cfg *conn; /* the client's; in Cluster mode conn->cluster routes */
    dlock_counters *ctr;
    dlock_lane *v;              /* v[0 .. n), grown by dlock_lanes_open */
    unsigned n;
    unsigned pass;              /* bumped by dlock_lanes_pass */
} dlock_lanes;

/* Starts a pass: until the next one, each lane is opened at most once. */
void dlock_lanes_pass(dlock_lanes *lanes);

/* The deadline of an exchange starting now: one command timeout. */
int64_t dlock_lanes_deadline(const dlock_lanes *lanes);

/* The lane of key: 0 outside Cluster mode, else the node index of the
 * master serving its slot (*slot set); -1 when no node is known (a refresh
 * of the slot map is asked for, not waited for). */
int dlock_lanes_route(dlock_lanes *lanes, const char *key, unsigned *slot);

/* Lane i's connection as it is (NULL: none). */
redisContext *dlock_lanes_get(const dlock_lanes *lanes, int i);

/* Lane i's connection for the current pass, opened if needed (lanes.c).
 * NULL if it has no usable connection. */
redisContext *dlock_lanes_open(dlock_lanes *lanes, int i);

/* Closes lane i's connection (reconnect next time). */
void dlock_lanes_drop(dlock_lanes *lanes, int i);

/* Closes every failed connection (and in Cluster mode asks for a refresh of
 * the map: a failover?). */
void dlock_lanes_drop_failed(dlock_lanes *lanes);

/* Forgets the pauses after failed opens: the next pass tries at once. */
void dlock_lanes_reset_backoff(dlock_lanes *lanes);

/* Closes every connection and frees the lanes. */
void dlock_lanes_close(dlock_lanes *lanes);

/* Marks c failed after an append ran out of memory: what it holds (an
 * ASKING without its call, say) is never flushed, and it is dropped. */
void dlock_lanes_oom(redisContext *c);

/* Flushes every lane marked `wrote`, clearing the marks. Returns how many
 * were written; a lane that failed keeps its error (its replies are not
 * read). */
unsigned dlock_lanes_flush(dlock_lanes *lanes, int64_t deadline);

/* Appends ASKING (after an ASK redirect) to c. 0 or -1. */
int dlock_lanes_append_asking(dlock_lanes *lanes, redisContext *c);

/* Reads the reply to an ASKING (when `asking`) and then one call's reply.
 * 0 with *out set, or -1 if the connection failed. */
int dlock_lanes_read_reply(redisContext *c, int asking, int64_t deadline, redisReply **out);

/* What a reply asks for: nothing, or to run the call again: as EVAL
 * (NOSCRIPT: kept for later tries), on the slot's new master (MOVED), or on
 * the importing node after ASKING (ASK: for the next try only). */
enum { DLOCK_REDO_NONE = 0, DLOCK_REDO_EVAL, DLOCK_REDO_MOVED, DLOCK_REDO_ASK };

/* Sorts out a MOVED or ASK reply from lane `from`: records a move in the
 * slot map, and sets *lane to the node to ask. DLOCK_REDO_MOVED or
 * DLOCK_REDO_ASK; DLOCK_REDO_NONE if it is none of them (or the node cannot
 * be added). */
int dlock_lanes_redirect(dlock_lanes *lanes, const redisReply *rep, int from, int *lane);

#endif
