/*
 * The client, as the modules of the lock calls share it (client.c, rpc.c,
 * acquire.c, release.c, orphan.c, api.c): its struct, the rules of the local
 * tier around an entry, which all of them keep, and the helpers they share.
 *
 * Invariants, per entry (all under e->mu; see table.h for the fields):
 *   I1. has_owner implies depth >= 1 and state is HELD or LOST.
 *   I2. At most one thread per entry talks to Redis for it:
 *       the poller (poller == 1, state ACQUIRING during its call) or the
 *       releaser (state RELEASING). A thread may become the poller only when
 *       !has_owner, state == NONE and poller == 0.
 *   I3. state HELD implies the grant is registered with the renewal manager
 *       (e->lease.renew != NULL), which holds a reference on e.
 *   I4. A LOST lease is never given to another thread: the owner must
 *       release it, which returns DLOCK_ELOST and resets state to NONE.
 *   I5. handoff == 1 (an open handoff, I10) implies !has_owner and state
 *       HELD (or LOST, if the renewal found it gone meanwhile: then it is
 *       reset, not taken). Every waiter checks handoff first when it wakes,
 *       so a pending handoff is taken by the first waiter to run; a release
 *       sets it only while waiters > 0 and wakes the head, and no poller
 *       exists while a lease is held locally.
 *   I6. woken is cleared by the poller before each try and set by the
 *       subscriber thread (wake_one, wake_all), which signals e->pcv, on
 *       which only the poller sleeps: a wake-up arriving during a try makes
 *       the poller try again at once instead of sleeping, and wakes no
 *       waiter.
 *   I7. queued: this client may be in the name's wait queue in Redis; the
 *       last thread to give up (waiters == 1), whatever its error, takes it
 *       out: itself (dlock_rpc_leave) after a timeout, through the renewal
 *       thread (dlock_renew_leave) when Redis failed. The leave is numbered
 *       from the attempt sequence under e->mu, so a later attempt of this
 *       client outranks it in Redis however late it arrives.
 *   I8. A thread that waited behind a poller whose call failed with an error
 *       of Redis (fail_seq changed) fails with it; no thread becomes the
 *       poller, or starts any Redis call, after its deadline.
 *   I9. When the lease goes back to Redis and threads still wait, the head
 *       of the local queue (e->wq) is woken to become the poller (not all: a
 *       herd); so is it when a poll ends without a grant. A woken waiter
 *       either polls or, if its deadline passed, wakes the next head before
 *       it leaves, so a wake-up is never lost with the thread that received
 *       it (dlock_entry_kick_head on every way out of acquire).
 *  I10. The local succession policy. Threads that wait for a lease held or
 *       being acquired by this client queue in e->wq in arrival order (the
 *       poller excepted), each parked on its own node. A release that keeps
 *       the lease here (a local handoff) either
 *         - hands it directly to the head, if the head has been the head
 *           for DLOCK_FAIR_NS or more: the releaser makes it the owner (has_owner,
 *           owner, depth, token, waiters--) under e->mu and sets its node's
 *           `granted`; no other thread can take it (the head, when it
 *           runs, keeps it only if it is still HELD and valid: else it was
 *           lost in passing and the head polls, take_direct_handoff); or
 *         - opens it (handoff = 1) and wakes the head: whichever thread of
 *           this client runs first takes it, a newcomer that has not queued
 *           (barging) or the head.
 *       Queued threads are served in arrival order; a newcomer passes them
 *       only while the head has led for less than DLOCK_FAIR_NS, so the head
 *       waits at most that plus one hold while the lease stays here, and no
 *       thread starves. A granted thread returns without touching the queue
 *       or e->waiters again. Wake-ups of the hot path (release) are issued
 *       after e->mu is dropped (park.h).
 *  I11. Direct grants (lua/release.lua). A release in another client may
 *       grant this client the lease while it waits in Redis, under its
 *       newest attempt, for its waiter ttl, and tell it on its channel.
 *       Only e's poller takes such a grant (take_direct_grant), between its
 *       tries, and only if the message names its last refused try of the
 *       current wait (try_nonce, reset when a poll starts): messages of an
 *       earlier wait or an earlier try, or late ones, are dropped. The
 *       validity counts min(waiter ttl, lease) from the send of the named
 *       try, which Redis saw before the release ran; the lease is HELD and
 *       `provisional` until the renewal makes it a whole lease. A grant
 *       that is dropped is found again by the poller's next try (the lease
 *       is its own), or freed by the leave of a client that gave up
 *       (lua/leave.lua, only a grant older than the leave), or expires
 *       after the waiter ttl.
 * References: a thread inside a call holds one; the owner thread keeps the
 * one of its outermost acquire until its outermost release.
 *
 * Lock order: e->mu, then the renewal manager's mutex; the table, pool,
 * subscriber, unconfirmed-set (unconfirmed.h) and trace (common/trace.h,
 * DLOCK_TRACE builds) mutexes are leaves. No Redis I/O happens with e->mu
 * held (the trace writes its file under its own mutex);
 * on_lost and the subscriber's callbacks run with no lock held (the latter
 * take e->mu only).
 *
 * Which operations may run concurrently on one client: all of them, from
 * any threads, except dlock_client_close (last, alone).
 */
