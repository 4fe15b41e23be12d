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

/* The next number of the client's attempt sequence, in decimal. */
void dlock_rpc_number(dlock_client *c, char out[24]);

/* What a refusal said of the holder (acquire.lua): see dlock_entry.busy_*. */
typedef struct busy_info {
    char holder[DLOCK_CLIENT_NAME_MAX + 1];
    long long held_ms, queue;
} busy_info;

/* The acquire script, as attempt `nonce` (rpc.c). */
int dlock_rpc_acquire(dlock_client *c, dlock_entry *e, const char *nonce, int queue,
                      uint64_t unconfirmed_last, int unconfirmed_end, int64_t deadline,
                      dlock_cancel *k, uint64_t *token, int *unclean, int64_t *pttl_ms,
                      busy_info *busy, int64_t *sent_boot);

/* The release script for the grant with Redis token `grant` (rpc.c). */
int dlock_rpc_release(dlock_client *c, dlock_entry *e, uint64_t grant, uint64_t last,
                      int ending);

/* Takes this client out of e's wait queue in Redis (rpc.c). */
void dlock_rpc_leave(dlock_client *c, dlock_entry *e, const char *number);

#endif
