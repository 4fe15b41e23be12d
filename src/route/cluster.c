/*
 * Redis Cluster: hash slots and the slot map (see cluster.h for the
 * invariants and the lock order).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "route/cluster.h"
#include "common/error.h"

struct dlock_cluster {
    const dlock_conn_cfg *base;
    dlock_counters *ctr;
    unsigned pool_size;
    uint32_t min_replicas;
    pthread_mutex_t mu;         /* appending nodes; last_ns, next_any */
    pthread_mutex_t refresh_mu; /* one refresh at a time; before mu */
    int64_t last_ns;            /* when the last refresh ended (0: never) */
    unsigned next_any, next_ask;
    unsigned nnodes;            /* release on raise, acquire on read */
    dlock_cluster_node *nodes[DLOCK_CLUSTER_NODES_MAX];
    uint16_t slots[DLOCK_CLUSTER_SLOTS]; /* node index + 1; 0: unknown */
    int known;                  /* slots with a node (under refresh_mu or mu) */
    int wanted;                 /* a refresh was asked for (atomic, relaxed: a hint) */
};

static unsigned load_nnodes(dlock_cluster *cl)
{
    /* Acquire: the node written before the count was raised is seen. */
    return __atomic_load_n(&cl->nnodes, __ATOMIC_ACQUIRE);
}

/* Acquire and release: a slot names a node only after the node is in
 * nodes[], so the reader sees the node's pointer and contents. */
static uint16_t load_slot(dlock_cluster *cl, unsigned slot)
{
    return __atomic_load_n(&cl->slots[slot], __ATOMIC_ACQUIRE);
}

static void store_slot(dlock_cluster *cl, unsigned slot, uint16_t v)
{
    __atomic_store_n(&cl->slots[slot], v, __ATOMIC_RELEASE);
}

static void node_free(dlock_cluster_node *n)
{
    if (!n)
        return;
    dlock_batch_destroy(n->batch);
    dlock_pool_destroy(n->pool);
    free(n->cfg.host);
    free(n);
}

/* Finds host:port among the nodes. cl->mu held. */
static dlock_cluster_node *find_locked(dlock_cluster *cl, const char *host, int port)
{
    for (unsigned i = 0; i < cl->nnodes; i++)
        if (cl->nodes[i]->cfg.port == port && strcmp(cl->nodes[i]->cfg.host, host) == 0)
            return cl->nodes[i];
    return NULL;
}