#ifndef DLOCK_CLIENT_H
#define DLOCK_CLIENT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "conn/batch.h"
#include "local/cancel.h"
#include "route/cluster.h"
#include "route/redlock.h"
#include "conn/conn.h"
#include "common/metrics.h"
#include "common/trace.h"
#include "global/renew.h"
#include "route/sentinel.h"
#include "global/sub.h"
#include "entry/table.h"
#include "local/unconfirmed.h"

/* The fairness bound of the local succession policy (I10; docs/guide.md, "Handoff"):
 * a waiter that has led the local queue this long is passed over by no one;
 * the next local release hands it the lease directly. Chosen by measurement
 * (docs/performance.md, "Many threads on one name"): 0.5 to 2 ms give the same throughput
 * as no bound at all, within the noise of this machine. */
#define DLOCK_FAIR_NS (1 * DLOCK_NS_PER_MS)

struct dlock_client {
    dlock_conn_cfg conn;
    char *prefix;
    char id[33];        /* 128 random bits, hex: the owner of our leases */
    char lease_str[16]; /* lease_ms in decimal, for the scripts */
    char pass_limit_str[16];
    char waiter_ttl_str[16];
    char keep_str[16];  /* how long Redis keeps the client's record of a name */
    char *wake_prefix;  /* "<prefix>wake:" */
    char *channel;      /* "<prefix>wake:<id>": this client's wake channel */
    dlock_script_args args;
    uint64_t attempts;  /* numbered calls so far (acquire attempts and leaves): the
                           next is attempts + 1; Redis refuses one older than the
                           newest it saw for a name (atomic fetch-and-add) */
    uint32_t lease_ms, pass_limit, waiter_ttl_ms, pool_size, keep_ms;
    uint32_t min_replicas; /* > 0: grants and renewals count only once WAIT confirms them */
    int protocol;          /* the setting: each acquire attempt is sent in it first
                              (rpc.c, dlock_rpc_acquire) */
    dlock_master master;   /* Sentinel mode: the newest master known (sentinel.h) */
    int64_t fallback_ns; /* a queued poller retries this often without a wake-up */
    int64_t join_ns;     /* the shared mode's join window (local/shared.h, S1) */
    int64_t drift_ns;
    int64_t handoff_margin_ns; /* no handoff this close to the validity deadline */
    uint32_t grant_ms;         /* a direct grant's validity: min(waiter ttl, lease) */
    int64_t grant_drift_ns;    /* its drift margin */
    int64_t grant_margin_ns;   /* the same as handoff_margin_ns, for a direct grant not
                                  renewed yet; and the least validity one is taken with */
    void (*on_lost)(const char *name, uint64_t fence, void *arg);
    void *on_lost_arg;
    void (*on_log)(int level, const char *message, void *arg);
    void *on_log_arg;
    unsigned fork_gen; /* fork generation at open: calls in a child fail */
    uint64_t serial;   /* unique among the clients of this process, ever: see dlock_held_find */
    dlock_counters ctr;
    dlock_counters sub_ctr; /* the subscriber's own: its keepalives are not lock traffic */
    dlock_table *table;
    dlock_pool *pool;   /* NULL in Cluster mode: each node has its own */
    dlock_batch *batch; /* the caller threads' script calls, pipelined over pool */
    dlock_cluster *cluster; /* Cluster mode: the slot map and the nodes */
    dlock_redlock *redlock; /* Redlock mode: the node set (local/rlmode.h), else NULL */
    dlock_renew *renew;
    dlock_sub *sub;
    /* Redlock mode: the subscribers of nodes 1 .. N-1 (node 0's is sub) */
    dlock_sub *rl_sub[DLOCK_REDLOCK_NODES_MAX];
    dlock_unconfirmed *unconfirmed; /* tokens of grants whose end Redis never confirmed */
    dlock_trace *trace; /* the protocol's decisions, for sim/check-trace; NULL: none (trace.h) */
    int closing;       /* atomic: dlock_client_shutdown began (never reset) */
    int server_bad;    /* atomic: the periodic check found the server unfit (server_check) */
    pthread_mutex_t server_mu; /* a leaf: guards server_msg */
    char server_msg[400];      /* why, for the acquires it refuses */
    unsigned inside;   /* atomic: threads inside a public call on this client */
    dlock_client *open_prev, *open_next; /* the open clients (open_mu) */
};

