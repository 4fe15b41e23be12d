/*
 * Redlock's quorum acquire and its releases (redlock.h; the set's private part:
 * redlock_int.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "route/redlock_int.h"

/* The release script on every peer that has a connection and did not
 * fail, by the node's token where known (tok[i] != 0), else by attempt;
 * replies read by deadline. How many answered; *gone (if not NULL) how
 * many of them answered that the grant was not there (0). */
static unsigned release_on(dlock_redlock *rl, peer *p, const dlock_redlock_req *q,
                           const uint64_t *tok, int64_t deadline, unsigned *gone)
{
    dlock_script_args a = *q->args;
    a.lease_ms = rl->lease_str;
    char att[24];
    snprintf(att, sizeof att, "%" PRIu64, q->attempt);
    /* by attempt where no token is known, by token elsewhere, each node
     * its own argv, all pipelined together (one deadline: a stopped node
     * costs the release one command timeout, not one per kind) */
    char t[DLOCK_REDLOCK_NODES_MAX][24], ended[8];
    /* (by token: the word for the next grant; by attempt the node passes on
     * the word its grant got, release.lua) */
    snprintf(ended, sizeof ended, "%d", q->ended > 0 && q->ended <= 3 ? q->ended : 0);
    const char *argv[DLOCK_REDLOCK_NODES_MAX][DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS];
    const char **each[DLOCK_REDLOCK_NODES_MAX];
    for (unsigned i = 0; i < rl->n; i++) {
        int by_token = tok && tok[i];
        snprintf(t[i], sizeof t[i], "%" PRIu64, by_token ? tok[i] : 0);
        dlock_script_release_argv(&a, q->keys, q->name, by_token ? "token" : "nonce",
                                  by_token ? t[i] : att, "0", ended, argv[i]);
        each[i] = argv[i];
    }
    dlock_rl_peers_call_each(rl, p, NULL, 0, dlock_script_release_of(2, q->shared),
                             DLOCK_SCRIPT_KEYS,
                             DLOCK_RELEASE_ARGS, (const char **const *)each, 0, deadline);
    unsigned answered = 0;
    if (gone)
        *gone = 0;
    for (unsigned i = 0; i < rl->n; i++)
        if (!p[i].failed && p[i].c && p[i].rep && p[i].rep->type == REDIS_REPLY_INTEGER) {
            answered++;
            if (gone && p[i].rep->integer < 1)
                (*gone)++;
        }
    return answered;
}

int dlock_redlock_release(dlock_redlock *rl, const dlock_redlock_req *q,
                          const dlock_redlock_grant *g)
{
    return dlock_redlock_release_past(rl, q, g, NULL);
}

int dlock_redlock_release_past(dlock_redlock *rl, const dlock_redlock_req *q,
                               const dlock_redlock_grant *g, int *down)
{
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    for (unsigned i = 0; down && i < rl->n; i++)
        if (down[i])
            dlock_rl_peer_fail(&p[i], "%s", "failed an earlier release of this batch");
    dlock_rl_peers_open_up(rl, p, q->deadline);
    int64_t d = dlock_rl_step_deadline(rl, q->deadline);
    dlock_rl_judge(rl, p, d);
    dlock_redlock_req r = *q;
    r.attempt = g->attempt;
    r.shared = g->shared;
    unsigned gone;
    unsigned answered = release_on(rl, p, &r, g->node_token, d, &gone);
    char msg[600] = "";
    size_t len = 0;
    for (unsigned i = 0; down && i < rl->n; i++)
        down[i] |= p[i].failed;
    for (unsigned i = 0; i < rl->n; i++)
        if (p[i].failed && len < sizeof msg)
            len += (size_t)snprintf(msg + len, sizeof msg - len, "; %s %s", rl->node[i].addr,
                                    p[i].why);
    dlock_rl_peers_close(rl, p);
    /* More than n - m nodes without the grant: no majority held it to the
     * end (it ran out, or was taken meanwhile): lost while held, as a
     * single server's release that finds its grant gone. */
    if (gone > rl->n - rl->m)
        return dlock_err_set(DLOCK_ELOST, "redlock release of '%s': %u of %u nodes no longer "
                             "held the grant: it was lost while held", q->name, gone, rl->n);
    if (answered >= rl->m)
        return DLOCK_OK;
    return dlock_err_set(DLOCK_EREDIS, "redlock: the release of '%s' reached %u of %u nodes "
                         "(%u needed; the others' grants end within a lease)%s", q->name,
                         answered, rl->n, rl->m, msg);
}

