/*
 * storm_fault.c: --node-fault (Redlock mode: one node of the N killed,
 * stopped, restarted from its AOF or restarted empty, --fault-at seconds
 * into the run) and the longest gap between two successive grants.
 *
 * The gap: the time between two successive returns of a successful
 * acquire, over every process, thread and name (a thread notes its grant
 * the moment dlock_acquire returns, note_grant); the run's start counts as
 * a grant, and the end of the run (its deadline) closes the last gap. So
 * with one hot name it is the longest time the name went ungranted
 * anywhere, its holder's critical section and release included; a gap
 * that ends after the fault also has its own maximum. Both in the JSON
 * (max_grant_gap_ms, fault.max_gap_after_ms) and the summary.
 *
 * The faulted node is the last one of the list. kill: SIGKILL, left down;
 * stop: SIGSTOP, then SIGCONT after --fault-for (default 2 s); restart:
 * SIGKILL, then the same server started again after --fault-for (default
 * 0) on its AOF (that node runs with appendonly yes, appendfsync always:
 * it keeps every write it acknowledged); wipe: the same without the AOF,
 * the node comes back empty. A restarted node has a new run id: the
 * clients count it again only once one of them has seeded it, a lease and
 * the drift allowance after they first saw it (docs/design.md, "Redlock").
 * The run fails unless the fault struck and acquisitions went on a lease
 * after it (node_fault_ok).
 *
 * Shared state: H->last_grant_ns, max_gap_ns, max_gap_end_ns and
 * max_gap_after_ns are updated by the threads atomically (compare and
 * swap, a maximum); H->fault_ns is written once by the parent when it
 * strikes. The rest of this file's state is the parent's.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "fixture.h"
#include "storm.h"

static const char *const fault_name[] = {"none", "kill", "stop", "restart", "wipe"};

static void atomic_max(int64_t *at, int64_t v)
{
    int64_t cur = __atomic_load_n(at, __ATOMIC_RELAXED);
    while (v > cur && !__atomic_compare_exchange_n(at, &cur, v, 0, __ATOMIC_RELAXED,
                                                   __ATOMIC_RELAXED))
        ;
}

void note_grant(int64_t t)
{
    int64_t prev = __atomic_load_n(&H->last_grant_ns, __ATOMIC_RELAXED);
    while (t > prev && !__atomic_compare_exchange_n(&H->last_grant_ns, &prev, t, 0,
                                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    if (t <= prev)
        return; /* a later grant was noted first: no gap ends here */
    int64_t gap = t - prev;
    int64_t cur = __atomic_load_n(&H->max_gap_ns, __ATOMIC_RELAXED);
    if (gap > cur) {
        atomic_max(&H->max_gap_ns, gap);
        if (__atomic_load_n(&H->max_gap_ns, __ATOMIC_RELAXED) == gap)
            __atomic_store_n(&H->max_gap_end_ns, t, __ATOMIC_RELAXED);
    }
    int64_t f = __atomic_load_n(&H->fault_ns, __ATOMIC_RELAXED);
    if (f && t > f)
        atomic_max(&H->max_gap_after_ns, gap);
}

/* ------------------------------------------------------------------ */
/* The parent                                                           */

static const char *const aof_args[] = {"--appendonly", "yes", "--appendfsync", "always", NULL};
static fx_redis_opts aof_opts = {.args = aof_args};

/* restart, wipe: 1 if the restarted node's seed key holds its run id at
 * the end (a client seeded it: it counts again), 0 if not, -1 unknown */
static int reseeded = -1;

static int64_t struck_ns, healed_ns; /* when the fault began; ended (0: not) */
/* acquisitions when it struck, and a lease later: every lease granted
 * before the fault has run out by then (renewed only by a majority after
 * it), so an acquisition after that came from the nodes that are left */
static uint64_t acq_at_fault, acq_at_lease;
static int64_t lease_ns;
static int fault_failed;             /* a signal or restart that did not work */

const fx_redis_opts *node_fault_opts(int i)
{
    return O.node_fault == NF_RESTART && i == O.redlock - 1 ? &aof_opts : NULL;
}

int node_fault_spoils_info(void)
{
    return O.node_fault == NF_KILL || O.node_fault == NF_RESTART || O.node_fault == NF_WIPE;
}

static uint64_t live_acq(size_t total)
{
    uint64_t acq = 0;
    for (size_t i = 0; i < total; i++)
        acq += __atomic_load_n(&TR[i].acq, __ATOMIC_RELAXED);
    return acq;
}

void node_fault_tick(fx_redis *srv, int64_t start, int64_t now, size_t total)
{
    if (!O.node_fault || fault_failed)
        return;
    fx_redis *n = &srv[O.redlock - 1];
    if (struck_ns && !lease_ns && now - struck_ns >= O.lease_ms * 1000000LL) {
        acq_at_lease = live_acq(total);
        lease_ns = now;
    }
    if (!struck_ns && now - start >= (int64_t)(O.fault_at * 1e9)) {
        acq_at_fault = live_acq(total);
        struck_ns = now_ns();
        __atomic_store_n(&H->fault_ns, struck_ns, __ATOMIC_RELAXED);
        int sig = O.node_fault == NF_STOP ? SIGSTOP : SIGKILL;
        if (fx_redis_signal(n, sig) != 0)
            fault_failed = 1;
        if (!O.quiet)
            fprintf(stderr, "storm: %.1fs  node %d (port %d): %s\n", (double)(now - start) / 1e9,
                    O.redlock, n->port, fault_name[O.node_fault]);
    } else if (struck_ns && !healed_ns && O.node_fault != NF_KILL &&
               now - struck_ns >= (int64_t)(O.fault_for * 1e9)) {
        if (O.node_fault == NF_STOP)
            fault_failed = fx_redis_signal(n, SIGCONT) != 0;
        else
            fault_failed = fx_redis_restart(n) != 0;
        healed_ns = now_ns();
        if (!O.quiet)
            fprintf(stderr, "storm: %.1fs  node %d: %s%s\n", (double)(now - start) / 1e9,
                    O.redlock, O.node_fault == NF_STOP ? "resumed" : "restarted",
                    fault_failed ? " FAILED" : "");
    }
}