/*
 * The entries the calling thread owns, so that its release, dlock_held and
 * reentrant acquire find them without the table mutex (at 1024 threads on
 * one name that mutex, taken three times per acquisition, cost 186 us of
 * waiting per acquisition: a preempted holder stalls everyone).
 * Only the owning thread reads or writes its slots. A slot holds an entry
 * from the thread's acquire to its outermost release, during which the
 * owner's reference keeps the entry alive. A slot is matched on the client's
 * serial before its entry is touched: a slot left by a client closed while
 * the thread held a lock (which the API forbids using again) is never
 * dereferenced, even if a new client gets the same address. When every slot
 * is taken, the entry is not cached and `dlock_held_uncached` counts it: lookups then
 * fall back to the table.
 */
#define DLOCK_HELD_SLOTS 8
typedef struct dlock_held_slot {
    uint64_t serial;
    dlock_entry *e;
    int64_t since_ns; /* the outermost acquire: the hold time's start */
} dlock_held_slot;
extern __thread dlock_held_slot dlock_held_slots[DLOCK_HELD_SLOTS];
extern __thread unsigned dlock_held_uncached;

/* The calling thread became the owner of e (outermost acquire). */
void dlock_held_remember(const dlock_client *c, dlock_entry *e);
/* The calling thread stops owning e (outermost release); counts the hold time. */
void dlock_held_forget(dlock_client *c, dlock_entry *e);
/* The entry `name` of c with a new reference, if the calling thread may own
 * it; else NULL. */
dlock_entry *dlock_held_find(dlock_client *c, const char *name, size_t len);

/* Formats one line for the application's log callback, if it has one.
 * Called with no library lock held. */
void dlock_client_log(dlock_client *c, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Checks the arguments common to the lock calls; sets *len. */
int dlock_client_check(dlock_client *c, const char *name, size_t *len);

/* Whether c was opened before a fork() of this process (the calling process
 * is the child): its calls fail with DLOCK_EFORK. */
int dlock_client_forked(const dlock_client *c);

/* A thread inside a public call on c counts itself (enter ... leave), so
 * that dlock_client_close waits for it; leave is its last access to c. */
void dlock_client_enter(dlock_client *c);
void dlock_client_leave(dlock_client *c);

/* DLOCK_ECLOSED if c is shutting down, DLOCK_ECANCELED if k is fired, else
 * DLOCK_OK. Any lock or none. */
int dlock_client_stop_rc(dlock_client *c, dlock_cancel *k);
/* dlock_client_stop_rc's code with its message. */
int dlock_client_stop_err(int rc, const char *name);

/* The open client with this serial, entered (dlock_client_enter), or NULL. */
dlock_client *dlock_client_find_enter(uint64_t serial);
/* Every open client of this process not inherited through fork(), entered,
 * in a new array of *n (the caller leaves each and frees the array); NULL
 * with *n == 0 if out of memory. */
dlock_client **dlock_client_enter_all(size_t *n);

/* The grant of e ended without a release Redis confirmed (client.c). Called
 * with e->mu held. */
void dlock_client_unconfirmed_end(dlock_client *c, dlock_entry *e, uint64_t last, int end);

#endif