int dlock_redlock_give_back(dlock_redlock *rl, const dlock_redlock_req *q)
{
    return dlock_redlock_give_back_past(rl, q, NULL, 0);
}

int dlock_redlock_give_back_past(dlock_redlock *rl, const dlock_redlock_req *q, int *down,
                                 uint32_t skip)
{
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    for (unsigned i = 0; i < rl->n; i++)
        if (skip >> i & 1)
            dlock_rl_peer_fail(&p[i], "%s", "not asked");
        else if (down && down[i])
            dlock_rl_peer_fail(&p[i], "%s", "failed an earlier give-back of this pass");
    dlock_rl_peers_open(rl, p, q->deadline);
    unsigned answered = release_on(rl, p, q, NULL, dlock_rl_step_deadline(rl, q->deadline), NULL);
    for (unsigned i = 0; i < rl->n; i++)
        answered += skip >> i & 1;
    char msg[600] = "";
    size_t len = 0;
    for (unsigned i = 0; i < rl->n; i++) {
        if (skip >> i & 1)
            continue;
        if (down)
            down[i] |= p[i].failed;
        if (p[i].failed && len < sizeof msg)
            len += (size_t)snprintf(msg + len, sizeof msg - len, "; %s %s", rl->node[i].addr,
                                    p[i].why);
    }
    dlock_rl_peers_close(rl, p);
    if (answered == rl->n)
        return DLOCK_OK;
    return dlock_err_set(DLOCK_EREDIS, "redlock give-back of attempt %" PRIu64 " of '%s' "
                         "reached %u of %u nodes%s", q->attempt, q->name, answered, rl->n, msg);
}

int dlock_redlock_leave_past(dlock_redlock *rl, const dlock_redlock_req *q, int *down,
                             uint32_t skip)
{
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    for (unsigned i = 0; i < rl->n; i++)
        if (skip >> i & 1)
            dlock_rl_peer_fail(&p[i], "%s", "not asked");
        else if (down && down[i])
            dlock_rl_peer_fail(&p[i], "%s", "failed an earlier job of this pass");
    dlock_rl_peers_open(rl, p, q->deadline);
    char number[24];
    snprintf(number, sizeof number, "%" PRIu64, q->attempt);
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_LEAVE_ARGS];
    dlock_script_leave_argv(q->args, q->keys, q->name, number, argv);
    dlock_rl_peers_call(rl, p, NULL, 0, dlock_script_in(DLOCK_SCRIPT_LEAVE, 2), DLOCK_SCRIPT_KEYS,
                        DLOCK_LEAVE_ARGS, argv, 0, dlock_rl_step_deadline(rl, q->deadline));
    unsigned answered = 0;
    for (unsigned i = 0; i < rl->n; i++) {
        if (skip >> i & 1) {
            answered++;
            continue;
        }
        if (!p[i].failed && p[i].c && p[i].rep && p[i].rep->type == REDIS_REPLY_INTEGER)
            answered++;
        else if (!p[i].failed)
            dlock_rl_peer_fail(&p[i], "answered %s", p[i].rep && p[i].rep->type ==
                               REDIS_REPLY_ERROR ? p[i].rep->str : "no count");
        if (down)
            down[i] |= p[i].failed;
    }
    dlock_rl_peers_close(rl, p);
    if (answered == rl->n)
        return DLOCK_OK;
    return dlock_err_set(DLOCK_EREDIS, "redlock leave of '%s' reached %u of %u nodes", q->name,
                         answered, rl->n);
}

/* A release by attempt of q on node i over a connection of its own,
 * opened with timeouts that end by deadline, then closed. */
