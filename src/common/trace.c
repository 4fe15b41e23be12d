/*
 * The client's trace (trace.h). Shared state: the buffer and its length,
 * guarded by t->mu (a leaf); the file descriptor is written only under it.
 */
#ifdef DLOCK_TRACE

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/common.h"
#include "common/trace.h"

/* A line of dlock_trace_event fits TRACE_LINE (a name escaped takes at
 * most 4 x DLOCK_NAME_MAX; the other fields at most 3 KiB, a Redlock
 * semaphore's 64 slots with their validities and their renewal's
 * judgements about 1.9 KiB of them); dlock_trace_argv's are measured
 * first and allocated when longer. */
enum { TRACE_BUF = 1 << 16, TRACE_LINE = 4 * DLOCK_NAME_MAX + 3072 };

struct dlock_trace {
    pthread_mutex_t mu;
    int fd;
    size_t len;
    char buf[TRACE_BUF];
};

dlock_trace *dlock_trace_open(const char *client_id)
{
    const char *dir = getenv("DLOCK_TRACE_DIR");
    if (!dir || !*dir)
        return NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/trace-%ld-%s.txt", dir, (long)getpid(), client_id);
    dlock_trace *t = malloc(sizeof *t);
    if (!t)
        return NULL;
    t->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (t->fd < 0) {
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->mu, NULL);
    t->len = 0;
    return t;
}

/* Writes the buffer out. Called with t->mu held. */
static void flush(dlock_trace *t)
{
    size_t off = 0;
    while (off < t->len) {
        ssize_t n = write(t->fd, t->buf + off, t->len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* a trace that cannot be written is cut short, nothing more */
        off += (size_t)n;
    }
    t->len = 0;
}

void dlock_trace_close(dlock_trace *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    flush(t);
    pthread_mutex_unlock(&t->mu);
    close(t->fd);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* Appends s escaped to line (of cap bytes) at *at, leaving room for the
 * newline. */
static void esc(char *line, size_t cap, size_t *at, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    if (!*s && *at + 5 < cap) {
        memcpy(line + *at, "\\x00", 4); /* an empty string is still a field */
        *at += 4;
        return;
    }
    for (; *s && *at + 5 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch > ' ' && ch <= '~' && ch != '\\') {
            line[(*at)++] = (char)ch;
        } else {
            line[(*at)++] = '\\';
            line[(*at)++] = 'x';
            line[(*at)++] = hex[ch >> 4];
            line[(*at)++] = hex[ch & 15];
        }
    }
}

static size_t head(char *line, const char *kind)
{
    return (size_t)snprintf(line, 64, "%" PRId64 " %ld %s", dlock_boot_ns(),
                            (long)syscall(SYS_gettid), kind);
}

/* Appends the line (at bytes of a buffer of cap) and its newline. */
static void put(dlock_trace *t, char *line, size_t cap, size_t at)
{
    if (at > cap - 2)
        at = cap - 2;
    line[at++] = '\n';
    pthread_mutex_lock(&t->mu);
    if (t->len + at > sizeof t->buf)
        flush(t);
    if (at > sizeof t->buf) {
        /* longer than the buffer: written out at once */
        size_t keep = t->len;
        t->len = 0;
        for (size_t off = 0; off < at;) {
            ssize_t n = write(t->fd, line + off, at - off);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            off += (size_t)n;
        }
        t->len = keep;
    } else {
        memcpy(t->buf + t->len, line, at);
        t->len += at;
    }
    pthread_mutex_unlock(&t->mu);
}

void dlock_trace_event(dlock_trace *t, const char *kind, const char *s, const char *fmt, ...)
{
    if (!t)
        return;
    char line[TRACE_LINE];
    size_t at = head(line, kind);
    if (s) {
        line[at++] = ' ';
        esc(line, TRACE_LINE, &at, s);
    }
    if (fmt && *fmt && at + 2 < TRACE_LINE) {
        line[at++] = ' ';
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(line + at, TRACE_LINE - at, fmt, ap);
        va_end(ap);
        if (n > 0)
            at += (size_t)n < TRACE_LINE - at ? (size_t)n : TRACE_LINE - at - 1;
    }
    put(t, line, TRACE_LINE, at);
}

void dlock_trace_argv(dlock_trace *t, const char *kind, const char *name, const char *extra,
                      int n, const char *const *argv, const char *tail)
{
    if (!t)
        return;
    size_t cap = 64 + 4 * strlen(name) + 2 + (extra ? strlen(extra) + 1 : 0) +
                 (tail ? strlen(tail) + 1 : 0) + 2;
    for (int i = 0; i < n; i++)
        cap += 4 * (argv[i] ? strlen(argv[i]) : 0) + 5;
    char small[TRACE_LINE], *line = cap <= sizeof small ? small : malloc(cap);
    if (!line)
        return; /* out of memory: the trace is cut short here (the checker then fails) */
    if (line == small)
        cap = sizeof small;
    size_t at = head(line, kind);
    line[at++] = ' ';
    esc(line, cap, &at, name);
    if (extra) {
        int m = snprintf(line + at, cap - at, " %s", extra);
        if (m > 0)
            at += (size_t)m < cap - at ? (size_t)m : cap - at - 1;
    }
    for (int i = 0; i < n && at + 2 < cap; i++) {
        line[at++] = ' ';
        esc(line, cap, &at, argv[i] ? argv[i] : "");
    }
    if (tail) {
        int m = snprintf(line + at, cap - at, " %s", tail);
        if (m > 0)
            at += (size_t)m < cap - at ? (size_t)m : cap - at - 1;
    }
    put(t, line, cap, at);
    if (line != small)
        free(line);
}

#else
typedef int dlock_trace_unused; /* ISO C: a translation unit is not empty */
#endif
