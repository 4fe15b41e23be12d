/*
 * The local tier: one entry per lock name that some thread of this client
 * holds or waits for, in a reference-counted table.
 *
 * Lock order (outermost first): entry->mu, then the renewal manager's mutex.
 * The table mutex is a leaf: it is never held while taking another lock, and
 * dlock_table_put must never be called with entry->mu held (it may free it).
 */
#ifndef DLOCK_TABLE_H
#define DLOCK_TABLE_H

#include <pthread.h>
#include <stdint.h>

#include <uthash.h>

#include "common/common.h"
#include "conn/script.h"
#include "entry/park.h"

typedef enum dlock_lease_state {
    DLOCK_LEASE_NONE,      /* this client does not own the lease */
    DLOCK_LEASE_ACQUIRING, /* the poller is asking Redis for it */
    DLOCK_LEASE_HELD,      /* owned and, as far as we know, valid */
    DLOCK_LEASE_RELEASING, /* the releaser is giving it back to Redis */
    DLOCK_LEASE_LOST       /* found gone, or expired unrenewed; the holder must release */
} dlock_lease_state;

typedef struct dlock_renew_item dlock_renew_item;

/* The Redis keys of one lock name (DLOCK_KEY_* and DLOCK_KEYS, from
 * lua/keys.lua: conn/script.h) all share the hash tag {<name>}. */

/*
 * An entry is a core (the table's link, references, the mutex, the name and
 * its keys, the threads waiting) and three parts, each with one purpose:
 *   lease  the client's lease of the name in Redis, as the renewal thread
 *          sees it: every kind of lock has one (docs/design.md, "Kinds of
 *          lock");
 *   poll   waiting for a lease in Redis: the one poller, what Redis told
 *          its tries, the messages the subscriber left for it;
 *   x      the exclusive kind's holders: one owner thread, its depth, the
 *          local handoff (src/local/excl.c, which alone writes it, and
 *          the readers named in excl.h);
 *   s      the shared kind's holders: how many threads share the lease,
 *          until when others may join it (src/local/shared.c alone
 *          writes it);
 *   m      a semaphore's permits: how many this client holds in Redis and
 *          how many of them its threads use (src/local/sem.c alone writes
 *          it; the lease is then the client's permits: local/sem.h).
 * Every field is guarded by mu unless it says otherwise.
 */
typedef struct dlock_lease {
    dlock_lease_state state;
    const struct dlock_kind *kind; /* the kind of lock it was granted in (local/kind.h);
                                    NULL before the entry's first grant */
    int shared;                  /* it was granted shared (lua/p2/acquire_shared.lua): it
                                    goes back with the shared release script */
    int sem;                     /* the client's permits of a semaphore (local/sem.h):
                                    renewed and given back with lua/p2/sem_*.lua */
    uint64_t grant_token;        /* token Redis gave the current grant */
    int grant_protocol;          /* the protocol it was granted in (1 or 2): its
                                    renewals and its release use that protocol's
                                    scripts */
    uint64_t token;              /* the last token handed out under the grant:
                                    grant_token + local passes */
    uint64_t epoch;              /* grants of this entry so far; renewals carry it */
    int64_t valid_until_ns;      /* lease validity on the boot clock (dlock_boot_ns) */
    int64_t grant_boot_ns;       /* when this client learned the grant (boot clock):
                                    Redis made it earlier, at server time grant_token */
    int provisional;             /* HELD by a direct grant not renewed yet: valid for
                                    the waiter ttl only (handoffs use a shorter margin) */
    int lost_notified;           /* on_lost already ran for this grant */
    int unconfirmed_end;         /* how that grant ended (unconfirmed.h) */
    uint64_t unconfirmed;        /* the last token handed out under a grant that ended
                                    other than by a confirmed release (it may still be, or
                                    be again, this client's in Redis: unconfirmed.h), 0 if
                                    none: the next acquire tells Redis; kept past the
                                    entry's life in unconfirmed.h */
    dlock_renew_item *renew;     /* registration with the renewal manager, or NULL */
    struct dlock_redlock_grant *rl; /* Redlock mode: the entry's last quorum grant
                                       (each node's token, for its renewals and its
                                       release), written by e's poller before the
                                       grant is taken; owned by the entry. NULL
                                       outside the mode */
    struct dlock_redlock_slots *rls; /* Redlock mode: a semaphore's slots this client
                                        holds and its wait's home slot (local/rlsem.h),
                                        owned by the entry; NULL until its first
                                        semaphore call */
} dlock_lease;

