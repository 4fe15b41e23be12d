/*
 * Redlock's renewals and re-grants (redlock.h; the set's private part:
 * redlock_int.h).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "route/redlock_int.h"

int dlock_redlock_renew(dlock_redlock *rl, const dlock_redlock_req *q,
                        const dlock_redlock_grant *g, int64_t *valid_boot)
{
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    int only[DLOCK_REDLOCK_NODES_MAX] = {0};
    for (unsigned i = 0; i < rl->n; i++) {
        only[i] = g->node_token[i] != 0;
        if (!only[i])
            dlock_rl_peer_fail(&p[i], "%s", "granted nothing");
    }
    dlock_rl_peers_open(rl, p, q->deadline);
    int64_t first = dlock_boot_ns();
    int64_t valid = first + rl->lease_ns - rl->drift_ns;
    int64_t d = dlock_rl_step_deadline(rl, q->deadline);
    /* One call per node, each its own grant's token, pipelined. */
    char tok[DLOCK_REDLOCK_NODES_MAX][24];
    const char *argv[DLOCK_REDLOCK_NODES_MAX][4];
    const char **each[DLOCK_REDLOCK_NODES_MAX];
    for (unsigned i = 0; i < rl->n; i++) {
        snprintf(tok[i], sizeof tok[i], "%" PRIu64, g->node_token[i]);
        argv[i][0] = q->keys[DLOCK_KEY_LEASE];
        argv[i][1] = q->args->client_id;
        argv[i][2] = rl->lease_str;
        argv[i][3] = tok[i];
        each[i] = argv[i];
    }
    dlock_rl_peers_call_each(rl, p, only, 1, dlock_script_in(DLOCK_SCRIPT_RENEW, 2), 1, 3,
                             (const char **const *)each, 1, d);
    unsigned ok = 0, gone = 0;
    char msg[600] = "";
    size_t len = 0;
    for (unsigned i = 0; i < rl->n; i++) {
        const redisReply *r = p[i].rep;
        int one = !p[i].failed && r && r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
                  r->element[0]->type == REDIS_REPLY_INTEGER;
        if (one && r->element[0]->integer == 1 && dlock_rl_same_run(rl, p, i) < 0 &&
            dlock_rl_counts_now(rl, i, p[i].run, p[i].seed, first))
            ok++; /* (a server listed twice counts once) */
        else if (one && r->element[0]->integer != 1)
            gone++;
        else if (len < sizeof msg)
            len += (size_t)snprintf(msg + len, sizeof msg - len, "; %s %s", rl->node[i].addr,
                                    p[i].failed ? p[i].why : "does not count");
    }
    dlock_rl_peers_close(rl, p);
    if (ok >= rl->m && dlock_boot_ns() < valid) {
        *valid_boot = valid;
        return DLOCK_OK;
    }
    if (gone > rl->n - rl->m)
        return dlock_err_set(DLOCK_ELOST, "redlock renewal of '%s': %u of %u nodes no longer "
                             "hold the grant", q->name, gone, rl->n);
    return dlock_err_set(DLOCK_EREDIS, "redlock renewal of '%s': %u of %u counting nodes "
                         "renewed it, %u needed%s", q->name, ok, rl->n, rl->m, msg);
}

/* One exchange of renew_many: leases l[0 .. k), every node asked for all
 * of them (token "0" where it granted none: renew.lua answers 0, not
 * counted). */
/* Re-grants l[0 .. k) after their renewal's exchange (first: its first
 * send): acquire.lua under each lease's attempt on the nodes that hold no
 * grant of it, one exchange per lease, at most DLOCK_REDLOCK_REGRANTS
 * leases; a node that failed the renewal's exchange (skip[i]), or fails
 * one here, is not asked (again). Adds to acks[j] each counting node that
 * granted lease j; its grants in l[j].regrant. */
