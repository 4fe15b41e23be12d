/*
 * Redlock's claims of semaphore names (redlock.h, dlock_redlock_claim;
 * the set's private part: redlock_int.h). No shared state of its own: the
 * node set's (rl->mu) through redlock_int.h's calls.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "route/redlock_int.h"

/* One exchange: cl[0 .. k) on every node. DLOCK_OK, or the first failure
 * (its message), as dlock_redlock_claim_many's. */
static int claim_chunk(dlock_redlock *rl, dlock_redlock_claim *cl, size_t k, int64_t deadline,
                       int caller)
{
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    const char **argv = malloc(sizeof *argv * (2 * k + 1));
    char *lim = malloc(16 * k), ttl[24];
    /* claimed, refused, refused as a lock's (counting nodes) */
    unsigned *ok = calloc(3 * k, sizeof *ok), *no = ok + k, *lk = ok + 2 * k;
    for (size_t j = 0; j < k; j++)
        cl[j].verdict = -1, cl[j].theirs = 0;
    if (!argv || !lim || !ok) {
        free(argv);
        free(lim);
        free(ok);
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    }
    snprintf(ttl, sizeof ttl, "%" PRIu64,
             (uint64_t)rl->lease_ms * DLOCK_REDLOCK_CLAIM_LEASES);
    for (size_t j = 0; j < k; j++) {
        argv[j] = cl[j].key;
        snprintf(lim + 16 * j, 16, "%" PRIu32, cl[j].limit);
        argv[k + 1 + j] = lim + 16 * j;
    }
    argv[k] = ttl;
    if (caller)
        dlock_rl_peers_open_up(rl, p, deadline); /* (as an acquire: a node down lately skipped) */
    else
        dlock_rl_peers_open(rl, p, deadline);
    int64_t first = dlock_boot_ns();
    /* (relied on for a lease, as a grant: a node restarted without the
     * claim counts again a lease + the drift allowance after it came
     * back, route/redlock.h; its time to live is longer) */
    int64_t valid = first + rl->lease_ns - rl->drift_ns;
    int64_t d = dlock_rl_step_deadline(rl, deadline);
    if (caller)
        dlock_rl_judge(rl, p, d);
    dlock_rl_peers_call(rl, p, NULL, 1, DLOCK_SCRIPT_SEM_CLAIM, (int)k, (int)k + 1, argv, 1, d);
    char msg[600] = "", err[300] = "";
    size_t len = 0;
    for (unsigned i = 0; i < rl->n; i++) {
        const redisReply *r = p[i].rep;
        int fits = !p[i].failed && r && r->type == REDIS_REPLY_ARRAY && r->elements == k;
        for (size_t j = 0; fits && j < k; j++)
            fits = r->element[j]->type == REDIS_REPLY_INTEGER;
        if (!fits && !p[i].failed) {
            if (r && r->type == REDIS_REPLY_ERROR && !err[0])
                snprintf(err, sizeof err, "; %s refused: %s", rl->node[i].addr, r->str);
            dlock_rl_peer_fail(&p[i], "answered %s", r && r->type == REDIS_REPLY_ERROR ? r->str
                               : "no claim");
        }
        /* (a server listed twice counts once) */
        int counts = fits && dlock_rl_same_run(rl, p, i) < 0 &&
                     dlock_rl_counts_now(rl, i, p[i].run, p[i].seed, first);
        if (!counts && len < sizeof msg) {
            char w[300];
            dlock_rl_why_not(rl, i, p, w, sizeof w);
            len += (size_t)snprintf(msg + len, sizeof msg - len, "; %s", w);
        }
        for (size_t j = 0; counts && j < k; j++) {
            long long v = r->element[j]->integer;
            if (v == 0) {
                ok[j]++;
                continue;
            }
            no[j]++;
            lk[j] += v == -1;
            if (cl[j].theirs == 0 || v == -1)
                cl[j].theirs = v; /* (a lock's data first: the graver refusal) */
        }
    }
    int in_time = dlock_boot_ns() < valid;
    for (size_t j = 0; j < k; j++) {
        cl[j].first_boot = first;
        if (ok[j] >= rl->m && in_time) {
            cl[j].verdict = 1;
            cl[j].valid_boot = valid;
        } else if (no[j] > rl->n - rl->m) {
            cl[j].verdict = 0; /* (no majority can claim it while those refusals stand) */
        }
    }
    int rc = DLOCK_OK;
    for (size_t j = 0; j < k && rc == DLOCK_OK; j++) {
        if (cl[j].verdict == 1)
            continue;
        if (cl[j].verdict == 0 && cl[j].theirs < 0)
            rc = dlock_err_set(DLOCK_ESERVER, "redlock claim of the semaphore '%s': refused by %u "
                          "of %u nodes, %u of them holding a lock's data there (a name is a "
                          "lock or a semaphore, never both)", cl[j].name, no[j], rl->n, lk[j]);
        else if (cl[j].verdict == 0)
            rc = dlock_err_set(DLOCK_EINVAL, "the semaphore '%s' is used with limit %lld by its "
                          "holders or waiters (its claim on %u of %u nodes, which ends about two "
                          "leases after its last use); this call gives limit %" PRIu32,
                          cl[j].name, cl[j].theirs, no[j], rl->n, cl[j].limit);
        else
            rc = dlock_err_set(DLOCK_EREDIS, "redlock claim of the semaphore '%s': %u of %u nodes "
                          "count and claimed it, %u needed (%u refused it)%s%s%s", cl[j].name,
                          ok[j], rl->n, rl->m, no[j], in_time ? "" : " within its validity", msg,
                          err);
    }
    dlock_rl_peers_close(rl, p);
    free(argv);
    free(lim);
    free(ok);
    return rc;
}

int dlock_redlock_claim_many(dlock_redlock *rl, dlock_redlock_claim *cl, size_t n,
                             int64_t deadline, int caller)
{
    int rc = DLOCK_OK;
    char why[700] = "";
    for (size_t from = 0; from < n; from += DLOCK_REDLOCK_RENEW_BATCH) {
        size_t k = n - from < DLOCK_REDLOCK_RENEW_BATCH ? n - from : DLOCK_REDLOCK_RENEW_BATCH;
        int r = claim_chunk(rl, cl + from, k, deadline, caller);
        if (r != DLOCK_OK && rc == DLOCK_OK) {
            rc = r;
            snprintf(why, sizeof why, "%s", dlock_last_error());
        }
    }
    if (rc == DLOCK_OK)
        return rc;
    return dlock_err_set(rc, "%s", why);
}