typedef struct dlock_poll {
    int poller;                  /* a thread is the designated poller (client.h, I2) */
    uint64_t fail_seq;           /* polls of this entry that failed with an error of
                                    Redis (not EBUSY or ETIMEDOUT) */
    int fail_rc;                 /* the last such failure's code */
    char fail_msg[160];          /* and its message */
    int woken;                   /* a wake-up came for this name since the poller's last try */
    int queued;                  /* this client may be in the name's wait queue in Redis */
    /* The poller's last refused try of its current wait (0: none), and when
     * it was sent (boot clock): a direct grant names the try it was made
     * under, and its validity counts from that send. */
    uint64_t try_nonce;
    int64_t try_sent_boot;
    int queue_protocol;          /* with queued: the protocol of the try that queued the
                                    client, where its leave goes (sent again in the
                                    other if refused as its data: rpc.c) */
    /* A direct grant message for this name (release.lua) that the poller has
     * not looked at yet: its attempt number and token. */
    int msg_grant;
    uint64_t msg_nonce, msg_token;
    int msg_unclean;             /* the direct grant message's end (a "u" message) */
    int msg_protocol;            /* the protocol of the release that sent it: the grant's */
    int msg_shared;              /* it grants a shared lease ("S": lua/p2/LAYOUT.txt) */
    /* Redlock mode's wait (local/rlmode.h), the poller's alone: its ticket
     * (the client's wall clock, us, at its first try; 0 no wait) and the
     * attempt whose split vote the last try kept (0 none). */
    uint64_t rl_ticket, rl_kept;
    int rl_kept_shared; /* rl_kept is a shared try's */
    int unreachable;             /* the poller's last try found too few Redlock
                                    nodes to ask (local/rlmode.h): a wait that ends
                                    now ends in DLOCK_EREDIS */
    /* What the poller's last refused try said of the holder, for the
     * messages of a timeout or a busy try (acquire.lua): its client name
     * ("" unknown), since when (server ms before the try) it holds the
     * lease, the lease's time left, and the clients in the wait queue (-1
     * unknown). */
    int busy_known;              /* the fields below are from the current wait */
    int64_t busy_at_ns;          /* when the try was sent (monotonic): they age from then */
    char busy_holder[DLOCK_CLIENT_NAME_MAX + 1];
    long long busy_held_ms, busy_left_ms, busy_queue;
    int busy_joined;             /* that try joined the queue (busy_queue counts us) */
} dlock_poll;

typedef struct dlock_excl {
    int has_owner;               /* a thread of this client holds the lock */
    pthread_t owner;             /* that thread, when has_owner */
    int by_handle;               /* with has_owner: the holder is a dlock_handle, which
                                    any thread may release; owner is then meaningless */
    unsigned depth;              /* its reentrancy depth, >= 1 when has_owner */
    int handoff;                 /* the holder passed the lease on: a waiter takes it */
    unsigned passes;             /* consecutive local handoffs of this grant */
    int unclean;                 /* how the hold before the owner's ended, when not by
                                    its holder's release (DLOCK_UNCLEAN_*, dlock_unclean):
                                    from the grant (acquire.lua, "End"), or from the
                                    local handoff; 0 when it was released */
    int ending;                  /* the owner's hold ends as DLOCK_UNCLEAN_ABANDONED: its
                                    thread exited (set by the exit hook for its release) */
} dlock_excl;

typedef struct dlock_shr {
    unsigned holders;            /* threads of this client holding the shared lease (each
                                    once, whatever its depth: local/shared.h) */
    int64_t join_until_ns;       /* the join window's end (boot clock): threads join the
                                    held shared lease without Redis until then only */
    int unclean;                 /* how the last exclusive hold before the grant ended
                                    (the grant's "End"), for dlock_unclean */
    int under_x;                 /* the holders are a reader phase under this client's
                                    exclusive lease (local/shared.h, S8), not holders
                                    of a shared lease */
} dlock_shr;

