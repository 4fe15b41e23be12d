/* lockstat (stress/lockstat.c): the library's mutex waits and holds, for
 * storm built with -DDLOCK_LOCKSTAT=ON. */
#ifndef DLOCK_LOCKSTAT_H
#define DLOCK_LOCKSTAT_H

#include <stdint.h>
#include <stdio.h>

/* Names a process-wide mutex of the library: "table", "pool", "renew" or
 * "sub" (anything else counts as "entry"). */
void dlock_lockstat_name(const void *addr, const char *name);

/* Prints one line per kind of mutex, per acquisition of the storm worker. */
void dlock_lockstat_report(FILE *f, int proc, uint64_t acquisitions, double seconds);

#endif
