/*
 * The configuration's checks: what dlock_client_open refuses, with a message
 * that names the setting. dlock_config_init (dlock.h) fills the defaults. No
 * shared state.
 */
#ifndef DLOCK_CONFIG_H
#define DLOCK_CONFIG_H

#include "dlock.h"

/* DLOCK_OK, or DLOCK_EINVAL with the message set. */
int dlock_config_check(const dlock_config *cfg);

#endif
