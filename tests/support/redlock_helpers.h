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
