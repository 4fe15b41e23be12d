/*
 * The fixture's part that reaches into the library's Redlock node set
 * (route/redlock.h, a private header): a fresh deployment's seeding, as
 * `dlockctl --redlock-nodes LIST seed-fresh` does, for the tests and the
 * stress programs that start their own nodes.
 */
#include <stdio.h>
#include <string.h>

#include "fixture.h"
#include "common/common.h"
#include "common/error.h"
#include "route/redlock.h"

int fx_redlock_seed_fresh(const char *nodes, const char *prefix, uint32_t lease_ms,
                          uint32_t timeout_ms, long wait_ms)
{
    dlock_conn_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.protocol = 2;
    cfg.connect_timeout_ms = timeout_ms;
    cfg.command_timeout_ms = timeout_ms;
    cfg.client_name = "fixture";
    dlock_counters ctr;
    memset(&ctr, 0, sizeof ctr);
    dlock_redlock *rl = NULL;
    int rc = dlock_redlock_create(&cfg, nodes, prefix, lease_ms, 1, &ctr, &rl);
    if (rc == DLOCK_OK) {
        rc = dlock_redlock_seed_fresh(rl, dlock_now_ns() + (int64_t)wait_ms * DLOCK_NS_PER_MS);
        dlock_redlock_destroy(rl);
    }
    if (rc != DLOCK_OK) {
        fprintf(stderr, "fixture: seeding the Redlock nodes %s fresh on prefix %s failed: %s\n",
                nodes, prefix, dlock_last_error());
        return -1;
    }
    return 0;
}
