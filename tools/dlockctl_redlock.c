/*
 * dlockctl seed-fresh: the operator's seeding of a fresh Redlock
 * deployment (docs/operations.md, "Redlock"; docs/design.md, "Redlock").
 * Never automatic in the library: nodes that all lost their data at once
 * must not seed themselves, or they would vote on marks they lost.
 */
#include <stdio.h>
#include <string.h>

#include "dlockctl.h"
#include "common/error.h"
#include "route/redlock.h"

int ctl_seed_fresh(void)
{
    dlock_conn_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.username = (char *)O.user;
    cfg.password = (char *)O.password;
    cfg.db = O.db;
    cfg.protocol = 2;
    cfg.connect_timeout_ms = 1000;
    cfg.command_timeout_ms = 2000;
    cfg.client_name = "dlockctl";
    dlock_counters ctr;
    memset(&ctr, 0, sizeof ctr);
    dlock_redlock *rl;
    /* (the lease does not matter to a fresh seeding) */
    if (dlock_redlock_create(&cfg, O.redlock_nodes, O.prefix, 1000, 1, &ctr, &rl) != DLOCK_OK)
        ctl_die("--redlock-nodes");
    int rc = dlock_redlock_seed_fresh(rl, dlock_now_ns() + 10000 * DLOCK_NS_PER_MS);
    unsigned n = dlock_redlock_nodes(rl);
    dlock_redlock_destroy(rl);
    if (rc != DLOCK_OK) {
        if (O.json) {
            printf("{\"seeded\": false, \"error\": ");
            ctl_json_str(dlock_last_error());
            printf("}\n");
        } else
            fprintf(stderr, "dlockctl: seed-fresh: %s\n", dlock_last_error());
        return 1;
    }
    if (O.json) {
        printf("{\"seeded\": true, \"nodes\": %u, \"prefix\": ", n);
        ctl_json_str(O.prefix);
        printf("}\n");
    } else
        printf("seeded %u nodes fresh (prefix %s): their votes count once each client has "
               "seen them for a lease\n", n, O.prefix);
    return 0;
}
