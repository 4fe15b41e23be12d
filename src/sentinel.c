/*
 * Master discovery through Sentinel and the client's record of the master
 * (see sentinel.h for the record's invariants and its lock).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "sentinel.h"

/* Appends "host:port: why; " to buf (truncating quietly). */
static void note(char *buf, size_t n, const dlock_addr *a, const char *why)
{
    size_t used = strlen(buf);
    if (used + 1 < n)
        snprintf(buf + used, n - used, "%s%s:%d: %s", used ? "; " : "", a->host, a->port, why);
}

/* Asks one sentinel. 1 with host, port and the config-epoch set, 0 with
 * why set; *auth_refused set when it refused the credentials. A sentinel
 * that knows no such master answers with an error ("No such master with
 * that name"). */
static int ask(const dlock_conn_cfg *cfg, dlock_counters *ctr, const dlock_addr *a, char *host,
               size_t hostlen, int *port, long long *epoch, char *why, size_t whylen,
               int *auth_refused)
{
    uint32_t ct = cfg->connect_timeout_ms < DLOCK_SENTINEL_TIMEOUT_MS ? cfg->connect_timeout_ms
                                                                      : DLOCK_SENTINEL_TIMEOUT_MS;
    uint32_t qt = cfg->command_timeout_ms < DLOCK_SENTINEL_TIMEOUT_MS ? cfg->command_timeout_ms
                                                                      : DLOCK_SENTINEL_TIMEOUT_MS;
    redisContext *c = dlock_conn_connect(a->host, a->port, NULL, ct, qt);
    if (!c || c->err) {
        snprintf(why, whylen, "%s", c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return 0;
    }
    int ok = 0;
    redisReply *r = NULL;
    if (cfg->sentinel_password) {
        const char *argv[2] = {"AUTH", cfg->sentinel_password};
        r = dlock_conn_command(c, ctr, qt, 2, argv);
        if (!r) {
            snprintf(why, whylen, "AUTH: %s", c->errstr);
            goto out;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            snprintf(why, whylen, "AUTH: %s", r->str);
            *auth_refused = 1;
            goto out;
        }
        freeReplyObject(r);
    }
    const char *argv[3] = {"SENTINEL", "MASTER", cfg->sentinel_master};
    r = dlock_conn_command(c, ctr, qt, 3, argv);
    if (!r) {
        snprintf(why, whylen, "%s", c->errstr);
    } else if (r->type == REDIS_REPLY_ERROR) {
        snprintf(why, whylen, "%s", r->str);
        if (strncmp(r->str, "NOAUTH", 6) == 0 || strncmp(r->str, "NOPERM", 6) == 0)
            *auth_refused = 1;
    } else if (r->type != REDIS_REPLY_ARRAY) {
        snprintf(why, whylen, "unexpected reply to SENTINEL MASTER");
    } else {
        /* A flat list of field, value pairs. */
        const redisReply *ip = NULL, *pt = NULL, *ep = NULL;
        for (size_t k = 0; k + 1 < r->elements; k += 2) {
            const redisReply *f = r->element[k], *v = r->element[k + 1];
            if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
                continue;
            if (strcmp(f->str, "ip") == 0)
                ip = v;
            else if (strcmp(f->str, "port") == 0)
                pt = v;
            else if (strcmp(f->str, "config-epoch") == 0)
                ep = v;
        }
        int p = pt ? atoi(pt->str) : 0;
        if (!ip || !ep || ip->len >= hostlen || ip->len == 0 || p <= 0 || p > 65535) {
            snprintf(why, whylen, "unexpected reply to SENTINEL MASTER");
        } else {
            memcpy(host, ip->str, ip->len);
            host[ip->len] = '\0';
            *port = p;
            *epoch = strtoll(ep->str, NULL, 10);
            ok = 1;
        }
    }
out:
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return ok;
}

void dlock_master_init(dlock_master *m)
{
    pthread_mutex_init(&m->mu, NULL);
    m->host[0] = '\0';
    m->port = 0;
    m->epoch = -1;
}

void dlock_master_destroy(dlock_master *m)
{
    pthread_mutex_destroy(&m->mu);
}

/* Records host:port at epoch unless a newer epoch is recorded; copies the
 * record out. 1 if the answer was not stale. */
static int record(dlock_master *m, const char *host, int port, long long epoch, char *out,
                  size_t outlen, int *out_port)
{
    pthread_mutex_lock(&m->mu);
    int fresh = epoch >= m->epoch;
    if (fresh) {
        snprintf(m->host, sizeof m->host, "%s", host);
        m->port = port;
        m->epoch = epoch;
    }
    snprintf(out, outlen, "%s", m->host);
    *out_port = m->port;
    pthread_mutex_unlock(&m->mu);
    return fresh;
}

int dlock_sentinel_master(const dlock_conn_cfg *cfg, dlock_counters *ctr, char *host,
                          size_t hostlen, int *port)
{
    char reasons[768] = "";
    int refused = 0;
    for (unsigned i = 0; i < cfg->nsentinels; i++) {
        char why[256], h[256];
        int auth_refused = 0, p;
        long long epoch;
        if (ask(cfg, ctr, &cfg->sentinels[i], h, sizeof h, &p, &epoch, why, sizeof why,
                &auth_refused)) {
            if (record(cfg->master, h, p, epoch, host, hostlen, port))
                return DLOCK_OK;
            snprintf(why, sizeof why, "config-epoch %lld is behind the one recorded", epoch);
        }
        refused += auth_refused;
        note(reasons, sizeof reasons, &cfg->sentinels[i], why);
    }
    pthread_mutex_lock(&cfg->master->mu);
    int known = cfg->master->epoch >= 0;
    if (known) {
        snprintf(host, hostlen, "%s", cfg->master->host);
        *port = cfg->master->port;
    }
    pthread_mutex_unlock(&cfg->master->mu);
    if (known)
        return DLOCK_OK; /* no fresher answer: the newest address known */
    return dlock_err_set(refused == (int)cfg->nsentinels ? DLOCK_ESERVER : DLOCK_EREDIS,
                         "no sentinel gave the address of master '%s' (%s)",
                         cfg->sentinel_master, reasons);
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