void node_fault_end(fx_redis *srv)
{
    fx_redis *n = &srv[O.redlock - 1];
    if (O.node_fault == NF_STOP && struck_ns && !healed_ns)
        (void)fx_redis_signal(n, SIGCONT);
    if ((O.node_fault != NF_RESTART && O.node_fault != NF_WIPE) || !healed_ns || fault_failed)
        return;
    redisReply *seed = fx_cmd_at(n->port, "GET %sredlock:seed", key_prefix);
    redisReply *info = fx_cmd_at(n->port, "INFO server");
    const char *id = info && info->type != REDIS_REPLY_ERROR && info->str
                         ? strstr(info->str, "run_id:") : NULL;
    if (seed && id)
        reseeded = seed->type == REDIS_REPLY_STRING && seed->len == 40 &&
                   strncmp(id + 7, seed->str, 40) == 0;
    if (seed)
        freeReplyObject(seed);
    if (info)
        freeReplyObject(info);
}

/* The gap still open at the end of the run, and the maxima with it. */
static void gaps(int64_t *max_gap, int64_t *end, int64_t *after)
{
    int64_t last = H->last_grant_ns, dl = H->deadline_ns;
    *max_gap = H->max_gap_ns;
    *end = H->max_gap_end_ns;
    *after = H->max_gap_after_ns;
    if (dl > last) {
        if (dl - last > *max_gap) {
            *max_gap = dl - last;
            *end = dl;
        }
        if (struck_ns && dl > struck_ns && dl - last > *after)
            *after = dl - last;
    }
}

int node_fault_ok(uint64_t acq)
{
    if (!O.node_fault)
        return 1;
    return lease_ns && !fault_failed && acq > acq_at_lease;
}

void node_fault_json(FILE *o, uint64_t acq)
{
    int64_t g, end, after;
    gaps(&g, &end, &after);
    int64_t start = H->start_ns;
    fprintf(o, "\"max_grant_gap_ms\":%.3f,\"max_grant_gap_end_s\":%.3f,", (double)g / 1e6,
            (double)(end - start) / 1e9);
    if (!O.node_fault)
        return;
    fprintf(o, "\"fault\":{\"kind\":\"%s\",\"node\":%d,\"at_s\":%.3f,", fault_name[O.node_fault],
            O.redlock, struck_ns ? (double)(struck_ns - start) / 1e9 : -1.0);
    if (healed_ns)
        fprintf(o, "\"healed_at_s\":%.3f,", (double)(healed_ns - start) / 1e9);
    if (reseeded >= 0)
        fprintf(o, "\"reseeded\":%s,", reseeded ? "true" : "false");
    fprintf(o, "\"failed\":%s,\"acq_after\":%" PRIu64 ",\"acq_after_a_lease\":%" PRIu64 ","
               "\"max_gap_after_ms\":%.3f,\"ok\":%s},",
            fault_failed ? "true" : "false", struck_ns ? acq - acq_at_fault : 0,
            lease_ns ? acq - acq_at_lease : 0,
            (double)after / 1e6, node_fault_ok(acq) ? "true" : "false");
}

void node_fault_summary(FILE *e, uint64_t acq)
{
    int64_t g, end, after;
    gaps(&g, &end, &after);
    int64_t start = H->start_ns;
    fprintf(e, "  grant gap      longest %.1f ms between two successive grants (any process,"
               " name), ending at %.2f s",
            (double)g / 1e6, (double)(end - start) / 1e9);
    if (!O.mutex && !O.naive)
        fprintf(e, "; lease %ld ms", O.lease_ms);
    fprintf(e, "\n");
    if (!O.node_fault)
        return;
    if (!struck_ns) {
        fprintf(e, "  node fault     %s never struck (--fault-at past the run)\n",
                fault_name[O.node_fault]);
        return;
    }
    fprintf(e, "  node fault     %s of node %d at %.2f s; %" PRIu64 " acquisitions after it (%"
               PRIu64 " after a lease more), longest gap after it %.1f ms%s\n",
            fault_name[O.node_fault], O.redlock, (double)(struck_ns - start) / 1e9,
            acq - acq_at_fault, lease_ns ? acq - acq_at_lease : 0, (double)after / 1e6, fault_failed ? " (the fault FAILED)" : "");
    if (healed_ns)
        fprintf(e, "                 (%s %.2f s after the fault%s)\n",
                O.node_fault == NF_STOP ? "resumed" : "restarted",
                (double)(healed_ns - struck_ns) / 1e9,
                reseeded == 1   ? "; seeded again by a client by the end: it counts"
                : reseeded == 0 ? "; NOT seeded again by the end: it does not count"
                                : "");
}
