/*
 * nemesis_topo.c: the nemesis soak's Sentinel topology (see nemesis.c): a
 * master and two replicas, each behind a fault proxy of the runner that all
 * its traffic passes (it announces the proxy's port), and three sentinels;
 * which server is master now, and whether the topology has settled.
 *
 * Used by the runner's main thread only (the proxies run their own threads,
 * tests/support/proxy.c); no lock.
 */
#define _GNU_SOURCE
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nemesis.h"

fx_redis srv[NSRV], sent[3];
fx_proxy *px[NSRV];
int pxport[NSRV];
const char *const *nm_topo_env;
static const char *srv_args[NSRV][16];
static char announce[NSRV][16];

/* The index of the server that the sentinels name master: at least two
 * answer and all that answer agree. -1 otherwise (a failover under way, a
 * sentinel lagging behind). */
int nm_master_index(void)
{
    int found = -1, answers = 0;
    for (int s = 0; s < 3; s++) {
        redisReply *r = fx_cmd_at(sent[s].port, "SENTINEL get-master-addr-by-name %s", NM_MASTER);
        int port = -1;
        if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2)
            port = atoi(r->element[1]->str);
        if (r)
            freeReplyObject(r);
        if (port < 0)
            continue;
        int idx = -1;
        for (int i = 0; i < NSRV; i++)
            if (port == pxport[i])
                idx = i;
        if (idx < 0 || (found >= 0 && idx != found))
            return -1;
        found = idx;
        answers++;
    }
    return answers >= 2 ? found : -1;
}

int nm_is_master(int i)
{
    return srv[i].pid > 0 && fx_is_master(srv[i].port);
}

/* Every sentinel names server m master and knows its two replicas and the
 * other two sentinels; server m says it is master and the others are its
 * connected replicas. */
static int topology_settled(int m)
{
    if (!nm_is_master(m))
        return 0;
    for (int s = 0; s < 3; s++) {
        redisReply *r = fx_cmd_at(sent[s].port, "SENTINEL MASTER %s", NM_MASTER);
        int ok = r && r->type == REDIS_REPLY_ARRAY;
        int port = -1, slaves = -1, others = -1, flags_ok = 0;
        for (size_t k = 0; ok && k + 1 < r->elements; k += 2) {
            const char *key = r->element[k]->str, *val = r->element[k + 1]->str;
            if (!key || !val)
                continue;
            if (!strcmp(key, "port"))
                port = atoi(val);
            else if (!strcmp(key, "num-slaves"))
                slaves = atoi(val);
            else if (!strcmp(key, "num-other-sentinels"))
                others = atoi(val);
            else if (!strcmp(key, "flags"))
                flags_ok = !strcmp(val, "master");
        }
        if (r)
            freeReplyObject(r);
        if (!ok || port != pxport[m] || slaves < NSRV - 1 || others < 2 || !flags_ok)
            return 0;
    }
    redisReply *r = fx_cmd_at(srv[m].port, "INFO replication");
    int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "connected_slaves:2");
    if (r)
        freeReplyObject(r);
    return ok;
}

int nm_wait_settled(long ms)
{
    int64_t end = nm_now_ns() + ms * 1000000LL;
    while (nm_now_ns() < end) {
        int m = nm_master_index();
        if (m >= 0 && topology_settled(m))
            return m;
        fx_sleep_ms(100);
    }
    return -1;
}

/* The arguments of data server i; replica_of: the proxy port it follows
 * (0: a master). */
static void set_args(int i)
{
    int a = 0;
    const char **v = srv_args[i];
    v[a++] = "--appendonly";
    v[a++] = "yes";
    v[a++] = "--appendfsync";
    v[a++] = "always";
    v[a++] = "--repl-diskless-sync-delay";
    v[a++] = "0";
    v[a++] = "--replica-announce-ip";
    v[a++] = "127.0.0.1";
    if (announce[i][0]) {
        v[a++] = "--replica-announce-port";
        v[a++] = announce[i];
    }
    v[a] = NULL;
}

static int start_data_server(int i, int replica_of)
{
    fx_redis_opts o = {0};
    o.replica_of = replica_of;
    set_args(i);
    o.args = srv_args[i];
    o.env = nm_topo_env;
    if (fx_redis_start_opts(&srv[i], &o) != 0)
        return -1;
    px[i] = fx_proxy_start(srv[i].port);
    if (!px[i])
        return -1;
    pxport[i] = fx_proxy_port(px[i]);
    snprintf(announce[i], sizeof announce[i], "%d", pxport[i]);
    set_args(i); /* restarts announce the proxy's port from the start */
    redisReply *r = fx_cmd_at(srv[i].port, "CONFIG SET replica-announce-port %d", pxport[i]);
    int ok = r && r->type == REDIS_REPLY_STATUS;
    if (r)
        freeReplyObject(r);
    return ok ? 0 : -1;
}

uint64_t nm_time_us_at(int port)
{
    redisReply *r = port > 0 ? fx_cmd_at(port, "TIME") : NULL;
    uint64_t us = 0;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2)
        us = strtoull(r->element[0]->str, NULL, 10) * 1000000ULL +
             strtoull(r->element[1]->str, NULL, 10);
    if (r)
        freeReplyObject(r);
    return us;
}

/* The master's TIME in us (direct, not through its proxy), or 0. */
uint64_t nm_server_time_us(int m)
{
    return m >= 0 ? nm_time_us_at(srv[m].port) : 0;
}

int nm_topo_start(void)
{
    /* The replicas follow the master's proxy once they announce their own
     * proxy's port (a replica tells its master its port when it connects). */
    if (start_data_server(0, 0) != 0 ||
        start_data_server(1, 0) != 0 || start_data_server(2, 0) != 0) {
        fprintf(stderr, "nemesis: could not start the servers\n");
        return -1;
    }
    for (int i = 1; i < NSRV; i++) {
        srv[i].opts.replica_of = pxport[0];
        redisReply *r = fx_cmd_at(srv[i].port, "REPLICAOF 127.0.0.1 %d", pxport[0]);
        int ok = r && r->type == REDIS_REPLY_STATUS;
        if (r)
            freeReplyObject(r);
        if (!ok) {
            fprintf(stderr, "nemesis: REPLICAOF failed on server %d\n", i);
            return -1;
        }
    }
    for (int s = 0; s < 3; s++) {
        fx_redis_opts so = {0};
        so.sentinel_master = NM_MASTER;
        so.sentinel_master_port = pxport[0];
        if (fx_redis_start_opts(&sent[s], &so) != 0) {
            fprintf(stderr, "nemesis: could not start the sentinels\n");
            return -1;
        }
    }
    if (nm_wait_settled(30000) != 0) {
        fprintf(stderr, "nemesis: the Sentinel topology did not settle in 30 s\n");
        return -1;
    }
    return 0;
}

void nm_topo_stop(void)
{
    for (int s = 0; s < 3; s++)
        fx_redis_stop(&sent[s]);
    for (int i = 0; i < NSRV; i++) {
        fx_proxy_stop(px[i]);
        px[i] = NULL;
        fx_redis_stop(&srv[i]);
    }
}