static void regrant_chunk(dlock_redlock *rl, const dlock_script_args *args,
                          const char *client_name, dlock_redlock_lease *l, size_t k,
                          int64_t first, int64_t deadline, const int *skip, unsigned *acks)
{
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    int need[DLOCK_REDLOCK_NODES_MAX] = {0}, any = 0;
    for (size_t j = 0; j < k; j++)
        for (unsigned i = 0; i < rl->n; i++)
            need[i] |= !l[j].g->node_token[i];
    for (unsigned i = 0; i < rl->n; i++) {
        need[i] &= !skip[i];
        any |= need[i];
        if (!need[i])
            dlock_rl_peer_fail(&p[i], "%s", "not asked");
    }
    if (!any)
        return;
    dlock_rl_peers_open(rl, p, deadline);
    char pl[16], att[24];
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_ACQUIRE_ARGS];
    const char **a = argv + DLOCK_SCRIPT_KEYS;
    for (size_t j = 0, done = 0; j < k && done < DLOCK_REDLOCK_REGRANTS; j++) {
        int only[DLOCK_REDLOCK_NODES_MAX], some = 0;
        for (unsigned i = 0; i < rl->n; i++)
            some |= only[i] = !l[j].g->node_token[i] && !p[i].failed;
        if (!some)
            continue;
        done++;
        for (int x = 0; x < DLOCK_SCRIPT_KEYS; x++)
            argv[x] = l[j].keys[x];
        snprintf(att, sizeof att, "%" PRIu64, l[j].g->attempt);
        snprintf(pl, sizeof pl, "%s", l[j].g->shared ? "0" : args->pass_limit);
        /* as the acquire's (dlock_redlock_acquire), a single try */
        a[0] = args->client_id;
        a[1] = rl->lease_str;
        a[2] = att;
        a[3] = pl;
        a[4] = args->waiter_ttl_ms;
        a[5] = "0";
        a[6] = args->keep_ms;
        a[7] = client_name;
        a[8] = "0";
        a[9] = "0";
        dlock_rl_peers_call(rl, p, only, 1, l[j].g->shared ? DLOCK_SCRIPT_ACQUIRE_SHARED
                            : dlock_script_in(DLOCK_SCRIPT_ACQUIRE, 2), DLOCK_SCRIPT_KEYS,
                            DLOCK_ACQUIRE_ARGS, argv, 1, dlock_rl_step_deadline(rl, deadline));
        for (unsigned i = 0; i < rl->n; i++) {
            const redisReply *r = p[i].rep;
            if (!only[i] || p[i].failed || !r || r->type != REDIS_REPLY_ARRAY ||
                r->elements < 2 || r->element[0]->type != REDIS_REPLY_INTEGER ||
                r->element[1]->type != REDIS_REPLY_INTEGER || r->element[0]->integer != 1)
                continue;
            l[j].regrant[i] = (uint64_t)r->element[1]->integer;
            if (dlock_rl_same_run(rl, p, i) < 0 && dlock_rl_counts_now(rl, i, p[i].run, p[i].seed,
                                                                       first))
                acks[j]++;
        }
    }
    dlock_rl_peers_close(rl, p);
}

