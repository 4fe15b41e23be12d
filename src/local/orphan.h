/*
 * Threads that exit holding locks: at exit, each lock the thread holds as
 * owner is released for it as DLOCK_UNCLEAN_ABANDONED (orphan.c).
 */
#ifndef DLOCK_ORPHAN_H
#define DLOCK_ORPHAN_H

/* Arms the calling thread's exit hook, once per thread (an outermost
 * acquire calls it). */
void dlock_orphan_arm(void);

#endif
