/*
 * Redlock's seeding of nodes: a restarted node's, a fresh deployment's
 * (redlock.h; the set's private part: redlock_int.h).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "route/redlock_int.h"

/* Whether key is a slot's mark of rl's prefix: exactly
 * "<prefix>hw:{<tag>}", the tag without braces (SCAN's pattern also
 * matches, say, "<prefix>hw:{a}b}" or another client's keys under the
 * prefix "<prefix>hw:"). */
static int is_mark_key(const dlock_redlock *rl, const char *key)
{
    size_t lp = strlen(rl->prefix), lk = strlen(key);
    if (lk < lp + 6 || strncmp(key, rl->prefix, lp) != 0 || strncmp(key + lp, "hw:{", 4) != 0 ||
        key[lk - 1] != '}')
        return 0;
    for (size_t k = lp + 4; k < lk - 1; k++)
        if (key[k] == '{' || key[k] == '}')
            return 0;
    return 1;
}

/* The keys of a SCAN reply's page into *keys (grown; only slots' marks if
 * rl is not NULL), with the cursor into cursor. 0 or -1. */
static int scan_page(const dlock_redlock *rl, const redisReply *r, char *cursor, size_t csize,
                     char ***keys, size_t *nk, size_t *cap)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY)
        return -1;
    snprintf(cursor, csize, "%s", r->element[0]->str);
    const redisReply *a = r->element[1];
    for (size_t k = 0; k < a->elements; k++) {
        if (a->element[k]->type != REDIS_REPLY_STRING)
            return -1;
        if (rl && !is_mark_key(rl, a->element[k]->str))
            continue;
        if (*nk == *cap) {
            size_t nc = *cap ? 2 * *cap : 64;
            char **nkeys = realloc(*keys, nc * sizeof *nkeys);
            if (!nkeys)
                return -1;
            *keys = nkeys;
            *cap = nc;
        }
        if (!((*keys)[*nk] = strdup(a->element[k]->str)))
            return -1;
        (*nk)++;
    }
    return 0;
}

/* Every key matching `match` on peer p's server (marks: only the string
 * keys of a slot's mark's exact form), appended to *keys, until at least
 * stop_after were found; each page by its own command timeout (at most
 * deadline). 0, or -1 (p failed). */
static int scan_all(dlock_redlock *rl, peer *p, const char *match, int marks, int64_t deadline,
                    char ***keys, size_t *nk, size_t *cap, size_t stop_after)
{
    char cursor[32] = "0";
    size_t start = *nk;
    do {
        const char *v[] = {"SCAN", cursor, "MATCH", match, "COUNT", "1000", "TYPE", "string"};
        redisReply *r = NULL;
        int64_t d = dlock_rl_step_deadline(rl, deadline);
        dlock_count(&rl->ctr->redis_commands, 1);
        dlock_count(&rl->ctr->redis_round_trips, 1);
        if (redisAppendCommandArgv(p->c, marks ? 8 : 6, v, NULL) != REDIS_OK ||
            dlock_conn_flush(p->c, d) != 0 || dlock_conn_read(p->c, d, &r) != 0) {
            dlock_rl_peer_broke(p, "%s", p->c->errstr);
            return -1;
        }
        int bad = scan_page(marks ? rl : NULL, r, cursor, sizeof cursor, keys, nk, cap);
        freeReplyObject(r);
        if (bad) {
            dlock_rl_peer_fail(p, "%s", "SCAN failed");
            return -1;
        }
    } while (strcmp(cursor, "0") != 0 && *nk - start < stop_after);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void keys_free(char **keys, size_t nk)
{
    for (size_t k = 0; k < nk; k++)
        free(keys[k]);
    free(keys);
}

/* Marks read or written per pipelined exchange. */
enum { SEED_BATCH = 256 };

/* mark.lua on peer p for keys[from .. to) with tokens toks (NULL: "0"),
 * pipelined, by one command timeout (at most deadline); each reply's mark
 * before into before[] (may be NULL), and its seed key into p->seed. A
 * WRONGTYPE reply (the key holds no string there: not a mark of this
 * prefix but another client's key of the same name) reads as no mark and
 * writes nothing. 0, or -1 (p failed). */
static int marks_on(dlock_redlock *rl, peer *p, char **keys, size_t from, size_t to,
                    char (*toks)[24], uint64_t *before, int64_t deadline)
{
    deadline = dlock_rl_step_deadline(rl, deadline);
    for (size_t k = from; k < to; k++) {
        const char *argv[] = {keys[k], rl->seed_key, toks ? toks[k - from] : "0", ""};
        if (dlock_conn_append_eval(p->c, rl->ctr, DLOCK_SCRIPT_MARK, 0, 2, 2, argv, NULL) != 0) {
            dlock_rl_peer_broke(p, "%s", "out of memory");
            return -1;
        }
    }
    dlock_count(&rl->ctr->redis_round_trips, 1);
    if (dlock_conn_flush(p->c, deadline) != 0) {
        dlock_rl_peer_broke(p, "%s", p->c->errstr);
        return -1;
    }
    int bad = 0;
    for (size_t k = from; k < to; k++) {
        redisReply *r = NULL;
        if (dlock_conn_read(p->c, deadline, &r) != 0) {
            dlock_rl_peer_broke(p, "%s", p->c->errstr);
            return -1;
        }
        if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "WRONGTYPE", 9) == 0) {
            if (before)
                before[k - from] = 0;
        } else if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING)
            bad = 1;
        else {
            if (before)
                before[k - from] = strtoull(r->element[0]->str, NULL, 10);
            snprintf(p->seed, sizeof p->seed, "%s", r->element[1]->str);
        }
        freeReplyObject(r);
    }
    if (bad)
        dlock_rl_peer_fail(p, "%s", "mark.lua failed");
    return bad ? -1 : 0;
}

