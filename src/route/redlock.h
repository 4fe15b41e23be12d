/*
 * Redlock: one lock over N independent Redis masters, and the rule that
 * keeps its fencing tokens increasing although two grants may be voted by
 * different majorities (docs/design.md, "Redlock"; proven by the
 * simulator's Redlock world, sim/redlock.lua, which this module follows:
 * acquire = W:acquire, seed = W:maybe_seed, counts = W:counts).
 *
 * N is odd and at least 3; a majority m = N/2 + 1 (rounded down). Every
 * node runs protocol 2's scripts unchanged, plus lua/p2/mark.lua (the
 * slot's mark write-back, which also writes the node's seed key).
 *
 *   counts  a node's reply counts when its seed key ("<prefix>redlock:seed")
 *           holds the run id of the server that answered (the run_id its
 *           connection's setup read with INFO when it opened: a connection
 *           reaches one server for its life, a restart closes it; INFO
 *           server in the pipeline on a connection whose run id is not
 *           known; and a GET of the seed key, read before the script in
 *           the same pipeline: within one run the seed key only ever takes
 *           that run's id, so a reading before the script holds at the
 *           script; mark.lua's replies carry the key as the script read
 *           it). A seeding comes a lease + the drift allowance after the
 *           seeding client first saw the run (below), so a node that counts
 *           has been up a lease, whoever asks: a client that starts fresh
 *           counts a seeded node at once (the rule the simulator proves,
 *           docs/design.md "Redlock"). Two nodes that report one run id
 *           (one server listed under two names) count once.
 *   acquire acquire.lua on every node with one attempt number; votes
 *           only from nodes that count. An exclusive acquire proposes a
 *           token, the floor F: the highest of the nodes' clocks as their
 *           last grants' replies told them, read on this client's
 *           CLOCK_BOOTTIME at its send, plus a margin (from 1 ms, after
 *           an acquire with a majority of votes doubled up to a lease / 8
 *           if a counting node's clock had reached a floor above 0 at its
 *           vote, else a 32nd less; F = 0 before any node's clock is
 *           known); each node votes at least F and writes its vote + the
 *           pass limit as its mark. If every node counts and voted the
 *           highest vote, T is that vote, handed out with no write-back
 *           (their marks hold T + the pass limit already; a majority
 *           would not do: docs/design.md "Redlock", hand-out order); else
 *           the write-back below, from T = highest vote + 2 * pass limit
 *           + 1 (above the marks this acquire's own votes wrote). A
 *           shared acquire proposes none; T = highest vote + 1. How the
 *           hold before ended, the end (acquire.lua's third reply) that at
 *           least m votes report alike, else 0; mark.lua T on
 *           every node, at most 3 rounds (a reply whose mark was T or more
 *           makes T that mark + 1 and the round run again), confirmed once
 *           m nodes that counted for the votes replied with marks below T
 *           and their seed key holding their run id; handed out only
 *           before the validity: the first send + the lease - the drift
 *           allowance (1% of the lease + 2 ms), on CLOCK_BOOTTIME. Any
 *           failure: a release by attempt on every node the votes' request
 *           was sent to (whatever it answered, if anything).
 *   seed    a node that does not count (it restarted: a new run id) and
 *           was seen for a lease + the drift allowance gets, for every
 *           slot's mark of the prefix (a string key "<prefix>hw:{<tag>}",
 *           the tag without braces) that any of
 *           at least m other counting nodes holds, the highest of their
 *           marks (mark.lua 0 reads them), and only once every mark is
 *           written its run id in its seed key.
 *
 *   renew   renew.lua on every node by that node's own grant; confirmed
 *           once m counting nodes renewed it; the new validity counts from
 *           the renewal's first send, as an acquire's.
 *
 *   wait    with q->queue (a try of a wait, docs/design.md "Redlock",
 *           Waiting): every node that refuses queues the client, under
 *           the name "<client_name>@<ticket>.<client id>"; a split vote
 *           (some votes, fewer than m) is kept, not released, unless the
 *           try keeps none (q->no_keep) or a node that refused it is held
 *           by a client whose ticket (then
 *           client id) comes first (wait-die: the caller's next try grants
 *           them anew under its new attempt, and the caller gives this
 *           attempt back once that try ends); a release after a failed try
 *           skips the nodes that refused it (they hold nothing under its
 *           attempt, and a direct grant one makes later is the client's
 *           turn there). Wake-ups come from any node's release, on the
 *           client's channel (local/rlmode.h).
 *
 * Shared state: each node's record (the run id last seen, when this
 * client first saw it, whether its seed key held it at the last reading, whether a
 * seeding is under way, the run id each of its connections reached) is
 * guarded by rl->mu, which is never held during I/O (a new connection's
 * setup records its run id through conn.h's saw_info after its INFO was
 * read, holding no pool's mutex); a node's pool has its own mutex
 * (conn.c), never taken under rl->mu.
 * Any thread may call any function here; a seeding of one node runs at
 * most once at a time (the others return DLOCK_EBUSY).
 */
