/*
 * The Redis calls of one lock, as the caller threads make them: the acquire,
 * release and leave scripts (lua/), pipelined through the batcher, and their
 * replies read into the entry. Each is made by the one thread that may talk
 * to Redis for the entry (client.h, I2) without e->mu held; see each
 * function's comment in rpc.c for what it sets and when.
 */
#ifndef DLOCK_RPC_H
#define DLOCK_RPC_H

#include "local/client.h"

/* Runs script `id` with argv (its keys, then nargs arguments) through the
 * batcher, as rpc.c's calls do (Cluster redirects and busy slots, a pooled
 * connection closed while idle): DLOCK_OK with the reply in *out, or an
 * error with its message and *sent (whether it may have reached Redis).
 * `what` names the call in messages; *acked (if acked) the replicas WAIT
 * confirmed (-1 unknown); `acquire` 1 for a waiting acquire, which a
 * shutdown or its cancel token k stops between retries of a busy slot.
 * Without e->mu. */
int dlock_rpc_script(dlock_client *c, dlock_script_id id, int nargs, const char **argv,
                     const char *what, const char *name, int64_t deadline, redisReply **out,
                     int *sent, int *acked, int acquire, dlock_cancel *k);

/* The next number of the client's attempt sequence, in decimal. */
void dlock_rpc_number(dlock_client *c, char out[24]);

/* What a refusal said of the holder (acquire.lua): see dlock_entry.busy_*. */
typedef struct busy_info {
    char holder[DLOCK_CLIENT_NAME_MAX + 1];
    long long held_ms, queue;
} busy_info;

/* One try of the acquire script: what the poller asks, and what Redis
 * answered (dlock_rpc_acquire says which fields it sets). */
typedef struct dlock_rpc_try {
    const char *nonce;        /* the attempt's number, decimal */
    int queue;                /* join the wait queue if refused (not a single try) */
    uint64_t unconfirmed;     /* the last token of a grant whose end Redis never
                                 confirmed, 0 if none (acquire.lua ARGV[9]) */
    int unconfirmed_end;      /* how that grant ended (ARGV[10]) */
    int64_t deadline;         /* wait for a connection, or a batch, until then */
    dlock_cancel *cancel;     /* the call's cancel token, or NULL */
    int protocol;             /* in: the protocol to send it in first (the setting);
                                 out: the one it was last sent in */
    int shared;               /* in: a shared acquire (lua/p2/acquire_shared.lua), in
                                 protocol 2 only */
    uint64_t token;           /* out, granted: the fencing token */
    int unclean;              /* out, granted: how the hold before ended */
    int64_t pttl_ms;          /* out, refused: the lease's time left */
    busy_info busy;           /* out, refused: what Redis said of the holder */
    int64_t sent_boot;        /* out: when the try was sent (boot clock) */
    int unanswered;           /* out, failed: it may have reached Redis, but no
                                 answer came: it may have run (granted, or, with
                                 `queue`, queued the client) */
    int unreachable;          /* out, refused: not refused but too few nodes asked
                                 (Redlock mode, local/rlmode.h): a wait that ends
                                 after it fails with DLOCK_EREDIS, its message */
} dlock_rpc_try;

/* The acquire script, as attempt t->nonce (rpc.c). */
int dlock_rpc_acquire(dlock_client *c, dlock_entry *e, dlock_rpc_try *t);

/* The release script for the grant with Redis token `grant` (rpc.c). */
int dlock_rpc_release(dlock_client *c, dlock_entry *e, uint64_t grant, int protocol,
                      uint64_t last, int ending);

/* Takes this client out of e's wait queue in Redis (rpc.c). */
void dlock_rpc_leave(dlock_client *c, dlock_entry *e, const char *number, int protocol);

#endif