dlock_cluster_node *dlock_cluster_node_at(dlock_cluster *cl, const char *host, int port)
{
    pthread_mutex_lock(&cl->mu);
    dlock_cluster_node *n = find_locked(cl, host, port);
    if (n || cl->nnodes >= DLOCK_CLUSTER_NODES_MAX) {
        pthread_mutex_unlock(&cl->mu);
        return n;
    }
    n = calloc(1, sizeof *n);
    if (n) {
        n->index = cl->nnodes;
        n->cfg = *cl->base;
        n->cfg.cluster = NULL; /* this node's own address */
        n->cfg.route = NULL;
        n->cfg.host = strdup(host);
        n->cfg.port = port;
        n->pool = n->cfg.host ? dlock_pool_create(&n->cfg, cl->pool_size, cl->ctr) : NULL;
        n->batch = n->pool ? dlock_batch_create(n->pool, cl->pool_size,
                                                cl->base->command_timeout_ms, cl->min_replicas,
                                                0, cl->ctr)
                           : NULL;
        if (!n->batch) {
            node_free(n);
            n = NULL;
        } else {
            cl->nodes[cl->nnodes] = n;
            /* Release: the node is complete before it is counted. */
            __atomic_store_n(&cl->nnodes, cl->nnodes + 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&cl->mu);
    return n;
}

int dlock_cluster_create(const dlock_conn_cfg *base, const char *seeds, unsigned pool_size,
                         uint32_t min_replicas, dlock_counters *ctr, dlock_cluster **out)
{
    *out = NULL;
    dlock_addr *a;
    unsigned n;
    int rc = dlock_addrs_parse(seeds, "cluster_nodes", &a, &n);
    if (rc != DLOCK_OK)
        return rc;
    dlock_cluster *cl = calloc(1, sizeof *cl);
    if (!cl) {
        dlock_addrs_free(a, n);
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    }
    cl->base = base;
    cl->ctr = ctr;
    cl->pool_size = pool_size;
    cl->min_replicas = min_replicas;
    pthread_mutex_init(&cl->mu, NULL);
    pthread_mutex_init(&cl->refresh_mu, NULL);
    DLOCK_LOCKSTAT_NAME(&cl->mu, "cluster");
    DLOCK_LOCKSTAT_NAME(&cl->refresh_mu, "cluster refresh");
    for (unsigned i = 0; i < n; i++) {
        if (!dlock_cluster_node_at(cl, a[i].host, a[i].port)) {
            dlock_addrs_free(a, n);
            dlock_cluster_destroy(cl);
            return dlock_err_set(DLOCK_ENOMEM, "out of memory");
        }
    }
    dlock_addrs_free(a, n);
    *out = cl;
    return DLOCK_OK;
}

void dlock_cluster_destroy(dlock_cluster *cl)
{
    if (!cl)
        return;
    for (unsigned i = 0; i < cl->nnodes; i++)
        node_free(cl->nodes[i]);
    pthread_mutex_destroy(&cl->refresh_mu);
    pthread_mutex_destroy(&cl->mu);
    free(cl);
}

unsigned dlock_cluster_nnodes(dlock_cluster *cl)
{
    return load_nnodes(cl);
}

dlock_cluster_node *dlock_cluster_node_get(dlock_cluster *cl, unsigned i)
{
    return cl->nodes[i];
}

void dlock_cluster_set_slot(dlock_cluster *cl, unsigned slot, const dlock_cluster_node *node)
{
    if (slot < DLOCK_CLUSTER_SLOTS)
        store_slot(cl, slot, (uint16_t)(node->index + 1));
}

unsigned dlock_cluster_masters(dlock_cluster *cl, dlock_cluster_node **out, unsigned max)
{
    unsigned n = 0;
    for (unsigned s = 0; s < DLOCK_CLUSTER_SLOTS && n < max; s++) {
        uint16_t v = load_slot(cl, s);
        int seen = !v;
        for (unsigned k = 0; k < n && !seen; k++)
            seen = out[k]->index + 1 == v;
        if (!seen)
            out[n++] = cl->nodes[v - 1];
    }
    return n;
}

void dlock_cluster_any(dlock_cluster *cl, char *host, size_t size, int *port)
{
    pthread_mutex_lock(&cl->mu);
    dlock_cluster_node *n = cl->nodes[cl->next_any++ % cl->nnodes];
    pthread_mutex_unlock(&cl->mu);
    snprintf(host, size, "%s", n->cfg.host);
    *port = n->cfg.port;
}

/* The string of a bulk or status reply element, or "" */
static const char *str_of(const redisReply *r)
{
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) ? r->str : "";
}

/* The value for key in a flat [key, value, ...] array (RESP2 maps). */
static const redisReply *field(const redisReply *map, const char *key)
{
    if (!map || map->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t k = 0; k + 1 < map->elements; k += 2)
        if (strcmp(str_of(map->element[k]), key) == 0)
            return map->element[k + 1];
    return NULL;
}

static long long int_of(const redisReply *r)
{
    if (!r)
        return -1;
    if (r->type == REDIS_REPLY_INTEGER)
        return r->integer;
    if (r->type == REDIS_REPLY_STRING)
        return atoll(r->str);
    return -1;
}

/* Applies slots [lo, hi] -> host:port into map (node index + 1). 0 or -1. */
static int assign(dlock_cluster *cl, uint16_t *map, long long lo, long long hi, const char *host,
                  int port)
{
    if (lo < 0 || hi >= DLOCK_CLUSTER_SLOTS || lo > hi || port <= 0 || port > 65535)
        return -1;
    dlock_cluster_node *n = dlock_cluster_node_at(cl, host, port);
    if (!n)
        return -1;
    for (long long s = lo; s <= hi; s++)
        map[s] = (uint16_t)(n->index + 1);
    return 0;
}

/* CLUSTER SHARDS (Redis >= 7): [[slots [lo hi ...] nodes [[id .. port ..
 * ip .. endpoint .. role master ..] ...]] ...]. Number of ranges applied,
 * or -1 if the reply is not that. */
static int parse_shards(dlock_cluster *cl, const redisReply *r, const char *asked, uint16_t *map)
{
    if (r->type != REDIS_REPLY_ARRAY)
        return -1;
    int ranges = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *slots = field(r->element[i], "slots");
        const redisReply *nodes = field(r->element[i], "nodes");
        if (!slots || slots->type != REDIS_REPLY_ARRAY || !nodes ||
            nodes->type != REDIS_REPLY_ARRAY)
            return -1;
        /* The master; an online one first: after a failover a shard may
         * still list its failed old master (Redis 7.2 and later). */
        const redisReply *master = NULL;
        for (int pass = 0; pass < 2 && !master; pass++)
            for (size_t k = 0; k < nodes->elements && !master; k++)
                if (strcmp(str_of(field(nodes->element[k], "role")), "master") == 0 &&
                    (pass == 1 ||
                     strcmp(str_of(field(nodes->element[k], "health")), "online") == 0))
                    master = nodes->element[k];
        if (!master || slots->elements == 0)
            continue; /* a shard without slots, or without a master now */
        const char *host = str_of(field(master, "endpoint"));
        if (!*host || strcmp(host, "?") == 0)
            host = str_of(field(master, "ip"));
        if (!*host)
            host = asked;
        int port = (int)int_of(field(master, "port"));
        for (size_t k = 0; k + 1 < slots->elements; k += 2) {
            if (assign(cl, map, int_of(slots->element[k]), int_of(slots->element[k + 1]), host,
                       port) != 0)
                return -1;
            ranges++;
        }
    }
    return ranges;
}

