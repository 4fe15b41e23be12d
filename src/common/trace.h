/*
 * The client's trace (build option DLOCK_TRACE): every protocol decision of
 * the C client, with the clock readings it was made on, one line each, for
 * the trace checker (sim/check-trace), which replays the lines through the
 * simulator's model of the client (sim/client.lua) and fails on the first
 * step the model would not take (docs/simulation.md, "Trace conformance").
 *
 * A client opened while the environment variable DLOCK_TRACE_DIR names a
 * directory writes DLOCK_TRACE_DIR/trace-<pid>-<client id>.txt; without it,
 * or in a build without DLOCK_TRACE, nothing is recorded and every call
 * below is a no-op (t == NULL).
 *
 * A line: "<boot ns> <thread> <kind> <fields...>", fields separated by one
 * space, strings escaped (bytes outside '!'..'~' and the backslash as
 * \xHH; the empty string as \x00), so that a line splits on spaces. The kinds and their fields are
 * listed in sim/trace.lua, their reader (the semaphore's, "sem.*", in
 * sim/trace_sem.lua, to which it hands them).
 *
 * Thread-safe: one mutex per trace, a leaf (taken with an entry mutex or
 * the renewal manager's held, never the other way round). Lines are
 * written in the order their callers take that mutex: an event recorded
 * under an entry mutex is in the entry's order. A line's time is read
 * before the mutex is taken, so the times of lines from different threads
 * may be out of order by the wait for it. A full buffer is written out
 * under the mutex, and so with whatever lock the caller holds: traced
 * builds are for checking, not for timing. The buffer is written out
 * with write(2) when full and at close (a process that dies loses its tail:
 * the checker reads what came).
 */
#ifndef DLOCK_TRACE_H
#define DLOCK_TRACE_H

#include <stddef.h>
#include <stdint.h>

typedef struct dlock_trace dlock_trace;

#ifdef DLOCK_TRACE

/* The trace of a new client, or NULL (not asked for, or it cannot be
 * written: the client runs without). */
dlock_trace *dlock_trace_open(const char *client_id);
/* Writes out what is left and frees t (NULL: nothing). */
void dlock_trace_close(dlock_trace *t);
/* One line: kind, the escaped string s (NULL: none), then fmt's fields. */
void dlock_trace_event(dlock_trace *t, const char *kind, const char *s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* One line: kind, the escaped name, the fields `extra` (as they are), then
 * each of argv[0..n) escaped, then the fields `tail` (as they are; NULL:
 * none). */
void dlock_trace_argv(dlock_trace *t, const char *kind, const char *name, const char *extra,
                      int n, const char *const *argv, const char *tail);

#else

static inline dlock_trace *dlock_trace_open(const char *client_id)
{
    (void)client_id;
    return NULL;
}
static inline void dlock_trace_close(dlock_trace *t) { (void)t; }
static inline __attribute__((format(printf, 4, 5))) void
dlock_trace_event(dlock_trace *t, const char *kind, const char *s, const char *fmt, ...)
{
    (void)t;
    (void)kind;
    (void)s;
    (void)fmt;
}
static inline void dlock_trace_argv(dlock_trace *t, const char *kind, const char *name,
                                    const char *extra, int n, const char *const *argv,
                                    const char *tail)
{
    (void)tail;
    (void)t;
    (void)kind;
    (void)name;
    (void)extra;
    (void)n;
    (void)argv;
}

#endif

#endif
