/*
 * The subscriber: one thread and one Redis connection per client, holding
 * exactly one subscription (SUBSCRIBE to the client's wake channel). Each
 * message's payload (a lock name) is handed to a callback, which signals the
 * poller of that name. When the connection is lost the thread reconnects by
 * itself, with a backoff, subscribes again, and then reports that messages
 * may have been missed (pub/sub is at-most-once), so the client can wake all
 * its pollers.
 *
 * Lock order: the subscriber's mutex is a leaf; no callback runs under it.
 */
#ifndef DLOCK_SUB_H
#define DLOCK_SUB_H

#include <stddef.h>
#include <stdint.h>

#include "conn/conn.h"

typedef struct dlock_sub dlock_sub;

typedef struct dlock_sub_cfg {
    const dlock_conn_cfg *conn; /* must outlive the subscriber */
    dlock_counters *ctr;        /* commands and round trips are counted here; NULL: not counted */
    const char *channel;        /* copied; not empty */
    /* Called for each message on the channel, in order, on the subscriber
     * thread, with no library lock held. payload is NUL-terminated after
     * len bytes and valid only during the call. It must not block for long
     * (it delays later messages) and must not call dlock_sub_stop. */
    void (*on_message)(void *arg, const char *payload, size_t len);
    /* Called on the subscriber thread, with no library lock held, after
     * every subscription confirmed on a new connection once an earlier one
     * had been confirmed (that is, not after the first): messages sent in
     * between may have been missed. It runs before any message received on
     * the new connection. NULL: not called. */
    void (*on_resubscribed)(void *arg);
    void *arg;
    /* Called like on_resubscribed, but after every confirmed subscription,
     * the first one included (a message sent before it was missed too), and
     * before on_resubscribed. NULL: not called. */
    void (*on_subscribed)(void *arg);
} dlock_sub_cfg;

/* Starts the subscriber thread, which connects and subscribes in the
 * background: DLOCK_OK even if Redis is down (it keeps retrying).
 * DLOCK_EINVAL for a missing conn, channel or on_message, or an empty
 * channel; DLOCK_ENOMEM (also when the thread cannot be created). */
int dlock_sub_start(const dlock_sub_cfg *cfg, dlock_sub **out);

/* Tells the thread to stop, without waiting for it (dlock_sub_stop
 * then returns sooner: several subscribers stop in parallel). NULL is
 * ignored. */
void dlock_sub_stop_ask(dlock_sub *s);

/* Stops and joins the thread, closes its connection, frees s. Returns within
 * the poll interval (100 ms) plus one callback in progress, or, if the thread
 * is opening a connection at that moment, within what dlock_conn_open may
 * take: the connect timeout, plus one command timeout when it sends a setup
 * command (AUTH, SELECT, SCRIPT LOAD) to a server that does not answer.
 * Not from a callback. NULL is ignored. */
void dlock_sub_stop(dlock_sub *s);

/* 1 while subscribed (the server confirmed the subscription on the current
 * connection and it is not known lost), else 0. For tests and stats. */
int dlock_sub_ready(dlock_sub *s);

/* Number of subscriptions confirmed after a lost connection. Each is
 * counted once its on_resubscribed call has returned. */
uint64_t dlock_sub_reconnects(dlock_sub *s);

#endif