#ifndef DLOCK_REDLOCK_H
#define DLOCK_REDLOCK_H

#include <stdint.h>

#include "common/common.h"
#include "conn/conn.h"
#include "conn/script.h"

/* The most nodes a set holds. */
#define DLOCK_REDLOCK_NODES_MAX 15
/* Write-back rounds of one acquire. */
#define DLOCK_REDLOCK_ROUNDS 3

/* The floor's least margin above the nodes' clocks, in us (redlock.h,
 * acquire; sim/redlock.lua's W.FLOOR_MIN). */
#define DLOCK_REDLOCK_FLOOR_MIN_US 1000

typedef struct dlock_redlock dlock_redlock;

/* A node set from "host:port,host:port,..." (dlock_addrs_parse, what
 * "redlock_nodes"), each node with base's settings (credentials,
 * timeouts, client name; base->protocol must be 2; base must outlive the
 * set) and its own address, and a pool of pool_size connections. Keys are
 * under `prefix` ("dlock:" as the client's); lease_ms is every grant's
 * lease. Nothing is connected yet. DLOCK_OK, DLOCK_EINVAL (a bad list, an
 * address listed twice, an even N or fewer than 3 nodes, more than
 * DLOCK_REDLOCK_NODES_MAX, a protocol other than 2, a lease under 10 ms:
 * the message says which) or DLOCK_ENOMEM. (One server under two names,
 * "localhost:1" and "127.0.0.1:1", is not refused here; its two nodes
 * count once: dlock_redlock_acquire.) */
int dlock_redlock_create(const dlock_conn_cfg *base, const char *nodes, const char *prefix,
                         uint32_t lease_ms, unsigned pool_size, dlock_counters *ctr,
                         dlock_redlock **out);

/* Frees the set and its pools; no call may be running. */
void dlock_redlock_destroy(dlock_redlock *rl);

/* N, and the majority m. */
unsigned dlock_redlock_nodes(const dlock_redlock *rl);
unsigned dlock_redlock_majority(const dlock_redlock *rl);

/* The drift allowance of the set's lease, in ns: 1% of it + 2 ms. */
int64_t dlock_redlock_drift_ns(const dlock_redlock *rl);

/* Reads every node's run id and seed key now (one pipelined exchange per
 * node, by deadline, monotonic) and records them. DLOCK_OK if every node
 * answered, else DLOCK_EREDIS naming those that did not. */
int dlock_redlock_refresh(dlock_redlock *rl, int64_t deadline);

/* Whether node i (0 .. N-1) counts, as of the last reading of its run id
 * and seed key (an acquire's, a seeding's or a refresh's): 1 or 0. */
int dlock_redlock_counts(dlock_redlock *rl, unsigned i);

/* The periodic server check of node i: INFO on a connection of its pool
 * (a new connection is checked as it opens), judged as one server's is
 * (dlock_conn_check_info, protocol 2: Redis 7.0, no eviction policy).
 * DLOCK_OK; DLOCK_ESERVER when the node is unfit, the message naming it
 * ("redlock node ADDR: ..."); DLOCK_EREDIS when it did not answer by
 * deadline (monotonic). */
int dlock_redlock_check_node(dlock_redlock *rl, unsigned i, int64_t deadline);

/* Seeds every node that does not count and was seen for a lease + the
 * drift allowance (dlock_redlock_seed), after a refresh. Meant to be
 * called periodically (the later step's background thread; the tests).
 * Returns how many nodes it seeded (>= 0), or DLOCK_EREDIS when a node
 * due could not be seeded (message set: why). */
int dlock_redlock_seed_due(dlock_redlock *rl, int64_t deadline);

