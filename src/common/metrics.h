/*
 * The client's counters in the Prometheus text exposition format. No state
 * of its own: it reads the counters (common.h) with atomic loads.
 */
#ifndef DLOCK_METRICS_H
#define DLOCK_METRICS_H

#include "common/common.h"

/* A new string (free() it) with every metric of ctr (the lock calls' and
 * the renewal's) and sub (the subscriber's own commands), each labelled
 * client="<client_name>"; NULL when out of memory. */
char *dlock_metrics_prometheus(dlock_counters *ctr, dlock_counters *sub, const char *client_name);

#endif