typedef struct dlock_semx {
    unsigned users;              /* threads in a semaphore call of e or holding its
                                    permits: while > 0, e is a semaphore in this client */
    uint32_t limit;              /* the limit those threads use (0 while users == 0) */
    unsigned held;               /* permits of e this client holds in Redis, as its last
                                    granted acquire said (lease HELD while > 0) */
    unsigned in_use;             /* of them, held by threads now; the rest are spare */
    uint64_t gen;                /* bumped when the permits are lost: a thread's permit
                                    of an older generation is lost (shared.h, record) */
    unsigned passes;             /* permits passed between threads since the last one
                                    from Redis (at most pass_limit in a row) */
    int calling;                 /* a thread is in a Redis call for e: the client's calls
                                    on a name go one at a time (lua/p2/SEM.txt) */
    uint64_t doubt;              /* an attempt whose grant this client may hold without
                                    knowing it (its reply lost, or a direct grant to a
                                    queued try): the next try names it, 0 if none */
} dlock_semx;

/* The kinds of lock, as an index of dlock_entry.kind_waiters (local/kind.h). */
enum { DLOCK_KIND_EXCL, DLOCK_KIND_SHARED, DLOCK_KINDS };

typedef struct dlock_entry {
    UT_hash_handle hh; /* guarded by the table mutex */

    /* References: one per thread inside acquire/release/held for this
     * name, one for the owner thread while it holds the lock, one for the
     * renewal manager while the lease is registered with it. Atomic
     * (ck_pr); 0 means closing: never revived. */
    unsigned refs;

    pthread_mutex_t mu;
    pthread_cond_t pcv; /* CLOCK_MONOTONIC; the poller alone sleeps on it, between tries */

    /* Guarded by mu. */
    unsigned waiters;            /* threads in acquire waiting for this name */
    unsigned kind_waiters[DLOCK_KINDS]; /* of them, those waiting in each kind */
    dlock_waitq wq;              /* the waiting threads but the poller, longest first
                                    (park.h): each parks on its own node */
    dlock_lease lease;
    dlock_poll poll;
    dlock_excl x;
    dlock_shr s;
    dlock_semx m;

    /* Immutable after creation. */
    uint64_t made;          /* the table's count of entries made, this one's
                               included: a name's entry freed and made anew
                               has a new number (the client's trace shows it) */
    size_t name_len;
    char *keys[DLOCK_KEYS]; /* the Redis keys of this name, see DLOCK_KEY_* */
    char name[];            /* NUL-terminated */
} dlock_entry;

typedef struct dlock_table dlock_table;

/* A table whose entries' keys start with prefix, for the client client_id
 * (both copied). NULL on ENOMEM. */
dlock_table *dlock_table_create(const char *prefix, const char *client_id, dlock_counters *ctr);

/* Frees the table and every entry still in it, whatever its count. */
void dlock_table_destroy(dlock_table *t);

/* The entry for name, created if absent, with one reference for the caller.
 * NULL when out of memory. */
dlock_entry *dlock_table_get(dlock_table *t, const char *name, size_t len);

/* The entry for name with one reference for the caller, or NULL if absent. */
dlock_entry *dlock_table_find(dlock_table *t, const char *name, size_t len);

/* Adds a reference; the caller must already hold one (so refs > 0). */
void dlock_table_ref(dlock_entry *e);

/* Drops a reference; the last one unlinks and frees the entry. Must not be
 * called with e->mu held. */
void dlock_table_put(dlock_table *t, dlock_entry *e);

/* Number of entries in the table now. */
unsigned dlock_table_count(dlock_table *t);

/* Calls fn on every live entry holding a reference on it, without the table
 * mutex (so fn may lock the entry); entries closing meanwhile are skipped. */
void dlock_table_each_ref(dlock_table *t, void (*fn)(dlock_entry *e, void *arg), void *arg);

/* Whether a thread of this client holds e, in any kind (then the lease is
 * HELD or LOST: client.h, I1). Called with e->mu held. */
static inline int dlock_entry_held(const dlock_entry *e)
{
    return e->x.has_owner || e->s.holders > 0;
}

/* Someone changed e's state: wakes the head of e's local queue if there is
 * something for it to do (client.h, I9). Called with e->mu held. */
void dlock_entry_kick_head(dlock_entry *e);

/* Calls fn on every entry, under the table mutex (fn must not lock entries
 * or call back into the table). For close and tests. */
void dlock_table_foreach(dlock_table *t, void (*fn)(dlock_entry *e, void *arg), void *arg);

#endif
