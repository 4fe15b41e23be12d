/*
 * Script texts and their digests.
 *
 * Concurrency: shas[] is written once per script (the same value by any
 * writer) and read by every caller thread. A writer fills the digest, then
 * publishes it by storing ready[id] = 1 after a store fence; a reader loads
 * ready[id], then a load fence, then reads the digest. Concurrent writers
 * write identical bytes under the mutex, so readers never see a torn value.
 */
#include <pthread.h>
#include <string.h>

#include "common/common.h"

#include "conn/script.h"

extern const char dlock_lua_acquire[];
extern const char dlock_lua_release[];
extern const char dlock_lua_renew[];
extern const char dlock_lua_leave[];
extern const char dlock_lua_ctl_read[];
extern const char dlock_lua_force[];
extern const char dlock_lua_p2_acquire[];
extern const char dlock_lua_p2_release[];
extern const char dlock_lua_p2_renew[];
extern const char dlock_lua_p2_leave[];
extern const char dlock_lua_p2_ctl_read[];
extern const char dlock_lua_p2_force[];
extern const char dlock_lua_p2_acquire_shared[];
extern const char dlock_lua_p2_release_shared[];
extern const char dlock_lua_p2_sem_acquire[];
extern const char dlock_lua_p2_sem_release[];
extern const char dlock_lua_p2_sem_leave[];
extern const char dlock_lua_p2_sem_renew[];
extern const char dlock_lua_p2_sem_ctl_read[];
extern const char dlock_lua_p2_mark[];
extern const char dlock_lua_p2_sem_claim[];

static const char *const key_suffixes[DLOCK_KEYS] = DLOCK_KEY_SUFFIXES;

const char *dlock_script_key_suffix(int k)
{
    return k >= 0 && k < DLOCK_KEYS ? key_suffixes[k] : "";
}

const char *dlock_script_ctl_read(int protocol)
{
    return protocol == 2 ? dlock_lua_p2_ctl_read : dlock_lua_ctl_read;
}

const char *dlock_script_force(int protocol)
{
    return protocol == 2 ? dlock_lua_p2_force : dlock_lua_force;
}

const char *dlock_script_sem_ctl_read(void)
{
    return dlock_lua_p2_sem_ctl_read;
}

static const char *const bodies[DLOCK_SCRIPT_COUNT] = {
    [DLOCK_SCRIPT_ACQUIRE] = dlock_lua_acquire,
    [DLOCK_SCRIPT_RELEASE] = dlock_lua_release,
    [DLOCK_SCRIPT_RENEW] = dlock_lua_renew,
    [DLOCK_SCRIPT_LEAVE] = dlock_lua_leave,
    [DLOCK_SCRIPT_PER_PROTOCOL + DLOCK_SCRIPT_ACQUIRE] = dlock_lua_p2_acquire,
    [DLOCK_SCRIPT_PER_PROTOCOL + DLOCK_SCRIPT_RELEASE] = dlock_lua_p2_release,
    [DLOCK_SCRIPT_PER_PROTOCOL + DLOCK_SCRIPT_RENEW] = dlock_lua_p2_renew,
    [DLOCK_SCRIPT_PER_PROTOCOL + DLOCK_SCRIPT_LEAVE] = dlock_lua_p2_leave,
    [DLOCK_SCRIPT_ACQUIRE_SHARED] = dlock_lua_p2_acquire_shared,
    [DLOCK_SCRIPT_RELEASE_SHARED] = dlock_lua_p2_release_shared,
    [DLOCK_SCRIPT_SEM_ACQUIRE] = dlock_lua_p2_sem_acquire,
    [DLOCK_SCRIPT_SEM_RELEASE] = dlock_lua_p2_sem_release,
    [DLOCK_SCRIPT_SEM_LEAVE] = dlock_lua_p2_sem_leave,
    [DLOCK_SCRIPT_SEM_RENEW] = dlock_lua_p2_sem_renew,
    [DLOCK_SCRIPT_MARK] = dlock_lua_p2_mark,
    [DLOCK_SCRIPT_SEM_CLAIM] = dlock_lua_p2_sem_claim,
};

void dlock_script_sem_release_argv(const dlock_script_args *a, char *const *keys,
                                   const char *name, const char *number, const char *count,
                                   const char *attempt, const char **argv)
{
    for (int k = 0; k < DLOCK_SCRIPT_KEYS; k++)
        argv[k] = keys[k];
    argv += DLOCK_SCRIPT_KEYS;
    argv[0] = a->client_id;
    argv[1] = number;
    argv[2] = count;
    argv[3] = attempt;
    argv[4] = a->wake_prefix;
    argv[5] = name;
    argv[6] = a->keep_ms;
}

void dlock_script_sem_leave_argv(const dlock_script_args *a, char *const *keys, const char *name,
                                 const char *number, const char *gave_up, const char **argv)
{
    for (int k = 0; k < DLOCK_SCRIPT_KEYS; k++)
        argv[k] = keys[k];
    argv += DLOCK_SCRIPT_KEYS;
    argv[0] = a->client_id;
    argv[1] = a->wake_prefix;
    argv[2] = name;
    argv[3] = a->waiter_ttl_ms;
    argv[4] = number;
    argv[5] = a->keep_ms;
    argv[6] = gave_up;
}

void dlock_script_release_argv(const dlock_script_args *a, char *const *keys, const char *name,
                               const char *field, const char *value, const char *last,
                               const char *ended, const char **argv)
{
    for (int k = 0; k < DLOCK_SCRIPT_KEYS; k++)
        argv[k] = keys[k];
    argv += DLOCK_SCRIPT_KEYS;
    argv[0] = a->client_id;
    argv[1] = field;
    argv[2] = value;
    argv[3] = a->lease_ms;
    argv[4] = last;
    argv[5] = a->wake_prefix;
    argv[6] = name;
    argv[7] = a->waiter_ttl_ms;
    argv[8] = a->keep_ms;
    argv[9] = ended;
}

void dlock_script_leave_argv(const dlock_script_args *a, char *const *keys, const char *name,
                             const char *number, const char **argv)
{
    for (int k = 0; k < DLOCK_SCRIPT_KEYS; k++)
        argv[k] = keys[k];
    argv += DLOCK_SCRIPT_KEYS;
    argv[0] = a->client_id;
    argv[1] = a->wake_prefix;
    argv[2] = name;
    argv[3] = a->waiter_ttl_ms;
    argv[4] = number;
    argv[5] = a->keep_ms;
}

static char shas[DLOCK_SCRIPT_COUNT][41];
static int ready[DLOCK_SCRIPT_COUNT];
static pthread_mutex_t sha_mu = PTHREAD_MUTEX_INITIALIZER;

const char *dlock_script_body(dlock_script_id id)
{
    return bodies[id];
}

const char *dlock_script_sha(dlock_script_id id)
{
    /* Acquire: pairs with the release in dlock_script_set_sha, so the digest
     * is complete when the flag is seen. */
    if (!dlock_load_int_acquire(&ready[id]))
        return NULL;
    return shas[id];
}

void dlock_script_set_sha(dlock_script_id id, const char *sha, size_t len)
{
    if (len != 40)
        return;
    pthread_mutex_lock(&sha_mu);
    if (!dlock_load_int(&ready[id])) {
        memcpy(shas[id], sha, 40);
        shas[id][40] = '\0';
        dlock_store_int_release(&ready[id], 1); /* the digest before the flag */
    }
    pthread_mutex_unlock(&sha_mu);
}