/* CLUSTER SLOTS: [[lo hi [ip port id ..] [replica ..] ..] ..]. */
static int parse_slots(dlock_cluster *cl, const redisReply *r, const char *asked, uint16_t *map)
{
    if (r->type != REDIS_REPLY_ARRAY)
        return -1;
    int ranges = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2)
            return -1;
        const redisReply *m = e->element[2];
        const char *host = str_of(m->element[0]);
        if (!*host || strcmp(host, "?") == 0)
            host = asked;
        if (assign(cl, map, int_of(e->element[0]), int_of(e->element[1]), host,
                   (int)int_of(m->element[1])) != 0)
            return -1;
        ranges++;
    }
    return ranges;
}

/* Asks node n for the map into map[], waiting for one of its pooled
 * connections until deadline at most. DLOCK_OK or an error (message set). */
static int ask_node(dlock_cluster *cl, dlock_cluster_node *n, uint16_t *map, int64_t deadline)
{
    redisContext *c;
    int64_t wait = dlock_conn_deadline(cl->base->command_timeout_ms);
    int rc = dlock_pool_get(n->pool, deadline < wait ? deadline : wait, &c);
    if (rc != DLOCK_OK)
        return rc;
    const char *shards[2] = {"CLUSTER", "SHARDS"}, *slots[2] = {"CLUSTER", "SLOTS"};
    int got = -1;
    redisReply *r =
        dlock_conn_command(c, cl->ctr, cl->base->command_timeout_ms, 2, shards);
    if (r && r->type != REDIS_REPLY_ERROR) {
        got = parse_shards(cl, r, n->cfg.host, map);
    } else if (r) {
        /* Redis 6 and older: no SHARDS */
        freeReplyObject(r);
        r = dlock_conn_command(c, cl->ctr, cl->base->command_timeout_ms, 2, slots);
        if (r && r->type != REDIS_REPLY_ERROR)
            got = parse_slots(cl, r, n->cfg.host, map);
    }
    if (!r)
        rc = dlock_err_set(DLOCK_EREDIS, "redis cluster map from %s:%d: %s", n->cfg.host,
                           n->cfg.port, c->errstr);
    else if (r->type == REDIS_REPLY_ERROR)
        rc = dlock_err_set(dlock_conn_reply_code(r), "redis cluster map from %s:%d: %s",
                           n->cfg.host, n->cfg.port, r->str);
    else if (got <= 0)
        rc = dlock_err_set(DLOCK_EREDIS, "redis cluster map from %s:%d: %s", n->cfg.host,
                           n->cfg.port, got < 0 ? "a reply dlock does not understand"
                                                : "no slot is assigned (not a cluster yet?)");
    if (r)
        freeReplyObject(r);
    dlock_pool_put(n->pool, c, c->err != 0);
    return rc;
}

void dlock_cluster_want_refresh(dlock_cluster *cl)
{
    dlock_store_int(&cl->wanted, 1);
}

int dlock_cluster_refresh_wanted(dlock_cluster *cl)
{
    return dlock_load_int(&cl->wanted);
}

