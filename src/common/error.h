/*
 * Error codes and the per-thread message of the last failure.
 * The message lives in thread-local storage: no sharing, no locks.
 */
#ifndef DLOCK_ERROR_H
#define DLOCK_ERROR_H

/* Records a printf-style message for the calling thread and returns code. */
int dlock_err_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clears the calling thread's message (at the start of a public call). */
void dlock_err_clear(void);

#endif
