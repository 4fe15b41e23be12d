/*
 * The Lua scripts of lua/, compiled in, and their SHA1 digests as reported by
 * SCRIPT LOAD. The digests are process-wide: the same text always has the
 * same digest, so they are learned once from any server and kept.
 */
#ifndef DLOCK_SCRIPT_H
#define DLOCK_SCRIPT_H

typedef enum dlock_script_id {
    DLOCK_SCRIPT_ACQUIRE,
    DLOCK_SCRIPT_RELEASE,
    DLOCK_SCRIPT_RENEW,
    DLOCK_SCRIPT_COUNT
} dlock_script_id;

/* The script's text. */
const char *dlock_script_body(dlock_script_id id);

/* Its 40-digit SHA1, or NULL while no SCRIPT LOAD has answered yet. */
const char *dlock_script_sha(dlock_script_id id);

/* Records the SHA1 that SCRIPT LOAD returned (40 characters). Idempotent. */
void dlock_script_set_sha(dlock_script_id id, const char *sha, size_t len);

#endif
