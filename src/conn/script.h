/*
 * The Lua scripts of lua/, compiled in, and their SHA1 digests as reported by
 * SCRIPT LOAD. The digests are process-wide: the same text always has the
 * same digest, so they are learned once from any server and kept.
 */
#ifndef DLOCK_SCRIPT_H
#define DLOCK_SCRIPT_H

/* The keys of one lock name, DLOCK_KEY_LEASE .. DLOCK_KEY_CLIENT and
 * DLOCK_KEYS, in the order the scripts take them: generated from
 * lua/keys.lua. */
#include "keys_gen.h"

typedef enum dlock_script_id {
    DLOCK_SCRIPT_ACQUIRE,
    DLOCK_SCRIPT_RELEASE,
    DLOCK_SCRIPT_RENEW,
    DLOCK_SCRIPT_LEAVE,
    DLOCK_SCRIPT_COUNT
} dlock_script_id;

/* What every script call of one client passes besides a lock's own keys,
 * as decimal strings. */
typedef struct dlock_script_args {
    const char *client_id;   /* 32 hex digits */
    const char *lease_ms;
    const char *pass_limit;
    const char *waiter_ttl_ms;
    const char *wake_prefix; /* "<prefix>wake:": a client's channel is this + its id */
    const char *keep_ms;     /* how long Redis keeps the client's record of a name */
} dlock_script_args;

/* The keys every script of one lock takes (DLOCK_KEY_*), and the argument
 * counts of the scripts that take them. */
enum {
    DLOCK_SCRIPT_KEYS = DLOCK_KEYS,
    DLOCK_ACQUIRE_ARGS = 10,
    DLOCK_RELEASE_ARGS = 10,
    DLOCK_LEAVE_ARGS = 6
};

/* Fills argv[0 .. DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS) for the release
 * script: the lock's keys, then the grant's identity (field is "token" or
 * "nonce", with its value), the last token handed out ("0" when none), and
 * how the grant ends (lua/release.lua ARGV[10]: "0" released by its holder,
 * "1" for a holder thread that exited or a client that closed, "3" by an
 * operator). */
void dlock_script_release_argv(const dlock_script_args *a, char *const *keys, const char *name,
                               const char *field, const char *value, const char *last,
                               const char *ended, const char **argv);

/* Fills argv[0 .. DLOCK_SCRIPT_KEYS + DLOCK_LEAVE_ARGS) for the leave script,
 * numbered `number` (decimal, from the client's attempt sequence). */
void dlock_script_leave_argv(const dlock_script_args *a, char *const *keys, const char *name,
                             const char *number, const char **argv);

/* The script's text. */
const char *dlock_script_body(dlock_script_id id);

/* Key k's suffix after "<prefix>{<name>}" (lua/keys.lua; DLOCK_KEY_CLIENT's
 * is followed by the client's id). */
const char *dlock_script_key_suffix(int k);

/* dlockctl's scripts, which clients never load: its read of one lock
 * (lua/ctl_read.lua), and the wrapper of its forced release (lua/force.lua),
 * whose line "--@release.lua" stands for the release script's text. */
const char *dlock_script_ctl_read(void);
const char *dlock_script_force(void);

/* Its 40-digit SHA1, or NULL while no SCRIPT LOAD has answered yet. */
const char *dlock_script_sha(dlock_script_id id);

/* Records the SHA1 that SCRIPT LOAD returned (40 characters). Idempotent. */
void dlock_script_set_sha(dlock_script_id id, const char *sha, size_t len);

#endif