static void release_fresh(dlock_redlock *rl, unsigned i, const dlock_redlock_req *q,
                          int64_t deadline)
{
    int64_t left = (deadline - dlock_now_ns()) / DLOCK_NS_PER_MS;
    if (left < 2)
        return;
    dlock_conn_cfg cfg = rl->node[i].cfg;
    uint32_t ms = (uint32_t)(left / 2); /* a connect and a setup at most */
    if (cfg.connect_timeout_ms > ms)
        cfg.connect_timeout_ms = ms;
    if (cfg.command_timeout_ms > ms)
        cfg.command_timeout_ms = ms;
    peer one[DLOCK_REDLOCK_NODES_MAX];
    memset(one, 0, sizeof one);
    for (unsigned j = 0; j < rl->n; j++)
        one[j].failed = j != i;
    if (dlock_conn_open(&cfg, rl->ctr, &one[i].c) != DLOCK_OK)
        return;
    one[i].used = 1; /* (not the pool's: never replaced by dlock_rl_retry_fresh) */
    release_on(rl, one, q, NULL, deadline, NULL);
    if (one[i].rep)
        freeReplyObject(one[i].rep);
    redisFree(one[i].c);
}

/* Ends a failed acquire: a release by attempt on every node its votes'
 * request was sent to (may[i]: it may have granted, whatever it answered,
 * if anything), within one command timeout from now, even past the
 * caller's deadline: over the step's connection while that is in step (a
 * node that answered an error, or did not count), else over a fresh one
 * (its reply or the write-back's timed out, or its connection failed).
 * Then the connections back. Returns rc, its message kept. */
static int acq_failed(dlock_redlock *rl, peer *p, const dlock_redlock_req *q, const int *may,
                      int rc)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dlock_last_error());
    int64_t d = dlock_conn_deadline(rl->node[0].cfg.command_timeout_ms);
    int fresh[DLOCK_REDLOCK_NODES_MAX] = {0};
    for (unsigned i = 0; i < rl->n; i++) {
        if (!may[i])
            p[i].failed = 1;
        else if (p[i].c && !p[i].broken)
            p[i].failed = 0;
        else
            fresh[i] = 1;
    }
    release_on(rl, p, q, NULL, d, NULL);
    for (unsigned i = 0; i < rl->n; i++)
        if (fresh[i])
            release_fresh(rl, i, q, d);
    dlock_rl_peers_close(rl, p);
    return dlock_err_set(rc, "%s", msg);
}

int dlock_rl_refused_by_older(const redisReply *r, const dlock_redlock_req *q)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[0]->integer != 0 ||
        r->element[1]->type != REDIS_REPLY_INTEGER || r->element[2]->type != REDIS_REPLY_STRING)
        return 0;
    /* A shared try refused by a node that names no holder (shared leases
     * there, or a waiter queued ahead) gives way: else readers and writers
     * that hold each other's nodes wait for one another unnamed
     * (docs/design.md "Redlock", Shared mode). */
    if (q->shared && r->element[2]->str[0] == '\0')
        return 1;
    if (r->element[1]->integer <= 0)
        return 0;
    /* "<client_name>@<ticket>.<id>": the last '@' (a client name may hold
     * one); a holder without a ticket waits for nothing */
    const char *at = strrchr(r->element[2]->str, '@');
    if (!at)
        return 0;
    char *end;
    errno = 0;
    unsigned long long t = strtoull(at + 1, &end, 10);
    if (end == at + 1 || *end != '.' || errno)
        return 0;
    const char *id = end + 1;
    if (!strcmp(id, q->client_id))
        return 0; /* its own grant */
    return t < q->ticket || (t == q->ticket && strcmp(id, q->client_id) < 0);
}

/* The token an exclusive acquire proposes, read at `at` (CLOCK_BOOTTIME,
 * ns): the highest clock of the nodes whose grants this client has seen,
 * plus the margin; 0 while it has seen none (redlock.h, acquire). Takes
 * rl->mu. */
static uint64_t floor_at(dlock_redlock *rl, int64_t at)
{
    int64_t f = 0;
    pthread_mutex_lock(&rl->mu);
    for (unsigned i = 0; i < rl->n; i++) {
        const rl_node *nd = &rl->node[i];
        if (nd->clock_known && at / 1000 + nd->clock_off_us + rl->floor_margin_us > f)
            f = at / 1000 + nd->clock_off_us + rl->floor_margin_us;
    }
    pthread_mutex_unlock(&rl->mu);
    return (uint64_t)f;
}

