/*
 * Master discovery through Sentinel and the client's record of the master
 * (see sentinel.h for the record's invariants and its lock).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "route/sentinel.h"

/* Appends "host:port: why; " to buf (truncating quietly). */
static void note(char *buf, size_t n, const dlock_addr *a, const char *why)
{
    size_t used = strlen(buf);
    if (used + 1 < n)
        snprintf(buf + used, n - used, "%s%s:%d: %s", used ? "; " : "", a->host, a->port, why);
}

/* The config-epoch field of a SENTINEL MASTER reply, or NULL. */
static const char *config_epoch(const redisReply *m)
{
    if (m->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t k = 0; k + 1 < m->elements; k += 2) /* field, value pairs */
        if (m->element[k]->type == REDIS_REPLY_STRING &&
            m->element[k + 1]->type == REDIS_REPLY_STRING &&
            strcmp(m->element[k]->str, "config-epoch") == 0)
            return m->element[k + 1]->str;
    return NULL;
}

/* Asks one sentinel, in one write and within DLOCK_SENTINEL_TIMEOUT_MS in
 * all (connect included): AUTH if set, SENTINEL MASTER (for the
 * config-epoch), SENTINEL get-master-addr-by-name (for the address) and
 * SENTINEL MASTER again.
 * The address comes from the latter because it is right during a failover:
 * the sentinel that runs it raises the epoch when the replica is promoted,
 * while SENTINEL MASTER keeps naming the old master until the other
 * replicas are reconfigured. Sentinel runs pipelined commands that arrive
 * in one read one after the other, without its timer in between; should
 * they arrive in two reads across the promotion, the two epochs differ and
 * the answer is not used. So epoch and address belong together. 1 with host, port and the epoch set, 0 with why set;
 * *auth_refused set when it refused the credentials. */