/* Seeds node i: reads its run id, refuses unless it was seen for a lease +
 * the drift allowance (DLOCK_EBUSY "not yet") and does not count already
 * (DLOCK_OK at once); finds every slot's mark of the prefix on the other
 * nodes that count (SCAN), needing at least m of them (else DLOCK_EREDIS:
 * how many count and answered), reads each mark on each of them
 * (mark.lua 0), writes each mark's highest to node i (mark.lua), and then,
 * once every write was answered, its run id to its seed key. DLOCK_OK,
 * DLOCK_EBUSY (not due, or another thread seeds it now) or DLOCK_EREDIS. */
int dlock_redlock_seed(dlock_redlock *rl, unsigned i, int64_t deadline);

/* Seeds a fresh deployment: gives every node its run id in its seed key.
 * For a deployment's first start and for tests only: it refuses, writing
 * nothing, unless every node answers and holds no key of the prefix at all
 * (no lock data, no mark, no seed key; or, a fresh seeding that failed
 * part way run again, only its seed key holding its own run id): a node
 * with data is seeded from the others (dlock_redlock_seed), never fresh,
 * since a fresh seed would let it vote on marks it lost. Each step (the
 * run ids, each node's scan, each write) has its own command timeout, at
 * most until deadline. DLOCK_OK, DLOCK_EINVAL (a node holds keys of the
 * prefix: the message names it and one key) or DLOCK_EREDIS (a node did not
 * answer: nothing written, or the nodes before it written; run again). */
int dlock_redlock_seed_fresh(dlock_redlock *rl, int64_t deadline);

/* One quorum acquire of one name by one client. */
typedef struct dlock_redlock_req {
    const char *name;
    char *const *keys;            /* the name's DLOCK_SCRIPT_KEYS keys (lua/keys.lua) */
    const dlock_script_args *args; /* the client's id, waiter ttl, wake prefix, keep;
                                     lease_ms and pass_limit are the set's own */
    const char *client_name;      /* acquire.lua ARGV[8] */
    uint64_t attempt;             /* unique and increasing per client and name */
    uint32_t pass_limit;          /* local handoffs the holder may make: the write-back
                                     writes T + pass_limit (the holder hands out
                                     T .. T + pass_limit); 0: none */
    int64_t deadline;             /* monotonic: waits for connections and replies end
                                     here (and one command timeout after each send);
                                     a failed acquire's release may take one command
                                     timeout more */
    int ended;                    /* a release's word for the next grant of the name
                                     (DLOCK_UNCLEAN_*, release.lua's ARGV[10]; 0 none),
                                     on the nodes released by token */
    int queue;                    /* acquire: a try of a wait (above, wait): queued
                                     where refused, a split vote kept or given back */
    int no_keep;                  /* with queue: no split vote kept (given back as a
                                     wait's: not to the nodes that refused it); a
                                     semaphore's slot other than its wait's home */
    uint64_t ticket;              /* with queue: the wait's ticket, the client's wall
                                     clock (us) when the wait began, kept by its tries */
    const char *client_id;        /* with queue: the client's id (args->client_id) */
    int shared;                   /* a shared lease (lua/p2/acquire_shared.lua, released
                                     and given back by release_shared.lua): pass_limit
                                     is not read (the write-back writes T alone), and a
                                     wait's try also gives its split vote back when a
                                     node refused it naming no holder (docs/design.md
                                     "Redlock", Shared mode) */
} dlock_redlock_req;

/* A quorum grant. */
typedef struct dlock_redlock_grant {
    uint64_t token;       /* T: above every token handed out before the first send */
    int64_t first_boot;   /* CLOCK_BOOTTIME (dlock_boot_ns) of the first send */
    int64_t valid_boot;   /* the validity: first_boot + lease - drift allowance */
    uint64_t attempt;
    unsigned votes;       /* counting nodes that granted */
    int unclean;          /* how the hold before ended (DLOCK_UNCLEAN_*): the end at
                             least m votes reported alike (acquire.lua's End), else 0 */
    uint64_t node_token[DLOCK_REDLOCK_NODES_MAX]; /* each node's own grant, 0: none known */
    int shared;           /* a shared lease (the request's shared): renewed, re-granted
                             and released as one */
} dlock_redlock_grant;