/* The seeding of node i, with its connection and the others' in p, the
 * seeding flag set. */
static int seed_with(dlock_redlock *rl, unsigned i, peer *p, int64_t deadline)
{
    rl_node *nd = &rl->node[i];
    int64_t d = dlock_rl_step_deadline(rl, deadline);
    const char *argv0[] = {rl->hw_any, rl->seed_key, "0", ""};
    int64_t at = dlock_boot_ns();
    dlock_rl_peers_call(rl, p, NULL, 1, DLOCK_SCRIPT_MARK, 2, 2, argv0, 1, d);
    if (p[i].failed)
        return dlock_err_set(DLOCK_EREDIS, "redlock: seeding %s: %s", nd->addr, p[i].why);
    if (dlock_rl_counts_now(rl, i, p[i].run, p[i].seed, at))
        return DLOCK_OK; /* seeded meanwhile */
    pthread_mutex_lock(&rl->mu);
    int64_t seen = strcmp(nd->run, p[i].run) == 0 ? at - nd->seen_boot : 0;
    int seeded = nd->seeded;
    pthread_mutex_unlock(&rl->mu);
    if (!seeded && seen < rl->lease_ns + rl->drift_ns)
        return dlock_err_set(DLOCK_EBUSY, "redlock: %s (run %.12s) seen for %" PRId64 " ms: not "
                             "seeded before a lease + the drift allowance (%" PRId64 " ms)",
                             nd->addr, p[i].run, (int64_t)(seen / DLOCK_NS_PER_MS),
                             (int64_t)((rl->lease_ns + rl->drift_ns) / DLOCK_NS_PER_MS));
    if (seeded)
        return DLOCK_OK; /* (seeded by another meanwhile) */
    /* the sources: every other node that counts */
    int src[DLOCK_REDLOCK_NODES_MAX] = {0};
    unsigned nsrc = 0;
    char why[700] = "";
    size_t wl = 0;
    for (unsigned j = 0; j < rl->n; j++) {
        if (j == i)
            continue;
        if (!p[j].failed && dlock_rl_same_run(rl, p, j) < 0 && strcmp(p[j].run, p[i].run) != 0 &&
            dlock_rl_counts_now(rl, j, p[j].run, p[j].seed, at)) {
            src[j] = 1;
            nsrc++;
        } else if (wl < sizeof why) {
            char w[300];
            dlock_rl_why_not(rl, j, p, w, sizeof w);
            wl += (size_t)snprintf(why + wl, sizeof why - wl, "; %s", w);
        }
    }
    if (nsrc < rl->m)
        return dlock_err_set(DLOCK_EREDIS, "redlock: seeding %s needs %u other nodes that count; "
                             "%u do%s", nd->addr, rl->m, nsrc, why);
    /* every slot's mark any source holds (one that holds none reads 0 on
     * all m sources, as a mark never written) */
    char **keys = NULL;
    size_t nk = 0, cap = 0;
    for (unsigned j = 0; j < rl->n; j++)
        if (src[j] &&
            scan_all(rl, &p[j], rl->hw_match, 1, deadline, &keys, &nk, &cap, SIZE_MAX) != 0)
            src[j] = 0, nsrc--;
    if (nsrc < rl->m) {
        keys_free(keys, nk);
        return dlock_err_set(DLOCK_EREDIS, "redlock: seeding %s: fewer than %u sources answered "
                             "the scan of the marks", nd->addr, rl->m);
    }
    if (nk > 1)
        qsort(keys, nk, sizeof *keys, cmp_str);
    size_t u = 0;
    for (size_t k = 0; k < nk; k++) {
        if (u && strcmp(keys[u - 1], keys[k]) == 0)
            free(keys[k]);
        else
            keys[u++] = keys[k];
    }
    nk = u;
    uint64_t *top = calloc(nk ? nk : 1, sizeof *top);
    char (*toks)[24] = malloc((nk ? nk : 1) * sizeof *toks);
    int rc = top && toks ? DLOCK_OK : dlock_err_set(DLOCK_ENOMEM, "out of memory");
    uint64_t before[SEED_BATCH];
    for (size_t from = 0; rc == DLOCK_OK && from < nk; from += SEED_BATCH) {
        size_t to = from + SEED_BATCH < nk ? from + SEED_BATCH : nk;
        for (unsigned j = 0; j < rl->n; j++) {
            if (!src[j])
                continue;
            /* a source restarted meanwhile fails (its connection closed);
             * one whose seed key changed stops counting */
            int64_t bat = dlock_boot_ns();
            if (marks_on(rl, &p[j], keys, from, to, NULL, before, deadline) != 0 ||
                !dlock_rl_counts_now(rl, j, p[j].run, p[j].seed, bat)) {
                src[j] = 0;
                nsrc--;
                continue;
            }
            for (size_t k = from; k < to; k++)
                if (before[k - from] > top[k])
                    top[k] = before[k - from];
        }
        if (nsrc < rl->m)
            rc = dlock_err_set(DLOCK_EREDIS, "redlock: seeding %s: fewer than %u sources answered "
                               "the reads of the marks", nd->addr, rl->m);
    }
    /* the marks, then (every write answered) the run id */
    for (size_t from = 0; rc == DLOCK_OK && from < nk; from += SEED_BATCH) {
        size_t to = from + SEED_BATCH < nk ? from + SEED_BATCH : nk;
        for (size_t k = from; k < to; k++)
            snprintf(toks[k - from], sizeof toks[0], "%" PRIu64, top[k]);
        if (marks_on(rl, &p[i], keys, from, to, toks, NULL, deadline) != 0)
            rc = dlock_err_set(DLOCK_EREDIS, "redlock: seeding %s: %s", nd->addr, p[i].why);
    }
    if (rc == DLOCK_OK) {
        const char *argv[] = {rl->hw_any, rl->seed_key, "0", p[i].run};
        int only[DLOCK_REDLOCK_NODES_MAX] = {0};
        only[i] = 1;
        dlock_rl_peers_call(rl, p, only, 0, DLOCK_SCRIPT_MARK, 2, 2, argv, 0,
                            dlock_rl_step_deadline(rl, deadline));
        const redisReply *r = p[i].rep;
        if (p[i].failed || !r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[1]->type != REDIS_REPLY_STRING)
            rc = dlock_err_set(DLOCK_EREDIS, "redlock: seeding %s: the write of its run id "
                               "failed%s%s", nd->addr, p[i].failed ? ": " : "", p[i].why);
        else
            dlock_rl_counts_now(rl, i, p[i].run, r->element[1]->str, at);
    }
    free(top);
    free(toks);
    keys_free(keys, nk);
    return rc;
}

