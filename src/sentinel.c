/*
 * Master discovery through Sentinel (see sentinel.h). No shared state: every
 * call opens its own short-lived connections.
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

/* Asks one sentinel. 1 with host/port set, 0 with why set; *auth_refused
 * set when it refused the credentials. */
static int ask(const dlock_conn_cfg *cfg, dlock_counters *ctr, const dlock_addr *a, char *host,
               size_t hostlen, int *port, char *why, size_t whylen, int *auth_refused)
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
    const char *argv[3] = {"SENTINEL", "get-master-addr-by-name", cfg->sentinel_master};
    r = dlock_conn_command(c, ctr, qt, 3, argv);
    if (!r) {
        snprintf(why, whylen, "%s", c->errstr);
    } else if (r->type == REDIS_REPLY_ERROR) {
        snprintf(why, whylen, "%s", r->str);
        if (strncmp(r->str, "NOAUTH", 6) == 0 || strncmp(r->str, "NOPERM", 6) == 0)
            *auth_refused = 1;
    } else if (r->type == REDIS_REPLY_NIL) {
        snprintf(why, whylen, "knows no master named '%s'", cfg->sentinel_master);
    } else if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
               r->element[0]->type != REDIS_REPLY_STRING ||
               r->element[1]->type != REDIS_REPLY_STRING || r->element[0]->len >= hostlen ||
               atoi(r->element[1]->str) <= 0 || atoi(r->element[1]->str) > 65535) {
        snprintf(why, whylen, "unexpected reply to SENTINEL get-master-addr-by-name");
    } else {
        memcpy(host, r->element[0]->str, r->element[0]->len);
        host[r->element[0]->len] = '\0';
        *port = atoi(r->element[1]->str);
        ok = 1;
    }
out:
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return ok;
}

int dlock_sentinel_master(const dlock_conn_cfg *cfg, dlock_counters *ctr, char *host,
                          size_t hostlen, int *port)
{
    char reasons[768] = "";
    int refused = 0;
    for (unsigned i = 0; i < cfg->nsentinels; i++) {
        char why[256];
        int auth_refused = 0;
        if (ask(cfg, ctr, &cfg->sentinels[i], host, hostlen, port, why, sizeof why,
                &auth_refused))
            return DLOCK_OK;
        refused += auth_refused;
        note(reasons, sizeof reasons, &cfg->sentinels[i], why);
    }
    return dlock_err_set(refused == (int)cfg->nsentinels ? DLOCK_ESERVER : DLOCK_EREDIS,
                         "no sentinel gave the address of master '%s' (%s)",
                         cfg->sentinel_master, reasons);
}