static int ask(const dlock_conn_cfg *cfg, dlock_counters *ctr, const dlock_addr *a, char *host,
               size_t hostlen, int *port, long long *epoch, char *why, size_t whylen,
               int *auth_refused)
{
    uint32_t t = DLOCK_SENTINEL_TIMEOUT_MS;
    if (cfg->connect_timeout_ms < t)
        t = cfg->connect_timeout_ms;
    int64_t deadline = dlock_conn_deadline(t);
    redisContext *c = dlock_conn_connect(a->host, a->port, NULL, t, t);
    if (!c || c->err) {
        snprintf(why, whylen, "%s", c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return 0;
    }
    int n = 0, ok = 0;
    if (cfg->sentinel_password) {
        const char *auth[2] = {"AUTH", cfg->sentinel_password};
        n += redisAppendCommandArgv(c, 2, auth, NULL) == REDIS_OK;
    }
    const char *master[3] = {"SENTINEL", "MASTER", cfg->sentinel_master};
    const char *addr[3] = {"SENTINEL", "get-master-addr-by-name", cfg->sentinel_master};
    n += redisAppendCommandArgv(c, 3, master, NULL) == REDIS_OK;
    n += redisAppendCommandArgv(c, 3, addr, NULL) == REDIS_OK;
    n += redisAppendCommandArgv(c, 3, master, NULL) == REDIS_OK;
    redisReply *r[4] = {NULL, NULL, NULL, NULL};
    int want = cfg->sentinel_password ? 4 : 3;
    dlock_count(&ctr->redis_commands, (uint64_t)n);
    dlock_count(&ctr->redis_round_trips, 1);
    if (n != want || dlock_conn_flush(c, deadline) != 0) {
        snprintf(why, whylen, "%s", c->err ? c->errstr : "out of memory");
        goto out;
    }
    for (int i = 0; i < want; i++)
        if (dlock_conn_read(c, deadline, &r[i]) != 0) {
            snprintf(why, whylen, "%s", c->errstr);
            goto out;
        }
    for (int i = 0; i < want; i++)
        if (r[i]->type == REDIS_REPLY_ERROR) {
            snprintf(why, whylen, "%s", r[i]->str);
            *auth_refused = strncmp(r[i]->str, "NOAUTH", 6) == 0 ||
                            strncmp(r[i]->str, "NOPERM", 6) == 0 ||
                            strncmp(r[i]->str, "WRONGPASS", 9) == 0 ||
                            (cfg->sentinel_password && i == 0);
            goto out;
        }
    const redisReply *ad = r[want - 2];
    const char *ep = config_epoch(r[want - 3]), *ep2 = config_epoch(r[want - 1]);
    if (ep && ep2 && strcmp(ep, ep2) != 0) {
        /* the epoch changed between the two: the address may belong to
         * either; the next check asks again */
        snprintf(why, whylen, "a failover is changing its answer");
        goto out;
    }
    int p = ad->type == REDIS_REPLY_ARRAY && ad->elements == 2 &&
                    ad->element[0]->type == REDIS_REPLY_STRING &&
                    ad->element[1]->type == REDIS_REPLY_STRING
                ? atoi(ad->element[1]->str)
                : 0;
    if (!ep || p <= 0 || p > 65535 || ad->element[0]->len == 0 ||
        ad->element[0]->len >= hostlen) {
        snprintf(why, whylen, "unexpected reply to SENTINEL MASTER or get-master-addr-by-name");
        goto out;
    }
    memcpy(host, ad->element[0]->str, ad->element[0]->len);
    host[ad->element[0]->len] = '\0';
    *port = p;
    *epoch = strtoll(ep, NULL, 10);
    ok = 1;
out:
    for (int i = 0; i < 4; i++)
        if (r[i])
            freeReplyObject(r[i]);
    redisFree(c);
    return ok;
}

void dlock_master_init(dlock_master *m)
{
    pthread_mutex_init(&m->mu, NULL);
    m->host[0] = '\0';
    m->port = 0;
    m->epoch = -1;
    m->suspect = 0;
}

void dlock_master_destroy(dlock_master *m)
{
    pthread_mutex_destroy(&m->mu);
}

/* Records host:port at epoch unless a newer epoch is recorded (or even
 * then, with any_epoch); clears the doubt; copies the record out. 1 if the
 * answer was recorded. */
static int record(dlock_master *m, const char *host, int port, long long epoch, int any_epoch,
                  char *out, size_t outlen, int *out_port)
{
    pthread_mutex_lock(&m->mu);
    int fresh = epoch >= m->epoch || any_epoch;
    if (fresh) {
        snprintf(m->host, sizeof m->host, "%s", host);
        m->port = port;
        m->epoch = epoch;
        m->suspect = 0;
    }
    snprintf(out, outlen, "%s", m->host);
    *out_port = m->port;
    pthread_mutex_unlock(&m->mu);
    return fresh;
}

int dlock_sentinel_master(const dlock_conn_cfg *cfg, dlock_counters *ctr, char *host,
                          size_t hostlen, int *port)
{
    dlock_master *m = cfg->master;
    pthread_mutex_lock(&m->mu);
    int suspect = m->suspect;
    pthread_mutex_unlock(&m->mu);
    char reasons[768] = "", best_host[256] = "";
    int refused = 0, answers = 0, best_port = 0;
    long long best_epoch = -1;
    for (unsigned i = 0; i < cfg->nsentinels; i++) {
        char why[256], h[256];
        int auth_refused = 0, p;
        long long epoch;
        if (ask(cfg, ctr, &cfg->sentinels[i], h, sizeof h, &p, &epoch, why, sizeof why,
                &auth_refused)) {
            answers++;
            /* Normally the first answer not behind the record is taken.
             * With the record in doubt (its master said it is none), every
             * sentinel is asked and the newest answer taken. */
            if (!suspect && record(m, h, p, epoch, 0, host, hostlen, port))
                return DLOCK_OK;
            if (epoch > best_epoch) {
                best_epoch = epoch;
                snprintf(best_host, sizeof best_host, "%s", h);
                best_port = p;
            }
            snprintf(why, sizeof why, "config-epoch %lld", epoch);
        }
        refused += auth_refused;
        note(reasons, sizeof reasons, &cfg->sentinels[i], why);
    }
    /* In doubt: an answer behind the record is believed only when most
     * sentinels answered and all are behind it: sentinels that lost their
     * state and count epochs from 0 again. A minority could be sentinels
     * that have not heard of the failover yet. */
    if (suspect && best_epoch >= 0 &&
        record(m, best_host, best_port, best_epoch, answers > (int)cfg->nsentinels / 2, host,
               hostlen, port))
        return DLOCK_OK;
    pthread_mutex_lock(&m->mu);
    int known = m->epoch >= 0;
    if (known) {
        snprintf(host, hostlen, "%s", m->host);
        *port = m->port;
    }
    pthread_mutex_unlock(&m->mu);
    if (known)
        return DLOCK_OK; /* no fresher answer: the newest address known */
    return dlock_err_set(refused == (int)cfg->nsentinels ? DLOCK_ESERVER : DLOCK_EREDIS,
                         "no sentinel gave the address of master '%s' (%s)",
                         cfg->sentinel_master, reasons);
}

void dlock_sentinel_doubt(const dlock_conn_cfg *cfg, const char *host, int port)
{
    dlock_master *m = cfg->master;
    pthread_mutex_lock(&m->mu);
    if (m->epoch >= 0 && m->port == port && strcmp(m->host, host) == 0)
        m->suspect = 1;
    pthread_mutex_unlock(&m->mu);
}

int dlock_sentinel_stale(const dlock_conn_cfg *cfg, const redisContext *c)
{
    if (!cfg->nsentinels || !c || !c->tcp.host)
        return 0;
    dlock_master *m = cfg->master;
    pthread_mutex_lock(&m->mu);
    int stale = m->epoch >= 0 && (c->tcp.port != m->port || strcmp(c->tcp.host, m->host) != 0);
    pthread_mutex_unlock(&m->mu);
    return stale;
}

const dlock_conn_route dlock_sentinel_route = {
    .where = dlock_sentinel_master,
    .doubt = dlock_sentinel_doubt,
    .stale = dlock_sentinel_stale,
    .check_role = 1,
    .any_node = 0,
};
