/*
 * The Lua scripts of lua/ (protocol 1) and lua/p2/ (protocol 2), compiled
 * in, and their SHA1 digests as reported by SCRIPT LOAD. The digests are process-wide: the same text always has the
 * same digest, so they are learned once from any server and kept.
 */
#ifndef DLOCK_SCRIPT_H
#define DLOCK_SCRIPT_H

/* The keys of one lock name, DLOCK_KEY_LEASE .. DLOCK_KEY_CLIENT and
 * DLOCK_KEYS, in the order the scripts take them: generated from
 * lua/keys.lua. */
#include "keys_gen.h"

#include "dlock.h"

/* The protocols this build speaks (docs/design.md, "Protocol versions"):
 * both take the same keys and arguments and give the same replies. A build
 * with -DDLOCK_PROTOCOL_ONLY=2 speaks protocol 2 only, as the release after
 * the roll will (scripts/upgrade-test runs it as the roll's second step). */
#ifdef DLOCK_PROTOCOL_ONLY
enum { DLOCK_PROTOCOL_MIN = DLOCK_PROTOCOL_ONLY, DLOCK_PROTOCOL_MAX = DLOCK_PROTOCOL_ONLY };
#define DLOCK_PROTOCOL_DEFAULT DLOCK_PROTOCOL_ONLY
#else
enum { DLOCK_PROTOCOL_MIN = DLOCK_PROTOCOL_LOWEST, DLOCK_PROTOCOL_MAX = DLOCK_PROTOCOL_HIGHEST };
#define DLOCK_PROTOCOL_DEFAULT DLOCK_PROTOCOL_VERSION
#endif

/* The library's scripts: protocol 1's, then the same four of protocol 2
 * (dlock_script_in), then protocol 2's shared mode (lua/p2/LAYOUT.txt,
 * "Shared mode"), which protocol 1 does not have: its acquire and release
 * take the same keys and arguments as the exclusive ones. */
typedef enum dlock_script_id {
    DLOCK_SCRIPT_ACQUIRE,
    DLOCK_SCRIPT_RELEASE,
    DLOCK_SCRIPT_RENEW,
    DLOCK_SCRIPT_LEAVE,
    DLOCK_SCRIPT_PER_PROTOCOL,
    DLOCK_SCRIPT_ACQUIRE_SHARED = DLOCK_SCRIPT_PER_PROTOCOL * 2,
    DLOCK_SCRIPT_RELEASE_SHARED,
    DLOCK_SCRIPT_SEM_ACQUIRE, /* the counting semaphore's (lua/p2/SEM.txt) */
    DLOCK_SCRIPT_SEM_RELEASE,
    DLOCK_SCRIPT_SEM_LEAVE,
    DLOCK_SCRIPT_SEM_RENEW,
    DLOCK_SCRIPT_MARK, /* Redlock's write-back of the slot's mark (lua/p2/mark.lua;
                          src/route/redlock.h) */
    DLOCK_SCRIPT_SEM_CLAIM, /* Redlock's claim of a semaphore's name (lua/p2/sem_claim.lua) */
    DLOCK_SCRIPT_COUNT
} dlock_script_id;

/* Script `id` (one of the first four) of protocol `protocol` (2, else 1). */
static inline dlock_script_id dlock_script_in(dlock_script_id id, int protocol)
{
    return (dlock_script_id)(id + (protocol == 2 ? DLOCK_SCRIPT_PER_PROTOCOL : 0));
}

/* The release script of a grant made in protocol `protocol`, shared (in
 * protocol 2) or exclusive: a shared lease, or the grant of an attempt
 * made shared, goes back with lua/p2/release_shared.lua only. */
static inline dlock_script_id dlock_script_release_of(int protocol, int shared)
{
    return shared ? DLOCK_SCRIPT_RELEASE_SHARED : dlock_script_in(DLOCK_SCRIPT_RELEASE, protocol);
}

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
    DLOCK_LEAVE_ARGS = 6,
    DLOCK_SEM_ACQUIRE_ARGS = 12,
    DLOCK_SEM_RELEASE_ARGS = 7,
    DLOCK_SEM_LEAVE_ARGS = 7
};

/* Fills argv[0 .. DLOCK_SCRIPT_KEYS + DLOCK_SEM_RELEASE_ARGS) for
 * lua/p2/sem_release.lua: call `number`, giving back `count` permits, or
 * with count "0" the grant of attempt `attempt`. */
void dlock_script_sem_release_argv(const dlock_script_args *a, char *const *keys,
                                   const char *name, const char *number, const char *count,
                                   const char *attempt, const char **argv);

/* Fills argv[0 .. DLOCK_SCRIPT_KEYS + DLOCK_SEM_LEAVE_ARGS) for
 * lua/p2/sem_leave.lua: call `number`, giving up attempt `gave_up`. */
void dlock_script_sem_leave_argv(const dlock_script_args *a, char *const *keys, const char *name,
                                 const char *number, const char *gave_up, const char **argv);

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

/* dlockctl's scripts of protocol `protocol` (1 or 2), which clients never
 * load: its read of one lock (lua/ctl_read.lua, lua/p2/ctl_read.lua), and
 * the wrapper of its forced release (force.lua), whose line
 * "--@release.lua" stands for that protocol's release script's text. */
const char *dlock_script_ctl_read(int protocol);
const char *dlock_script_force(int protocol);

/* dlockctl's read of one counting semaphore (lua/p2/sem_ctl_read.lua:
 * protocol 2 only, as the semaphore is; its head says its KEYS and reply). */
const char *dlock_script_sem_ctl_read(void);

/* Its 40-digit SHA1, or NULL while no SCRIPT LOAD has answered yet. */
const char *dlock_script_sha(dlock_script_id id);

/* Records the SHA1 that SCRIPT LOAD returned (40 characters). Idempotent. */
void dlock_script_set_sha(dlock_script_id id, const char *sha, size_t len);

#endif