int dlock_cluster_refresh(dlock_cluster *cl, int force, int64_t deadline)
{
    int64_t now = dlock_now_ns();
    if (force) {
        pthread_mutex_lock(&cl->refresh_mu);
    } else if (pthread_mutex_trylock(&cl->refresh_mu) != 0) {
        pthread_mutex_lock(&cl->mu);
        int empty = cl->known == 0;
        pthread_mutex_unlock(&cl->mu);
        if (!empty)
            return DLOCK_OK; /* another thread refreshes now */
        pthread_mutex_lock(&cl->refresh_mu);
    }
    pthread_mutex_lock(&cl->mu);
    int recent = cl->last_ns &&
                 now < cl->last_ns + DLOCK_CLUSTER_REFRESH_MIN_MS * DLOCK_NS_PER_MS;
    unsigned start = cl->next_ask++;
    pthread_mutex_unlock(&cl->mu);
    if (recent && !force) {
        pthread_mutex_unlock(&cl->refresh_mu);
        return DLOCK_OK;
    }
    uint16_t *map = calloc(DLOCK_CLUSTER_SLOTS, sizeof *map);
    if (!map) {
        pthread_mutex_unlock(&cl->refresh_mu);
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    }
    /* Every node in turn, from a different one each time: a dead node is
     * not asked first again and again. */
    dlock_store_int(&cl->wanted, 0); /* a request from now on asks again */
    int rc = dlock_err_set(DLOCK_EREDIS, "the deadline passed before any node was asked");
    unsigned n = load_nnodes(cl), asked = 0;
    for (unsigned k = 0; k < n && rc != DLOCK_OK && dlock_now_ns() < deadline; k++, asked++) {
        memset(map, 0, DLOCK_CLUSTER_SLOTS * sizeof *map);
        rc = ask_node(cl, cl->nodes[(start + k) % n], map, deadline);
    }
    if (rc == DLOCK_OK) {
        int known = 0;
        for (unsigned s = 0; s < DLOCK_CLUSTER_SLOTS; s++) {
            /* a slot the map leaves out keeps its last node: better a
             * MOVED than no route */
            if (map[s] && load_slot(cl, s) != map[s])
                store_slot(cl, s, map[s]);
            known += load_slot(cl, s) != 0;
        }
        pthread_mutex_lock(&cl->mu);
        cl->known = known;
        pthread_mutex_unlock(&cl->mu);
    }
    if (asked) { /* a refresh that asked no one does not count for the rate limit */
        pthread_mutex_lock(&cl->mu);
        cl->last_ns = dlock_now_ns();
        pthread_mutex_unlock(&cl->mu);
    }
    pthread_mutex_unlock(&cl->refresh_mu);
    free(map);
    return rc;
}

dlock_cluster_node *dlock_cluster_route(dlock_cluster *cl, unsigned slot, int64_t deadline)
{
    uint16_t v = load_slot(cl, slot);
    int asked = 0;
    if (!v && dlock_now_ns() < deadline) {
        asked = dlock_cluster_refresh(cl, 0, deadline) != DLOCK_OK;
        v = load_slot(cl, slot);
    }
    if (!v) {
        char why[200] = "";
        if (asked) /* the refresh's reason */
            snprintf(why, sizeof why, "%s", dlock_last_error());
        dlock_err_set(DLOCK_EREDIS, "redis cluster: no node is known to serve slot %u (%s)", slot,
                      why[0] ? why : "no map yet");
        return NULL;
    }
    return cl->nodes[v - 1];
}

int dlock_cluster_redirect(const redisReply *r, const char *asked, unsigned *slot, char *host,
                           size_t size, int *port)
{
    if (!r || r->type != REDIS_REPLY_ERROR)
        return DLOCK_REDIRECT_NONE;
    int kind;
    const char *p;
    if (strncmp(r->str, "MOVED ", 6) == 0) {
        kind = DLOCK_REDIRECT_MOVED;
        p = r->str + 6;
    } else if (strncmp(r->str, "ASK ", 4) == 0) {
        kind = DLOCK_REDIRECT_ASK;
        p = r->str + 4;
    } else {
        return DLOCK_REDIRECT_NONE;
    }
    char *end;
    unsigned long s = strtoul(p, &end, 10);
    if (end == p || *end != ' ' || s >= DLOCK_CLUSTER_SLOTS)
        return DLOCK_REDIRECT_NONE;
    const char *addr = end + 1, *colon = strrchr(addr, ':');
    if (!colon)
        return DLOCK_REDIRECT_NONE;
    long pt = strtol(colon + 1, &end, 10);
    if (pt <= 0 || pt > 65535 || (*end && *end != ' '))
        return DLOCK_REDIRECT_NONE;
    size_t hl = (size_t)(colon - addr);
    if (hl == 0)
        snprintf(host, size, "%s", asked);
    else
        snprintf(host, size, "%.*s", (int)hl, addr);
    *slot = (unsigned)s;
    *port = (int)pt;
    return kind;
}

int dlock_cluster_is_busy(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR &&
           (strncmp(r->str, "TRYAGAIN", 8) == 0 || strncmp(r->str, "CLUSTERDOWN", 11) == 0);
}

static int any_node(const dlock_conn_cfg *cfg, dlock_counters *ctr, char *host, size_t n,
                    int *port)
{
    (void)ctr;
    dlock_cluster_any(cfg->cluster, host, n, port);
    return DLOCK_OK;
}

const dlock_conn_route dlock_cluster_any_route = {
    .where = any_node,
    .doubt = NULL,
    .stale = NULL,
    .check_role = 0,
    .any_node = 1,
};
