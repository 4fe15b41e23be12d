/*
 * Helpers shared by the tests of Redlock mode through dlock.h
 * (test_redlock_client.c, test_redlock_shared.c, test_redlock_unclean.c,
 * test_redlock_wait.c, test_dlockctl_redlock.c), each a cmocka executable
 * of its own: NSRV private redis-servers as the node set
 * (fx_redis_start_set: the group's setup and teardown below), a key prefix
 * of each test's own, seeded fresh on every node as `dlockctl seed-fresh`
 * does (a fresh prefix: no lock data, no mark), and a client of the set.
 * The including file defines NSRV (the nodes), LEASE_MS (the lease its
 * prefixes are seeded for) and RL_TAG (its prefixes' stem) first.
 * static inline: each executable uses some of them.
 */
#ifndef DLOCK_TESTS_REDLOCK_HELPERS_H
#define DLOCK_TESTS_REDLOCK_HELPERS_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "dlock.h"
#include "fixture.h"
#include "common/common.h"

static fx_redis srv[NSRV];
static int prefix_no;
static char nodes[NSRV * 24]; /* "host:port,..." of srv */
static char prefix[32];       /* the running test's */

/* A new prefix for the running test, "<RL_TAG><n>:", seeded fresh on
 * every node unless seed is 0 (a test of an unseeded deployment). */
static inline void rl_prefix_new(int seed)
{
    snprintf(prefix, sizeof prefix, "%s%d:", RL_TAG, ++prefix_no);
    if (seed)
        assert_int_equal(fx_redlock_seed_fresh(nodes, prefix, LEASE_MS, 300, 2000), 0);
}

/* *cfg for a client of the set on the running test's prefix, with that
 * lease and that connect and command timeout; the rest the defaults. */
static inline void rl_config(dlock_config *cfg, uint32_t lease_ms, uint32_t timeout_ms)
{
    dlock_config_init(cfg);
    cfg->redlock_nodes = nodes;
    cfg->key_prefix = prefix;
    cfg->lease_ms = lease_ms;
    cfg->connect_timeout_ms = timeout_ms;
    cfg->command_timeout_ms = timeout_ms;
}

/* A client opened with cfg, which must open. */
static inline dlock_client *rl_open(const dlock_config *cfg)
{
    dlock_client *c = NULL;
    if (dlock_client_open(cfg, &c) != DLOCK_OK)
        fail_msg("open: %s", dlock_last_error());
    return c;
}

/* The on_lost calls of the clients rl_open_of opened (every test's). */
static int rl_lost;
static pthread_mutex_t rl_lost_mu = PTHREAD_MUTEX_INITIALIZER;

static inline void rl_on_lost(const char *name, uint64_t fence, void *arg)
{
    (void)name;
    (void)fence;
    (void)arg;
    pthread_mutex_lock(&rl_lost_mu);
    rl_lost++;
    pthread_mutex_unlock(&rl_lost_mu);
}

static inline int rl_lost_count(void)
{
    pthread_mutex_lock(&rl_lost_mu);
    int n = rl_lost;
    pthread_mutex_unlock(&rl_lost_mu);
    return n;
}

static inline void rl_lost_reset(void)
{
    pthread_mutex_lock(&rl_lost_mu);
    rl_lost = 0;
    pthread_mutex_unlock(&rl_lost_mu);
}

/* A client of the set on the running test's prefix with that lease and
 * connect and command timeout, its on_lost calls counted (rl_lost_count). */
static inline dlock_client *rl_open_of(uint32_t lease_ms, uint32_t timeout_ms)
{
    dlock_config cfg;
    rl_config(&cfg, lease_ms, timeout_ms);
    cfg.on_lost = rl_on_lost;
    return rl_open(&cfg);
}

/* Whether slot k of semaphore name (Redlock mode: "<prefix>{<name>}:s<k>",
 * a lock's lease hash) holds a live grant on a majority of the nodes. */
static inline int rl_slot_held(const char *name, unsigned k)
{
    int n = 0;
    for (int i = 0; i < NSRV; i++) {
        char key[160];
        snprintf(key, sizeof key, "%s{%s}:s%u", prefix, name, k);
        redisContext *c = fx_connect("127.0.0.1", srv[i].port);
        assert_non_null(c);
        n += fx_lease_ms(c, key) >= 0;
        redisFree(c);
    }
    return n >= NSRV / 2 + 1;
}

static inline int64_t now_ms(void)
{
    return dlock_now_ns() / DLOCK_NS_PER_MS;
}

/* The group's setup: the NSRV servers started, each on a free port. */
static inline int group_setup(void **state)
{
    (void)state;
    return fx_redis_start_set(srv, NSRV, nodes, sizeof nodes);
}

static inline int group_teardown(void **state)
{
    (void)state;
    fx_redis_stop_set(srv, NSRV);
    return 0;
}

#endif