/* Why an acquire was refused. */
typedef struct dlock_redlock_busy {
    unsigned refused;     /* counting nodes that refused */
    unsigned votes;       /* counting nodes that granted (fewer than m) */
    int64_t pttl_ms;      /* the longest pttl they told, -1 none */
    char holder[128];     /* a holder's client name they told, "" none (a waiting
                             holder's with "@<ticket>.<id>" after it); else, when a
                             node refused it for this client's own lease of the
                             other mode (DLOCKMODE: a refusal, counted), words that
                             say so */
    int older;            /* q->queue: a node that refused is held by a client whose
                             wait began first (its ticket, then its id, comes first) */
    int kept;             /* q->queue: the split vote was kept (no release sent): the
                             caller gives the attempt back once its next try ended */
    uint32_t sent;        /* every outcome: the nodes its votes' request was flushed to
                             (bit i: node i), where it may have run */
} dlock_redlock_busy;

/* The quorum acquire (above). DLOCK_OK with *g; DLOCK_EBUSY with *busy
 * (enough nodes count and answered, but fewer than m granted, or the
 * write-back met higher marks in every round; the message says which; a
 * wait's split vote kept: busy->kept, nothing released);
 * DLOCK_EREDIS (fewer than m counting nodes answered, or the validity ran
 * out before the hand-out: the message names how many and why; nodes that
 * count once as one server say so). Every failure but a kept split vote
 * first sends a release by attempt to every node the request was sent to,
 * whatever it answered (a wait's try: but those that refused it):
 * over the step's connection while it is in step, else over a fresh one,
 * all within one command timeout from the failure (a node that does not
 * answer it in time keeps its grant at most a lease). A pooled connection
 * that fails at once with EOF or a reset (the server restarted, or closed
 * it while idle) is replaced and its request sent again (safe: every
 * script is idempotent for its attempt). */
int dlock_redlock_acquire(dlock_redlock *rl, const dlock_redlock_req *q, dlock_redlock_grant *g,
                          dlock_redlock_busy *busy);

/* Releases grant g of q's name on every node: by its node's token where it
 * is known, with q->ended as the word for the next grant, else by attempt
 * (release.lua, which then passes on the word the node's grant got; no
 * token of the hand-out is written: the rule does not rely on it). DLOCK_ELOST when more than
 * N - m nodes answered that the grant was not there (it ran out or was
 * taken: no majority held it to the release); else DLOCK_OK when at
 * least m nodes answered (the others' grants end within a lease), else
 * DLOCK_EREDIS. */
int dlock_redlock_release(dlock_redlock *rl, const dlock_redlock_req *q,
                          const dlock_redlock_grant *g);

/* Semaphores (docs/design.md "Redlock", Semaphores): a name's `limit`
 * permits are `limit` slots, slot k an exclusive quorum lock of its own
 * under the calls above, whose keys are the name's with ":s<k>" after
 * "<prefix>{<name>}" (the name's hash slot and slot mark: its HW key is
 * the name's). A permit is a slot held. At most this many slots. */
#define DLOCK_REDLOCK_SEM_MAX 64

/* Bytes dlock_redlock_slot_keys writes for the name's keys `keys`. */
size_t dlock_redlock_slot_keys_size(char *const *keys);

/* Slot k's keys (DLOCK_SCRIPT_KEYS of them, in out) from the name's,
 * written into buf (dlock_redlock_slot_keys_size bytes). */
void dlock_redlock_slot_keys(char *const *keys, unsigned k, char *buf, char **out);

/* One slot a client holds: the slot and its quorum grant. */
typedef struct dlock_redlock_slot {
    unsigned k;
    dlock_redlock_grant g;
} dlock_redlock_slot;

/* A client's permits of one semaphore in this mode (local/rlsem.h):
 * the slots it holds, and its wait's state. One allocation. */
