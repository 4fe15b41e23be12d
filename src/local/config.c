/*
 * The configuration: its defaults and its checks (config.h). No shared state.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

#include "common/common.h"
#include "local/config.h"
#include "common/error.h"
#include "conn/script.h"

void dlock_config_init(dlock_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->redis_host = "127.0.0.1";
    cfg->redis_port = 6379;
    cfg->redis_password = NULL;
    cfg->redis_db = 0;
    cfg->key_prefix = "dlock:";
    cfg->lease_ms = 30000;
    cfg->connect_timeout_ms = 1000;
    cfg->command_timeout_ms = 1000;
    cfg->pass_limit = 128;
    cfg->pool_size = 4;
    cfg->waiter_ttl_ms = 2000;
    cfg->protocol = DLOCK_PROTOCOL_DEFAULT;
    cfg->join_ms = 20;
}

/* Which settings name the server: exactly one of host/port, the Unix
 * socket, the sentinels, the cluster's nodes and Redlock's nodes. */
static int check_server_config(const dlock_config *cfg)
{
    int by_unix = cfg->redis_unix_path != NULL, by_sentinel = cfg->sentinels != NULL;
    int by_cluster = cfg->cluster_nodes != NULL, by_redlock = cfg->redlock_nodes != NULL;
    int host_set = (cfg->redis_host && strcmp(cfg->redis_host, "127.0.0.1") != 0) ||
                   cfg->redis_port != 6379;
    const char *set[4];
    int nset = 0;
    if (by_unix)
        set[nset++] = "redis_unix_path";
    if (by_sentinel)
        set[nset++] = "sentinels";
    if (by_cluster)
        set[nset++] = "cluster_nodes";
    if (by_redlock)
        set[nset++] = "redlock_nodes";
    if (nset > 1)
        return dlock_err_set(DLOCK_EINVAL, "%s and %s both name the server: set one of them",
                             set[0], set[1]);
    if (nset && host_set)
        return dlock_err_set(DLOCK_EINVAL, "%s and redis_host/redis_port (%s:%d) both name the "
                             "server: set redis_host to NULL, or leave host and port at their "
                             "defaults", set[0],
                             cfg->redis_host ? cfg->redis_host : "NULL", cfg->redis_port);
    if (by_unix) {
        if (!cfg->redis_unix_path[0])
            return dlock_err_set(DLOCK_EINVAL, "redis_unix_path is empty");
        if (strlen(cfg->redis_unix_path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
            return dlock_err_set(DLOCK_EINVAL, "redis_unix_path is longer than %zu bytes",
                                 sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
    } else if (!nset) {
        if (!cfg->redis_host || !cfg->redis_host[0])
            return dlock_err_set(DLOCK_EINVAL, "redis_host is NULL or empty");
        if (cfg->redis_port <= 0 || cfg->redis_port > 65535)
            return dlock_err_set(DLOCK_EINVAL, "redis_port %d is not in 1..65535",
                                 cfg->redis_port);
    }
    if (by_sentinel && (!cfg->sentinel_master || !cfg->sentinel_master[0]))
        return dlock_err_set(DLOCK_EINVAL, "sentinels is set but sentinel_master is NULL or "
                                           "empty: name the master the sentinels watch");
    if (!by_sentinel && (cfg->sentinel_master || cfg->sentinel_password))
        return dlock_err_set(DLOCK_EINVAL, "%s is set but sentinels is NULL",
                             cfg->sentinel_master ? "sentinel_master" : "sentinel_password");
    if (cfg->redis_username && (!cfg->redis_username[0] || !cfg->redis_password))
        return dlock_err_set(DLOCK_EINVAL, "%s", cfg->redis_username[0]
                             ? "redis_username needs redis_password (any string for a user "
                               "with nopass)"
                             : "redis_username is empty");
    if (by_cluster) {
        /* A cluster has database 0 only; a brace in the prefix would make
         * it, not the name, the keys' hash tag (or leave an empty one). */
        if (cfg->redis_db != 0)
            return dlock_err_set(DLOCK_EINVAL, "redis_db %d: a Redis Cluster has database 0 "
                                 "only", cfg->redis_db);
        if (cfg->key_prefix && strpbrk(cfg->key_prefix, "{}"))
            return dlock_err_set(DLOCK_EINVAL, "key_prefix \"%s\" holds a brace: in Cluster "
                                 "mode the name is each key's hash tag", cfg->key_prefix);
    }
    return DLOCK_OK;
}

int dlock_config_check(const dlock_config *cfg)
{
    int rc = check_server_config(cfg);
    if (rc != DLOCK_OK)
        return rc;
    if (cfg->redis_db < 0)
        return dlock_err_set(DLOCK_EINVAL, "redis_db %d is negative", cfg->redis_db);
    if (!cfg->key_prefix)
        return dlock_err_set(DLOCK_EINVAL, "key_prefix is NULL");
    if (strnlen(cfg->key_prefix, DLOCK_PREFIX_MAX + 1) > DLOCK_PREFIX_MAX)
        return dlock_err_set(DLOCK_EINVAL, "key_prefix is longer than %d bytes", DLOCK_PREFIX_MAX);
    if (cfg->lease_ms < DLOCK_LEASE_MIN_MS || cfg->lease_ms > DLOCK_LEASE_MAX_MS)
        return dlock_err_set(DLOCK_EINVAL, "lease_ms %" PRIu32 " is not in %u..%u", cfg->lease_ms,
                             DLOCK_LEASE_MIN_MS, DLOCK_LEASE_MAX_MS);
    if (cfg->connect_timeout_ms == 0 || cfg->connect_timeout_ms > DLOCK_TIMEOUT_MAX_MS)
        return dlock_err_set(DLOCK_EINVAL, "connect_timeout_ms %" PRIu32 " is not in 1..%u",
                             cfg->connect_timeout_ms, DLOCK_TIMEOUT_MAX_MS);
    if (cfg->command_timeout_ms == 0 || cfg->command_timeout_ms > DLOCK_TIMEOUT_MAX_MS)
        return dlock_err_set(DLOCK_EINVAL, "command_timeout_ms %" PRIu32 " is not in 1..%u",
                             cfg->command_timeout_ms, DLOCK_TIMEOUT_MAX_MS);
    /* Tokens of local handoffs are reserved for one lease time; beyond it,
     * server time in us must be past them: pass_limit < lease_ms * 1000. */
    if (cfg->pass_limit > DLOCK_PASS_LIMIT_MAX || cfg->pass_limit >= (uint64_t)cfg->lease_ms * 1000)
        return dlock_err_set(DLOCK_EINVAL, "pass_limit %" PRIu32 " is above %u or not below "
                             "lease_ms * 1000", cfg->pass_limit, DLOCK_PASS_LIMIT_MAX);
    if (cfg->join_ms > cfg->lease_ms)
        return dlock_err_set(DLOCK_EINVAL, "join_ms %" PRIu32 " is above lease_ms %" PRIu32,
                             cfg->join_ms, cfg->lease_ms);
    if (cfg->protocol < DLOCK_PROTOCOL_MIN || cfg->protocol > DLOCK_PROTOCOL_MAX) {
        if (DLOCK_PROTOCOL_MIN == DLOCK_PROTOCOL_MAX)
            return dlock_err_set(DLOCK_EINVAL, "protocol %" PRIu32 ": this build speaks "
                                 "protocol %d only", cfg->protocol, DLOCK_PROTOCOL_MIN);
        return dlock_err_set(DLOCK_EINVAL, "protocol %" PRIu32 ": this release speaks "
                             "protocols %d to %d", cfg->protocol, DLOCK_PROTOCOL_MIN,
                             DLOCK_PROTOCOL_MAX);
    }
    if (cfg->redlock_nodes && cfg->min_replicas)
        return dlock_err_set(DLOCK_EINVAL, "redlock_nodes with min_replicas %" PRIu32 ": Redlock "
                             "mode has no replicas to wait for", cfg->min_replicas);
    if (cfg->redlock_nodes && cfg->protocol != 2)
        return dlock_err_set(DLOCK_EINVAL, "redlock_nodes needs protocol 2 (protocol is %" PRIu32
                             "): Redlock runs protocol 2's scripts on every node", cfg->protocol);
    if (cfg->pool_size == 0 || cfg->pool_size > 1024)
        return dlock_err_set(DLOCK_EINVAL, "pool_size %" PRIu32 " is not in 1..1024",
                             cfg->pool_size);
    if (cfg->min_replicas > DLOCK_MIN_REPLICAS_MAX)
        return dlock_err_set(DLOCK_EINVAL, "min_replicas %" PRIu32 " is above %u",
                             cfg->min_replicas, DLOCK_MIN_REPLICAS_MAX);
    if (cfg->client_name) {
        size_t n = strnlen(cfg->client_name, DLOCK_CLIENT_NAME_MAX + 1);
        if (n == 0 || n > DLOCK_CLIENT_NAME_MAX)
            return dlock_err_set(DLOCK_EINVAL, "client_name is empty or longer than %d bytes",
                                 DLOCK_CLIENT_NAME_MAX);
        for (size_t i = 0; i < n; i++)
            if (cfg->client_name[i] <= ' ' || cfg->client_name[i] > '~')
                return dlock_err_set(DLOCK_EINVAL, "client_name \"%s\": only printable ASCII "
                                     "without spaces (Redis' CLIENT SETNAME rule)",
                                     cfg->client_name);
    }
    if (cfg->waiter_ttl_ms < DLOCK_WAITER_TTL_MIN_MS || cfg->waiter_ttl_ms > DLOCK_LEASE_MAX_MS)
        return dlock_err_set(DLOCK_EINVAL, "waiter_ttl_ms %" PRIu32 " is not in %u..%u",
                             cfg->waiter_ttl_ms, DLOCK_WAITER_TTL_MIN_MS, DLOCK_LEASE_MAX_MS);
    return DLOCK_OK;
}