/* Records the clock of each counting node (counted[i]) as its grant's
 * reply told it (acquire.lua's fourth element, sent with a floor), less
 * this client's at the send, `first` (CLOCK_BOOTTIME, ns): the reply's
 * time less the one-way delay, read high so that the floor errs above.
 * Whether a node's clock had reached a floor F > 0 at its vote. Takes
 * rl->mu. */
static int floor_learn(dlock_redlock *rl, const peer *p, const int *counted, uint64_t F,
                       int64_t first)
{
    int late = 0;
    pthread_mutex_lock(&rl->mu);
    for (unsigned i = 0; i < rl->n; i++) {
        const redisReply *r = p[i].rep;
        if (!counted[i] || !r || r->type != REDIS_REPLY_ARRAY || r->elements < 4 ||
            r->element[0]->type != REDIS_REPLY_INTEGER || r->element[0]->integer != 1 ||
            r->element[3]->type != REDIS_REPLY_INTEGER)
            continue;
        rl->node[i].clock_off_us = r->element[3]->integer - first / 1000;
        rl->node[i].clock_known = 1;
        late |= F > 0 && (uint64_t)r->element[3]->integer >= F;
    }
    pthread_mutex_unlock(&rl->mu);
    return late;
}

/* The floor's margin after an acquire with a majority of votes: doubled,
 * up to a lease / 8, if a node's clock had reached the floor at its vote
 * (late), else a 32nd less, down to DLOCK_REDLOCK_FLOOR_MIN_US. Takes
 * rl->mu. */
static void floor_adapt(dlock_redlock *rl, int late)
{
    pthread_mutex_lock(&rl->mu);
    int64_t m = rl->floor_margin_us, cap = rl->lease_ns / 1000 / 8;
    if (late)
        m = 2 * m < cap ? 2 * m : cap;
    else
        m -= m / 32;
    rl->floor_margin_us = m > DLOCK_REDLOCK_FLOOR_MIN_US ? m : DLOCK_REDLOCK_FLOOR_MIN_US;
    pthread_mutex_unlock(&rl->mu);
}

