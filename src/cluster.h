/*
 * Redis Cluster: the hash slot of a key.
 *
 * Every key of a lock name is "<prefix>{<name>}..." and so shares the hash
 * tag <name> (or, for a name that holds '}', the part before it): all keys
 * of a name live in one slot, which a script may touch in a cluster. This
 * module computes that slot exactly as Redis does (keyHashSlot): CRC16
 * (XMODEM: polynomial 0x1021, initial 0) of the hash tag if the key has a
 * non-empty one (the bytes between the first '{' and the first '}' after
 * it), else of the whole key, modulo 16384. No state.
 */
#ifndef DLOCK_CLUSTER_H
#define DLOCK_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#define DLOCK_CLUSTER_SLOTS 16384

/* CRC16/XMODEM of buf[0..len), as Redis' crc16(). */
uint16_t dlock_crc16(const char *buf, size_t len);

/* The hash slot (0..16383) of key[0..len). */
unsigned dlock_cluster_slot(const char *key, size_t len);

#endif