int dlock_redlock_seed(dlock_redlock *rl, unsigned i, int64_t deadline)
{
    if (i >= rl->n)
        return dlock_err_set(DLOCK_EINVAL, "redlock: no node %u", i);
    pthread_mutex_lock(&rl->mu);
    int busy = rl->node[i].seeding;
    rl->node[i].seeding = 1;
    pthread_mutex_unlock(&rl->mu);
    if (busy)
        return dlock_err_set(DLOCK_EBUSY, "redlock: %s is being seeded", rl->node[i].addr);
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    dlock_rl_peers_open(rl, p, deadline);
    int rc = seed_with(rl, i, p, deadline);
    dlock_rl_peers_close(rl, p);
    pthread_mutex_lock(&rl->mu);
    rl->node[i].seeding = 0;
    pthread_mutex_unlock(&rl->mu);
    return rc;
}

int dlock_redlock_seed_due(dlock_redlock *rl, int64_t deadline)
{
    dlock_redlock_refresh(rl, deadline); /* a node that did not answer is not due */
    int seeded = 0, rc = DLOCK_OK;
    for (unsigned i = 0; i < rl->n; i++) {
        rl_node *nd = &rl->node[i];
        pthread_mutex_lock(&rl->mu);
        int due = nd->run[0] && !nd->seeded &&
                  dlock_boot_ns() - nd->seen_boot >= rl->lease_ns + rl->drift_ns;
        pthread_mutex_unlock(&rl->mu);
        if (!due)
            continue;
        int r = dlock_redlock_seed(rl, i, deadline);
        if (r == DLOCK_OK)
            seeded++;
        else if (r != DLOCK_EBUSY)
            rc = r;
    }
    return rc == DLOCK_OK ? seeded : rc;
}

