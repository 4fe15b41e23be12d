/*
 * Sentinel: which server is the master of a name the sentinels watch.
 */
#ifndef DLOCK_SENTINEL_H
#define DLOCK_SENTINEL_H

#include "conn.h"

/* Each sentinel gets at most this long to connect and this long to answer,
 * so a dead one costs little before the next is tried. */
#define DLOCK_SENTINEL_TIMEOUT_MS 500u

/* Asks cfg's sentinels in turn (AUTH sentinel_password first if set) for
 * SENTINEL get-master-addr-by-name <sentinel_master>; the first address
 * given wins. The master is not checked here: dlock_conn_open runs ROLE on
 * it. Stateless and safe on any thread. DLOCK_OK with host (NUL-terminated,
 * at most hostlen - 1 bytes) and *port set; DLOCK_EREDIS when no sentinel
 * answered with an address (the message gives each one's reason), or
 * DLOCK_ESERVER when every sentinel refused the credentials (one that could
 * not be reached makes it DLOCK_EREDIS: it may know the master later). */
int dlock_sentinel_master(const dlock_conn_cfg *cfg, dlock_counters *ctr, char *host,
                          size_t hostlen, int *port);

#endif