static void renew_chunk(dlock_redlock *rl, const dlock_script_args *args,
                        const char *client_name, dlock_redlock_lease *l, size_t k,
                        int64_t deadline)
{
    const char *client_id = args->client_id;
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    const char **argv[DLOCK_REDLOCK_NODES_MAX];
    char *tok[DLOCK_REDLOCK_NODES_MAX];
    int only[DLOCK_REDLOCK_NODES_MAX] = {0}, oom = 0;
    for (unsigned i = 0; i < rl->n; i++) {
        argv[i] = malloc(sizeof *argv[i] * (2 * k + 2));
        tok[i] = malloc(24 * k);
        oom |= !argv[i] || !tok[i];
        for (size_t j = 0; j < k; j++)
            only[i] |= l[j].g->node_token[i] != 0;
        if (!only[i])
            dlock_rl_peer_fail(&p[i], "%s", "granted nothing");
    }
    for (unsigned i = 0; i < rl->n && !oom; i++) {
        for (size_t j = 0; j < k; j++) {
            argv[i][j] = l[j].key;
            snprintf(tok[i] + 24 * j, 24, "%" PRIu64, l[j].g->node_token[i]);
            argv[i][k + 2 + j] = tok[i] + 24 * j;
        }
        argv[i][k] = client_id;
        argv[i][k + 1] = rl->lease_str;
    }
    for (size_t j = 0; j < k; j++) {
        l[j].verdict = -1, l[j].sent_boot = 0;
        memset(l[j].regrant, 0, sizeof l[j].regrant);
    }
    unsigned *acks = calloc(k, sizeof *acks);
    oom |= !acks;
    if (!oom) {
        dlock_rl_peers_open(rl, p, deadline);
        int64_t first = dlock_boot_ns();
        int64_t valid = first + rl->lease_ns - rl->drift_ns;
        for (size_t j = 0; j < k; j++)
            l[j].sent_boot = first;
        dlock_rl_peers_call_each(rl, p, only, 1, dlock_script_in(DLOCK_SCRIPT_RENEW, 2), (int)k,
                                 (int)k + 2, (const char **const *)argv, 1,
                                 dlock_rl_step_deadline(rl, deadline));
        int counts[DLOCK_REDLOCK_NODES_MAX];
        for (unsigned i = 0; i < rl->n; i++) {
            const redisReply *r = p[i].rep;
            int fits = !p[i].failed && r && r->type == REDIS_REPLY_ARRAY && r->elements == k;
            for (size_t j = 0; fits && j < k; j++)
                fits = r->element[j]->type == REDIS_REPLY_INTEGER;
            if (!fits && !p[i].failed)
                dlock_rl_peer_fail(&p[i], "%s", "answered no renewal");
            /* (a server listed twice counts once) */
            counts[i] = !p[i].failed && dlock_rl_same_run(rl, p, i) < 0 &&
                        dlock_rl_counts_now(rl, i, p[i].run, p[i].seed, first);
        }
        int skip[DLOCK_REDLOCK_NODES_MAX];
        for (unsigned i = 0; i < rl->n; i++)
            skip[i] = only[i] && p[i].failed; /* (asked, and failed: stopped or gone) */
        regrant_chunk(rl, args, client_name, l, k, first, deadline, skip, acks);
        int in_time = dlock_boot_ns() < valid;
        for (size_t j = 0; j < k; j++) {
            unsigned ok = acks[j], gone = 0;
            for (unsigned i = 0; i < rl->n; i++) {
                if (p[i].failed || !l[j].g->node_token[i])
                    continue;
                if (p[i].rep->element[j]->integer == 1)
                    ok += counts[i];
                else
                    gone++;
            }
            if (ok >= rl->m && in_time) {
                l[j].verdict = 1;
                l[j].valid_boot = valid;
            } else if (gone > rl->n - rl->m) {
                l[j].verdict = 0;
            }
        }
        char msg[600] = "";
        size_t len = 0;
        for (unsigned i = 0; i < rl->n; i++)
            if ((p[i].failed || !counts[i]) && only[i] && len < sizeof msg)
                len += (size_t)snprintf(msg + len, sizeof msg - len, "; %s %s",
                                        rl->node[i].addr,
                                        p[i].failed ? p[i].why : "does not count");
        for (size_t j = 0; j < k; j++)
            if (l[j].verdict != 1)
                dlock_err_set(l[j].verdict ? DLOCK_EREDIS : DLOCK_ELOST, "redlock renewal of "
                              "'%s': not confirmed by %u counting nodes%s%s", l[j].name, rl->m,
                              in_time ? "" : " within its validity", msg);
        dlock_rl_peers_close(rl, p);
    } else {
        dlock_err_set(DLOCK_ENOMEM, "out of memory");
    }
    for (unsigned i = 0; i < rl->n; i++) {
        free(argv[i]);
        free(tok[i]);
    }
    free(acks);
}

int dlock_redlock_renew_many(dlock_redlock *rl, const dlock_script_args *args,
                             const char *client_name, dlock_redlock_lease *l, size_t n,
                             int64_t deadline)
{
    int rc = DLOCK_OK;
    char why[700] = "";
    for (size_t from = 0; from < n; from += DLOCK_REDLOCK_RENEW_BATCH) {
        size_t k = n - from < DLOCK_REDLOCK_RENEW_BATCH ? n - from : DLOCK_REDLOCK_RENEW_BATCH;
        renew_chunk(rl, args, client_name, l + from, k, deadline);
        for (size_t j = from; j < from + k; j++)
            if (l[j].verdict != 1 && rc == DLOCK_OK) {
                rc = l[j].verdict ? DLOCK_EREDIS : DLOCK_ELOST;
                snprintf(why, sizeof why, "%s", dlock_last_error());
            }
    }
    if (rc == DLOCK_OK)
        return rc;
    return dlock_err_set(rc, "%s", why);
}
