/*
 * dlockctl doctor (dlockctl.h): the server's settings against what dlock
 * needs (of both protocols: protocol 2's scripts need Redis 7.0).
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dlockctl.h"
#include "common/error.h"
#include "conn/script.h"

/* The value of "field:" in INFO's text into out ("" if absent). */
static void info_get(const char *info, const char *field, char *out, size_t n)
{
    out[0] = '\0';
    size_t fl = strlen(field);
    for (const char *p = info; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, field, fl) && p[fl] == ':') {
            size_t k = strcspn(p + fl + 1, "\r\n");
            snprintf(out, n, "%.*s", (int)(k < n ? k : n - 1), p + fl + 1);
            return;
        }
}

static int doctor_fails, doctor_first = 1;

/* One finding: status "ok", "warn" or "FAIL". */
static void finding(const char *server, const char *status, const char *check, const char *fmt,
                    ...) __attribute__((format(printf, 4, 5)));
static void finding(const char *server, const char *status, const char *check, const char *fmt,
                    ...)
{
    char detail[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    doctor_fails += !strcmp(status, "FAIL");
    if (O.json) {
        printf("%s{\"server\":", doctor_first ? "" : ",");
        ctl_json_str(server);
        printf(",\"check\":");
        ctl_json_str(check);
        printf(",\"status\":\"%s\",\"detail\":", status);
        ctl_json_str(detail);
        printf("}");
        doctor_first = 0;
    } else {
        printf("%-4s  %-12s %s\n", status, check, detail);
    }
}

/* Checks one server (a connection without dlock's own setup check, which
 * would refuse an unfit server before it could be looked at). */
static void doctor_one(const char *host, int port, const char *unix_path)
{
    char where[300];
    if (unix_path)
        snprintf(where, sizeof where, "unix:%s", unix_path);
    else
        snprintf(where, sizeof where, "%s:%d", host, port);
    if (!O.json)
        printf("%s\n", where);
    redisContext *c = dlock_conn_connect(host, port, unix_path, CFG.connect_timeout_ms,
                                         CFG.command_timeout_ms);
    if (!c || c->err) {
        finding(where, "FAIL", "connect", "cannot connect: %s", c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return;
    }
    if (CFG.password) {
        redisReply *r = CFG.username ? redisCommand(c, "AUTH %s %s", CFG.username, CFG.password)
                                     : redisCommand(c, "AUTH %s", CFG.password);
        int bad = !r || r->type == REDIS_REPLY_ERROR;
        if (!r)
            finding(where, "FAIL", "auth", "no answer to AUTH (%s): the server is stuck or "
                    "not a Redis server", c->errstr);
        else if (bad)
            finding(where, "FAIL", "auth", "AUTH refused: %s", r->str);
        if (r)
            freeReplyObject(r);
        if (bad) {
            redisFree(c);
            return;
        }
    }
    redisReply *r = redisCommand(c, "INFO");
    if (!r && c->err == REDIS_ERR_PROTOCOL) {
        finding(where, "FAIL", "info", "not a Redis server: it answered INFO in another "
                "protocol (%s)", c->errstr);
        redisFree(c);
        return;
    }
    if (!r) {
        /* no answer (a timeout, a closed connection): not a permission */
        finding(where, "FAIL", "info", "no answer to INFO within %" PRIu32 " ms (%s): the "
                "server is stuck", CFG.command_timeout_ms, c->errstr);
        redisFree(c);
        return;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        finding(where, "FAIL", "info", "INFO refused (dlock reads it on every connection; an ACL "
                "user needs +info): %s", r->str);
        if (r)
            freeReplyObject(r);
        redisFree(c);
        return;
    }
    const char *info = r->str;
    char v[128], mm[64], pol[64], aof[16], role[32], slaves[16], cluster[16], minrep[16];
    info_get(info, "redis_version", v, sizeof v);
    info_get(info, "maxmemory", mm, sizeof mm);
    info_get(info, "maxmemory_policy", pol, sizeof pol);
    info_get(info, "aof_enabled", aof, sizeof aof);
    info_get(info, "role", role, sizeof role);
    info_get(info, "connected_slaves", slaves, sizeof slaves);
    info_get(info, "cluster_enabled", cluster, sizeof cluster);
    /* protocol 2 (which this release reads, and writes by default) needs
     * Redis 7.0: PEXPIRE ... GT (lua/p2/LAYOUT.txt) */
    if (atoi(v) >= 7)
        finding(where, "ok", "version", "Redis %s (dlock needs 5 or later; protocol 2, 7.0 or "
                "later)", v);
    else if (atoi(v) >= 5)
        finding(where, "warn", "version", "Redis %s: enough for dlock protocol 1; protocol 2 "
                "(the default since 0.4.0) needs Redis 7.0 or later (PEXPIRE ... GT): upgrade "
                "the server, or set dlock_config.protocol to 1", v);
    else
        finding(where, "FAIL", "version", "Redis %s: dlock needs Redis 5 or later (its scripts "
                "read TIME before writing), 7.0 or later for protocol 2, the default; upgrade "
                "the server", v[0] ? v : "(unknown)");
    if (!mm[0] || strtoull(mm, NULL, 10) == 0 || !strcmp(pol, "noeviction"))
        finding(where, "ok", "eviction", "maxmemory %s, maxmemory-policy %s: no lease is evicted",
                mm[0] ? mm : "0", pol[0] ? pol : "(unknown)");
    else
        finding(where, "FAIL", "eviction", "maxmemory %s with maxmemory-policy %s may evict a "
                "live lease and grant it again: CONFIG SET maxmemory-policy noeviction (or "
                "maxmemory 0), and put it in redis.conf", mm, pol);
    if (!strcmp(role, "master"))
        finding(where, "ok", "role", "a master");
    else
        finding(where, "FAIL", "role", "a %s: the clients must talk to the master (Sentinel "
                "mode finds it: --sentinels)", role[0] ? role : "server of unknown role");
    /* RDB snapshots: the "save" setting, if CONFIG may be read */
    char save[128] = "";
    int save_known = 0;
    redisReply *cs = redisCommand(c, "CONFIG GET save");
    if (cs && cs->type == REDIS_REPLY_ARRAY && cs->elements == 2 &&
        cs->element[1]->type == REDIS_REPLY_STRING) {
        snprintf(save, sizeof save, "%s", cs->element[1]->str);
        save_known = 1;
    }
    if (cs)
        freeReplyObject(cs);
    if (!strcmp(aof, "1"))
        finding(where, "ok", "persistence", "AOF on: a restart keeps the leases written before "
                "its last fsync");
    else if (save[0])
        finding(where, "warn", "persistence", "RDB snapshots only (save %s): a restart loses the "
                "leases granted since the last snapshot, and a second holder may run while "
                "the first still works (fencing tokens keep its writes out; docs/guide.md: Semantics); "
                "appendonly yes keeps them", save);
    else
        finding(where, "warn", "persistence", "no AOF%s: a restart loses every lease, and a "
                "second holder may run while the first still works (fencing tokens keep its "
                "writes out; docs/guide.md: Semantics); appendonly yes keeps them",
                save_known ? " and no RDB snapshots" : "");
    int n = atoi(slaves);
    snprintf(minrep, sizeof minrep, "%d", n);
    if (n > 0)
        finding(where, "warn", "replicas", "%d replica%s: a failover may promote one that missed "
                "a grant, and two clients hold the name; min_replicas %s in the clients keeps "
                "every lease across a failover, at a cost in availability while a replica is "
                "down (docs/deployments.md)", n, n == 1 ? "" : "s", minrep);
    else if (!strcmp(cluster, "1"))
        finding(where, "warn", "replicas", "a cluster master without replicas: its slots are "
                "down while it is (no failover)");
    else
        finding(where, "ok", "replicas", "none: nothing to wait for");
    freeReplyObject(r);
    redisFree(c);
}

/* doctor: every server the clients would use. 0 if nothing failed, 1 if
 * something must change. */
int ctl_doctor(void)
{
    if (O.json)
        printf("[");
    if (CL) {
        dlock_cluster_node *m[DLOCK_CLUSTER_NODES_MAX];
        unsigned n = dlock_cluster_masters(CL, m, DLOCK_CLUSTER_NODES_MAX);
        for (unsigned i = 0; i < n; i++)
            doctor_one(m[i]->cfg.host, m[i]->cfg.port, NULL);
    } else if (CFG.nsentinels) {
        char host[256];
        int port;
        if (dlock_sentinel_master(&CFG, &CTR, host, sizeof host, &port) != DLOCK_OK)
            finding("sentinels", "FAIL", "sentinels", "no master from the sentinels: %s",
                    dlock_last_error());
        else
            doctor_one(host, port, NULL);
    } else {
        doctor_one(CFG.host, CFG.port, CFG.unix_path);
    }
    if (O.json)
        printf("]\n");
    else
        printf("%s\n", doctor_fails ? "something must change (FAIL above)"
                                     : "fit for dlock (see any warn above)");
    return doctor_fails ? 1 : 0;
}