int dlock_redlock_acquire(dlock_redlock *rl, const dlock_redlock_req *q, dlock_redlock_grant *g,
                          dlock_redlock_busy *busy)
{
    memset(g, 0, sizeof *g);
    busy->refused = busy->votes = 0;
    busy->older = busy->kept = 0;
    busy->sent = 0;
    busy->pttl_ms = -1;
    busy->holder[0] = '\0';
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    char att[24];
    snprintf(att, sizeof att, "%" PRIu64, q->attempt);
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_ACQUIRE_ARGS + 1];
    for (int k = 0; k < DLOCK_SCRIPT_KEYS; k++)
        argv[k] = q->keys[k];
    const char **a = argv + DLOCK_SCRIPT_KEYS;
    a[0] = q->args->client_id;
    a[1] = rl->lease_str;
    a[2] = att;
    char pl[16];
    snprintf(pl, sizeof pl, "%" PRIu32, q->pass_limit);
    a[3] = q->shared ? "0" : pl; /* the node reserves the handoffs in its own mark too
                                     (acquire.lua; a shared lease has none) */
    a[4] = q->args->waiter_ttl_ms;
    a[5] = q->queue ? "1" : "0"; /* a wait's try: queued where refused */
    a[6] = q->args->keep_ms;
    /* a wait's name tells its ticket and id to the clients it refuses
     * (wait-die, below) */
    char waiter[DLOCK_CLIENT_NAME_MAX + 64];
    if (q->queue)
        snprintf(waiter, sizeof waiter, "%s@%" PRIu64 ".%s", q->client_name, q->ticket,
                 q->client_id);
    a[7] = q->queue ? waiter : q->client_name;
    a[8] = "0";
    a[9] = "0";
    char floor_s[24]; /* a[10], the floor: an exclusive acquire's, set at the first send */
    a[10] = floor_s;

    /* 1. Votes, read until a command timeout, the caller's deadline or the
     * validity, whichever comes first; the validity counts from the first
     * send, once every node's connection is open (opening one costs up to
     * a connect and a command timeout, node after node; a node that did
     * not answer lately is skipped). */
    dlock_rl_peers_open_up(rl, p, q->deadline);
    int64_t first = dlock_boot_ns(), mono = dlock_now_ns();
    int64_t valid = first + rl->lease_ns - rl->drift_ns;
    int64_t d = dlock_rl_step_deadline(rl, q->deadline);
    if (mono + (valid - first) < d)
        d = mono + (valid - first);
    g->first_boot = first;
    g->valid_boot = valid;
    g->attempt = q->attempt;
    g->shared = q->shared;
    uint64_t F = q->shared ? 0 : floor_at(rl, first);
    snprintf(floor_s, sizeof floor_s, "%" PRIu64, F);
    dlock_rl_judge(rl, p, d);
    dlock_rl_peers_call(rl, p, NULL, 1, q->shared ? DLOCK_SCRIPT_ACQUIRE_SHARED
                        : dlock_script_in(DLOCK_SCRIPT_ACQUIRE, 2), DLOCK_SCRIPT_KEYS,
                        DLOCK_ACQUIRE_ARGS + !q->shared, argv, 1, d);
    /* may[i]: the request reached node i, perhaps (a release goes there on
     * a failure); counted[i]: node i counts for this acquire, judged at the
     * first send (its seed key read before the script: dlock_rl_append_one) */
    int may[DLOCK_REDLOCK_NODES_MAX], counted[DLOCK_REDLOCK_NODES_MAX] = {0};
    int refused[DLOCK_REDLOCK_NODES_MAX] = {0}; /* counting, and refused it */
    busy->sent = 0;
    for (unsigned i = 0; i < rl->n; i++) {
        may[i] = p[i].sent;
        busy->sent |= (uint32_t)(p[i].sent != 0) << i;
    }
    unsigned votes = 0, counting = 0;
    int own_mode = 0; /* a node refused it for this client's own lease of the other mode */
    unsigned kind = 0; /* counting nodes that refused the name as a semaphore's (a
                          claim): more than n - m, and no majority can grant it
                          while they stand */
    unsigned ends[4] = {0}; /* votes by the end they report (acquire.lua, End) */
    uint64_t top = 0;
    char why[900] = "", err[300] = "";
    size_t wl = 0;
    for (unsigned i = 0; i < rl->n; i++) {
        const redisReply *r = p[i].rep;
        if (!p[i].failed && r && r->type == REDIS_REPLY_ARRAY && r->elements >= 2 &&
            r->element[0]->type == REDIS_REPLY_INTEGER &&
            r->element[1]->type == REDIS_REPLY_INTEGER) {
            if (r->element[0]->integer == 1)
                g->node_token[i] = (uint64_t)r->element[1]->integer;
            if (dlock_rl_same_run(rl, p, i) < 0 && dlock_rl_counts_now(rl, i, p[i].run, p[i].seed,
                                                                       first)) {
                counted[i] = 1;
                counting++;
                if (r->element[0]->integer == 1) {
                    votes++;
                    if ((uint64_t)r->element[1]->integer > top)
                        top = (uint64_t)r->element[1]->integer;
                    if (r->elements >= 3 && r->element[2]->type == REDIS_REPLY_INTEGER &&
                        r->element[2]->integer > 0 && r->element[2]->integer <= 3)
                        ends[r->element[2]->integer]++;
                } else if (r->element[0]->integer == 0) {
                    refused[i] = 1;
                    busy->refused++;
                    if (r->element[1]->integer > busy->pttl_ms)
                        busy->pttl_ms = r->element[1]->integer;
                    if (r->elements >= 3 && r->element[2]->type == REDIS_REPLY_STRING &&
                        r->element[2]->str[0] && !busy->holder[0])
                        snprintf(busy->holder, sizeof busy->holder, "%s", r->element[2]->str);
                }
            } else if (wl < sizeof why) {
                char w[300];
                dlock_rl_why_not(rl, i, p, w, sizeof w);
                wl += (size_t)snprintf(why + wl, sizeof why - wl, "; %s", w);
            }
        } else if (!p[i].failed && r && r->type == REDIS_REPLY_ERROR &&
                   !strncmp(r->str, "DLOCKMODE ", 10) && dlock_rl_same_run(rl, p, i) < 0 &&
                   dlock_rl_counts_now(rl, i, p[i].run, p[i].seed, first)) {
            /* This client's own lease of the other mode lives there (its
             * release lost, or a direct grant under an attempt it gave
             * up): the node answered, and refused, writing and queueing
             * nothing; so a refusal (no vote, as the simulator counts it;
             * nothing to release there), not a node that did not answer
             * (docs/design.md "Redlock", Shared mode). */
            counted[i] = 1;
            counting++;
            refused[i] = 1;
            busy->refused++;
            own_mode = 1;
        } else {
            if (!p[i].failed && r && r->type == REDIS_REPLY_ERROR && !err[0])
                snprintf(err, sizeof err, "; %s refused: %s", rl->node[i].addr, r->str);
            if (!p[i].failed && r && r->type == REDIS_REPLY_ERROR &&
                !strncmp(r->str, "DLOCKKIND", 9) && dlock_rl_same_run(rl, p, i) < 0 &&
                dlock_rl_counts_now(rl, i, p[i].run, p[i].seed, first))
                kind++; /* (a semaphore's claim, lua/p2/sem_claim.lua, where it counts) */
            if (!p[i].failed)
                dlock_rl_peer_fail(&p[i], "answered %s", r && r->type == REDIS_REPLY_ERROR ? r->str
                                   : "no vote");
            if (wl < sizeof why) {
                char w[300];
                dlock_rl_why_not(rl, i, p, w, sizeof w);
                wl += (size_t)snprintf(why + wl, sizeof why - wl, "; %s", w);
            }
        }
    }
    int late = !q->shared && floor_learn(rl, p, counted, F, first);
    if (own_mode && !busy->holder[0])
        /* (in one server's words: rpc.c) */
        snprintf(busy->holder, sizeof busy->holder, "%s",
                 "this client in the other mode (given up or lost, not ended yet)");
    if (counting < rl->m && kind > rl->n - rl->m)
        /* (as a single server's refusal: conn.c, a configuration error) */
        return acq_failed(rl, p, q, may, dlock_err_set(DLOCK_ESERVER, "redlock acquire of "
                          "'%s': the name is a semaphore's on %u of %u counting nodes (a name "
                          "is a lock or a semaphore, never both)%s", q->name, kind, rl->n, err));
    if (counting < rl->m)
        return acq_failed(rl, p, q, may, dlock_err_set(DLOCK_EREDIS, "redlock acquire of '%s': "
                          "%u of %u nodes count and answered, %u needed%s%s", q->name, counting,
                          rl->n, rl->m, why, err));
    busy->votes = votes;
    if (votes < rl->m && q->queue) {
        /* A wait's split vote (docs/design.md "Redlock", Waiting): kept,
         * unless the try keeps none (q->no_keep) or a node that refused it
         * is held by a client waiting since before this one (then given
         * back, so that those nodes pass to their next waiter); a release
         * skips the nodes that refused it (nothing of this attempt there;
         * a direct grant one makes later is this client's turn). */
        for (unsigned i = 0; i < rl->n && !busy->older; i++)
            busy->older = !p[i].failed && dlock_rl_refused_by_older(p[i].rep, q);
        if (votes > 0 && !q->no_keep && !busy->older && dlock_boot_ns() < valid) {
            busy->kept = 1;
            dlock_rl_peers_close(rl, p);
            return dlock_err_set(DLOCK_EBUSY, "redlock acquire of '%s': %u of %u nodes granted, "
                                 "%u needed (kept for the next try); held by '%s' for %" PRId64
                                 " ms more", q->name, votes, rl->n, rl->m, busy->holder,
                                 busy->pttl_ms);
        }
        for (unsigned i = 0; i < rl->n; i++)
            if (refused[i])
                may[i] = 0;
    }
    if (votes < rl->m)
        return acq_failed(rl, p, q, may, dlock_err_set(DLOCK_EBUSY, "redlock acquire of '%s': "
                          "%u of %u nodes granted, %u needed; held by '%s' for %" PRId64
                          " ms more", q->name, votes, rl->n, rl->m, busy->holder,
                          busy->pttl_ms));
    if (dlock_boot_ns() >= valid)
        return acq_failed(rl, p, q, may, dlock_err_set(DLOCK_EREDIS, "redlock acquire of '%s': "
                          "the votes came after the validity (%" PRIu32 " ms lease)",
                          q->name, rl->lease_ms));

    /* 2., 3. The token, and its write-back: none when every node counts
     * and voted the highest vote (each took the floor and wrote the vote
     * + the pass limit as its mark; every node, not a majority: an
     * acquire whose write-back these votes overlapped may have been
     * confirmed by nodes that refused it and handed out first, and one of
     * every node granted it, and voted here after its lease there, so
     * after its write-back: docs/design.md "Redlock", hand-out order);
     * else from above the marks this acquire's own votes wrote (each vote
     * + the pass limit, read + another pass limit while the node's clock
     * is behind it). */
    unsigned same = 0;
    for (unsigned i = 0; i < rl->n; i++)
        same += counted[i] && g->node_token[i] == top;
    int floored = !q->shared && same == rl->n;
    if (!q->shared)
        floor_adapt(rl, late);
    uint64_t T = floored ? top : top + 1 + (q->shared ? 0 : 2 * (uint64_t)q->pass_limit);
    int confirmed = floored, met = 0;
    unsigned acks = 0;
    for (int round = 0; round < DLOCK_REDLOCK_ROUNDS && !confirmed; round++) {
        /* T + the pass limit: the holder's local handoffs hand out up to it */
        char t[24];
        snprintf(t, sizeof t, "%" PRIu64, T + (q->shared ? 0 : q->pass_limit));
        const char *wargv[] = {q->keys[DLOCK_KEY_HW], rl->seed_key, t, ""};
        int64_t wd = dlock_rl_step_deadline(rl, q->deadline);
        if (mono + (valid - first) < wd)
            wd = mono + (valid - first);
        /* once per server: a server listed twice would meet its own T */
        int once[DLOCK_REDLOCK_NODES_MAX];
        for (unsigned i = 0; i < rl->n; i++)
            once[i] = dlock_rl_same_run(rl, p, i) < 0;
        dlock_rl_judge(rl, p, wd);
        dlock_rl_peers_call(rl, p, once, 0, DLOCK_SCRIPT_MARK, 2, 2, wargv, 0, wd);
        uint64_t high = 0;
        met = 0;
        acks = 0;
        for (unsigned i = 0; i < rl->n; i++) {
            const redisReply *r = p[i].rep;
            if (p[i].failed || !r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
                r->element[0]->type != REDIS_REPLY_STRING ||
                r->element[1]->type != REDIS_REPLY_STRING)
                continue;
            if (!once[i])
                continue; /* (its reply is still the vote's) */
            uint64_t before = strtoull(r->element[0]->str, NULL, 10);
            if (before >= T) {
                met = 1;
                if (before > high)
                    high = before;
            } else if (dlock_rl_counts_now(rl, i, p[i].run, r->element[1]->str,
                                           first) && counted[i]) {
                acks++; /* (its seed key as the write-back's script read it) */
            }
        }
        if (met)
            T = high + 1;
        else
            confirmed = acks >= rl->m;
        if (!met)
            break;
    }
    if (!confirmed) {
        if (met)
            return acq_failed(rl, p, q, may, dlock_err_set(DLOCK_EBUSY, "redlock acquire of "
                              "'%s': the write-back met higher marks in %d rounds (contended)",
                              q->name, DLOCK_REDLOCK_ROUNDS));
        return acq_failed(rl, p, q, may, dlock_err_set(DLOCK_EREDIS, "redlock acquire of '%s': "
                          "the token's write-back reached %u counting nodes, %u needed",
                          q->name, acks, rl->m));
    }
    /* 4. The hand-out, only within the validity. */
    if (dlock_boot_ns() >= valid)
        return acq_failed(rl, p, q, may, dlock_err_set(DLOCK_EREDIS, "redlock acquire of '%s': "
                          "confirmed after the validity (%" PRIu32 " ms lease); released",
                          q->name, rl->lease_ms));
    g->token = T;
    /* How the hold before ended: only what a majority of the nodes say
     * alike (a node that missed a release, or never held the grant
     * before, tells another word than the rest; a minority's word is
     * none). */
    for (int k = 1; k <= 3; k++)
        if (ends[k] >= rl->m)
            g->unclean = k;
    g->votes = votes;
    dlock_rl_peers_close(rl, p);
    return DLOCK_OK;
}
