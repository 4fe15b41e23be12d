/*
 * Hash slots as Redis Cluster computes them, and the tag that puts a key in
 * a given slot: the high-water mark of a slot's fencing tokens (lua/keys.lua,
 * HW) is "<prefix>hw:{<tag>}", in the same slot as the names it bounds, so
 * that one script touches both on a Cluster too. Without a Cluster the
 * slots only spread the names over 16384 marks.
 *
 * The tag of a slot is the smallest decimal number, as a string, whose
 * CRC16 falls in that slot (all 16384 slots are reached by 0 .. 109757),
 * computed once per process; sim/client.lua computes the same.
 */
#ifndef DLOCK_SLOT_H
#define DLOCK_SLOT_H

#include <stddef.h>
#include <stdint.h>

#define DLOCK_SLOTS 16384
/* The longest tag, with its NUL. */
#define DLOCK_SLOT_TAG_MAX 7

/* CRC16/XMODEM of buf[0..len), as Redis' crc16(). */
uint16_t dlock_crc16(const char *buf, size_t len);

/* The hash slot (0..16383) of key[0..len), as Redis' keyHashSlot: the
 * CRC16 of its hash tag (what is between its first '{' and the next '}',
 * if not empty) or else of the whole key. */
unsigned dlock_cluster_slot(const char *key, size_t len);

/* The tag of slot (0..16383): a NUL-terminated decimal number of at most
 * DLOCK_SLOT_TAG_MAX - 1 digits whose CRC16 falls in that slot. Thread-safe;
 * the first call computes every slot's tag (a few milliseconds). */
const char *dlock_slot_tag(unsigned slot);

#endif