typedef struct dlock_redlock_slots {
    uint32_t limit;       /* the slots: 0 .. limit - 1 */
    unsigned n;           /* slots held: s[0 .. n) */
    unsigned home;        /* a wait's home slot + 1 (its tries keep a split vote
                             there), 0 none */
    uint64_t queued;      /* the slots a wait's tries asked, queued where refused
                             (bit k: slot k), 0 none: left when the wait ends */
    uint64_t ticket;      /* the wait's ticket (redlock.h, wait), kept until it ends
                             (its own grant, its leave), 0 none */
    uint64_t kept;        /* an attempt whose split vote on the home slot was kept,
                             0 none: given back once the next try ended */
    unsigned kept_k;      /* its slot */
    uint64_t fresh;       /* the attempt of the last granted try, 0 none: until the
                             local tier took its grant (local/rlsem.h) */
    unsigned fresh_k;     /* its slot */
    int64_t claim_valid;  /* until when the name's claim for this limit surely lives
                             (dlock_redlock_claim: a try's, a renewal's), 0 none */
    dlock_redlock_slot s[]; /* limit of them */
} dlock_redlock_slots;

/* The slots held, for a trace line: "k:valid,k:valid,..." (each slot and
 * its validity on the boot clock, ns), "-" if none, into out (size bytes:
 * DLOCK_REDLOCK_SLOTS_TEXT holds every slot). */
#define DLOCK_REDLOCK_SLOTS_TEXT (DLOCK_REDLOCK_SEM_MAX * 24 + 2)
void dlock_redlock_slots_text(const dlock_redlock_slots *h, char *out, size_t size);

/* A held lease, for dlock_redlock_renew_many. */
typedef struct dlock_redlock_lease {
    const char *name;              /* for messages */
    const char *key;               /* its lease key (DLOCK_KEY_LEASE) */
    const char *const *keys;       /* all its keys (DLOCK_SCRIPT_KEYS: the acquire's) */
    const dlock_redlock_grant *g;
    int verdict;                   /* out: 1 renewed, 0 gone, -1 not confirmed */
    int64_t valid_boot;            /* out, verdict 1: the new validity */
    int64_t sent_boot;             /* out: the first send of its exchange (0: none) */
    /* out: node i's grant made by this renewal (a re-grant), 0 none */
    uint64_t regrant[DLOCK_REDLOCK_NODES_MAX];
} dlock_redlock_lease;

/* A semaphore name's claim (lua/p2/sem_claim.lua; docs/design.md
 * "Redlock", Semaphores): its hash on the nodes says that the name is a
 * semaphore of one limit, so that a lock's scripts refuse the name, and a
 * claim of another limit is refused, while the claim lives on a majority.
 * A claim lives DLOCK_REDLOCK_CLAIM_LEASES leases from its script's run on
 * a node, but is relied on for one (valid_boot, below): a node restarted
 * without persistence loses its claims, and counts again a lease and the
 * drift allowance after it came back, as for a grant. */
#define DLOCK_REDLOCK_CLAIM_LEASES 2

typedef struct dlock_redlock_claim {
    const char *name;   /* for messages */
    const char *key;    /* the name's hash (DLOCK_KEY_LEASE of its keys) */
    uint32_t limit;
    int verdict;        /* out: 1 claimed by m counting nodes; 0 refused by more
                           than n - m counting nodes (no majority can claim it
                           while they stand; theirs says why); -1 not
                           confirmed (too few answered, or refused by fewer) */
    long long theirs;   /* out, verdict 0: -1 a lock's data (or another
                           protocol's) holds the name, else the limit in use */
    int64_t valid_boot; /* out, verdict 1: until when a majority surely holds the
                           claim (the exchange's first send + a lease - the
                           drift allowance, CLOCK_BOOTTIME, as a grant's) */
    int64_t first_boot; /* out: the exchange's first send (CLOCK_BOOTTIME), for
                           the trace; 0 if none was sent */
} dlock_redlock_claim;

/* Claims the names of cl[0 .. n) on every node in one pipelined exchange
 * per DLOCK_REDLOCK_RENEW_BATCH names, by deadline (monotonic); a node
 * counts as for an acquire (its seed, its run id once). caller: a caller's
 * try (a node that did not answer lately is skipped, and one that does
 * not answer now is marked down, as an acquire does); else the renewal's
 * (every node asked). Each name's
 * verdict in cl[j]. DLOCK_OK if every name was claimed; else the first
 * failure: DLOCK_EINVAL (another limit in use), DLOCK_ESERVER (the name
 * holds a lock's data), both only when refused by more than n - m
 * counting nodes; DLOCK_EREDIS (too few nodes count and claimed it),
 * the message naming the name and why; DLOCK_ENOMEM. */
int dlock_redlock_claim_many(dlock_redlock *rl, dlock_redlock_claim *cl, size_t n,
                             int64_t deadline, int caller);