int dlock_redlock_seed_fresh(dlock_redlock *rl, int64_t deadline)
{
    peer p[DLOCK_REDLOCK_NODES_MAX];
    memset(p, 0, sizeof p);
    dlock_rl_peers_open(rl, p, deadline);
    /* each step (the run ids, each node's scan, each write) by its own
     * command timeout, at most the caller's deadline */
    const char *argv0[] = {rl->hw_any, rl->seed_key, "0", ""};
    int64_t at = dlock_boot_ns();
    dlock_rl_peers_call(rl, p, NULL, 1, DLOCK_SCRIPT_MARK, 2, 2, argv0, 1,
                        dlock_rl_step_deadline(rl, deadline));
    int rc = DLOCK_OK;
    for (unsigned i = 0; rc == DLOCK_OK && i < rl->n; i++) {
        if (p[i].failed || !p[i].run[0]) {
            rc = dlock_err_set(DLOCK_EREDIS, "redlock: a fresh seeding needs every node; %s %s",
                               rl->node[i].addr, p[i].failed ? p[i].why : "told no run id");
            break;
        }
        /* empty, or (a fresh seeding that failed part way, run again) its
         * only key of the prefix is its seed key holding its own run id */
        char **keys = NULL;
        size_t nk = 0, cap = 0;
        if (scan_all(rl, &p[i], rl->any_match, 0, deadline, &keys, &nk, &cap, 2) != 0)
            rc = dlock_err_set(DLOCK_EREDIS, "redlock: a fresh seeding needs every node; %s %s",
                               rl->node[i].addr, p[i].why);
        else if (nk && !(nk == 1 && strcmp(keys[0], rl->seed_key) == 0 &&
                         strcmp(p[i].seed, p[i].run) == 0))
            rc = dlock_err_set(DLOCK_EINVAL, "redlock: %s already holds keys of prefix '%s' (such "
                               "as '%s'): a node with data is seeded from the others, never "
                               "fresh", rl->node[i].addr, rl->prefix,
                               strcmp(keys[0], rl->seed_key) == 0 && nk > 1 ? keys[1] : keys[0]);
        keys_free(keys, nk);
    }
    for (unsigned i = 0; rc == DLOCK_OK && i < rl->n; i++) {
        const char *argv[] = {rl->hw_any, rl->seed_key, "0", p[i].run};
        int only[DLOCK_REDLOCK_NODES_MAX] = {0};
        only[i] = 1;
        dlock_rl_peers_call(rl, p, only, 0, DLOCK_SCRIPT_MARK, 2, 2, argv, 0,
                            dlock_rl_step_deadline(rl, deadline));
        const redisReply *r = p[i].rep;
        if (p[i].failed || !r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[1]->type != REDIS_REPLY_STRING)
            rc = dlock_err_set(DLOCK_EREDIS, "redlock: the fresh seeding of %s failed%s%s (the "
                               "nodes written hold only their seed key: it may run again)",
                               rl->node[i].addr, p[i].failed ? ": " : "", p[i].why);
        else
            dlock_rl_counts_now(rl, i, p[i].run, r->element[1]->str, at);
    }
    dlock_rl_peers_close(rl, p);
    return rc;
}