/* Leases re-granted in one renewal exchange (of DLOCK_REDLOCK_RENEW_BATCH),
 * at most: one round trip each (the rest wait for the next round). */
#define DLOCK_REDLOCK_REGRANTS 8

/* Leases renewed by one exchange of at most this many. */
#define DLOCK_REDLOCK_RENEW_BATCH 256

/* Renews every lease of l[0 .. n) of the client of args (its id) and
 * client_name as dlock_redlock_renew renews one, but all of them in one
 * pipelined exchange per DLOCK_REDLOCK_RENEW_BATCH leases (renew.lua takes
 * them as one batch on each node): a stopped node costs the batch one
 * command timeout, not one per lease. A lease that some nodes never
 * granted (down, cut off or refusing at its acquire) is also re-granted
 * there after that exchange: acquire.lua under its attempt, which grants
 * it if the name is free (docs/design.md "Redlock", Renewals), one round
 * trip per lease for at most DLOCK_REDLOCK_REGRANTS leases per batch
 * (a node that fails one is not asked again in the batch), the grants
 * made in l[j].regrant. Each lease is confirmed by its own majority of
 * counting nodes that renewed or re-granted it; its verdict and validity
 * in l[j] (the validity counted from the batch's first send). DLOCK_OK if
 * every lease was renewed, else the first failure's code and message. */
int dlock_redlock_renew_many(dlock_redlock *rl, const dlock_script_args *args,
                             const char *client_name, dlock_redlock_lease *l, size_t n,
                             int64_t deadline);

/* dlock_redlock_release, for one of many releases in a row (a close):
 * down[i] set skips node i, and is set for every node this release
 * failed to reach, so that a stopped node costs the row one command
 * timeout, not one per release. down NULL: as dlock_redlock_release. */
int dlock_redlock_release_past(dlock_redlock *rl, const dlock_redlock_req *q,
                               const dlock_redlock_grant *g, int *down);

/* Takes the client of q (args: its id) out of the name's wait queue on
 * every node, giving up a direct grant or a grant of an older attempt it
 * never took (leave.lua, numbered q->attempt: a node that saw a later
 * attempt of the client ignores it), as dlock_redlock_give_back_past does
 * a give-back (down); not on the nodes of skip (bit i: node i). DLOCK_OK
 * once every other node answered, else DLOCK_EREDIS. */
int dlock_redlock_leave_past(dlock_redlock *rl, const dlock_redlock_req *q, int *down,
                             uint32_t skip);

/* The settings of node i's connections (its address, the set's base's
 * credentials and timeouts): for a subscriber of its own. */
const dlock_conn_cfg *dlock_redlock_node_cfg(const dlock_redlock *rl, unsigned i);

/* Gives back whatever grant attempt q->attempt of q's name holds on any
 * node (an acquire of unknown outcome: a node that did not answer may
 * have run it): a release by attempt on every node. DLOCK_OK only once
 * every node answered, else DLOCK_EREDIS (the caller tries again). */
int dlock_redlock_give_back(dlock_redlock *rl, const dlock_redlock_req *q);

/* dlock_redlock_give_back, for one of many in a row (the renewal thread's
 * pass over its give-backs): down[i] set skips node i (the give-back is
 * then not done: DLOCK_EREDIS), and is set for every node it failed to
 * reach, so that a stopped node costs the pass one command timeout, not
 * one per give-back; the nodes of skip (bit i: node i), which the attempt
 * never reached, are not asked and count as answered. */
int dlock_redlock_give_back_past(dlock_redlock *rl, const dlock_redlock_req *q, int *down,
                                 uint32_t skip);

/* Renews grant g of q's name (q->attempt unused) on every node by its
 * node's token (renew.lua; a node without one is not asked). DLOCK_OK when
 * at least m counting nodes renewed it, with *valid_boot = the first send
 * + the lease - the drift allowance (CLOCK_BOOTTIME), and only if that
 * confirmation came before it; DLOCK_ELOST when more than N - m nodes
 * answered that the grant is gone (no majority can renew it again);
 * DLOCK_EREDIS otherwise (too few answered: the message says how many). */
int dlock_redlock_renew(dlock_redlock *rl, const dlock_redlock_req *q,
                        const dlock_redlock_grant *g, int64_t *valid_boot);

#endif
